"""cuDNN SDPA is off for every model danka loads (issue 11 #1: NaN gradients on padded rows)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from danka.models.loading import configure_attention_backends, load_causal_lm
from danka.models.tiny import save_tiny_model


@pytest.fixture
def cudnn_flag():
    """Restore the process-wide cuDNN SDPA flag after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_load_causal_lm_turns_cudnn_sdpa_off(tmp_path, cudnn_flag):
    # The old loader left the flag as torch sets it (on): this test failed there.
    path = save_tiny_model(tmp_path / "model", arch="llama")
    torch.backends.cuda.enable_cudnn_sdp(True)
    load_causal_lm(str(path), dtype="float32", log=lambda _: None)
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_configure_reports_previous_state(cudnn_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert configure_attention_backends() is True
    assert configure_attention_backends() is False


def _smollm2_shaped(layers: int = 4) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).train()


def _nonfinite_grads(model: LlamaForCausalLM, length: int) -> int:
    """Non-finite parameter-gradient entries after a left-padded masked-log-prob backward."""
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(length)
    b, pads = 4, [0, 17, 100, 200]
    ids = torch.randint(0, model.config.vocab_size, (b, length), generator=g).cuda()
    mask = torch.ones(b, length, dtype=torch.long, device="cuda")
    for i, p in enumerate(pads):
        mask[i, :p] = 0
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    # Padding positions get a zero upstream gradient, as in the training loss.
    (-(lp * mask[:, 1:]).sum() / mask.sum()).backward()
    return sum(
        int((~torch.isfinite(p.grad)).sum()) for p in model.parameters() if p.grad is not None
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("length", [448, 576])
def test_cudnn_sdpa_nan_grads_reproduced_and_fixed(length, cudnn_flag):
    model = _smollm2_shaped()
    configure_attention_backends()
    fixed = _nonfinite_grads(model, length)
    torch.backends.cuda.enable_cudnn_sdp(True)
    broken = _nonfinite_grads(model, length)
    assert fixed == 0, f"{fixed} non-finite gradient entries with danka's attention setting"
    if broken == 0:
        pytest.skip(
            f"torch {torch.__version__} on {torch.cuda.get_device_name()} gives finite "
            f"gradients with cuDNN SDPA at L={length}: the bug does not reproduce here"
        )
