import io

import torch
import transformers

from danka.cli import main
from danka.tools.doctor import Check, collect_checks, print_report


def test_collect_checks_reports_versions_and_fixes(tmp_path):
    checks = {c.name: c for c in collect_checks(tmp_path)}
    assert checks["torch"].value == torch.__version__
    assert checks["transformers"].value == transformers.__version__
    assert {
        "python",
        "peft",
        "CUDA",
        "SDPA attention",
        "flash-attn",
        "liger-kernel",
        "bitsandbytes",
        "vllm",
        "disk",
        "Hugging Face Hub",
        "SmolLM2 offline",
    } <= set(checks)
    assert str(tmp_path) in checks["disk"].value
    for c in checks.values():
        assert c.status in ("ok", "warn", "fail", "info")
        if c.status != "ok":
            assert c.fix, f"{c.name} has a problem but no fix"
    if checks["flash-attn"].status != "ok":
        assert "pip install danka[flash]" in checks["flash-attn"].fix


def test_plain_report_lists_problems():
    out = io.StringIO()
    print_report([Check("a", "ok", "1"), Check("b", "warn", "low", "do x")], out)
    text = out.getvalue()
    assert "[  ok] a" in text and "fix: do x" in text and "1 problem(s)" in text


def test_cli_doctor_exits_0(capsys, monkeypatch):
    # offline: the Hub probe must answer quickly either way
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and torch.__version__ in out
