"""Cross-field checks and derived values, done once before any model loads."""

from __future__ import annotations

import copy
import dataclasses
from typing import Protocol

from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.algorithms.kl import KL_ESTIMATORS, KL_MODES
from danka.algorithms.losses import AGG_MODES, POLICY_LOSSES
from danka.algorithms.presets import ALGORITHMS
from danka.algorithms.rollout_correction import ROLLOUT_CORRECTIONS
from danka.config.dtypes import canonical_dtype
from danka.config.schema import DankaConfig
from danka.config.units import parse_memory
from danka.data.tasks import TASKS
from danka.errors import UserError
from danka.rollout.base import LORA_COMPUTE, ROLLOUT_ENGINES


class ConfigSource(Protocol):
    """Where config values came from (config.load's _Source)."""

    explicit: set[str]  # dotted keys the user set (file or override)

    def where(self, key: str) -> str: ...


# default cap of each rollout correction mode (TRL's token cap, verl's sequence threshold)
CORRECTION_CAPS = {"none": 3.0, "token_tis": 3.0, "seq_mask": 2.0}


def choices() -> dict[str, set]:
    """Valid values per key: names from the registries, the rest fixed here."""
    return {
        "model.torch_dtype": {"auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"},
        "model.reward_model_type": {"auto", "classifier", "judge"},
        "model.tokenizer_kwargs.padding_side": {"left", "right"},
        "trainer.algorithm": set(ALGORITHMS.names()),
        "trainer.advantage_estimator": {None, *ADVANTAGE_ESTIMATORS.names()},
        "loss.policy_loss": set(POLICY_LOSSES.names()),
        "loss.agg_mode": set(AGG_MODES),
        "optim.lr_scheduler": {"constant", "cosine", "linear"},
        "loss.kl.estimator": set(KL_ESTIMATORS.names()),
        "loss.kl.mode": set(KL_MODES.names()),
        "trainer.rollout_correction.mode": set(ROLLOUT_CORRECTIONS.names()),
        "rollout.engine": {"auto", *ROLLOUT_ENGINES.names()},
        "data.format": {"auto", "seed", "trl", "verl", "gsm8k"},
        "data.overlong_prompt": {"error", "drop", "truncate_left"},
        "data.on_bad_row": {"error", "skip"},
        "data.task": {None, *TASKS.names()},
        "reward.on_error": {"fail", "zero", "skip_sample"},
        "backend.fsdp.sharding": {"auto", "shard", "replicate"},
        "rollout.tool_sandbox": {"auto", "bwrap", "namespaces", "none"},
        "rollout.lora_compute": set(LORA_COMPUTE),
    }


