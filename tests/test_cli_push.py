"""``danka push``: a checkpoint (or a run's newest) goes to a Hub repo with its model card,
through huggingface_hub against a local fake Hub; no token / no route = exit 2, one line."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from danka.cli import main


class FakeHub(BaseHTTPRequestHandler):
    """The three calls ``create_repo`` + ``upload_folder`` make, every file "regular"."""

    files: dict[str, bytes] = {}
    repos: list[str] = []
    auth: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def _json(self, payload, status=200):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.auth.append(self.headers.get("Authorization", ""))
        if self.path == "/api/repos/create":
            spec = json.loads(body)
            name = f"{spec.get('organization') or 'me'}/{spec['name']}"
            self.repos.append(name)
            return self._json({"url": f"{base}/{name}", "name": name})
        if self.path == "/api/validate-yaml":  # the Hub checks a README's metadata
            return self._json({"errors": [], "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(body)["files"]
            return self._json(
                {
                    "files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files
                    ]
                }  # fmt: skip
            )
        if "/commit/" in self.path:
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    value = item["value"]
                    self.files[value["path"]] = base64.b64decode(value["content"])
            return self._json({"commitUrl": f"{base}/me/model/commit/abc", "commitOid": "abc"})
        return self._json({"error": f"unexpected {self.path}"}, 404)


@pytest.fixture()
def fake_hub():
    FakeHub.files, FakeHub.repos, FakeHub.auth = {}, [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _run_dir(tmp_path):
    """A finished run's layout: actor/checkpoint_{1,2} (2 is the newest complete one)."""
    run = tmp_path / "run"
    for step in (1, 2):
        ckpt = run / "actor" / f"checkpoint_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "b"}))
        (ckpt / "adapter_model.safetensors").write_bytes(b"weights %d" % step)
        (ckpt / ".hidden").write_text("not uploaded")
        info = {
            "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "kind": "lora",
            "algorithm": "grpo", "step": step, "data": {"train": "t", "eval": "e"},
            "rewards": [{"name": "last_number", "weight": 1.0}],
            "eval": [{"step": 0, "accuracy": 0.2, "n": 200}, {"step": 2, "accuracy": 0.6, "n": 200}],
        }  # fmt: skip
        (ckpt / "danka_training.json").write_text(json.dumps(info))
        (run / "state" / f"checkpoint_{step}").mkdir(parents=True)
        (run / "state" / f"checkpoint_{step}" / "manifest.json").write_text("{}")
    return run


def test_push_a_run_uploads_its_newest_checkpoint_with_a_card(tmp_path, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fake_write_token")
    run = _run_dir(tmp_path)
    assert main(["push", str(run), "me/model", "--endpoint", fake_hub]) == 0
    assert FakeHub.repos == ["me/model"]
    assert set(FakeHub.files) == {
        "adapter_config.json", "adapter_model.safetensors", "danka_training.json", "README.md",
    }  # fmt: skip
    assert FakeHub.files["adapter_model.safetensors"] == b"weights 2"
    card = FakeHub.files["README.md"].decode()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert "| after | 2 | 60.0% |" in card and "Noise floor" in card
    assert all(a == "Bearer hf_fake_write_token" for a in FakeHub.auth)


def test_push_without_token_or_network_is_one_message(tmp_path, monkeypatch, capsys):
    run = _run_dir(tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no stored token either
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    assert main(["push", str(run), "me/model"]) == 2
    assert "no Hugging Face token" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    assert main(["push", str(run), "me/model", "--endpoint", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Hugging Face Hub at http://127.0.0.1:9" in err
    assert "Traceback" not in err


def test_push_bad_input(tmp_path, capsys):
    assert main(["push", str(tmp_path), "me/model"]) == 2
    assert "neither a checkpoint nor a run folder" in capsys.readouterr().err
    assert main(["push", str(_run_dir(tmp_path)), "not-a-repo-id"]) == 2
    assert "is not a repo id" in capsys.readouterr().err
