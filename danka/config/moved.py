"""Keys that moved out of ``trainer`` into sections by concern, and the map that keeps the
old layout working.

The single-card tutorial's ``trainer`` keys (algorithm, num_epochs, batch_size, micro_batch_size,
max_length, max_new_tokens) stay where the tutorial writes them. Sampling, optimisation,
loss, checkpointing, evaluation and speed settings live in their own sections; a config
(or a ``key=value`` override) that still names one of them under ``trainer`` is read as
the new key, so older configs run unchanged. Naming both the old and the new key is
refused: the two could disagree.
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
}


def new_key(dotted: str) -> str:
    """The current name of a dotted key (``trainer.kl.coef`` -> ``loss.kl.coef``)."""
    for old, new in MOVED.items():
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old) :]
    return dotted


def relocate(data: dict) -> dict[str, str]:
    """Move every old key of ``data`` (parsed YAML with overrides applied) to its new
    place, in place. Returns new dotted key -> the old one the user wrote (for messages).
    Both the old and the new key set -> UserError."""
    renamed: dict[str, str] = {}
    trainer = data.get("trainer")
    if not isinstance(trainer, dict):
        return renamed
    for key in list(trainer):
        old = f"trainer.{key}"
        new = MOVED.get(old)
        if new is None:
            continue
        section, leaf = new.split(".", 1)
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            raise UserError(
                f"{section!r} must be a section (a mapping of keys)",
                where=f"config key {section}",
                fix=f"write {section}: as a section, e.g. {new}: ...",
            )
        if leaf in target:
            raise UserError(
                f"both {old} and {new} are set; {old} is the older name of {new}",
                where=f"config key {old}",
                fix=f"keep only {new}",
            )
        target[leaf] = trainer.pop(key)
        renamed[new] = old
    return renamed