def _get(cfg: DankaConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def validate(cfg: DankaConfig, source: ConfigSource | None = None) -> None:
    """Raise UserError on the first inconsistency; fill in derived values in place
    (algorithm presets where the user set nothing, samples_per_prompt, ...). After this
    the config is read-only: the run keeps its changing state elsewhere."""
    explicit = source.explicit if source else set()

    def where(key: str) -> str:
        return source.where(key) if source else f"config key {key}"

    def fail(key: str, what: str, fix: str) -> None:
        raise UserError(what, where=where(key), fix=fix)

    def size_or_auto(key: str, value, minimum: int, example: str) -> None:
        """A size the memory plan may choose: a number >= ``minimum``, or ``auto``."""
        if value != "auto" and (isinstance(value, str) or value < minimum):
            fail(key, f"must be a number >= {minimum} or auto, got {value!r}", example)

    for key, allowed in choices().items():
        value = _get(cfg, key)
        if key == "model.torch_dtype" and isinstance(value, str):
            value = canonical_dtype(value)
        if value not in allowed:
            shown = ", ".join(sorted(str(a) for a in allowed if a is not None))
            fail(key, f"{value!r} is not a valid value", f"use one of: {shown}")

    m, t, d = cfg.model, cfg.trainer, cfg.data
    smp, opt, lo, ck, sp = cfg.sampling, cfg.optim, cfg.loss, cfg.checkpoint, cfg.speed
    resolve_data_source(cfg)  # a named file replaces a generated task (one warning)
    m.torch_dtype = canonical_dtype(m.torch_dtype)  # the loaders know the long names only
    if not m.actor_model_name_or_path:
        fail(
            "model.actor_model_name_or_path",
            "no policy model given",
            "set model.actor_model_name_or_path to a hub id, a local folder or a .gguf file",
        )
    if not d.train_dataset and not d.task:
        fail(
            "data.train_dataset",
            "no training data given",
            "set data.train_dataset to a .jsonl/.json/.parquet file (or data.task: arithmetic | calculator)",
        )
    if m.use_flash_attention_2 and m.attn_implementation not in (None, "flash_attention_2"):
        fail(
            "model.use_flash_attention_2",
            "conflicts with model.attn_implementation",
            "set only one of them",
        )
    if m.use_flash_attention_2:
        m.attn_implementation = "flash_attention_2"
    if m.load_in_4bit and m.load_in_8bit:
        fail("model.load_in_4bit", "load_in_4bit and load_in_8bit are both set", "choose one")
    if (m.load_in_4bit or m.load_in_8bit) and not cfg.lora.enable_lora:
        fail(
            "model.load_in_4bit",
            "a quantised base cannot be trained in full",
            "set lora.enable_lora: true (QLoRA) or turn quantisation off",
        )

    # Derived values, printed by --print-config and at start-up.
    preset = ALGORITHMS.get(t.algorithm, where=where("trainer.algorithm"))
    if t.advantage_estimator is None:
        t.advantage_estimator = preset.advantage_estimator
    for key, value in preset.settings.items():  # the paper's settings, unless set by the user
        if key not in explicit:
            section, leaf = key.split(".")
            setattr(getattr(cfg, section), leaf, value)
    estimator = ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator)
    if t.samples_per_prompt is None:
        t.samples_per_prompt = 8 if estimator.grouped else 1
    rc = t.rollout_correction
    if rc.cap is None:
        rc.cap = CORRECTION_CAPS.get(rc.mode, 3.0)
    if t.mini_batch_size is None:
        t.mini_batch_size = t.batch_size
    if d.max_prompt_length is None:
        agent = cfg.rollout.tools or cfg.rollout.environment  # the response spans all turns
        response = max(cfg.rollout.max_total_tokens, t.max_new_tokens) if agent else 0
        d.max_prompt_length = t.max_length - max(response, t.max_new_tokens)

    for key in (
        "batch_size",
        "mini_batch_size",
        "samples_per_prompt",
        "ppo_epochs",
        "num_epochs",
        "max_new_tokens",
        "max_length",
        "max_bad_steps",
    ):
        if getattr(t, key) < 1:
            fail(f"trainer.{key}", f"must be >= 1, got {getattr(t, key)}", "use a positive number")
    if sp.gpu_memory is not None:
        try:
            parse_memory(sp.gpu_memory)
        except UserError:
            fail("speed.gpu_memory", f"cannot read {sp.gpu_memory!r} as a size", "e.g. 24GiB")
    size_or_auto("speed.logprob_chunk_size", sp.logprob_chunk_size, 1,
                  "e.g. 1024 (tokens per chunk), or auto")  # fmt: skip
    size_or_auto("rollout.generation_batch_size", cfg.rollout.generation_batch_size, 0,
                  "e.g. 0 (all at once), 64 (sequences per call), or auto")  # fmt: skip
    if t.max_train_minutes is not None and t.max_train_minutes <= 0:
        fail(
            "trainer.max_train_minutes",
            f"must be > 0, got {t.max_train_minutes}",
            "give minutes of training, e.g. 6, or null for no limit",
        )
    if not cfg.logging.result_file or "/" in cfg.logging.result_file:
        fail(
            "logging.result_file",
            f"{cfg.logging.result_file!r} is not a file name",
            "a plain file name written inside output_dir, e.g. result.json",
        )
    if t.total_steps is not None and t.total_steps < 1:
        fail("trainer.total_steps", "must be >= 1", "use a positive number or null")
    if t.max_new_tokens >= t.max_length:
        fail(
            "trainer.max_new_tokens",
            f"max_new_tokens ({t.max_new_tokens}) must be below max_length ({t.max_length})",
            "raise trainer.max_length or lower trainer.max_new_tokens",
        )
    if d.max_prompt_length < 1 or d.max_prompt_length + t.max_new_tokens > t.max_length:
        fail(
            "data.max_prompt_length",
            f"max_prompt_length ({d.max_prompt_length}) + max_new_tokens ({t.max_new_tokens}) "
            f"exceeds max_length ({t.max_length})",
            "lower data.max_prompt_length or raise trainer.max_length",
        )
    if estimator.grouped and t.samples_per_prompt < 2:
        fail(
            "trainer.samples_per_prompt",
            f"{t.algorithm.upper() if t.algorithm == 'grpo' else t.advantage_estimator} needs "
            f">= 2 samples per prompt: it compares answers to the same prompt "
            f"(samples_per_prompt >= 2, got {t.samples_per_prompt})",
            "set trainer.samples_per_prompt: 8 (or use trainer.algorithm: ppo)",
        )
    if t.batch_size % t.mini_batch_size:
        fail(
            "trainer.mini_batch_size",
            f"batch_size ({t.batch_size}) is not a multiple of mini_batch_size "
            f"({t.mini_batch_size})",
            "choose a mini_batch_size that divides batch_size",
        )
    seqs = t.mini_batch_size * t.samples_per_prompt
    micro = t.micro_batch_size
    size_or_auto("trainer.micro_batch_size", micro, 1,
                  "e.g. 8, or auto (the largest the GPU's memory plan fits)")  # fmt: skip
    if micro != "auto" and seqs % micro:
        fail(
            "trainer.micro_batch_size",
            f"a mini-batch has mini_batch_size x samples_per_prompt = {t.mini_batch_size} x "
            f"{t.samples_per_prompt} = {seqs} sequences, not a multiple of micro_batch_size "
            f"({t.micro_batch_size})",
            f"choose a micro_batch_size that divides {seqs}",
        )
    if rc.cap <= 1.0:
        fail(
            "trainer.rollout_correction.cap",
            f"must be > 1, got {rc.cap}",
            "use 3.0 for token_tis or 2.0 for seq_mask (or null for these defaults)",
        )
    if t.critic_warmup_steps < 0:
        fail("trainer.critic_warmup_steps", "must be >= 0", "e.g. 0 (off) or 5")
    if t.critic_warmup_steps and not estimator.needs_critic:
        fail(
            "trainer.critic_warmup_steps",
            f"{t.advantage_estimator} trains no critic, so there is nothing to warm up",
            "remove trainer.critic_warmup_steps, or use trainer.algorithm: ppo",
        )
    if not 0.0 < lo.clip_ratio_low < 1.0 or lo.clip_ratio_high <= 0.0:
        fail(
            "loss.clip_ratio_low",
            "clip ranges must be in (0, 1) below and > 0 above",
            "typical: clip_ratio_low 0.2, clip_ratio_high 0.2-0.28",
        )
    if not 0.0 <= t.gamma <= 1.0 or not 0.0 <= t.lam <= 1.0:
        fail("trainer.gamma", "gamma and lam must be in [0, 1]", "use gamma 1.0, lam 0.95")
    ranges = (  # key, value, in range, the range, the fix
        ("loss.dual_clip_c", lo.dual_clip_c, lo.dual_clip_c is None or lo.dual_clip_c > 1.0,
         "> 1", "use 3.0 or null"),
        ("optim.lr", opt.lr, opt.lr > 0, "> 0", "typical LoRA: 1e-5 to 5e-4"),
        ("sampling.temperature", smp.temperature, smp.temperature >= 0, ">= 0", "typical: 1.0"),
        ("sampling.top_p", smp.top_p, 0 < smp.top_p <= 1, "in (0, 1]",
         "1.0 samples from the whole distribution; 0.9-0.95 cuts the tail"),
        ("sampling.top_k", smp.top_k, smp.top_k >= 0, ">= 0", "0 (off) or e.g. 50"),
    )  # fmt: skip
    for key, value, ok, wanted, fix in ranges:
        if not ok:  # NaN compares false, so it lands here too
            fail(key, f"must be {wanted}, got {value}", fix)
    lora = cfg.lora
    if lora.enable_lora and (lora.lora_r < 1 or lora.lora_alpha <= 0):
        fail("lora.lora_r", "lora_r must be >= 1 and lora_alpha > 0", "typical: r 8-64, alpha 2r")
    if not 0.0 <= lora.lora_dropout < 1.0:
        fail("lora.lora_dropout", "must be in [0, 1)", "typical: 0.0-0.1")
    if isinstance(lora.target_modules, str) and lora.target_modules != "all-linear":
        fail(
            "lora.target_modules",
            f"{lora.target_modules!r} is not a list",
            "give a list like [q_proj, v_proj] or the string all-linear",
        )
    if not cfg.reward.timeout_s > 0:
        fail("reward.timeout_s", "must be > 0", "e.g. 30")
    from danka.rewards.specs import check_reward_specs  # torch-free; runs no user code

    check_reward_specs(cfg.reward.functions)
    if cfg.backend.hf_transformers.enable_hf_transformers and cfg.rollout.engine == "fast":
        fail(
            "backend.hf_transformers.enable_hf_transformers",
            "true asks for the HF engine, which conflicts with rollout.engine: fast",
            "set only one of them",
        )
    if cfg.rollout.lora_compute != "auto" and not lora.enable_lora:
        fail(
            "rollout.lora_compute",
            f"{cfg.rollout.lora_compute} sets how a LoRA adapter runs in the rollout, and "
            "this run trains no adapter (lora.enable_lora: false)",
            "remove rollout.lora_compute, or set lora.enable_lora: true",
        )
    if d.eval_size < 0 or d.task_train_size < 1:
        fail("data.eval_size", "sizes must be >= 0", "e.g. data.eval_size: 200")
    if d.packing and d.max_packed_length < t.max_length:
        fail(
            "data.max_packed_length",
            f"max_packed_length ({d.max_packed_length}) is below max_length ({t.max_length}): "
            "a sequence must fit one packed row",
            "raise data.max_packed_length",
        )
    if ck.save_steps is not None and ck.save_steps < 0:
        fail("checkpoint.save_steps", "must be >= 0 or null", "null = every 10% of the run")
    if ck.save_minutes is not None and ck.save_minutes <= 0:
        fail("checkpoint.save_minutes", "must be > 0 or null", "e.g. 30")
    if ck.keep_last is not None and ck.keep_last < 1:
        fail("checkpoint.keep_last", "must be >= 1 or null", "e.g. 3 (null keeps every checkpoint)")
    if cfg.eval.every_steps < 0:
        fail("eval.every_steps", "must be >= 0", "0 = at the start and the end only")
    if not cfg.eval.every_minutes >= 0:  # also NaN
        fail("eval.every_minutes", "must be >= 0", "0 = off; e.g. 2 for a curve over time")
    if cfg.eval.subset_size < 0:
        fail("eval.subset_size", "must be >= 0", "0 = every held-out prompt; e.g. 500")
    if cfg.eval.max_new_tokens is not None and cfg.eval.max_new_tokens < 1:
        fail("eval.max_new_tokens", "must be >= 1 or null", "null = trainer.max_new_tokens")
    if cfg.eval.probe_max_new_tokens < 1:
        fail("eval.probe_max_new_tokens", "must be >= 1", "e.g. 96")
    if cfg.logging.log_interval < 1:
        fail("logging.log_interval", "must be >= 1", "e.g. 1 or 10")
    if smp.max_sampling_rounds < 1:
        fail("sampling.max_sampling_rounds", "must be >= 1", "e.g. 3 (1 = no extra round)")
    if smp.dynamic_sampling and t.samples_per_prompt < 2:
        fail(
            "sampling.dynamic_sampling",
            "dynamic sampling drops groups whose rewards are all equal; a group of one "
            f"sample (samples_per_prompt {t.samples_per_prompt}) always is",
            "set trainer.samples_per_prompt >= 2 or sampling.dynamic_sampling: false",
        )
    ob = cfg.reward.overlong_buffer
    if not 0 <= ob.length < t.max_new_tokens:
        fail(
            "reward.overlong_buffer.length",
            f"must be in [0, max_new_tokens={t.max_new_tokens}), got {ob.length}",
            "e.g. a quarter of trainer.max_new_tokens; 0 turns the penalty off",
        )
    if ob.penalty < 0:
        fail("reward.overlong_buffer.penalty", f"must be >= 0, got {ob.penalty}", "e.g. 1.0")
    if cfg.rollout.tools or cfg.rollout.environment:
        _check_agent(cfg, fail)
    c = cfg.rm.center_rewards_coefficient
    if c is not None and c < 0:
        fail("rm.center_rewards_coefficient", f"must be >= 0, got {c}", "e.g. 0.01, or null")
    for key in ("chosen_key", "rejected_key", "margin_key"):
        if not getattr(cfg.rm, key):
            fail(f"rm.{key}", "must name a column", f"e.g. rm.{key}: {key.split('_')[0]}")
    if cfg.rm.chosen_key == cfg.rm.rejected_key:
        fail("rm.rejected_key", "is the same column as rm.chosen_key", "name two columns")


