"""HF Transformers ``generate`` backend: pure PyTorch, works on CPU and on any GPU.

Slow for small models (Python and kernel-launch bound), but it runs every architecture
transformers supports, which makes it the reference the fast engine is checked against.
"""

from __future__ import annotations

import torch

from danka.rollout.base import SamplingParams, finish_batch
from danka.types import RolloutBatch


class HFGenerateEngine:
    name = "hf"

    def __init__(self, batch_size: int = 0):
        # batch_size 0 = all sequences at once; otherwise generate in chunks of prompts.
        self.batch_size = batch_size

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        *,
        eos_ids: list[int],
        pad_id: int,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        device = next(model.parameters()).device
        chunk = self.batch_size or len(prompt_ids)
        responses: list[list[int]] = []
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(prompt_ids), chunk):
                part = prompt_ids[start : start + chunk]
                responses.extend(self._generate_chunk(model, part, params, eos_ids, pad_id, device))
        finally:
            model.train(was_training)
        return finish_batch(
            prompt_ids,
            responses,
            params.n,
            eos_ids=eos_ids,
            pad_id=pad_id,
            max_new_tokens=params.max_new_tokens,
        )

    @staticmethod
    def _generate_chunk(model, prompts, params, eos_ids, pad_id, device) -> list[list[int]]:
        plen = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), plen), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, plen - len(p) :] = torch.tensor(p)
            mask[i, plen - len(p) :] = 1
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(eos_ids),
            pad_token_id=pad_id,
            num_return_sequences=params.n,
        )
        if params.greedy:
            # greedy search refuses num_return_sequences > 1: repeat the prompts instead
            ids, mask = ids.repeat_interleave(params.n, 0), mask.repeat_interleave(params.n, 0)
            kwargs.update(
                do_sample=False, temperature=None, top_p=None, top_k=None, num_return_sequences=1
            )
        else:
            kwargs.update(
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else None,
            )
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
        return [row[plen:].tolist() for row in out.cpu()]
