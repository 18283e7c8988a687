"""The one log-prob forward (trainer.forward.policy_logprobs) equals the model's own
logits: values, entropies and gradients, LoRA on the head too, and Gemma's soft-cap."""

import pytest
import torch
import torch.nn.functional as F

from danka.models.lora import apply_lora
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer
from danka.step.forward import ForwardSettings, policy_logprobs
from danka.types import RolloutBatch


def sequence_logprobs(model, ids, mask, start, *, temperature=1.0, chunk_size=1024,
                      compute_entropy=False):  # fmt: skip
    """policy_logprobs on the RolloutBatch of left-padded prompt + right-padded response."""
    batch = RolloutBatch(
        prompt_ids=ids[:, :start],
        prompt_mask=mask[:, :start],
        response_ids=ids[:, start:],
        response_mask=mask[:, start:].float(),
        group_index=torch.arange(ids.shape[0]),
        truncated=torch.zeros(ids.shape[0], dtype=torch.bool),
    )
    fwd = ForwardSettings(temperature=temperature, chunk_size=chunk_size)
    lp, ent = policy_logprobs(model, batch, settings=fwd, with_entropy=compute_entropy)
    keep = mask[:, start:].float()  # padded response columns are the caller's to mask
    return lp * keep, (ent * keep if ent is not None else None)


def _batch(tokenizer):
    # two left-padded prompts (P = 5) + right-padded responses (R = 4)
    pad = tokenizer.pad_token_id
    ids = torch.tensor(
        [[pad, pad, 10, 11, 12, 40, 41, 42, 2], [20, 21, 22, 23, 24, 50, 51, pad, pad]]
    )
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    return ids, mask, 5


def _naive_sequence(model, ids, mask, start, temperature):
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma 2: c tanh(z / c) (the llama forward does not apply it itself)
        logits = cap * torch.tanh(logits / cap)
    logp_all = F.log_softmax(logits[:, start - 1 : -1] / temperature, dim=-1)
    logp = logp_all.gather(-1, ids[:, start:, None]).squeeze(-1)
    keep = mask[:, start:].float()
    return logp * keep, -(logp_all.exp() * logp_all).sum(-1) * keep


@pytest.mark.parametrize("arch,lora_head", [("llama", False), ("qwen2", False), ("llama", True)])
def test_sequence_logprobs_matches_model_logits(arch, lora_head):
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, arch=arch, seed=3)
    targets = ["q_proj", "v_proj"] + (["lm_head"] if lora_head else [])
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=targets)
    # B starts at 0: make the adapters non-trivial so the LoRA path is really exercised
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    ids, mask, start = _batch(tok)
    lora_params = [p for n, p in model.named_parameters() if p.requires_grad]

    lp, ent = sequence_logprobs(
        model, ids, mask, start, temperature=0.8, chunk_size=3, compute_entropy=True
    )
    assert lp.shape == ent.shape == (2, 4)
    (lp.sum() + 0.5 * ent.sum()).backward()
    grads = [p.grad.clone() for p in lora_params]
    model.zero_grad(set_to_none=True)

    lp_ref, ent_ref = _naive_sequence(model, ids, mask, start, 0.8)
    (lp_ref.sum() + 0.5 * ent_ref.sum()).backward()
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
    for g, p in zip(grads, lora_params):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=0)


def test_sequence_logprobs_full_finetune_head_grad():
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, seed=4)
    ids, mask, start = _batch(tok)
    lp, ent = sequence_logprobs(model, ids, mask, start, chunk_size=5)
    assert ent is None
    lp.sum().backward()
    g_head = model.lm_head.weight.grad.clone()
    g_embed = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    _naive_sequence(model, ids, mask, start, 1.0)[0].sum().backward()
    torch.testing.assert_close(g_head, model.lm_head.weight.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(g_embed, model.model.embed_tokens.weight.grad, atol=1e-5, rtol=0)


def test_final_logit_softcapping_is_honoured():
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, seed=5)
    model.config.final_logit_softcapping = 0.5  # tight: clearly changes the log-probs
    ids, mask, start = _batch(tok)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, ids, mask, start)
        ref, _ = _naive_sequence(model, ids, mask, start, 1.0)
        model.config.final_logit_softcapping = None
        plain, _ = _naive_sequence(model, ids, mask, start, 1.0)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)
    assert (lp - plain).abs().max() > 1e-3
