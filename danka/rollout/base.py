"""The rollout interface: prompts in, one ``RolloutBatch`` out.

Every engine samples ``n`` responses per prompt from the *live* policy (LoRA adapters
active, no merge and no weight copy) and returns right-padded responses. Sample ``i * n + j``
is the j-th answer to prompt ``i``; ``group_index`` records ``i``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from danka.data.template import left_pad
from danka.errors import UserError
from danka.registry import Registry
from danka.types import RolloutBatch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


Sampled = tuple[list[list[int]], list[list[float]] | None]  # (responses, their log-probs)


class RolloutEngine:
    """Base of the engines: ``generate`` is the interface, an engine implements ``sample``."""

    name: str

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
        """Sample ``params.n`` responses for each prompt (token ids, no padding); sample
        ``i * n + j`` answers prompt ``i``."""
        responses, logprobs = self.sample(model, prompt_ids, params, eos_ids, pad_id, generator)
        return finish_batch(
            prompt_ids,
            responses,
            params.n,
            eos_ids=eos_ids,
            pad_id=pad_id,
            max_new_tokens=params.max_new_tokens,
            logprobs=logprobs,
        )

    def sample(self, model, prompt_ids, params, eos_ids, pad_id, generator) -> Sampled:
        """``generate``'s arguments -> one token list per sample (``i * n + j`` answers
        prompt ``i``; EOS and what follows it are cut by ``finish_batch``) and, if the
        engine reports them, each sampled token's log-prob (else None)."""
        raise NotImplementedError

    @classmethod
    def configured(cls, **settings) -> RolloutEngine:
        """The engine built with the config's settings (named as ``EngineMeta.options``
        maps them); an engine whose constructor takes a settings record overrides this."""
        return cls(**settings)

    def halve_batch(self, n: int, total: int) -> tuple[int, int] | None:
        """After an out-of-memory: halve the sequences per generate call (``total``: this
        call's, ``n``: a group's, the least a call holds); ``(before, after)``, or None
        when it cannot shrink (one group already, or an engine without the knob)."""
        return None


