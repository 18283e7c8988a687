"""The padding-free (varlen) forward == the padded forward: layout by hand, log-probs,
entropies, values and gradients on a tiny model (CPU: per-sequence attention), LoRA too;
token-budget micro-batches."""

from __future__ import annotations

import torch

from danka.models import varlen
from danka.models.lora import apply_lora, compute_adapters_in
from danka.models.tiny import tiny_causal_lm
from danka.models.value_head import ValueHead
from danka.rollout.base import finish_batch
from danka.step.forward import (
    ForwardSettings,
    critic_values,
    micro_batch_indices,
    policy_logprobs,
    trim,
)

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
RESPONSES = [[20, 21, 22, 2], [23], [24, 25], [26, 27, 28, 29, 30], [31, 2], [32, 33, 34]]


def batch():
    # 3 prompts x 2 samples, prompt lengths 3/3/2/2/5/5, response lengths 4/1/2/5/2/3
    return trim(finish_batch(PROMPTS, RESPONSES, 2, eos_ids=[2], pad_id=0, max_new_tokens=5))


def test_flat_layout_by_hand():
    mb = batch()
    flat = varlen.pack_flat(mb)
    lengths = [3 + 4, 3 + 1, 2 + 2, 2 + 5, 5 + 2, 5 + 3]  # 7 4 4 7 7 8 = 37 real tokens
    assert flat.tokens == 37 and flat.max_len == 8
    assert flat.cu_seqlens.tolist() == [0, 7, 11, 15, 22, 29, 37]
    # row 0: prompt 5 6 7, response 20 21 22 2; row 1 starts at 7: prompt 5 6 7, response 23
    assert flat.input_ids[0, :11].tolist() == [5, 6, 7, 20, 21, 22, 2, 5, 6, 7, 23]
    assert flat.position_ids[0, :11].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    # response token j of row 0 (prompt 3) is predicted at flat 2 + j; row 1's one at 7 + 2
    assert flat.predict_at[:5].tolist() == [2, 3, 4, 5, 9]
    assert int(flat.valid.sum()) == sum(len(r) for r in RESPONSES) == sum(lengths) - 20
    # each predicting position is followed by its target token in the flat row
    targets = flat.input_ids[0, flat.predict_at + 1]
    assert targets.tolist() == mb.response_ids[flat.valid].tolist()


def _forward(model, head, mb, fwd):
    model.zero_grad()
    head.zero_grad()
    mask = mb.response_mask.bool()
    lp, ent = policy_logprobs(model, mb, settings=fwd, with_entropy=True)
    values = critic_values(model, mb, value_head=head, settings=fwd)
    (lp[mask].sum() + 0.5 * ent[mask].sum() + values[mask].sum()).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    padding = (lp[~mask].abs().sum() + values[~mask].abs().sum()).item()
    return (lp[mask], ent[mask], values[mask], *grads), padding


def test_varlen_forward_equals_padded_forward():
    torch.manual_seed(0)
    model = tiny_causal_lm(arch="qwen2").float()
    head = ValueHead(model.config.hidden_size)
    mb = batch()
    padded, _ = _forward(model, head, mb, ForwardSettings(temperature=0.7, chunk_size=5))
    flat, at_padding = _forward(
        model, head, mb, ForwardSettings(temperature=0.7, chunk_size=5, varlen=True)
    )
    assert len(flat) == len(padded) > 3  # log-probs, entropies, values and weight gradients
    for got, want in zip(flat, padded):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert at_padding == 0.0  # padding positions hold exact zeros
    assert model.config._attn_implementation == "sdpa"  # switched back after the forward


def test_varlen_lora_in_bf16_matches_fp32_lora():
    """LoRA computed in the base dtype (no fp32 copy of the inputs) keeps fp32 masters and
    gives the fp32 path's log-probs within bf16 rounding."""
    torch.manual_seed(0)
    model = apply_lora(tiny_causal_lm(arch="qwen2"), r=4, alpha=8, dropout=0.0,
                       target_modules="all-linear")  # fmt: skip
    for name, p in model.named_parameters():  # non-zero B: the adapters change the output
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    model = model.to(torch.bfloat16)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    mb = batch()
    fwd = ForwardSettings(varlen=True, chunk_size=64)
    want, _ = policy_logprobs(model, mb, settings=fwd)
    assert compute_adapters_in(model, torch.bfloat16) > 0
    got, _ = policy_logprobs(model, mb, settings=fwd)
    mask = mb.response_mask.bool()
    assert (got[mask] - want[mask]).abs().max() < 0.05
    got[mask].sum().backward()
    lora = [p for n, p in model.named_parameters() if "lora_A" in n]
    assert all(p.dtype == torch.float32 and p.grad is not None for p in lora)
    assert any(float(p.grad.abs().sum()) > 0 for p in lora)


def test_token_budget_micro_batches():
    lengths = torch.tensor([300, 700, 100, 650, 200, 50])
    fwd = ForwardSettings(varlen=True, seq_tokens=500)
    # micro 2 x 500 tokens = budgets of 1000, first-fit decreasing: 700 -> a; 650 -> b
    # (1350 > 1000); 300 -> a (1000); 200 -> b (850); 100 -> b (950); 50 -> b (1000)
    groups = [g.tolist() for g in micro_batch_indices(lengths, 2, fwd)]
    assert groups == [[1, 0], [3, 4, 2, 5]]
    # a sequence longer than the budget gets a micro-batch of its own
    assert [g.tolist() for g in micro_batch_indices(lengths, 1, fwd)][0] == [1]
    # padded micro-batches: by sequences, longest first
    assert [g.tolist() for g in micro_batch_indices(lengths, 4)] == [[1, 3, 0, 4], [2, 5]]


def test_only_plain_causal_attention_runs_padding_free():
    model = tiny_causal_lm(arch="qwen2")
    decoder = model.get_decoder()
    assert varlen.supports(decoder)
    decoder.config.attn_logit_softcapping = 50.0  # Gemma 2: the kernel would drop the cap
    assert not varlen.supports(decoder)
    decoder.config.attn_logit_softcapping = None
    decoder.config.layer_types = ["sliding_attention"] * decoder.config.num_hidden_layers
    assert not varlen.supports(decoder)


def test_packed_update_takes_a_bool_or_null():
    import pytest

    from danka.config import load_config
    from danka.errors import UserError

    with pytest.raises(UserError, match="speed.packed_update") as err:
        load_config("examples/quickstart.yaml", ["speed.packed_update=maybe"])
    assert "bool or null" in str(err.value) + err.value.fix
    cfg, _ = load_config("examples/quickstart.yaml", ["speed.packed_update=false"])
    assert cfg.speed.packed_update is False and not varlen.wanted(False, "cuda")
    assert varlen.wanted(None, "cpu") is False and varlen.wanted(True, "cpu") is True
