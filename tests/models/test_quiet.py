"""The third-party warnings danka silences are the known noise only: the real trigger
(transformers' code) is run, and a neighbouring warning still shows."""

from __future__ import annotations

import logging
import warnings

from danka.models.quiet import silence_known_noise


def test_the_gradient_checkpointing_future_warning_is_silenced():
    from peft import LoraConfig, get_peft_model

    from danka.models.tiny import tiny_causal_lm, tiny_tokenizer

    tiny_model = tiny_causal_lm(tiny_tokenizer())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        silence_known_noise()  # inside the block: catch_warnings reset the filters
        get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]))  # peft reads it
        warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
    messages = [str(w.message) for w in seen]
    assert messages == ["another FutureWarning"]


def test_only_sampling_flags_in_the_generation_warning_are_silenced():
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("transformers.generation.configuration_utils")
    logger.addHandler(handler)
    try:
        silence_known_noise()  # transformers' exact words (generation/configuration_utils.py)
        logger.warning(
            "The following generation flags are not valid and may be ignored: ['top_k']."
        )
        logger.warning(
            "The following generation flags are not valid and may be ignored: ['num_beams']."
        )
    finally:
        logger.removeHandler(handler)
    assert records == [
        "The following generation flags are not valid and may be ignored: ['num_beams']."
    ]
