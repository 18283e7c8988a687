"""Packed update forward == padded forward (log-probs, entropy, values, gradients)."""

from __future__ import annotations

import torch

from danka.models.tiny import tiny_causal_lm
from danka.models.value_head import ValueHead
from danka.step.forward import (
    ForwardSettings,
    critic_values,
    effective_token_ratio,
    policy_logprobs,
)
from danka.step.packing import assign_rows, pack
from tests.models.test_varlen import batch  # 3 prompts x 2 samples, ragged


def test_assign_rows_first_fit_decreasing():
    # lengths 7, 3, 4, 7, 7, 8 into rows of 10: 8 -> r0; 7 -> r1; 7 -> r2; 7 -> r3; 4 -> r4
    # (no row has room: 8+4, 7+4 > 10); 3 -> r1 (7 + 3 = 10)
    assert assign_rows([7, 3, 4, 7, 7, 8], 10) == [[5], [0, 1], [3], [4], [2]]


def test_pack_layout_and_ratio():
    mb = batch()
    packed = pack(mb, max_len=32, pad_id=0)
    # total real tokens: prompts 3+3+2+2+5+5 = 20, responses 4+1+2+5+2+3 = 17 -> 37 > 32
    assert packed.real_tokens == 37 and packed.input_ids.shape[0] == 2
    assert int((packed.position_ids == 0).sum()) >= 6  # every sequence restarts at 0
    # padded layout: 6 rows x (5 prompt + 5 response) = 60 computed for 37 real
    assert abs(effective_token_ratio(mb, micro_size=6) - 37 / 60) < 1e-9
    assert abs(effective_token_ratio(mb, 6, pack_len=32) - 37 / packed.computed_tokens) < 1e-9


def test_packed_forward_equals_padded_forward():
    torch.manual_seed(0)
    model = tiny_causal_lm(arch="qwen2").float()
    head = ValueHead(model.config.hidden_size)
    mb = batch()
    mask = mb.response_mask.bool()
    results = {}
    for pack_len in (None, 16, 64):
        model.zero_grad()
        fwd = ForwardSettings(temperature=0.7, chunk_size=5, pack_len=pack_len)
        lp, ent = policy_logprobs(model, mb, settings=fwd, with_entropy=True)
        values = critic_values(model, mb, value_head=head, settings=fwd)
        (lp[mask].sum() + values[mask].sum()).backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        results[pack_len] = (lp[mask], ent[mask], values[mask], grad)
    for pack_len in (16, 64):
        for got, want in zip(results[pack_len], results[None]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
