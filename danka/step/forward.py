"""Forward passes over a RolloutBatch: log-probs (policy, reference) and values (critic).

Sequences are laid out as ``[left-padded prompt | right-padded response]``, so every
response starts at column P. Position ids come from the attention mask, as in generation,
so training and sampling see the same positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from danka.data.template import mask_positions
from danka.models import body_graphs, varlen
from danka.models.logprobs import chunked_logprobs_entropy
from danka.step import shared_prefix
from danka.step.packing import assign_rows, pack
from danka.types import RolloutBatch


@dataclass(frozen=True)
class ForwardSettings:
    """How the training forward runs (the same for old, reference and trained log-probs)."""

    temperature: float = 1.0  # the sampling temperature (0 = greedy: 1 here)
    chunk_size: int = 1024  # tokens per chunk of the log-prob head
    pack_len: int | None = None  # speed.packing: tokens per packed row, else None
    shared_prefix: bool = True  # a prompt prefix the rows share runs once (shared_prefix.py)
    fused_head: bool = True  # CUDA: the head's per-chunk elementwise work compiled
    # speed.packed_update: sequences end to end without padding (danka.models.varlen), a
    # micro-batch of ``micro`` holding up to micro x seq_tokens real tokens
    varlen: bool = False
    seq_tokens: int = 0  # the planned tokens of one sequence (prompt + response)
    cuda_graphs: bool = False  # speed.cuda_graphs: padding-free bodies replayed (body_graphs)


def micro_batch_indices(
    lengths: torch.Tensor, micro_size: int, settings: ForwardSettings | None = None
) -> Iterator[torch.Tensor]:
    """Split rows into micro-batches, in a fixed order: of ``micro_size`` rows of similar
    length (less padding); padding-free (``settings.varlen``), of as many rows as fit in
    ``micro_size x settings.seq_tokens`` real tokens (first-fit decreasing: the memory plan
    priced that many tokens, and a micro-batch of short answers holds more of them)."""
    if settings is not None and settings.varlen and settings.seq_tokens:
        budget = micro_size * settings.seq_tokens
        for rows in assign_rows([int(n) for n in lengths.tolist()], budget):
            yield torch.tensor(rows, dtype=torch.long)
        return
    order = torch.argsort(lengths, descending=True, stable=True)
    for start in range(0, len(order), micro_size):
        yield order[start : start + micro_size]


def trim(batch):
    """Drop columns that are padding in every row (prompt on the left, response on the
    right) from a dataclass of (B, P) prompt and (B, R) response tensors (a RolloutBatch
    or a TrainBatch)."""
    p_keep = int(batch.prompt_mask.sum(1).max())
    r_keep = max(1, int(batch.response_mask.sum(1).max()))
    out = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if f.name in ("prompt_ids", "prompt_mask"):
            value = value[:, value.shape[1] - p_keep :]
        elif isinstance(value, torch.Tensor) and value.dim() == 2:
            value = value[:, :r_keep]
        out[f.name] = value
    return dataclasses.replace(batch, **out)


def effective_token_ratio(
    batch: RolloutBatch, micro_size: int, pack_len: int | None = None, varlen: bool = False
) -> float:
    """Real tokens / tokens computed: micro-batches length-grouped and trimmed, or packed
    into rows of ``pack_len`` tokens; padding-free (``varlen``): 1."""
    if varlen:
        return 1.0
    lengths = batch.prompt_mask.sum(1) + batch.response_mask.sum(1)
    real, computed = 0.0, 0.0
    for idx in micro_batch_indices(lengths, micro_size):
        mb = trim(batch.select(idx))
        real += float(mb.prompt_mask.sum() + mb.response_mask.sum())
        if pack_len:
            computed += pack(mb, pack_len, pad_id=0).computed_tokens
        else:
            computed += mb.size * (mb.prompt_ids.shape[1] + mb.response_ids.shape[1])
    return real / max(computed, 1.0)


def _inputs(mb: RolloutBatch, device: torch.device):
    ids = torch.cat([mb.prompt_ids, mb.response_ids], dim=1).to(device)
    mask = torch.cat([mb.prompt_mask, mb.response_mask.long()], dim=1).to(device)
    return ids, mask, mask_positions(mask)


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body (no LM head) of a causal LM, through a PeftModel too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def _config_of(model: torch.nn.Module):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "config", None)


def lm_head_of(model: torch.nn.Module) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()


def response_hidden(
    model: torch.nn.Module,
    mb: RolloutBatch,
    pack_len: int | None = None,
    shared_prefix_forward: bool = True,
) -> torch.Tensor:
    """Hidden states at the positions that predict response tokens: (b, R, H).

    With ``pack_len`` the sequences are packed into rows without padding (packing.py);
    without it, a prompt prefix all rows share runs once where shared_prefix.py applies;
    the result is the same up to floating-point rounding either way.
    """
    device = next(model.parameters()).device
    if pack_len:
        packed = pack(mb, pack_len, pad_id=0)  # the tail is its own ignored sequence: any id
        out = decoder_of(model)(
            input_ids=packed.input_ids.to(device),
            attention_mask=None,  # restarts in position_ids give a block-diagonal mask
            position_ids=packed.position_ids.to(device),
            use_cache=False,
        )
        return out.last_hidden_state[packed.row.to(device), packed.col.to(device)]
    decoder = decoder_of(model)
    shared = None
    if shared_prefix_forward:
        shared = shared_prefix.response_hidden(model, decoder, mb, device)
    if shared is not None:  # the prompt prefix all rows share ran once (shared_prefix.py)
        return shared
    ids, mask, pos = _inputs(mb, device)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    p, r = mb.prompt_ids.shape[1], mb.response_ids.shape[1]
    # position t predicts token t + 1: response token j is predicted at column p - 1 + j
    return out.last_hidden_state[:, p - 1 : p - 1 + r]


def policy_logprobs(
    model: torch.nn.Module,
    mb: RolloutBatch,
    *,
    settings: ForwardSettings = ForwardSettings(),
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) under ``model`` (b, R), and the entropy (b, R) if asked.

    The LM head runs chunk by chunk from hidden states, never materialising the full
    (b, R, V) fp32 logits. Gemma-style final logit soft-capping
    (``config.final_logit_softcapping``: z -> c tanh(z / c)) is applied when the model has it.
    This is danka's one log-prob forward (policy, reference, old log-probs).
    """
    s = settings
    flat = _flat(model, mb, s)
    if flat is not None:  # padding-free: the head runs over the real response tokens only
        hidden = _flat_hidden(model, flat)
        targets = mb.response_ids[flat.valid].to(hidden.device)
    else:
        hidden = response_hidden(model, mb, s.pack_len, s.shared_prefix)
        b, r, h = hidden.shape
        targets = mb.response_ids.to(hidden.device).reshape(-1)
        hidden = hidden.reshape(b * r, h)
    head = lm_head_of(model)
    logprobs, entropy = chunked_logprobs_entropy(
        hidden,
        head,
        targets,
        temperature=s.temperature,
        chunk_size=s.chunk_size,
        compute_entropy=with_entropy,
        softcap=getattr(_config_of(model), "final_logit_softcapping", None),
        fused=s.fused_head,
    )
    if flat is not None:
        valid = flat.valid.to(hidden.device)
        return _scatter(logprobs, valid), (
            _scatter(entropy, valid) if entropy is not None else None
        )
    return logprobs.view(b, r), (entropy.view(b, r) if entropy is not None else None)


