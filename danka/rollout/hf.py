"""HF Transformers ``generate`` backend: pure PyTorch, works on CPU and on any GPU.

Slow for small models (Python and kernel-launch bound), but it runs every architecture
transformers supports, which makes it the reference the fast engine is checked against.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch
from transformers import GenerationConfig

from danka.data.template import left_pad
from danka.models.prefix import usable as prefix_usable
from danka.models.unwrap import unwrap_causal_lm
from danka.rollout import hf_prefix
from danka.rollout.base import RolloutEngine, Sampled, SamplingParams, halve_groups


class HFGenerateEngine(RolloutEngine):
    name = "hf"

    def __init__(self, batch_size: int = 0, shared_prefix: bool = True):
        # batch_size (rollout.generation_batch_size): sequences per generate call, 0 = all
        # at once; the prompts are chunked so a call holds batch_size // n of them (>= 1).
        self.batch_size = max(0, int(batch_size))
        self.shared_prefix = shared_prefix  # rollout.shared_prefix (see hf_prefix)

    def halve_batch(self, n: int, total: int) -> tuple[int, int] | None:
        current = min(self.batch_size or total, total)
        smaller = halve_groups(current, n)
        if smaller is None:
            return None
        self.batch_size = smaller
        return current, smaller

    def sample(self, model, prompt_ids, params, eos_ids, pad_id, generator) -> Sampled:
        device = next(model.parameters()).device
        chunk = max(1, self.batch_size // params.n) if self.batch_size else len(prompt_ids)
        responses: list[list[int]] = []
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(prompt_ids), chunk):
                part = prompt_ids[start : start + chunk]
                responses.extend(self._generate_chunk(model, part, params, eos_ids, pad_id, device))
        finally:
            model.train(was_training)
        return responses, None

    def _generate_chunk(self, model, prompts, params, eos_ids, pad_id, device) -> list[list[int]]:
        kw = {}
        if self.shared_prefix and prefix_usable(model):  # shared tokens once (hf_prefix)
            ids, mask, kw = hf_prefix.prefill(model, prompts, params.n, pad_id, device)
        else:  # greedy search refuses num_return_sequences > 1: repeat the prompts instead
            ids, mask = left_pad(prompts, pad_id)
            ids, mask = ids.repeat_interleave(params.n, 0), mask.repeat_interleave(params.n, 0)
        plen = ids.shape[1]
        # the rows are already repeated per sample (row i * n + j, HF's own order)
        gen_cfg = sampling_config(replace(params, n=1), eos_ids, pad_id)
        with _clean_generation_config(model):
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=gen_cfg,
                **kw,
            )
        return [row[plen:].tolist() for row in out.cpu()]


def sampling_config(params: SamplingParams, eos_ids: list[int], pad_id: int) -> GenerationConfig:
    """Exactly danka's sampling: temperature, top-p, top-k (0 = off), nothing else.

    Every processor HF would otherwise add (repetition penalty, min-p, typical-p, n-gram
    bans, suppressed tokens, ...) is set to its neutral value, so a model's own
    ``generation_config.json`` (e.g. Qwen2-Instruct's repetition_penalty 1.05, top_k 20)
    cannot change the distribution the policy is trained on.
    """
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        min_length=0,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        do_sample=not params.greedy,
        num_return_sequences=1 if params.greedy else params.n,
        num_beams=1,
        temperature=1.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=0 if params.greedy else params.top_k,  # 0 = off (HF's default would be 50)
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        renormalize_logits=False,
        use_cache=True,
    )


@contextmanager
def _clean_generation_config(model: torch.nn.Module):
    """Hide the model's ``generation_config`` during ``generate``: HF fills every field our
    config leaves ``None`` (min_p, bad_words_ids, suppress_tokens, ...) from it."""
    root = unwrap_causal_lm(model)
    saved = getattr(root, "generation_config", None)
    if saved is None:
        yield
        return
    clean = GenerationConfig(
        bos_token_id=saved.bos_token_id,
        eos_token_id=saved.eos_token_id,
        pad_token_id=saved.pad_token_id,
    )
    # the HF model and any wrapper (peft) that holds its own reference
    owners = [
        m for m in {id(m): m for m in (model, root)}.values() if "generation_config" in vars(m)
    ]
    old = [vars(m)["generation_config"] for m in owners]
    for m in owners:
        m.generation_config = clean
    try:
        yield
    finally:
        for m, cfg in zip(owners, old):
            m.generation_config = cfg
