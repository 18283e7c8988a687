import os

import pytest
import torch

from danka.cli import main
from danka.tools.export import export_merged, human_size


def _export(adapter, output, **flags) -> int:
    """Exit code of ``danka export --adapter ADAPTER --output OUTPUT --flag value ...``."""
    argv = ["export", "--adapter", str(adapter), "--output", str(output)]
    for flag, value in flags.items():
        argv += [f"--{flag}", str(value)]
    return main(argv)


def test_export_merges_and_matches_base_plus_adapter(adapter_dir, tiny_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    old = os.umask(0o022)
    try:
        info = export_merged(adapter_dir, out, dtype="fp32", device="cpu", log=lambda m: None)
    finally:
        os.umask(old)
    # danka's one file mode (safetensors writes 0600 on its own)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert out.stat().st_mode & 0o777 == 0o755  # mkdtemp's 0700 would hide it
    assert info["base_model"] == str(tiny_dir)  # from adapter_config.json
    assert info["adapter_effect"] > 1e-3  # non-zero lora_B: the adapter matters
    assert info["max_abs_diff"] < 1e-4 <= info["tolerance"]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not (out / "adapter_config.json").exists()
    assert (out / "tokenizer_config.json").is_file()
    assert info["adapter_bytes"] > 0 and info["merged_bytes"] > info["adapter_bytes"]

    # the saved folder alone reproduces base + adapter
    ids = torch.tensor([[5, 17, 40, 2, 99, 120]])
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    ref = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with torch.no_grad():
        diff = (merged(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-4
    assert AutoTokenizer.from_pretrained(str(out)).eos_token == "<|im_end|>"


def test_cli_export_bf16_prints_the_check_and_sizes(adapter_dir, tiny_dir, tmp_path, capsys):
    out = tmp_path / "m16"
    assert _export(adapter_dir, out, model=tiny_dir, dtype="bf16", device="cpu") == 0
    text = capsys.readouterr().out
    assert "max |logits(merged) - logits(base + adapter)|" in text
    assert "adapter" in text and "merged model" in text and "bfloat16" in text
    # a second export into the same (now non-empty) folder is refused
    assert _export(adapter_dir, out) == 2


def test_export_fails_with_exit_2_when_the_merge_is_wrong(
    adapter_dir, tmp_path, monkeypatch, capsys
):
    from peft import PeftModel

    # a "merge" that drops the adapter: logits move by the adapter's effect
    monkeypatch.setattr(PeftModel, "merge_and_unload", lambda self: self.unload(), raising=False)
    out = tmp_path / "bad"
    assert _export(adapter_dir, out, dtype="fp32", device="cpu") == 2
    assert "merged logits differ" in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_export_bad_adapter(tmp_path, capsys):
    assert _export(tmp_path / "nope", tmp_path / "o") == 2
    assert "adapter folder not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "n, text", [(512, "512B"), (1536, "1.5K"), (15 * 2**30, "15G"), (3 * 2**20 + 2**19, "3.5M")]
)
def test_human_size(n, text):
    assert human_size(n) == text


def test_export_default_dtype_is_the_one_the_adapter_was_trained_in(tmp_path):
    """Old default bf16 refused a CPU-trained (fp32) adapter: merged logits off by 2.44."""
    import json

    from danka.tools.export import trained_dtype

    run = tmp_path / "run"
    adapter = run / "actor" / "checkpoint_2"
    adapter.mkdir(parents=True)
    assert trained_dtype(adapter) is None  # not known: export falls back to auto
    (run / "state" / "checkpoint_2").mkdir(parents=True)
    (run / "state" / "checkpoint_2" / "config.json").write_text(
        json.dumps({"model": {"torch_dtype": "bf16"}})
    )
    assert trained_dtype(adapter) == "bfloat16"  # the config named it
    (run / "logs").mkdir()
    (run / "logs" / "train.log").write_text(
        "[INFO] Using HF Transformers backend for Actor/Critic inference\n"
        "[INFO] Loaded model HuggingFaceTB/SmolLM2-135M-Instruct with float32\n"
    )
    assert trained_dtype(adapter) == "float32"  # what the run actually loaded wins


def test_cli_export_gguf_round_trips_and_has_a_card(adapter_dir, tmp_path, capsys):
    """``danka export --gguf f32``: the .gguf reads back (transformers) to the merged
    model's logits; the folder has a model card naming the base."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    assert _export(adapter_dir, out, dtype="fp32", device="cpu", gguf="f32") == 0
    [gguf_file] = out.glob("*.gguf")
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    back = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=gguf_file.name).eval()
    ids = torch.tensor([[5, 17, 40, 2, 99, 120]])
    with torch.no_grad():
        diff = (merged(input_ids=ids).logits - back(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-5
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "gguf" in card
    assert f"llama-cli -m {gguf_file.name}" in card
    printed = capsys.readouterr().out
    assert "writing " in printed and f"wrote {out / gguf_file.name} (f32" in printed
    assert ".tmp-export" not in printed  # the final path only, never the staging folder


def test_export_a_full_parameter_checkpoint_to_gguf(tiny_dir, tmp_path):
    info = export_merged(tiny_dir, tmp_path / "out", device="cpu", gguf="q8_0", log=lambda m: None)
    assert info["gguf"].endswith("-q8_0.gguf") and (tmp_path / "out" / "README.md").is_file()
    assert (tmp_path / "out" / "model.safetensors").is_file()