def halve_groups(current: int, n: int) -> int | None:
    """Half of ``current`` sequences per call in whole groups of ``n`` (at least one group),
    or None when ``current`` is one group already: what ``halve_batch`` shrinks to."""
    return None if current <= n else max(n, current // 2 // n * n)


# rollout.lora_compute (the fast engine's modes); auto = base
LORA_COMPUTE = ("auto", "adapter", "base", "merge")


def keeps_cache(keep_cache: bool | None) -> bool:
    """``rollout.keep_cache`` for every engine: whether it keeps its KV cache (the fast
    engine also its buffers and graphs; vLLM its weights, awake) through the update. Only
    when asked: ``None`` and ``False`` give it back before the update (vLLM sleeps);
    danka.planning.memory prices the same rule."""
    return bool(keep_cache)


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings from the config (``rollout.*``); the default of each means "not set".

    An engine declares which of them it honours (``EngineMeta.options``, mapping an
    option to its setting); a set option the chosen engine does not honour
    is a UserError at start-up, never silently ignored.
    """

    generation_batch_size: int = 0  # sequences per generate call (0 = all at once)
    # keep the KV cache between calls: None and False alike give it back (keeps_cache)
    keep_cache: bool | None = field(default=None, metadata={"unset": (None, False)})
    compile: bool = False  # torch.compile the engine's decode layer
    decode_attention: str = "auto"  # the decode step's attention kernel (auto|sdpa|triton)
    shared_prefix: bool = True  # HF: prompt tokens the rows share are prefilled once
    lora_compute: str = "auto"  # a live LoRA's path: fast LORA_COMPUTE, vllm merge|adapter
    # an engine with its own memory (EngineMeta.own_memory): its share of the GPU and the
    # longest prompt + response, from the memory plan (danka.planning.vllm)
    gpu_memory_fraction: float = 0.0
    max_model_len: int = 0


@dataclass(frozen=True)
class EngineMeta:
    """Capabilities of a rollout engine, asked instead of comparing engine names."""

    options: dict[str, str] = field(default_factory=dict)  # EngineOptions field -> setting
    auto_devices: tuple[str, ...] = ()  # device types on which ``auto`` picks it
    auto_priority: int = 0  # higher wins among the engines ``auto`` may pick
    quantized_base: bool = False  # samples from a bitsandbytes-quantised base (QLoRA)
    reports_logprobs: bool = False  # fills RolloutBatch.rollout_logprobs
    distributed: bool = False  # works under torchrun with a sharded (FSDP2) policy
    reads_weights: bool = False  # reads parameters directly: full weights gathered under FSDP2
    banner: str = ""  # the start-up log line naming it
    # holds its own weight copy and KV cache for the whole run: the memory plan gives it a
    # fixed share (EngineOptions.gpu_memory_fraction)
    own_memory: bool = False
    # "module:function(device_type)" raising UserError when it cannot run here (an optional
    # package missing); called when a config names the engine
    check: str = ""


# Entries are "module:Class" (imported when built: no import cycle, and the capability
# table of every engine is here in one place) or a class added by ``register_engine``.
ROLLOUT_ENGINES: Registry[EngineMeta] = Registry("rollout engine", EngineMeta())
ROLLOUT_ENGINES.add(
    "hf",
    "danka.rollout.hf:HFGenerateEngine",
    EngineMeta(
        options={"generation_batch_size": "batch_size", "shared_prefix": "shared_prefix"},
        auto_devices=("cpu", "cuda"),
        quantized_base=True,
        distributed=True,
        banner="Using HF Transformers backend for Actor/Critic inference",
    ),
)
ROLLOUT_ENGINES.add(
    "fast",
    "danka.rollout.fast.engine:FastEngine",
    EngineMeta(
        options={
            "generation_batch_size": "batch_size",
            "keep_cache": "keep_cache",
            "compile": "compile_step",
            "decode_attention": "attention",
            "lora_compute": "lora_compute",
        },
        auto_devices=("cuda",),
        auto_priority=1,
        reports_logprobs=True,
        reads_weights=True,
        banner="Using danka fast rollout engine (static KV cache, CUDA graphs) for inference",
    ),
)


ROLLOUT_ENGINES.add(
    "vllm",
    "danka.rollout.vllm.engine:VllmEngine",
    EngineMeta(
        options={
            "generation_batch_size": "max_num_seqs",
            "keep_cache": "keep_cache",
            "lora_compute": "lora_mode",
            "gpu_memory_fraction": "gpu_memory_utilization",
            "max_model_len": "max_model_len",
        },
        quantized_base=True,
        reports_logprobs=True,
        own_memory=True,
        check="danka.rollout.vllm.calls:check_vllm",
        banner="Using vLLM backend (colocated, weights synced every step) for inference",
    ),
)


def register_engine(name: str, meta: EngineMeta | None = None):
    """Class decorator for another engine: ``@register_engine("mine", EngineMeta(...))``."""

    def deco(cls: type) -> type:
        cls.name = name
        ROLLOUT_ENGINES.add(name, cls, meta)
        return cls

    return deco


def engine_class(name: str) -> type:
    entry = ROLLOUT_ENGINES.get(name, where="rollout.engine")
    if isinstance(entry, str):
        module, cls = entry.split(":")
        entry = getattr(importlib.import_module(module), cls)
    return entry


def engine_meta(name: str) -> EngineMeta:
    return ROLLOUT_ENGINES.meta(name, where="rollout.engine")


def resolve_engine(name: str, device_type: str, *, quantized: bool) -> str:
    """The engine ``rollout.engine`` names; ``auto`` picks the highest-priority engine
    whose capabilities fit the device and the base (a quantised base needs an engine
    that reads quantised weights)."""
    if name != "auto":
        meta = engine_meta(name)
        if meta.check:  # e.g. vllm: installed, with the torch it was built for
            module, func = meta.check.split(":")
            getattr(importlib.import_module(module), func)(device_type)
        if quantized and not meta.quantized_base:
            fits = [n for n, _ in ROLLOUT_ENGINES.items() if ROLLOUT_ENGINES.meta(n).quantized_base]
            raise UserError(
                f"rollout engine {name!r} cannot sample from a quantised (4/8-bit) base",
                where="rollout.engine",
                fix=f"use rollout.engine: {' or '.join(fits) or 'auto'}",
            )
        return name
    fits = [
        (ROLLOUT_ENGINES.meta(n).auto_priority, n)
        for n, _ in ROLLOUT_ENGINES.items()
        if device_type in ROLLOUT_ENGINES.meta(n).auto_devices
        and (ROLLOUT_ENGINES.meta(n).quantized_base or not quantized)
    ]
    if not fits:
        raise UserError(f"no rollout engine runs on {device_type}", where="rollout.engine")
    return max(fits)[1]


# the rollout.* settings that become EngineOptions as written (the rest are planned)
SETTINGS = ("keep_cache", "compile", "decode_attention", "shared_prefix", "lora_compute")


def options_of(rollout: Any) -> EngineOptions:
    """The engine options the config's ``rollout`` section sets, for the checks made
    before any model loads (the run adds the planned sizes later)."""
    return EngineOptions(**{k: getattr(rollout, k) for k in SETTINGS})


def unsupported_option(name: str, options: EngineOptions) -> tuple[str, str, str] | None:
    """``(key, what, fix)`` for the first option set that engine ``name`` does not
    honour, else None. An option is set unless it holds its default or a value meaning
    the same (a field's ``unset`` metadata: ``keep_cache: false`` is the default too)."""
    meta = ROLLOUT_ENGINES.meta(name)
    for f in fields(options):
        value = getattr(options, f.name)
        unset = f.metadata.get("unset", (f.default,))
        if f.name in meta.options or value == f.default or any(value is u for u in unset):
            continue
        able = [n for n, _ in ROLLOUT_ENGINES.items() if f.name in ROLLOUT_ENGINES.meta(n).options]
        key = f"rollout.{f.name}"
        what = f"{key} is set ({value}), but the {name!r} engine does not support it"
        return key, what, f"remove {key}, or use rollout.engine: {' or '.join(able) or '?'}"
    return None


def check_options(name: str, options: EngineOptions) -> None:
    """UserError naming the first option engine ``name`` does not honour."""
    if bad := unsupported_option(name, options):
        raise UserError(bad[1], where=bad[0], fix=bad[2])


def build_engine(name: str, options: EngineOptions | None = None) -> RolloutEngine:
    """The engine registered as ``name``, built with the options the config set; an
    option it does not honour is a UserError naming the option and the engine."""
    cls = engine_class(name)
    meta = ROLLOUT_ENGINES.meta(name)
    options = options or EngineOptions()
    check_options(name, options)
    kwargs = {
        meta.options[f.name]: getattr(options, f.name)
        for f in fields(options)
        if f.name in meta.options and getattr(options, f.name) != f.default
    }
    return getattr(cls, "configured", cls)(**kwargs)  # a plain class: its constructor


@dataclass(frozen=True)
class AnswerOptions:
    """How ``danka generate/chat/eval`` answer prompts outside training: the options shared
    by ``danka.tools.generate.generate_batch`` and ``danka.agent.setup.agent_generate``."""

    system: str | None = None  # system prompt (None: the chat template's default)
    instruction: str | None = None  # text added to every prompt, as data.instruction
    examples: tuple[dict[str, str], ...] = ()  # worked turns before every prompt: data.examples
    max_new_tokens: int = 256  # per answer (per turn with tools)
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 0.95
    n: int = 1  # answers per prompt
    seed: int | None = 0  # torch.manual_seed before generating (None: leave the RNG)
    batch_size: int = 16  # prompts per generate call

    def start(self, engine: str, sequences_per_call: int) -> tuple[RolloutEngine, SamplingParams]:
        """Seed the RNG, build ``engine`` generating ``sequences_per_call`` sequences per
        call, and return it with the sampling parameters."""
        if self.seed is not None:
            torch.manual_seed(self.seed)
        gen = build_engine(engine, EngineOptions(generation_batch_size=sequences_per_call))
        params = SamplingParams(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
        )
        return gen, params


def finish_batch(
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    n: int,
    *,
    eos_ids: list[int],
    pad_id: int,
    max_new_tokens: int,
    logprobs: list[list[float]] | None = None,
) -> RolloutBatch:
    """Pack per-sample token lists into a RolloutBatch.

    ``responses[k]`` is cut after its first EOS; a response without EOS that reached
    ``max_new_tokens`` is marked truncated.
    """
    eos = set(eos_ids)
    cut: list[list[int]] = []
    truncated: list[bool] = []
    for resp in responses:
        end = next((t + 1 for t, tok in enumerate(resp) if tok in eos), None)
        cut.append(resp[:end] if end is not None else resp[:max_new_tokens])
        truncated.append(end is None)
    b = len(cut)
    rlen = max(1, max(len(r) for r in cut))
    p_ids, p_mask = left_pad([prompt_ids[k // n] for k in range(b)], pad_id)
    r_ids = torch.full((b, rlen), pad_id, dtype=torch.long)
    r_mask = torch.zeros((b, rlen), dtype=torch.float32)
    lp = torch.zeros((b, rlen), dtype=torch.float32) if logprobs is not None else None
    for k, resp in enumerate(cut):
        if resp:
            r_ids[k, : len(resp)] = torch.tensor(resp, dtype=torch.long)
            r_mask[k, : len(resp)] = 1.0
            if lp is not None:
                lp[k, : len(resp)] = torch.tensor(logprobs[k][: len(resp)], dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=r_ids,
        response_mask=r_mask,
        group_index=torch.arange(b, dtype=torch.long) // n,
        truncated=torch.tensor(truncated, dtype=torch.bool),
        rollout_logprobs=lp,
    )