def _flat(model: torch.nn.Module, mb: RolloutBatch, s: ForwardSettings) -> varlen.Flat | None:
    """The micro-batch laid end to end when this forward runs padding-free, else None."""
    if not s.varlen or not varlen.supports(decoder_of(model)):
        return None
    return varlen.pack_flat(mb)


def _flat_hidden(model: torch.nn.Module, flat: varlen.Flat) -> torch.Tensor:
    """Hidden states (N, H) at the positions predicting the real response tokens (through
    the open CUDA-graph session's replay where it takes the micro-batch)."""
    device = next(model.parameters()).device
    decoder = decoder_of(model)
    graphs = body_graphs.current()
    hidden = graphs.hidden(decoder, flat) if graphs is not None else None
    if hidden is None:
        hidden = varlen.varlen_forward(decoder, flat, device)
    return hidden[flat.predict_at.to(device, non_blocking=True)]


def _scatter(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N,) values of the real response tokens -> (b, R), 0 at padding (differentiable)."""
    return torch.zeros(valid.shape, dtype=values.dtype, device=values.device).masked_scatter(
        valid, values
    )


def critic_values(
    model: torch.nn.Module,
    mb: RolloutBatch,
    *,
    value_head: torch.nn.Module,
    settings: ForwardSettings = ForwardSettings(),
):
    """V(s_t) for each response position t: (b, R), fp32 (0 at padding when padding-free)."""
    flat = _flat(model, mb, settings)
    if flat is not None:
        values = value_head(_flat_hidden(model, flat)).squeeze(-1).float()
        return _scatter(values, flat.valid.to(values.device))
    hidden = response_hidden(model, mb, settings.pack_len, settings.shared_prefix)
    return value_head(hidden).squeeze(-1).float()


@torch.no_grad()
def batched(fn, model, batch: RolloutBatch, micro_size: int, **kwargs) -> torch.Tensor:
    """Run ``fn`` (no grad, eval mode: no dropout) over micro-batches and scatter results
    back to (B, R)."""
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
    lengths = batch.prompt_mask.sum(1) + batch.response_mask.sum(1)
    was_training = model.training
    model.eval()
    try:
        with graph_session(kwargs.get("settings"), micro_size, model):
            _batched(fn, model, batch, micro_size, lengths, out, **kwargs)
    finally:
        model.train(was_training)
    return out * batch.response_mask


def _batched(fn, model, batch, micro_size: int, lengths, out, **kwargs) -> None:
    for idx in micro_batch_indices(lengths, micro_size, kwargs.get("settings")):
        mb = trim(batch.select(idx))
        value = fn(model, mb, **kwargs)
        value = value[0] if isinstance(value, tuple) else value
        out[idx, : value.shape[1]] = value.float().cpu()


def graph_session(settings: ForwardSettings | None, micro_size: int, model):
    """The phase's CUDA-graph session (``speed.cuda_graphs``, padding-free forwards:
    danka.models.body_graphs) at the micro-batch budget, or a context that changes
    nothing."""
    if settings is None or not (settings.cuda_graphs and settings.varlen):
        return nullcontext()
    device = next(model.parameters()).device
    return body_graphs.session(micro_size * settings.seq_tokens, settings.seq_tokens, device)