def resolve_data_source(cfg: DankaConfig) -> None:
    """``data.train_dataset`` and ``data.task`` both set: the file is what the user means
    (``danka train quickstart.yaml data.train_dataset=my.jsonl``), so it replaces the task,
    with one warning (logged at start-up, printed by ``--print-config``)."""
    from danka.config.compat import add_warning

    d = cfg.data
    if not (d.train_dataset and d.task):
        return
    if d.eval_dataset:
        held = f"held-out prompts from data.eval_dataset ({d.eval_dataset})"
    elif d.eval_size:
        held = f"the last {d.eval_size} rows of the file held out (data.eval_size)"
    else:
        held = "no held-out evaluation"
    add_warning(
        cfg,
        f"data.train_dataset ({d.train_dataset}) replaces data.task ({d.task}): training on "
        f"the file, not on generated problems; {held}",
    )
    d.task = None


def _check_agent(cfg: DankaConfig, fail) -> None:
    """rollout.tools / rollout.environment: the agent settings, and a prompt budget that
    leaves room for the whole multi-turn response (all turns + tool responses)."""
    from danka.agent.setup import check_agent_config

    t, d = cfg.trainer, cfg.data
    check_agent_config(cfg.rollout, max_new_tokens=t.max_new_tokens)
    if cfg.rollout.tool_sandbox not in ("auto", "none") and "python" in cfg.rollout.tools:
        from danka.agent.sandbox import choose

        choose(cfg.rollout.tool_sandbox)  # an explicit sandbox that cannot work: refused now
    total = cfg.rollout.max_total_tokens or t.max_new_tokens
    if d.max_prompt_length + total > t.max_length:
        fail(
            "rollout.max_total_tokens",
            f"data.max_prompt_length ({d.max_prompt_length}) + the multi-turn response budget "
            f"({total}) exceeds trainer.max_length ({t.max_length})",
            "raise trainer.max_length, or set data.max_prompt_length to "
            f"{max(1, t.max_length - total)} or less",
        )
    if cfg.sampling.dynamic_sampling:
        fail(
            "sampling.dynamic_sampling",
            "is not supported with rollout.tools / rollout.environment yet",
            "set sampling.dynamic_sampling: false",
        )


