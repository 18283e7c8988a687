"""Third-party warnings that say nothing a danka user can act on, silenced at the source.

Each is matched exactly, so a new or a real warning still shows:

- transformers' ``FutureWarning: `is_gradient_checkpointing` is deprecated``: peft reads
  the old attribute whenever it wraps a model (every command that loads an adapter);
- transformers' ``The following generation flags are not valid and may be ignored:
  ['top_k']`` (or ``top_p``, ``temperature``): a model's ``generation_config.json`` sets
  sampling flags, and danka's greedy evaluation (``do_sample=False``) overrides them on
  purpose. Other flags in that message still show.
"""

from __future__ import annotations

import ast
import logging
import re
import warnings

SAMPLING_FLAGS = {"top_k", "top_p", "temperature", "min_p", "typical_p"}
_FLAGS = re.compile(r"generation flags are not valid and may be ignored: (\[[^\]]*\])")
_GENERATION_LOGGER = "transformers.generation.configuration_utils"


class _GreedyFlagsFilter(logging.Filter):
    """Drops the generation-flags warning when it lists only sampling flags."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = _FLAGS.search(record.getMessage())
        if found is None:
            return True
        try:
            flags = set(ast.literal_eval(found.group(1)))
        except (ValueError, SyntaxError):
            return True
        return not flags <= SAMPLING_FLAGS


def silence_known_noise() -> None:
    """Install the filters (idempotent: a second call adds nothing)."""
    warnings.filterwarnings(
        "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    logger = logging.getLogger(_GENERATION_LOGGER)
    if not any(isinstance(f, _GreedyFlagsFilter) for f in logger.filters):
        logger.addFilter(_GreedyFlagsFilter())
