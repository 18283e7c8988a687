"""Keys that moved into sections by concern, the retired ``backend`` switches, and the map
that keeps the old layout working.

The single-card tutorial's ``trainer`` keys (algorithm, num_epochs, batch_size,
micro_batch_size, max_length, max_new_tokens) stay where the tutorial writes them.
Sampling, optimisation, loss, checkpointing, evaluation and speed settings live in their
own sections, the multi-turn settings in ``agent`` (once under ``rollout``), packing with
the update's speed settings (once under ``data``); a config (or a ``key=value`` override)
that still names a key in its old place is read as the new key, so older configs run
unchanged. Naming both the old and the new key is refused: the two could disagree.

Two switches of the tutorial's ``backend`` block are retired (:func:`retire`):
``backend.hf_transformers.enable_hf_transformers: true`` is ``rollout.engine: hf``, and
``backend.fsdp.enable_fsdp: false`` is what danka does anyway (``true`` is refused); each
leaves one note, logged at start-up.
"""

from __future__ import annotations

from danka.errors import UserError

MOVED: dict[str, str] = {
    # sampling
    "trainer.temperature": "sampling.temperature",
    "trainer.top_p": "sampling.top_p",
    "trainer.top_k": "sampling.top_k",
    "trainer.dynamic_sampling": "sampling.dynamic_sampling",
    "trainer.max_sampling_rounds": "sampling.max_sampling_rounds",
    # optimisation
    "trainer.lr": "optim.lr",
    "trainer.critic_lr": "optim.critic_lr",
    "trainer.weight_decay": "optim.weight_decay",
    "trainer.warmup_steps": "optim.warmup_steps",
    "trainer.lr_scheduler": "optim.lr_scheduler",
    "trainer.max_grad_norm": "optim.max_grad_norm",
    # the loss
    "trainer.policy_loss": "loss.policy_loss",
    "trainer.loss_agg_mode": "loss.agg_mode",
    "trainer.clip_ratio_low": "loss.clip_ratio_low",
    "trainer.clip_ratio_high": "loss.clip_ratio_high",
    "trainer.dual_clip_c": "loss.dual_clip_c",
    "trainer.value_clip": "loss.value_clip",
    "trainer.vf_coef": "loss.vf_coef",
    "trainer.entropy_coef": "loss.entropy_coef",
    "trainer.mask_truncated": "loss.mask_truncated",
    "trainer.kl": "loss.kl",
    # checkpointing
    "trainer.save_steps": "checkpoint.save_steps",
    "trainer.save_minutes": "checkpoint.save_minutes",
    "trainer.keep_last": "checkpoint.keep_last",
    # evaluation
    "trainer.eval_steps": "eval.every_steps",
    "trainer.eval_max_new_tokens": "eval.max_new_tokens",
    # speed and memory
    "trainer.logprob_chunk_size": "speed.logprob_chunk_size",
    "trainer.fused_logprob_head": "speed.fused_logprob_head",
    "trainer.shared_prefix_forward": "speed.shared_prefix_forward",
    "trainer.preflight": "speed.preflight",
    "trainer.auto_micro_batch": "speed.auto_micro_batch",
    "trainer.tf32": "speed.tf32",
    "trainer.compile": "speed.compile",
    # the update's packing
    "data.packing": "speed.packing",
    "data.max_packed_length": "speed.max_packed_length",
    # multi-turn rollouts
    **{
        f"rollout.{key}": f"agent.{key}"
        for key in (
            "tools",
            "environment",
            "max_turns",
            "max_tool_calls",
            "max_total_tokens",
            "tool_timeout_s",
            "tool_sandbox",
            "tool_max_chars",
            "tool_prompt",
            "tool_demo",
            "kv_reuse",
        )
    },
}


def new_key(dotted: str) -> str:
    """The current name of a dotted key (``trainer.kl.coef`` -> ``loss.kl.coef``)."""
    for old, new in MOVED.items():
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old) :]
    return dotted


def relocate(data: dict, where=lambda key: f"config key {key}") -> dict[str, str]:
    """Move every old key of ``data`` (parsed YAML) to its new place, in place. Returns
    new dotted key -> the old one the user wrote (for messages). Both the old and the new
    key set -> UserError at ``where(old key)`` (the file's line)."""
    renamed: dict[str, str] = {}
    for old, new in MOVED.items():
        section, key = old.split(".", 1)
        holder = data.get(section)
        if not isinstance(holder, dict) or key not in holder:
            continue
        target_section, leaf = new.split(".", 1)
        target = data.setdefault(target_section, {})
        if not isinstance(target, dict):
            raise UserError(
                f"{target_section!r} must be a section (a mapping of keys)",
                where=where(target_section),
                fix=f"write {target_section}: as a section, e.g. {new}: ...",
            )
        if leaf in target:
            raise UserError(
                f"both {old} and {new} are set; {old} is the older name of {new}",
                where=where(old),
                fix=f"keep only {new}",
            )
        target[leaf] = holder.pop(key)
        renamed[new] = old
    return renamed


HF_SWITCH = "backend.hf_transformers.enable_hf_transformers"
FSDP_SWITCH = "backend.fsdp.enable_fsdp"


def _pop(data: dict, dotted: str) -> tuple[bool, object]:
    """Remove ``dotted`` from ``data``: (whether it was there, its value); an emptied
    section goes too."""
    section, sub, key = dotted.split(".")
    outer = data.get(section)
    holder = outer.get(sub) if isinstance(outer, dict) else None
    if not isinstance(holder, dict) or key not in holder:
        return False, None
    value = holder.pop(key)
    if not holder:
        del data[section][sub]
    return True, value


def retire(data: dict, where=lambda key: f"config key {key}") -> list[str]:
    """Read the retired ``backend`` switches of ``data`` (file and overrides applied) as
    what they mean now, in place (module docstring); returns one note per switch found.
    ``where(key)``: where a key was written, for the refusals."""
    notes = []
    found, fsdp = _pop(data, FSDP_SWITCH)
    if found and fsdp is True:
        raise UserError(
            "FSDP is not used on one card",
            where=where(FSDP_SWITCH),
            fix="set backend.fsdp.enable_fsdp: false; for several GPUs run "
            "torchrun --nproc-per-node N -m danka train CONFIG (docs/several_gpus.md)",
        )
    if found:
        notes.append(
            f"{FSDP_SWITCH}: {str(fsdp).lower()} is not a setting any more (one process, no "
            "FSDP, is what danka does; several GPUs: --nproc N); ignored"
        )
    found, hf = _pop(data, HF_SWITCH)
    if found and hf is True:
        rollout = data.setdefault("rollout", {})
        if rollout.get("engine", "auto") not in ("auto", "hf"):
            raise UserError(
                "true asks for the HF engine, which conflicts with rollout.engine: "
                f"{rollout['engine']}",
                where=where(HF_SWITCH),
                fix="set only one of them",
            )
        rollout["engine"] = "hf"
        notes.append(f"{HF_SWITCH}: true is read as rollout.engine: hf (the HF generate rollout)")
    elif found:
        notes.append(
            f"{HF_SWITCH}: {str(hf).lower()} is not a setting any more "
            "(rollout.engine decides); ignored"
        )
    return notes
