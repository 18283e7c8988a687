"""The README's code blocks, as written, on a fresh clone (quick, in CI; the slow
walk-through that runs every command on SmolLM2 is tests/test_cli_readme.py).

- every ```bash line is checked for shape: a script it runs exists and parses (``bash
  -n``); a ``danka`` command names a subcommand and flags its parser takes; a file of the
  repository it names (``examples/``, ``scripts/``) exists, and a config it names loads
  and validates (no model is loaded);
- every ```python block runs as written, in a folder where ``examples/quickstart.yaml`` is
  the quickstart on a tiny model (same task, data, reward, examples; small sizes), after
  that quickstart ran, as the README orders them: the snippet must not collide with the
  quickstart's output, and a second run into its folder must say what to pass in Python.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from danka.cli import build_parser
from danka.config import load_config
from danka.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REPO_PATHS = ("examples/", "scripts/", "docs/")


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def bash_commands(text: str) -> list[str]:
    """Each command line of each ```bash block (continuations joined, comments dropped)."""
    out = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            cmd = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


def check_shape(cmd: str) -> None:
    """AssertionError naming ``cmd`` unless it has the shape of a working command."""
    argv = shlex.split(cmd)
    for arg in argv:
        value = arg.split("=", 1)[-1]
        if value.startswith(REPO_PATHS):
            assert (ROOT / value).exists(), f"{cmd}: {value} is not in the repository"
    if argv[0] == "bash":
        script = ROOT / argv[1]
        assert script.is_file(), f"{cmd}: no {argv[1]}"
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, cmd
        return
    assert argv[0] == "danka", f"{cmd}: neither danka nor a script of the repository"
    try:
        args, extra = build_parser().parse_known_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"{cmd}: danka's parser refuses it") from None
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    assert not stray, f"{cmd}: unknown arguments {stray}"
    config = getattr(args, "config_file", None) or getattr(args, "config", None)
    if config and str(config).startswith("examples/"):
        load_config(ROOT / config)  # validates: a bad key fails here, no model loads


def test_every_bash_line_of_the_readme_has_a_working_shape():
    cmds = bash_commands(README.read_text(encoding="utf-8"))
    assert "bash scripts/quickstart.sh" in cmds and any(
        c.startswith("danka generate") for c in cmds
    )
    for cmd in cmds:
        check_shape(cmd)


def test_a_wrong_command_is_caught():
    for bad in ("danka generat --prompt x", "danka generate --promt x", "bash scripts/nope.sh",
                "danka eval examples/nope.yaml"):  # fmt: skip
        with pytest.raises(AssertionError):
            check_shape(bad)


def _tiny_quickstart(folder: Path, model_dir: Path) -> None:
    """``folder/examples/quickstart.yaml``: the README's quickstart on the tiny model."""
    cfg = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    cfg["model"]["actor_model_name_or_path"] = str(model_dir)
    cfg["trainer"].update(batch_size=2, samples_per_prompt=2, micro_batch_size=4, max_length=256,
                          max_new_tokens=8, total_steps=2)  # fmt: skip
    cfg["data"].update(task_train_size=16, eval_size=4)
    cfg["lora"].update(lora_r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    cfg["logging"].update(tensorboard=False, progress=False, save_completions=0)
    (folder / "examples").mkdir()
    (folder / "examples" / "quickstart.yaml").write_text(yaml.safe_dump(cfg))


def test_the_python_snippets_run_as_written_after_the_quickstart(tmp_path, monkeypatch):
    import danka
    from danka.models.tiny import save_tiny_model

    _tiny_quickstart(tmp_path, save_tiny_model(tmp_path / "tiny"))
    monkeypatch.chdir(tmp_path)
    quickstart = danka.train("examples/quickstart.yaml", plot=False)  # bash scripts/quickstart.sh
    [snippet] = code_blocks(README.read_text(encoding="utf-8"), "python")
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    result = scope["result"]
    assert result.checkpoint is not None and result.checkpoint.is_dir()
    assert result.output_dir.resolve() != quickstart.output_dir.resolve()
    assert 0.0 <= result.before <= 1.0 and 0.0 <= result.after <= 1.0

    with pytest.raises(UserError) as again:  # the same snippet again: its folder is taken
        exec(compile(snippet, "README.md", "exec"), {})
    text = str(again.value)
    assert 'resume="auto"' in text and "--resume" not in text, text