_FROZEN: dict[type, type] = {}


def _refuse(self, name, value=None):
    raise AttributeError(
        f"the config is read-only after validation (tried to set {name!r}); keep changing "
        "run state elsewhere (e.g. danka.trainer.state.RunState)"
    )


def _thawed_copy(self, memo: dict):
    """``copy.deepcopy`` of a frozen section is an ordinary, writable one (a what-if copy,
    e.g. ``danka estimate`` trying settings, is the caller's to change)."""
    base = type(self).__mro__[1]
    new = object.__new__(base)
    memo[id(self)] = new
    for f in dataclasses.fields(self):
        object.__setattr__(new, f.name, copy.deepcopy(getattr(self, f.name), memo))
    return new


def freeze(obj: object) -> None:
    """Make a validated config (and every section in it) read-only: each dataclass
    instance becomes an instance of a subclass whose ``__setattr__`` raises. ``asdict``,
    ``isinstance``, pickling and reading work as before; a deep copy is writable."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        if isinstance(obj, list):
            for item in obj:
                freeze(item)
        return
    for f in dataclasses.fields(obj):
        freeze(getattr(obj, f.name))
    cls = type(obj)
    if cls in _FROZEN.values():
        return
    if cls not in _FROZEN:
        name = f"Frozen{cls.__name__}"  # a module-level name, so pickle finds the class
        _FROZEN[cls] = globals()[name] = type(
            name,
            (cls,),
            {
                "__setattr__": _refuse,
                "__delattr__": _refuse,
                "__deepcopy__": _thawed_copy,
                "__module__": __name__,
            },
        )
    object.__setattr__(obj, "__class__", _FROZEN[cls])
