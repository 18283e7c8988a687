"""Typed config: schema (dataclasses), loading (YAML + overrides) and validation."""

from danka.config.load import config_to_dict, load_config
from danka.schema.sections import DankaConfig

__all__ = ["DankaConfig", "config_to_dict", "load_config"]
