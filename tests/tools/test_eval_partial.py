"""``danka eval`` stopped midway (``timeout`` sends SIGTERM; Ctrl-C): every batch is scored
as soon as it is answered and the result file is rewritten atomically after it, marked
``partial``; the stop leaves a valid partial result that says so (answered k of n, the
signal) and exits 143. Before, a run killed at 48 of 60 prompts wrote nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability.conftest import running

REPO = Path(__file__).resolve().parents[2]
# the first batch (16 prompts) is scored at once; the second one's reward hangs
SLOW_REWARD = """
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) >= 16:
        time.sleep(60)
    return 1.0 if int(ground_truth) % 2 == 0 else 0.0
"""


def test_sigterm_leaves_a_valid_partial_result(tiny_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                            for i in range(20)))  # fmt: skip
    (tmp_path / "r.py").write_text(SLOW_REWARD)
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tiny_dir), "--data", str(data), "--reward",
            f"{tmp_path / 'r.py'}:compute_score", "--max-new-tokens", "2", "--output", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "danka", *argv]
    with running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        end = time.monotonic() + 180
        while not out.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert out.exists(), proc.communicate()[1][-3000:]
        first = json.loads(out.read_text())  # written after the first batch
        assert first["partial"] is True and first["answered"] == 16 and first["prompts"] == 20
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    result = json.loads(out.read_text())
    assert result["partial"] is True and result["stopped"] == "SIGTERM"
    assert result["answered"] == 16 and result["n"] == 16 and result["accuracy"] == 0.5
    assert "PARTIAL: stopped by SIGTERM after 16 of 20 prompts" in stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".eval.json")]  # no temp


def test_generate_writes_each_batch_as_it_is_done(tiny_dir, tmp_path):
    from danka.tools.generate import generate_file, load_for_inference

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(5)))
    model, tok = load_for_inference(str(tiny_dir), log=lambda s: None)

    class Out:
        lines: list[int] = []
        text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            self.lines.append(self.text.count("\n"))

    out = Out()
    assert generate_file(model, tok, str(data), out, batch_size=2, max_new_tokens=2) == 5
    assert out.lines == [2, 4, 5]  # flushed after each batch of 2


def test_a_partial_result_never_replaces_a_complete_one(
    tiny_dir, prompts_file, tmp_path, monkeypatch, capsys
):
    """A second `danka eval` into the same --output stopped before its first batch: the
    earlier complete result stays, the partial one goes beside it (and says where); a
    later complete result replaces the first and the stale partial file goes. Every
    version is 0644 under umask 022, as a run's outputs are."""
    import danka.tools.generate as generate
    from danka.cli import main

    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tiny_dir), "--data", str(prompts_file), "--reward",
            "last_number", "--max-new-tokens", "2", "--output", str(out)]  # fmt: skip
    old = os.umask(0o022)
    try:
        assert main(argv) == 0
        complete = out.read_text()
        assert "partial" not in json.loads(complete) and json.loads(complete)["n"] == 4
        capsys.readouterr()

        def stopped_at_once(*args, **kwargs):
            raise KeyboardInterrupt  # Ctrl-C before the first batch is answered

        with monkeypatch.context() as m:
            m.setattr(generate, "generate_batch", stopped_at_once)
            assert main(argv) == 130
        err = capsys.readouterr().err
        assert out.read_text() == complete  # kept, byte for byte
        partial = json.loads((tmp_path / "eval.partial.json").read_text())
        assert partial["partial"] is True and partial["answered"] == 0
        assert partial["stopped"] == "SIGINT"
        assert f"{out} holds an earlier complete result: kept" in err
        assert f"wrote {tmp_path / 'eval.partial.json'}" in err
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("eval*.json")}
        assert modes == {"eval.json": 0o644, "eval.partial.json": 0o644}
        assert main(argv) == 0  # complete again: replaces, and the partial file goes
    finally:
        os.umask(old)
    assert json.loads(out.read_text())["n"] == 4
    assert not (tmp_path / "eval.partial.json").exists()
