"""The step's tests share the trainer tests' tiny model (built once a session)."""

from tests.trainer.conftest import tiny_model_dir  # noqa: F401 - the fixture, re-exported
