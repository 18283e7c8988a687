import importlib.util
import io
import sys

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
        "FlashAttention-2",
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
    if checks["FlashAttention-2"].status != "ok":
        assert "pip install danka[flash]" in checks["FlashAttention-2"].fix


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


def _fake_flash_attn(tmp_path, monkeypatch, body: str) -> None:
    pkg = tmp_path / "fake" / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)


def test_doctor_flash_attention_missing(monkeypatch):
    from danka.tools import doctor

    real = importlib.util.find_spec
    monkeypatch.setattr(
        doctor.importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real(n)
    )
    check = doctor.flash_attention_check()
    assert check.status == "info" and "danka uses sdpa" in check.value


def test_doctor_flash_attention_broken_build(tmp_path, monkeypatch):
    """The story's failure 2: a flash-attn built for another torch/CUDA."""
    from danka.tools import doctor

    _fake_flash_attn(
        tmp_path,
        monkeypatch,
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')",
    )
    check = doctor.flash_attention_check()
    assert check.status == "fail" and "undefined symbol" in check.value
    assert "pip install flash-attn --no-build-isolation" in check.fix


def test_doctor_flash_attention_wrong_gpu_arch(tmp_path, monkeypatch):
    import torch

    from danka.tools import doctor

    _fake_flash_attn(tmp_path, monkeypatch, "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))  # a T4
    check = doctor.flash_attention_check()
    assert check.status == "warn" and "compute capability 7.5" in check.value
    assert "use_flash_attention_2: false" in check.fix
