"""``danka push`` that cannot upload changes nothing (it used to write README.md into the
checkpoint before failing), and an endpoint's credentials are never echoed."""

from __future__ import annotations

from danka.cli import main
from danka.tools.hub import redact
from tests.test_cli_push import _run_dir


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_push_that_fails_leaves_the_checkpoint_unchanged(tmp_path, monkeypatch, capsys):
    run = _run_dir(tmp_path)
    before = _files(run)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    with monkeypatch.context() as m:  # HF_HUB_OFFLINE=1 as huggingface_hub read it
        m.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        assert main(["push", str(run), "me/model", "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err
    assert _files(run) == before  # no README.md written into the checkpoint
    assert main(["push", str(run), "me/model", "--endpoint", "http://127.0.0.1:9"]) == 2
    assert _files(run) == before
    capsys.readouterr()


def test_credentials_in_the_endpoint_are_not_echoed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    endpoint = "http://alice:s3cret-pass@127.0.0.1:9/hub?token=s3cret-query"
    assert main(["push", str(_run_dir(tmp_path)), "me/model", "--endpoint", endpoint]) == 2
    out = capsys.readouterr()
    assert "s3cret" not in out.err + out.out and "***@127.0.0.1:9" in out.err
    assert redact("https://u:p@h.example/x?a=b") == "https://***@h.example/x"
