"""danka/trainer/build.py: what a run refuses before any model loads is located where
the user wrote it, as a config error is: at the command-line override that set the key,
or at the config file's line (checks made there name a bare key: the engine's options,
the drift probe's prompts in tokens)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from danka.config import load_config
from danka.trainer.build import build

from .conftest import make_config, train_cli


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr("danka.trainer.build.build_model_set", refuse)


def _refusal(config, out, *overrides, capsys) -> str:
    assert train_cli(config, out, *overrides) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("danka: error:") == 1, err
    return err[err.index("danka: error:") :]


def test_keep_cache_true_on_the_hf_engine_is_refused_at_its_override(
    tmp_path, tiny_model_dir, capsys, no_model_loads
):
    """Before: 'rollout.keep_cache: rollout.keep_cache is set (True), but the 'hf' engine
    does not support it' named neither the override nor the file (auto picks the engine
    by device, so the config check cannot refuse it)."""
    path = make_config(tmp_path, tiny_model_dir)
    err = _refusal(path, tmp_path / "out", "rollout.keep_cache=true", capsys=capsys)
    assert err.startswith(
        "danka: error: command-line override #1: rollout.keep_cache=true: rollout.keep_cache "
        "is set (True), but the 'hf' engine does not support it"
    ), err
    assert "fix: remove rollout.keep_cache" in err


def test_keep_cache_true_in_the_file_is_refused_at_its_line(
    tmp_path, tiny_model_dir, capsys, no_model_loads
):
    path = make_config(tmp_path, tiny_model_dir, rollout={"keep_cache": True})
    line = path.read_text().splitlines().index("  keep_cache: true") + 1
    err = _refusal(path, tmp_path / "out", capsys=capsys)
    assert err.startswith(f"danka: error: {path}:{line}: key rollout.keep_cache: "), err


def test_a_probe_prompt_past_max_length_is_refused_at_its_override(
    tmp_path, tiny_model_dir, capsys, no_model_loads
):
    """Before: 'eval.probe_prompts[1]: the probe prompt 1 is ... tokens' (the override
    that set it unnamed); checked by the tokenizer, before the model loads."""
    path = make_config(tmp_path, tiny_model_dir, data={"eval_size": 1})
    probes = "eval.probe_prompts=[hi, '" + "word " * 200 + "']"
    err = _refusal(path, tmp_path / "out", probes, capsys=capsys)
    assert err.startswith("danka: error: command-line override #1: eval.probe_prompts=[hi, "), err
    assert ": key eval.probe_prompts[1]: the probe prompt 1 is " in err
    assert "longer than trainer.max_length (128)" in err


@pytest.mark.parametrize(
    "rollout, eval_tokens, chunk",
    [
        ({"generation_batch_size": "auto"}, None, 8),  # the plan's 2 prompts x 4 (a CPU run)
        ({"generation_batch_size": 3}, None, 3),  # as written
        ({"generation_batch_size": 0}, None, 256),  # all at once: 256 prompts a call
        ({"generation_batch_size": 300}, 32, 256),  # longer answers than the plan priced
    ],
)
def test_the_evaluation_decodes_the_planned_generation_batch_a_call(
    tmp_path, tiny_model_dir, rollout, eval_tokens, chunk
):
    """Held-out prompts a generate call: rollout.generation_batch_size, auto resolved by
    the plan (before: 256 for auto, whatever the plan had fitted, e.g. 512 rows for the GRPO
    example); at most 256 when the evaluation's answers are longer than training's (a KV
    cache the plan did not price)."""
    evals = {"max_new_tokens": eval_tokens} if eval_tokens else {}
    path = make_config(tmp_path, tiny_model_dir, rollout=rollout, data={"eval_size": 4}, eval=evals)
    cfg, base = load_config(path)
    built = build(cfg, base, Path(cfg.output_dir), logging.getLogger("test"))
    assert built.evaluator.held.chunk == chunk
