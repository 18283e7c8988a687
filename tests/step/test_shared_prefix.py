"""The shared-prefix training forward (danka/step/shared_prefix.py): the same log-probs
and LoRA gradients as the plain forward, and the cases where it must stand aside."""

from __future__ import annotations

import pytest
import torch

from danka.models.tiny import tiny_causal_lm
from danka.step import shared_prefix
from danka.step.forward import ForwardSettings, critic_values, decoder_of, policy_logprobs
from danka.types import RolloutBatch

SYSTEM = list(range(10, 20))  # 10 tokens every prompt starts with (>= MIN_PREFIX)
PROMPTS = [SYSTEM + [30, 31, 32], SYSTEM + [40], SYSTEM + [50, 51], SYSTEM + [30, 31, 33]]
RESPONSES = [[5, 6, 7], [8], [9, 10], [11, 12, 13]]


def left_right(rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, cols], mask[i, cols] = torch.tensor(r), 1.0
    return ids, mask


def batch(prompts=PROMPTS, responses=RESPONSES) -> RolloutBatch:
    p_ids, p_mask = left_right(prompts, left=True)
    r_ids, r_mask = left_right(responses, left=False)
    n = len(prompts)
    return RolloutBatch(
        p_ids, p_mask.long(), r_ids, r_mask, torch.arange(n), torch.zeros(n, dtype=torch.bool)
    )


def lora_model(dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_causal_lm(),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj", "v_proj"]),
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.3)
    return model.train()


def logprobs_and_grads(model, mb, shared: bool):
    model.zero_grad()
    fwd = ForwardSettings(temperature=1.0, chunk_size=64, shared_prefix=shared)
    lp, _ = policy_logprobs(model, mb, settings=fwd)
    (lp * mb.response_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach() * mb.response_mask, grads


def test_unpadded_prompts_by_hand():
    assert shared_prefix.unpadded_prompts(batch()) == PROMPTS


def test_same_logprobs_and_lora_grads_as_the_plain_forward():
    model, mb = lora_model(), batch()
    assert shared_prefix.response_hidden(model, decoder_of(model), mb, torch.device("cpu"))[
        0
    ].shape == (3, 64)  # taken: (R, H) per row
    lp_s, g_s = logprobs_and_grads(model, mb, True)
    lp_p, g_p = logprobs_and_grads(model, mb, False)
    torch.testing.assert_close(lp_s, lp_p, atol=1e-5, rtol=0)
    assert g_s.keys() == g_p.keys() and len(g_s) == 8  # 2 layers x (q, v) x (A, B)
    for name in g_p:
        torch.testing.assert_close(g_s[name], g_p[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "prompts, responses",
    [
        # GRPO groups without a common prefix (p = 0): prompts A, B, A, B, A; A's rest runs
        # once for rows 0, 2, 4 and B's once for rows 1, 3
        ([[21, 22, 23], [31, 32], [21, 22, 23], [31, 32], [21, 22, 23]],
         [[5, 6], [7, 8, 9], [10], [11, 12], [13, 14, 15]]),
        # one token per response (step 3 does not run): a group and a common prefix
        ([SYSTEM + [30], SYSTEM + [30], SYSTEM + [40, 41]], [[5], [6], [7]]),
    ],
)  # fmt: skip
def test_groups_share_their_prompt(prompts, responses):
    model, mb = lora_model(), batch(prompts, responses)
    assert (
        shared_prefix.response_hidden(model, decoder_of(model), mb, torch.device("cpu")) is not None
    )
    lp_s, g_s = logprobs_and_grads(model, mb, True)
    lp_p, g_p = logprobs_and_grads(model, mb, False)
    torch.testing.assert_close(lp_s, lp_p, atol=1e-5, rtol=0)
    for name in g_p:
        torch.testing.assert_close(g_s[name], g_p[name], atol=1e-5, rtol=1e-4)


def test_critic_values_through_the_shared_prefix():
    model, mb = tiny_causal_lm().eval(), batch()
    head = torch.nn.Linear(64, 1)
    shared = critic_values(model, mb, value_head=head)
    plain = critic_values(model, mb, value_head=head, settings=ForwardSettings(shared_prefix=False))
    torch.testing.assert_close(shared * mb.response_mask, plain * mb.response_mask)


@pytest.mark.parametrize("case", ["checkpointing", "dropout", "short prefix", "one row"])
def test_stands_aside(case):
    model, mb = lora_model(dropout=0.1 if case == "dropout" else 0.0), batch()
    if case == "checkpointing":
        model.gradient_checkpointing_enable()
    if case == "short prefix":  # 10 shared tokens, MIN_PREFIX 8 -> cut the shared part to 4
        mb = RolloutBatch(
            mb.prompt_ids.clone(), mb.prompt_mask, mb.response_ids, mb.response_mask,
            mb.group_index, mb.truncated,
        )  # fmt: skip
        mb.prompt_ids[1, -7] = 99  # row 1 differs from column 4 of SYSTEM on
    if case == "one row":
        mb = mb.select(torch.tensor([0]))
    assert shared_prefix.response_hidden(model, decoder_of(model), mb, torch.device("cpu")) is None
    # and the dropout case is taken in eval mode (no dropout active there)
    if case == "dropout":
        model.eval()
        assert (
            shared_prefix.response_hidden(model, decoder_of(model), mb, torch.device("cpu"))
            is not None
        )


def test_stands_aside_under_torch_distributed(tmp_path):
    # torchrun runs (FSDP2 frees the gathered weights between the two forwards of a step:
    # tests/trainer/test_distributed.py failed with it); a 1-process gloo group stands in
    import torch.distributed as dist

    model = lora_model()
    assert shared_prefix.applies(model, decoder_of(model), torch.device("cpu"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        assert not shared_prefix.applies(model, decoder_of(model), torch.device("cpu"))
    finally:
        dist.destroy_process_group()
