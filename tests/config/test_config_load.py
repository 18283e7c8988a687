"""Config loading: YAML + overrides, typed, validated once, errors that say what to do."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from danka.cli import main
from danka.config import load_config
from danka.config.compat import config_notes, fallback_warnings
from danka.errors import UserError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


BASE = """
model:
  actor_model_name_or_path: some/model
data:
  train_dataset: rows.jsonl
"""


# The seed story's single_card_ppo.yaml as the story prints it (shared/SEED_STORY.md).
SEED_KEYS = {
    "model": {
        "actor_model_name_or_path": "Qwen/Qwen2-7B-Instruct",
        "critic_model_name_or_path": "Qwen/Qwen2-7B-Instruct",
        "reward_model_name_or_path": "Qwen/Qwen2-7B-Instruct",
        "use_flash_attention_2": True,
        "torch_dtype": "bfloat16",
        "trust_remote_code": True,
    },
    "trainer": {
        "algorithm": "ppo",
        "num_epochs": 1,
        "batch_size": 4,
        "micro_batch_size": 2,
        "max_length": 512,
        "max_new_tokens": 128,
    },
    "lora": {
        "enable_lora": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.1,
        "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
    },
    "backend": {
        "fsdp": {"enable_fsdp": False},
        "vllm": {"enable_vllm": False},
        "hf_transformers": {"enable_hf_transformers": True},
    },
    "data": {
        "train_dataset": "./mini_gsm8k.json",
        "dataset_type": "json",
        "prompt_key": "prompt",
        "response_key": "response",
        "reward_key": "reward",
    },
    "logging": {"wandb_project": "verl_single_card", "log_interval": 10},
}


def test_seed_example_is_the_seed_file_verbatim():
    """Nothing added, nothing changed (the old file set reward_model: null, a reward block...)."""
    data = yaml.safe_load((EXAMPLES / "single_card_ppo.yaml").read_text())
    assert data == SEED_KEYS


def test_seed_story_config_loads_as_written(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(  # this machine has neither flash_attn nor wandb; pin that
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("flash_attn", "wandb") else real(name, *a),
    )
    cfg, _ = load_config(EXAMPLES / "single_card_ppo.yaml")
    assert cfg.trainer.algorithm == "ppo"
    assert cfg.trainer.advantage_estimator == "gae"  # derived from the algorithm
    assert cfg.trainer.samples_per_prompt == 1
    assert cfg.lora.target_modules == ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    assert cfg.data.max_prompt_length == 512 - 128
    assert cfg.model.trust_remote_code is True  # honoured, passed to every loader
    # what danka does instead of what cannot work here, one warning line each
    assert cfg.model.attn_implementation == "sdpa" and not cfg.model.use_flash_attention_2
    assert cfg.logging.wandb_project is None
    lines = fallback_warnings(cfg)
    assert len(lines) == 2
    assert "use_flash_attention_2" in lines[0] and "using sdpa" in lines[0]
    assert "wandb_project" in lines[1] and "logging locally" in lines[1]
    # the retired backend switches: what they mean now, one note each
    assert cfg.rollout.engine == "hf"
    assert [n.split(":")[0] for n in config_notes(cfg)] == [
        "backend.fsdp.enable_fsdp",
        "backend.hf_transformers.enable_hf_transformers",
    ]


def test_recommended_example_validates():
    cfg, _ = load_config(EXAMPLES / "single_card_ppo_recommended.yaml")
    assert cfg.checkpoint.save_steps is None and cfg.checkpoint.save_minutes == 30
    assert [f.name for f in cfg.reward.functions] == ["gsm8k"]


@pytest.mark.parametrize("alias, name", [("bf16", "bfloat16"), ("fp16", "float16"),
                                         ("fp32", "float32"), ("BF16", "bfloat16")])  # fmt: skip
def test_dtype_aliases_reach_the_loader_as_real_names(tmp_path, alias, name):
    """Old code validated bf16 but the loader refused it naming the key model.dtype."""
    from danka.models.loading import resolve_dtype

    cfg, _ = load_config(write(tmp_path, BASE), [f"model.torch_dtype={alias}"])
    assert cfg.model.torch_dtype == name
    assert str(resolve_dtype(alias)) == f"torch.{name}"
    with pytest.raises(UserError) as err:
        resolve_dtype("int8")
    assert err.value.where == "model.torch_dtype"


def test_abbreviated_option_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", str(write(tmp_path, BASE)), "--resum", "auto", "--print-config"])
    assert exc.value.code == 2
    assert "--resum" in capsys.readouterr().err


def test_help_config_lists_every_key_with_help_and_default(capsys):
    from danka.config.help import config_rows

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    rows = config_rows()
    assert len(rows) > 100 and all(help_text for _, _, _, help_text in rows)
    for key, _, default, help_text in rows:
        assert f"{key}  (" in out and f"default {default})" in out and help_text in out
    assert "checkpoint.save_steps  (int or null, default null)" in out
    assert "reward.functions[i].kwargs" in out
    # every field of every section, e.g. a top-level one and a nested one
    assert "output_dir  (str, default output)" in out and "loss.kl.horizon  (" in out


def test_print_config_masks_secrets(tmp_path, capsys):
    # a user reward file's kwargs are passed through (a builtin would refuse api_key)
    (tmp_path / "judge.py").write_text("def score(completions, **kw):\n    return [0.0]\n")
    text = (
        BASE
        + "reward:\n  functions:\n    - name: judge.py:score\n      kwargs: {api_key: sk-123}\n"
    )
    assert main(["train", str(write(tmp_path, text)), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "sk-123" not in out and "api_key: '***'" in out


def test_overrides_types_lists_and_null(tmp_path):
    path = write(tmp_path, BASE)
    cfg, base = load_config(
        path,
        [
            "trainer.batch_size=4",
            "trainer.lr=3e-4",
            "lora.target_modules=[q_proj, v_proj]",
            "trainer.dual_clip_c=null",
            "trainer.micro_batch_size=4",
        ],
    )
    assert cfg.trainer.batch_size == 4 and cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.loss.dual_clip_c is None
    assert base == tmp_path.resolve()


def test_unknown_key_names_file_line_and_suggestion(tmp_path):
    path = write(tmp_path, BASE + "trainer:\n  batch_sise: 4\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    text = str(err.value)
    assert (
        f"{path}:7" in text and "batch_sise" in text and "did you mean trainer.batch_size" in text
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ("trainer:\n  batch_size: four\n", r"expected int, got 'four'"),  # wrong type
        (
            "trainer:\n  algorithm: grpo\n  samples_per_prompt: 1\n  micro_batch_size: 1\n",
            "samples_per_prompt >= 2",  # GRPO needs a group
        ),
        (  # the seed's vLLM switch and another engine: which one?
            "backend:\n  vllm:\n    enable_vllm: true\nrollout:\n  engine: fast\n",
            "set only one of them",
        ),
        ("backend:\n  fsdp:\n    enable_fsdp: true\n", "torchrun"),
        ("reward:\n  on_error: ignore\n", "fail, skip_sample, zero"),  # lists valid values
    ],
)
def test_bad_value_says_what_to_do(tmp_path, text, words):
    with pytest.raises(UserError, match=words):
        load_config(write(tmp_path, BASE + text))


def test_inconsistent_batch_sizes_show_the_numbers(tmp_path):
    path = write(
        tmp_path,
        BASE + "trainer:\n  batch_size: 4\n  samples_per_prompt: 3\n  micro_batch_size: 5\n",
    )
    with pytest.raises(UserError) as err:
        load_config(path)
    assert "4 x 3 = 12" in str(err.value) and "micro_batch_size (5)" in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    path = write(tmp_path, "model: [unclosed\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_config(path)


def test_cli_print_config_and_typo_exit_2(tmp_path, capsys):
    assert main(["train", str(EXAMPLES / "single_card_ppo.yaml"), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "algorithm: ppo" in out and "samples_per_prompt: 1" in out  # defaults resolved
    bad = tmp_path / "typo.yaml"
    bad.write_text((EXAMPLES / "single_card_ppo.yaml").read_text().replace("lora_r:", "lora_rr:"))
    assert main(["train", str(bad), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "did you mean lora.lora_r" in err and "Traceback" not in err


def test_cli_seed_story_flags(capsys):
    code = main(
        [
            "train",
            "--config_file",
            str(EXAMPLES / "single_card_ppo.yaml"),
            "--output_dir",
            "./output_single",
            "--seed",
            "7",
            "--print-config",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "output_dir: ./output_single" in captured.out and "seed: 7" in captured.out
    if importlib.util.find_spec("flash_attn") is None:  # one warning line, no traceback
        assert "[WARNING] model.use_flash_attention_2: true, but" in captured.err
        assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    "override, words",
    [
        ("trainer.max_train_minutes=0", "trainer.max_train_minutes"),
        ("logging.result_file=../x.json", "not a file name"),
        ("trainer.eval_max_new_tokens=many", "expected int or null"),
        ("trainer.auto_micro_batch=maybe", "expected bool"),
        ("speed.packing=true speed.max_packed_length=100", "a sequence must fit one packed row"),
        ("backend.fsdp.sharding=zero3", "use one of: auto, replicate, shard"),
        ("agent.kv_reuse=sometimes", "expected bool"),
    ],
)
def test_newer_options_are_checked(tmp_path, override, words):
    with pytest.raises(UserError, match=words):
        load_config(write(tmp_path, BASE), override.split())


def test_qlora_options_checked_and_install_hint(tmp_path, capsys):
    with pytest.raises(UserError, match="choose one"):
        load_config(write(tmp_path, BASE), ["model.load_in_4bit=true", "model.load_in_8bit=true"])
    with pytest.raises(UserError, match="cannot be trained in full"):
        load_config(write(tmp_path, BASE), ["model.load_in_4bit=true", "lora.enable_lora=false"])
    import importlib.util

    from danka.models.loading import load_causal_lm

    if importlib.util.find_spec("bitsandbytes") is None:  # the CPU machines: a clear hint
        with pytest.raises(UserError, match=r"pip install 'danka\[bnb\]'"):
            load_causal_lm("any/model", quantize="4bit")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_validates(path):
    cfg, _ = load_config(path)
    assert cfg.model.actor_model_name_or_path and (cfg.data.train_dataset or cfg.data.task)


def test_keys_under_their_older_name_land_in_their_section(tmp_path):
    """Configs written before the sections by concern still load: ``trainer.lr`` is
    ``optim.lr``, ``trainer.kl.coef`` is ``loss.kl.coef`` (file or override); naming both
    the old and the new key is refused; a message names the key as the user wrote it."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {actor_model_name_or_path: x}\ndata: {train_dataset: x.jsonl}\n"
        "trainer:\n  lr: 3.0e-4\n  kl: {coef: 0.01}\n  eval_steps: 5\n"
    )
    cfg, _ = load_config(path, ["trainer.temperature=0.5", "checkpoint.keep_last=2"])
    assert cfg.optim.lr == 3e-4 and cfg.loss.kl.coef == 0.01 and cfg.eval.every_steps == 5
    assert cfg.sampling.temperature == 0.5 and cfg.checkpoint.keep_last == 2
    both = tmp_path / "both.yaml"
    both.write_text(path.read_text() + "optim: {lr: 1.0e-5}\n")
    with pytest.raises(UserError, match="both trainer.lr and optim.lr are set"):
        load_config(both)
    with pytest.raises(UserError, match=r"w.yaml:4: key trainer.lr \(now optim.lr\)"):
        load_config(_write(tmp_path, path.read_text().replace("3.0e-4", "-1")))


def _write(tmp_path, text: str):
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return p
