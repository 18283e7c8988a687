"""What the memory plan reads of a config, as one frozen record.

``PlanInput.of(cfg)`` takes the settings once (the advantage estimator's needs resolved
through the registry); a variant the planner prices is ``inp.with_(micro_batch_size=4)``,
never a copy of the config. Each field names the config key it comes from, so a fix the
plan suggests reads as that key (``trainer.micro_batch_size=4``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from danka.schema.sections import DankaConfig


def _key(dotted: str, default: Any = dataclasses.MISSING):
    return field(default=default, metadata={"key": dotted})


@dataclass(frozen=True, kw_only=True)
class PlanInput:
    model: str = _key("model.actor_model_name_or_path")
    torch_dtype: str = _key("model.torch_dtype")
    load_in_4bit: bool = _key("model.load_in_4bit")
    load_in_8bit: bool = _key("model.load_in_8bit")
    use_gradient_checkpointing: bool = _key("model.use_gradient_checkpointing")
    separate_critic: bool = _key("model.critic_model_name_or_path")  # its own model
    batch_size: int = _key("trainer.batch_size")
    samples_per_prompt: int = _key("trainer.samples_per_prompt")
    mini_batch_size: int | None = _key("trainer.mini_batch_size")
    micro_batch_size: int | str = _key("trainer.micro_batch_size")
    max_length: int = _key("trainer.max_length")
    max_new_tokens: int = _key("trainer.max_new_tokens")
    max_prompt_length: int | None = _key("data.max_prompt_length")
    # the longest training prompt as encoded (None: not known, the config's bound is priced)
    data_prompt_tokens: int | None = _key("data.train_dataset", None)
    needs_critic: bool = _key("trainer.advantage_estimator")  # the estimator's metadata
    reference: bool = _key("loss.kl.coef")  # a KL term: coef > 0
    enable_lora: bool = _key("lora.enable_lora")
    target_modules: Any = _key("lora.target_modules")
    lora_r: int = _key("lora.lora_r")
    engine: str = _key("rollout.engine")
    generation_batch_size: int | str = _key("rollout.generation_batch_size")
    lora_compute: str = _key("rollout.lora_compute")
    keep_cache: bool | None = _key("rollout.keep_cache")
    tools: bool = _key("agent.tools")  # a tool or environment rollout (not modelled)
    logprob_chunk_size: int | str = _key("speed.logprob_chunk_size")
    fused_logprob_head: bool = _key("speed.fused_logprob_head")
    # null plans a GPU run: padding-free, LoRA computed in the model's dtype
    packed_update: bool | None = _key("speed.packed_update")
    cuda_graphs: bool = _key("speed.cuda_graphs")

    @classmethod
    def of(cls, cfg: DankaConfig, data_prompt_tokens: int | None = None) -> PlanInput:
        """The plan's input of ``cfg``; ``data_prompt_tokens``: the longest training prompt
        as encoded, when the data has been read (the plan then prices sequences of that
        prompt plus ``max_new_tokens``, not of ``max_length``)."""
        t, m, r, lo = cfg.trainer, cfg.model, cfg.rollout, cfg.lora
        meta = estimator_meta(cfg)
        n = t.samples_per_prompt
        return cls(
            model=m.actor_model_name_or_path,
            torch_dtype=m.torch_dtype,
            load_in_4bit=bool(m.load_in_4bit),
            load_in_8bit=bool(m.load_in_8bit),
            use_gradient_checkpointing=bool(m.use_gradient_checkpointing),
            separate_critic=m.critic_model_name_or_path
            not in (None, "", m.actor_model_name_or_path),
            batch_size=t.batch_size,
            samples_per_prompt=n if n is not None else (8 if meta.grouped else 1),
            mini_batch_size=t.mini_batch_size,
            micro_batch_size=t.micro_batch_size,
            max_length=t.max_length,
            max_new_tokens=t.max_new_tokens,
            max_prompt_length=cfg.data.max_prompt_length,
            data_prompt_tokens=data_prompt_tokens,
            needs_critic=meta.needs_critic,
            reference=cfg.loss.kl.coef > 0,
            enable_lora=lo.enable_lora,
            target_modules=lo.target_modules,
            lora_r=lo.lora_r,
            engine=r.engine,
            generation_batch_size=r.generation_batch_size,
            lora_compute=r.lora_compute,
            keep_cache=r.keep_cache,
            tools=bool(cfg.agent.tools or cfg.agent.environment),
            logprob_chunk_size=cfg.speed.logprob_chunk_size,
            fused_logprob_head=cfg.speed.fused_logprob_head,
            packed_update=cfg.speed.packed_update,
            cuda_graphs=cfg.speed.cuda_graphs and not cfg.speed.compile,
        )

    def with_(self, **changes: Any) -> PlanInput:
        """This input with some settings changed (the variants a plan prices)."""
        return dataclasses.replace(self, **changes)

    @property
    def quantized(self) -> str | None:
        return "4bit" if self.load_in_4bit else "8bit" if self.load_in_8bit else None

    def sequences_per_call(self) -> int:
        """Sequences in one generate call: ``rollout.generation_batch_size`` counts
        sequences, and the engines fill a call with whole groups of ``samples_per_prompt``
        (at least one, danka.rollout.hf / fast); 0 = the whole step's ``batch_size x
        samples``."""
        n = self.samples_per_prompt
        every = self.batch_size * n
        per_call = self.generation_batch_size
        return min(every, max(1, per_call // n) * n) if per_call else every

    def mini_batch_sequences(self, world_size: int = 1) -> int:
        """Sequences per optimiser step on one rank: what a micro-batch size must divide."""
        prompts = self.mini_batch_size or self.batch_size
        return max(1, prompts * self.samples_per_prompt // world_size)


KEYS = {f.name: f.metadata["key"] for f in dataclasses.fields(PlanInput)}


def label(changes: dict[str, Any]) -> str:
    """``{field: value}`` as the settings to write: ``trainer.micro_batch_size=4``."""
    return " ".join(
        f"{KEYS[k]}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items()
    )


def estimator_meta(cfg: DankaConfig):
    """The advantage estimator's registry entry (a critic? grouped?): the config's own
    choice, or the one its algorithm implies (validation fills the same default)."""
    from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from danka.algorithms.presets import ALGORITHMS

    t = cfg.trainer
    name = (
        t.advantage_estimator
        or ALGORITHMS.get(t.algorithm, "trainer.algorithm").advantage_estimator
    )
    return ADVANTAGE_ESTIMATORS.meta(name)
