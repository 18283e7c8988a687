"""Bad input through ``danka train``: exit code 2, a message naming the file/line/key and the
fix, no traceback (unless ``--debug``), nothing partial written.

One test per case: config, data, reward code, checkpoint. Errors in config, data files and
checkpoints come before the model is loaded; reward-code and over-long-prompt errors come
after it today (see ``test_error_comes_before_model_loading``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from danka.cli import main
from danka.logging.runlog import close_run_logger
from tests.trainer.conftest import make_config, write_rows

REPO = Path(__file__).resolve().parents[1]
REWARD = "def reward(prompts, completions, **columns):\n    return [0.5 for _ in completions]\n"
MODEL_LOADED = "Loaded model"  # the run log's line once weights are in memory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from danka.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("bad_input_model"))


def _setup(root: Path, model_dir: Path, **sections) -> Path:
    """The trainer tests' tiny GRPO+LoRA config cut to 1 step and 8 rows (so an appended
    row is line 9); ``sections`` update it key by key."""
    trainer = {"total_steps": 1, "samples_per_prompt": 2, "max_new_tokens": 4}
    path = make_config(root, model_dir, trainer={**trainer, **sections.pop("trainer", {})},
                       **sections)  # fmt: skip
    write_rows(root / "rows.jsonl", 8)
    return path


def _fails(capsys, argv: list[str], *words: str, user_traceback: bool = False) -> str:
    """Run ``danka`` in-process; assert exit 2, ``words`` in the message, no traceback
    (``user_traceback``: the message may quote the traceback of the user's own code)."""
    try:
        code = main(argv)
    finally:
        close_run_logger()
    err = capsys.readouterr().err
    assert code == 2, err
    message = err[err.index("danka: error:") :]
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    assert "fix:" in message
    if not user_traceback:
        assert "Traceback" not in err
    return err


def _snapshot(out: Path) -> dict[str, bytes]:
    return (
        {
            str(p.relative_to(out)): p.read_bytes()
            for p in sorted(out.rglob("*"))
            if p.is_file() and not p.is_relative_to(out / "logs")
        }
        if out.exists()
        else {}
    )


def _nothing_partial(out: Path) -> None:
    """A failed start leaves no checkpoint, metrics or temporary file: at most its log and
    the resolved config.json, each a whole file."""
    if not out.exists():
        return
    names = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert names <= {"logs", "logs/train.log", "config.json"}, names
    if "config.json" in names:
        json.loads((out / "config.json").read_text())


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class Bad:
    """A start that must fail: the valid config with ``sections`` changed, ``files`` (name:
    text) written into the run folder (``"+text"`` appends), ``argv`` added to the command
    line; ``words`` must be in the message (``{root}`` is the run folder)."""

    words: tuple[str, ...]
    sections: dict = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    before_model: bool = True  # refused before the model is loaded


# fmt: off
BAD_STARTS = {
    # config
    "unknown_key": Bad(("{root}/config.yaml:", "unknown key 'trainer.batch_sise'",
                        "did you mean trainer.batch_size?"), {"trainer": {"batch_sise": 2}}),
    "wrong_type_in_an_override": Bad(("trainer.lr", "expected float"), argv=("trainer.lr=fast",)),
    "impossible_batch_sizes": Bad(
        ("trainer.mini_batch_size", "batch_size (3) is not a multiple of mini_batch_size (2)"),
        {"trainer": {"batch_size": 3, "mini_batch_size": 2}}),
    "rollout_compile_on_the_hf_engine": Bad(
        ("rollout.compile is set (True), but the 'hf' engine does not support it",
         "rollout.engine: fast"), {"rollout": {"compile": True}}, before_model=False),
    "lora_compute_on_the_hf_engine": Bad(
        ("rollout.lora_compute is set (merge), but the 'hf' engine does not support it",),
        {"rollout": {"lora_compute": "merge"}}, before_model=False),
    "lora_compute_without_an_adapter": Bad(
        ("rollout.lora_compute", "this run trains no adapter (lora.enable_lora: false)"),
        {"rollout": {"lora_compute": "base"}, "lora": {"enable_lora": False}}),
    "unknown_lora_compute": Bad(("rollout.lora_compute", "fp8"),
                                {"rollout": {"lora_compute": "fp8"}}),
    # data
    "invalid_json_line": Bad(("{root}/rows.jsonl:9", "invalid JSON"),
                             files={"rows.jsonl": "+{not json\n"}),
    "row_without_the_prompt_key": Bad(
        ("rows.jsonl:9", "missing 'prompt'", "question", "data.prompt_key"),
        files={"rows.jsonl": "+" + json.dumps({"question": "What is 1 + 1?"}) + "\n"}),
    "empty_data_file": Bad(("rows.jsonl", "no rows"), files={"rows.jsonl": ""}),
    "missing_data_file": Bad(("nope.jsonl", "data file not found"),
                             {"data": {"train_dataset": "nope.jsonl"}}),
    "overlong_prompt_with_policy_error": Bad(
        ("rows.jsonl", "longer than max_prompt_length 16", "data.overlong_prompt"),
        {"data": {"max_prompt_length": 16, "overlong_prompt": "error"}}, before_model=False),
    # reward code
    "reward_file_missing": Bad(("nope.py", "reward function file not found"),
                               {"reward": {"functions": [{"name": "nope.py:reward"}]}},
                               before_model=False),
    "reward_function_with_a_wrong_signature": Bad(
        ("reward.py:reward", "signature", "fn(prompts, completions, **kwargs)"),
        files={"reward.py": "def reward(x):\n    return 1.0\n"}, before_model=False),
    "reward_label_that_is_a_metric_of_danka": Bad(
        ("{root}/config.yaml:", "reward.functions[0].label", "one of danka's own reward metrics",
         "zero_adv_groups"),
        {"reward": {"functions": [{"name": "reward.py:reward", "label": "error_rate"}]}}),
    "reward_label_of_danka_in_an_override": Bad(
        ("command-line override #1", "key reward.functions[0].label", "valid_frac"),
        argv=("reward.functions=[{name: gsm8k, label: valid_frac}]",)),
    "reward_weights_that_overflow": Bad(
        ("{root}/config.yaml:", "reward.functions[1].weight", "weights add up to more than",
         "3.4e+38"),
        {"reward": {"functions": [{"name": "reward.py:reward", "weight": 2.0e+38},
                                  {"name": "reward.py:reward", "weight": 2.0e+38}]}}),
    "reward_file_that_fails_to_import": Bad(
        ("reward.py", "importing the reward file failed", "no_such_module_xyz"),
        files={"reward.py": "import no_such_module_xyz\n" + REWARD}, before_model=False),
}
# fmt: on


@pytest.mark.parametrize("bad", BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_bad_start_exits_2_with_the_fix(tmp_path, model_dir, capsys, bad):
    cfg = _setup(tmp_path, model_dir, **bad.sections)
    for name, text in bad.files.items():
        with (tmp_path / name).open("a" if text.startswith("+") else "w") as f:
            f.write(text.removeprefix("+"))
    words = [w.format(root=tmp_path) for w in bad.words]
    err = _fails(capsys, ["train", str(cfg), *bad.argv], *words)
    if bad.before_model:
        assert MODEL_LOADED not in err
    _nothing_partial(tmp_path / "out")


def test_wrong_type_names_file_line_and_key(tmp_path, model_dir, capsys):
    cfg = _setup(tmp_path, model_dir, trainer={"batch_size": "eight"})
    line = cfg.read_text().splitlines().index("  batch_size: eight") + 1
    _fails(
        capsys,
        ["train", str(cfg)],
        f"{cfg}:{line}",
        "trainer.batch_size",
        "expected int",
        "'eight'",
    )
    _nothing_partial(tmp_path / "out")


def test_missing_config_file(tmp_path, capsys):
    _fails(capsys, ["train", str(tmp_path / "nope.yaml")], "nope.yaml", "config file not found")


def test_reward_function_that_raises_on_the_pre_flight_check(tmp_path, model_dir, capsys):
    """The user's own traceback is shown (it is their bug), danka's is not."""
    cfg = _setup(tmp_path, model_dir)
    (tmp_path / "reward.py").write_text(
        "def reward(prompts, completions, **columns):\n    return [1 / 0 for _ in completions]\n"
    )
    err = _fails(
        capsys,
        ["train", str(cfg)],
        "reward.py:reward",
        "before training",
        "data row 0",
        "ZeroDivisionError",
        f'{tmp_path / "reward.py"}", line 2',
        user_traceback=True,
    )
    assert "danka/trainer" not in err and "danka/cli.py" not in err
    _nothing_partial(tmp_path / "out")


@pytest.mark.parametrize("case", ["reward_import", "overlong_prompt"])
def test_error_comes_before_model_loading(tmp_path, model_dir, capsys, case):
    if case == "reward_import":
        cfg = _setup(tmp_path, model_dir)
        (tmp_path / "reward.py").write_text("import no_such_module_xyz\n" + REWARD)
    else:
        cfg = _setup(tmp_path, model_dir, data={"max_prompt_length": 16})
    err = _fails(capsys, ["train", str(cfg)])
    assert MODEL_LOADED not in err


# ---------------------------------------------------------------- checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir) -> Path:
    """A finished 1-step run to resume from (copied by each test)."""
    root = tmp_path_factory.mktemp("bad_input_trained")
    cfg = _setup(root, model_dir)
    try:
        assert main(["train", str(cfg)]) == 0
    finally:
        close_run_logger()
    return root


def _copy(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "run"
    shutil.copytree(trained, root)
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    cfg["output_dir"] = str(root / "out")
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root / "config.yaml", root / "out"


def _refused(capsys, cfg: Path, out: Path, argv: list[str], *words: str) -> None:
    """``danka train CFG ARGV`` exits 2 naming ``words`` before the model loads; the run
    folder ``out`` is left as it was."""
    before = _snapshot(out)
    err = _fails(capsys, ["train", str(cfg), *argv], *words)
    assert MODEL_LOADED not in err
    assert _snapshot(out) == before


def test_fresh_start_into_an_output_dir_with_checkpoints(tmp_path, trained, capsys):
    """Without --resume a new run would interleave its checkpoints with the old ones."""
    cfg, out = _copy(trained, tmp_path)
    words = (str(out), "already holds checkpoints", "checkpoint_1", "--resume auto")
    _refused(capsys, cfg, out, [], *words)


def test_resume_from_a_missing_path(tmp_path, trained, capsys):
    cfg, out = _copy(trained, tmp_path)
    missing = out / "state" / "checkpoint_7"
    words = (str(missing), "checkpoint not found", "--resume auto")
    _refused(capsys, cfg, out, ["--resume", str(missing)], *words)


def test_resume_from_a_folder_that_is_no_checkpoint(tmp_path, trained, capsys):
    cfg, out = _copy(trained, tmp_path)
    words = ("not a checkpoint folder", "state/checkpoint_N")
    _refused(capsys, cfg, out, ["--resume", str(out / "state")], *words)


def test_resume_from_a_corrupted_checkpoint(tmp_path, trained, capsys):
    cfg, out = _copy(trained, tmp_path)
    adapter = out / "actor" / "checkpoint_1" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    argv = ["trainer.total_steps=2", "--resume", str(out / "state" / "checkpoint_1")]
    _refused(capsys, cfg, out, argv, str(adapter), "incomplete or corrupted", "bytes")


def test_resume_a_checkpoint_of_another_model(tmp_path, trained, capsys):
    from danka.models.tiny import save_tiny_model

    cfg, out = _copy(trained, tmp_path)
    other = save_tiny_model(tmp_path / "other_model", seed=1)
    argv = ["trainer.total_steps=2", f"model.actor_model_name_or_path={other}", "--resume", "auto"]
    words = ("checkpoint was trained on", str(other), "model.actor_model_name_or_path")
    _refused(capsys, cfg, out, argv, *words)


@pytest.mark.parametrize(
    "override,key",
    [
        ("lora.lora_r=8", "lora.lora_r=4"),
        ("lora.enable_lora=false", "lora.enable_lora=True"),
        ("trainer.algorithm=ppo", "no critic"),
    ],
)
def test_resume_with_another_weight_layout(tmp_path, trained, capsys, override, key):
    """Before the fix these raised torch's RuntimeError/KeyError with a traceback."""
    cfg, out = _copy(trained, tmp_path)
    extra = (
        ["trainer.samples_per_prompt=1", "trainer.micro_batch_size=1"] if "ppo" in override else []
    )
    _refused(capsys, cfg, out, ["trainer.total_steps=2", override, *extra, "--resume", "auto"], key)


def test_resume_with_other_training_data(tmp_path, trained, capsys):
    cfg, out = _copy(trained, tmp_path)
    with (out.parent / "rows.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "What is 9 + 1?", "answer": "10"}) + "\n")
    _fails(
        capsys,
        ["train", str(cfg), "trainer.total_steps=2", "--resume", "auto"],
        "trained on 8 prompts, this run has 9",
        "data.train_dataset",
    )
    assert sorted(p.name for p in (out / "state").iterdir()) == ["checkpoint_1"]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]


# ---------------------------------------------------------------- --debug


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "config file not found" in err
    proc = subprocess.run(
        [sys.executable, "-m", "danka", "--debug", "train", str(tmp_path / "nope.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert "UserError" in proc.stderr and "config file not found" in proc.stderr
