"""Config loading: YAML + overrides, typed, validated once, errors that say what to do."""

from pathlib import Path

import pytest

from danka.cli import main
from danka.config import load_config
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


def test_seed_story_config_loads_as_written():
    cfg, _ = load_config(EXAMPLES / "single_card_ppo.yaml")
    assert cfg.trainer.algorithm == "ppo"
    assert cfg.trainer.advantage_estimator == "gae"  # derived from the algorithm
    assert cfg.trainer.samples_per_prompt == 1
    assert cfg.lora.target_modules == ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    assert cfg.model.tokenizer_kwargs.model_max_length == 32768
    assert cfg.data.max_prompt_length == 512 - 128
    assert cfg.logging.wandb_project is None


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
    assert cfg.trainer.batch_size == 4 and cfg.trainer.lr == pytest.approx(3e-4)
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.trainer.dual_clip_c is None
    assert base == tmp_path.resolve()


def test_unknown_key_names_file_line_and_suggestion(tmp_path):
    path = write(tmp_path, BASE + "trainer:\n  batch_sise: 4\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    text = str(err.value)
    assert (
        f"{path}:7" in text and "batch_sise" in text and "did you mean trainer.batch_size" in text
    )


def test_wrong_type_says_expected_type(tmp_path):
    path = write(tmp_path, BASE + "trainer:\n  batch_size: four\n")
    with pytest.raises(UserError, match=r"expected int, got 'four'"):
        load_config(path)


def test_inconsistent_batch_sizes_show_the_numbers(tmp_path):
    path = write(
        tmp_path,
        BASE + "trainer:\n  batch_size: 4\n  samples_per_prompt: 3\n  micro_batch_size: 5\n",
    )
    with pytest.raises(UserError) as err:
        load_config(path)
    assert "4 x 3 = 12" in str(err.value) and "micro_batch_size (5)" in str(err.value)


def test_grpo_needs_a_group(tmp_path):
    path = write(
        tmp_path,
        BASE + "trainer:\n  algorithm: grpo\n  samples_per_prompt: 1\n  micro_batch_size: 1\n",
    )
    with pytest.raises(UserError, match="samples_per_prompt >= 2"):
        load_config(path)


def test_vllm_and_fsdp_rejected_with_what_to_use(tmp_path):
    path = write(tmp_path, BASE + "backend:\n  vllm:\n    enable_vllm: true\n")
    with pytest.raises(UserError, match="rollout.engine: fast"):
        load_config(path)
    path = write(tmp_path, BASE + "backend:\n  fsdp:\n    enable_fsdp: true\n")
    with pytest.raises(UserError, match="torchrun"):
        load_config(path)


def test_bad_choice_lists_valid_values(tmp_path):
    path = write(tmp_path, BASE + "reward:\n  on_error: ignore\n")
    with pytest.raises(UserError, match="fail, skip_sample, zero"):
        load_config(path)


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
    out = capsys.readouterr().out
    assert "output_dir: ./output_single" in out and "seed: 7" in out


@pytest.mark.parametrize(
    "override, words",
    [
        ("trainer.max_train_minutes=0", "trainer.max_train_minutes"),
        ("logging.result_file=../x.json", "not a file name"),
        ("trainer.eval_max_new_tokens=many", "expected int or null"),
        ("trainer.auto_micro_batch=maybe", "expected bool"),
        ("data.packing=true data.max_packed_length=100", "a sequence must fit one packed row"),
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
