"""danka knows the shapes of the families its examples and docs name, offline: the counts
below are the parameter totals the models' own safetensors publish (a wrong hidden size,
MLP width, head count or a tied/untied head would change them), and the GSM8K examples'
``danka estimate`` works as shipped with no network and no HF cache."""

from pathlib import Path

import pytest

from danka.cli import main
from danka.planning.known_shapes import known_config
from danka.planning.shape import count_parameters, load_model_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-Coder-3B-Instruct": 3_085_938_688,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-Coder-14B-Instruct": 14_770_033_664,
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
    "HuggingFaceTB/SmolLM2-360M-Instruct": 361_821_120,
    "HuggingFaceTB/SmolLM2-1.7B": 1_711_376_384,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_known_shape_has_the_published_parameter_count(name):
    params, _ = count_parameters(known_config(name), "all-linear", 8)
    assert params == PUBLISHED[name]


def test_any_owner_and_case_but_not_other_names():
    a = known_config("someone/qwen2.5-coder-0.5b-instruct")
    assert a is not None and a.hidden_size == 896 and a.tie_word_embeddings
    assert known_config("Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ") is None
    assert known_config("my-model") is None


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No Hub, an empty HF cache: only the table can answer."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr("danka.models.loading.hub_reachable", lambda timeout=0: False)
    monkeypatch.chdir(tmp_path)


def test_unknown_model_offline_names_the_known_families(offline):
    from danka.errors import UserError

    with pytest.raises(UserError, match="Llama-3.2"):
        load_model_config("acme/unheard-of-7b")


@pytest.mark.parametrize("example", ["gsm8k_grpo.yaml", "gsm8k_ppo.yaml"])
def test_gsm8k_examples_estimate_offline_as_shipped(offline, capsys, example):
    assert main(["estimate", str(EXAMPLES / example)]) == 0
    out = capsys.readouterr().out
    assert "model Qwen/Qwen2.5-Coder-0.5B-Instruct: 0.494B parameters" in out
    assert "verdict: fits in 24.0 GiB" in out
