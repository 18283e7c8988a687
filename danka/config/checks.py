"""One ``check_<section>`` per config section: each raises UserError (exit 2) naming the
key, where it was written and the fix, on the first value that cannot work. They run
after :func:`danka.config.resolve.resolve` (derived values filled in) and change nothing."""

from __future__ import annotations

from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.data.tasks import check_task_options
from danka.errors import UserError
from danka.limits import check_template
from danka.rollout.base import options_of, unsupported_option
from danka.schema.sections import DankaConfig
from danka.schema.units import parse_memory


def check_model(cfg: DankaConfig, at) -> None:
    m = cfg.model
    if not m.actor_model_name_or_path:
        at.fail(
            "model.actor_model_name_or_path",
            "no policy model given",
            "set model.actor_model_name_or_path to a hub id, a local folder or a .gguf file",
        )
    if m.load_in_4bit and m.load_in_8bit:
        at.fail("model.load_in_4bit", "load_in_4bit and load_in_8bit are both set", "choose one")
    if (m.load_in_4bit or m.load_in_8bit) and not cfg.lora.enable_lora:
        at.fail(
            "model.load_in_4bit",
            "a quantised base cannot be trained in full",
            "set lora.enable_lora: true (QLoRA) or turn quantisation off",
        )


def check_data(cfg: DankaConfig, at) -> None:
    d = cfg.data
    if not d.train_dataset and not d.task:
        at.fail(
            "data.train_dataset",
            "no training data given",
            "set data.train_dataset to a .jsonl/.json/.parquet file (or data.task: arithmetic | calculator)",
        )
    if d.eval_size < 0 or d.task_train_size < 1:
        at.fail("data.eval_size", "sizes must be >= 0", "e.g. data.eval_size: 200")
    if d.task:  # its options (a template's format specs) before any row is made
        try:
            check_task_options(d.task, d.task_kwargs)
        except UserError as err:
            at.fail(err.where or "data.task_kwargs", err.what, err.fix or "")
    check_examples(d.examples, at)


EXAMPLE_FIX = (
    "write data.examples as [{role: user, content: 'What is 36 + 47?'}, "
    "{role: assistant, content: '36 + 47 = 83'}]: user and assistant turns in turn, "
    "ending with the assistant's"
)


def check_examples(examples, at) -> None:
    """data.examples: user/assistant turns in turn, each with text, ending with the
    assistant's answer (a trailing question would be answered by nobody; a system turn
    belongs in data.system_prompt)."""

    def bad(what: str) -> None:
        at.fail("data.examples", what[:200], EXAMPLE_FIX)

    if not isinstance(examples, list):
        bad(f"expected a list of messages, got {examples!r}")
    for i, m in enumerate(examples):
        want = "user" if i % 2 == 0 else "assistant"
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            bad(f"turn {i} is not a {{role, content}} message: {m!r}")
        elif m["role"] != want:  # a system role included: data.system_prompt says that
            bad(f"turn {i} has role {m['role']!r}, expected {want!r}")
        elif not isinstance(m["content"], str) or not m["content"].strip():
            bad(f"turn {i} ({want}) has no text")
    if len(examples) % 2:
        bad(f"the {len(examples)} turns end with a user turn, not the assistant's answer")


def check_trainer_sizes(cfg: DankaConfig, at) -> None:
    """The step's shape: every count >= 1, prompt and response within max_length, a time
    limit > 0."""
    t = cfg.trainer
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
            at.fail(
                f"trainer.{key}", f"must be >= 1, got {getattr(t, key)}", "use a positive number"
            )
    if t.max_train_minutes is not None and t.max_train_minutes <= 0:
        at.fail(
            "trainer.max_train_minutes",
            f"must be > 0, got {t.max_train_minutes}",
            "give minutes of training, e.g. 6, or null for no limit",
        )
    if t.total_steps is not None and t.total_steps < 1:
        at.fail("trainer.total_steps", "must be >= 1", "use a positive number or null")
    if t.max_new_tokens >= t.max_length:
        at.fail(
            "trainer.max_new_tokens",
            f"max_new_tokens ({t.max_new_tokens}) must be below max_length ({t.max_length})",
            "raise trainer.max_length or lower trainer.max_new_tokens",
        )
    d = cfg.data
    if d.max_prompt_length < 1 or d.max_prompt_length + t.max_new_tokens > t.max_length:
        at.fail(
            "data.max_prompt_length",
            f"max_prompt_length ({d.max_prompt_length}) + max_new_tokens ({t.max_new_tokens}) "
            f"exceeds max_length ({t.max_length})",
            "lower data.max_prompt_length or raise trainer.max_length",
        )


def check_trainer_batches(cfg: DankaConfig, at) -> None:
    """Groups, mini-batches and micro-batches that divide one another."""
    t = cfg.trainer
    if ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator).grouped and t.samples_per_prompt < 2:
        at.fail(
            "trainer.samples_per_prompt",
            f"{t.algorithm.upper() if t.algorithm == 'grpo' else t.advantage_estimator} needs "
            f">= 2 samples per prompt: it compares answers to the same prompt "
            f"(samples_per_prompt >= 2, got {t.samples_per_prompt})",
            "set trainer.samples_per_prompt: 8 (or use trainer.algorithm: ppo)",
        )
    if t.batch_size % t.mini_batch_size:
        at.fail(
            "trainer.mini_batch_size",
            f"batch_size ({t.batch_size}) is not a multiple of mini_batch_size "
            f"({t.mini_batch_size})",
            "choose a mini_batch_size that divides batch_size",
        )
    seqs = t.mini_batch_size * t.samples_per_prompt
    micro = t.micro_batch_size
    at.size_or_auto(
        "trainer.micro_batch_size",
        micro,
        1,
        "e.g. 8, or auto (the largest the GPU's memory plan fits)",
    )
    if micro != "auto" and seqs % micro:
        at.fail(
            "trainer.micro_batch_size",
            f"a mini-batch has mini_batch_size x samples_per_prompt = {t.mini_batch_size} x "
            f"{t.samples_per_prompt} = {seqs} sequences, not a multiple of micro_batch_size "
            f"({t.micro_batch_size})",
            f"choose a micro_batch_size that divides {seqs}",
        )


def check_trainer_algorithm(cfg: DankaConfig, at) -> None:
    """The rollout correction's cap, the critic's warm-up, gamma and lambda."""
    t = cfg.trainer
    if t.rollout_correction.cap <= 1.0:
        at.fail(
            "trainer.rollout_correction.cap",
            f"must be > 1, got {t.rollout_correction.cap}",
            "use 3.0 for token_tis or 2.0 for seq_mask (or null for these defaults)",
        )
    if t.critic_warmup_steps < 0:
        at.fail("trainer.critic_warmup_steps", "must be >= 0", "e.g. 0 (off) or 5")
    if t.critic_warmup_steps and not ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator).needs_critic:
        at.fail(
            "trainer.critic_warmup_steps",
            f"{t.advantage_estimator} trains no critic, so there is nothing to warm up",
            "remove trainer.critic_warmup_steps, or use trainer.algorithm: ppo",
        )
    if not 0.0 <= t.gamma <= 1.0 or not 0.0 <= t.lam <= 1.0:
        at.fail("trainer.gamma", "gamma and lam must be in [0, 1]", "use gamma 1.0, lam 0.95")


def check_speed(cfg: DankaConfig, at) -> None:
    sp, t = cfg.speed, cfg.trainer
    if sp.gpu_memory is not None:
        try:
            parse_memory(sp.gpu_memory)
        except UserError as err:
            at.fail("speed.gpu_memory", err.what, "write it like 24GiB, 80GB or 40 (GiB)")
    at.size_or_auto(
        "speed.logprob_chunk_size",
        sp.logprob_chunk_size,
        1,
        "e.g. 1024 (tokens per chunk), or auto",
    )
    at.size_or_auto("speed.cpu_threads", sp.cpu_threads, 1, "e.g. 2 (threads), or auto")
    if sp.packing and sp.max_packed_length < t.max_length:
        at.fail(
            "speed.max_packed_length",
            f"max_packed_length ({sp.max_packed_length}) is below max_length ({t.max_length}): "
            "a sequence must fit one packed row",
            "raise speed.max_packed_length",
        )


def check_rollout(cfg: DankaConfig, at) -> None:
    r = cfg.rollout
    at.size_or_auto(
        "rollout.generation_batch_size",
        r.generation_batch_size,
        0,
        "e.g. 0 (all at once), 64 (sequences per call), or auto",
    )
    if r.lora_compute != "auto" and not cfg.lora.enable_lora:
        at.fail(
            "rollout.lora_compute",
            f"{r.lora_compute} sets how a LoRA adapter runs in the rollout, and "
            "this run trains no adapter (lora.enable_lora: false)",
            "remove rollout.lora_compute, or set lora.enable_lora: true",
        )
    # the HF switch is read as rollout.engine: hf already (config.moved.retire)
    if cfg.backend.vllm.enable_vllm and r.engine not in ("auto", "vllm"):
        at.fail(
            "backend.vllm.enable_vllm",
            f"true asks for the vLLM engine, which conflicts with rollout.engine: {r.engine}",
            "set only one of them",
        )
    named = "vllm" if cfg.backend.vllm.enable_vllm else r.engine
    if named != "auto" and (bad := unsupported_option(named, options_of(r))):
        at.fail(*bad)  # auto: once the device picks the engine (trainer.setup.choose_engine)


def check_loss_and_optim(cfg: DankaConfig, at) -> None:
    lo, opt = cfg.loss, cfg.optim
    if not 0.0 < lo.clip_ratio_low < 1.0 or lo.clip_ratio_high <= 0.0:
        at.fail(
            "loss.clip_ratio_low",
            "clip ranges must be in (0, 1) below and > 0 above",
            "typical: clip_ratio_low 0.2, clip_ratio_high 0.2-0.28",
        )
    at.in_range(
        "loss.dual_clip_c",
        lo.dual_clip_c,
        lo.dual_clip_c is None or lo.dual_clip_c > 1.0,
        "> 1",
        "use 3.0 or null",
    )
    at.in_range("optim.lr", opt.lr, opt.lr > 0, "> 0", "typical LoRA: 1e-5 to 5e-4")


def check_sampling(cfg: DankaConfig, at) -> None:
    smp, t = cfg.sampling, cfg.trainer
    at.in_range(
        "sampling.temperature", smp.temperature, smp.temperature >= 0, ">= 0", "typical: 1.0"
    )
    at.in_range(
        "sampling.top_p",
        smp.top_p,
        0 < smp.top_p <= 1,
        "in (0, 1]",
        "1.0 samples from the whole distribution; 0.9-0.95 cuts the tail",
    )
    at.in_range("sampling.top_k", smp.top_k, smp.top_k >= 0, ">= 0", "0 (off) or e.g. 50")
    if smp.max_sampling_rounds < 1:
        at.fail("sampling.max_sampling_rounds", "must be >= 1", "e.g. 3 (1 = no extra round)")
    if smp.dynamic_sampling and t.samples_per_prompt < 2:
        at.fail(
            "sampling.dynamic_sampling",
            "dynamic sampling drops groups whose rewards are all equal; a group of one "
            f"sample (samples_per_prompt {t.samples_per_prompt}) always is",
            "set trainer.samples_per_prompt >= 2 or sampling.dynamic_sampling: false",
        )


def check_lora(cfg: DankaConfig, at) -> None:
    lora = cfg.lora
    if lora.enable_lora and (lora.lora_r < 1 or lora.lora_alpha <= 0):
        at.fail(
            "lora.lora_r", "lora_r must be >= 1 and lora_alpha > 0", "typical: r 8-64, alpha 2r"
        )
    if not 0.0 <= lora.lora_dropout < 1.0:
        at.fail("lora.lora_dropout", "must be in [0, 1)", "typical: 0.0-0.1")
    if isinstance(lora.target_modules, str) and lora.target_modules != "all-linear":
        at.fail(
            "lora.target_modules",
            f"{lora.target_modules!r} is not a list",
            "give a list like [q_proj, v_proj] or the string all-linear",
        )


def check_reward(cfg: DankaConfig, at) -> None:
    from danka.rewards.specs import check_reward_specs, check_reward_weights  # torch-free

    if not cfg.reward.timeout_s > 0:
        at.fail("reward.timeout_s", "must be > 0", "e.g. 30")
    if (judge := cfg.reward.judge_template) is not None:
        try:
            check_template("reward.judge_template", judge, ["prompt", "completion"])
        except UserError as err:
            at.fail("reward.judge_template", err.what, err.fix or "")
    rm = cfg.reward.model_weight if cfg.model.reward_model_name_or_path else None
    # their errors name a bare key, said at the file's line or the override by
    # danka.config.load.located, which runs around validation
    check_reward_specs(cfg.reward.functions)
    check_reward_weights(cfg.reward.functions, rm)
    ob, new = cfg.reward.overlong_buffer, cfg.trainer.max_new_tokens
    if not 0 <= ob.length < new:
        at.fail(
            "reward.overlong_buffer.length",
            f"must be in [0, max_new_tokens={new}), got {ob.length}",
            "e.g. a quarter of trainer.max_new_tokens; 0 turns the penalty off",
        )
    if ob.penalty < 0:
        at.fail("reward.overlong_buffer.penalty", f"must be >= 0, got {ob.penalty}", "e.g. 1.0")


def check_outputs(cfg: DankaConfig, at) -> None:
    """checkpoint, eval and logging: cadences and file names."""
    ck, ev = cfg.checkpoint, cfg.eval
    if ck.save_steps is not None and ck.save_steps < 0:
        at.fail("checkpoint.save_steps", "must be >= 0 or null", "null = every 10% of the run")
    if ck.save_minutes is not None and ck.save_minutes <= 0:
        at.fail("checkpoint.save_minutes", "must be > 0 or null", "e.g. 30")
    if ck.keep_last is not None and ck.keep_last < 1:
        at.fail(
            "checkpoint.keep_last", "must be >= 1 or null", "e.g. 3 (null keeps every checkpoint)"
        )
    if ev.every_steps < 0:
        at.fail("eval.every_steps", "must be >= 0", "0 = at the start and the end only")
    if not ev.every_minutes >= 0:  # also NaN
        at.fail("eval.every_minutes", "must be >= 0", "0 = off; e.g. 2 for a curve over time")
    if ev.subset_size < 0:
        at.fail("eval.subset_size", "must be >= 0", "0 = every held-out prompt; e.g. 500")
    if ev.max_new_tokens is not None and ev.max_new_tokens < 1:
        at.fail("eval.max_new_tokens", "must be >= 1 or null", "null = trainer.max_new_tokens")
    at.size_or_auto("eval.probe_max_new_tokens", ev.probe_max_new_tokens, 1, "e.g. 96, or auto")
    if cfg.logging.log_interval < 1:
        at.fail("logging.log_interval", "must be >= 1", "e.g. 1 or 10")
    if not cfg.logging.result_file or "/" in cfg.logging.result_file:
        at.fail(
            "logging.result_file",
            f"{cfg.logging.result_file!r} is not a file name",
            "a plain file name written inside output_dir, e.g. result.json",
        )


# characters a token may hold, at most, over a whole prompt: English runs about 4 a
# token; no tokenizer for chat packs 32 a token into every token of a prompt
PROBE_CHARS_PER_TOKEN = 32


def check_probe_prompts(cfg: DankaConfig, at) -> None:
    """eval.probe_prompts: each one a question. There is no tokenizer before the model
    loads, so the length bound here is in characters, a conservative one (more than
    PROBE_CHARS_PER_TOKEN characters per token of trainer.max_length cannot fit); the
    exact count follows with the tokenizer, still before the model loads
    (danka.step.heldout.probe_prompts, from danka.trainer.components.build_prompts)."""
    most = cfg.trainer.max_length * PROBE_CHARS_PER_TOKEN
    for i, text in enumerate(cfg.eval.probe_prompts):
        key = f"eval.probe_prompts[{i}]"
        if not text.strip():
            fix = "write a question, or remove it (no probe_prompts: danka's own set)"
            at.fail(key, "is empty: the probe would ask the model nothing", fix)
        if len(text) > most:
            what = f"is {len(text):,} characters, more than trainer.max_length tokens hold"
            at.fail(key, what, "shorten the probe prompt, or raise trainer.max_length")


def check_agent(cfg: DankaConfig, at) -> None:
    """agent.tools / agent.environment: the agent settings, and a prompt budget that
    leaves room for the whole multi-turn response (all turns + tool responses)."""
    a, t, d = cfg.agent, cfg.trainer, cfg.data
    if not (a.tools or a.environment):
        return
    from danka.agent.setup import check_agent_config

    check_agent_config(a, max_new_tokens=t.max_new_tokens)
    if a.tool_sandbox not in ("auto", "none") and "python" in a.tools:
        from danka.agent.sandbox import choose

        choose(a.tool_sandbox)  # an explicit sandbox that cannot work: refused now
    total = a.max_total_tokens or t.max_new_tokens
    if d.max_prompt_length + total > t.max_length:
        at.fail(
            "agent.max_total_tokens",
            f"data.max_prompt_length ({d.max_prompt_length}) + the multi-turn response budget "
            f"({total}) exceeds trainer.max_length ({t.max_length})",
            "raise trainer.max_length, or set data.max_prompt_length to "
            f"{max(1, t.max_length - total)} or less",
        )
    if cfg.sampling.dynamic_sampling:
        at.fail(
            "sampling.dynamic_sampling",
            "is not supported with agent.tools / agent.environment yet",
            "set sampling.dynamic_sampling: false",
        )


def check_rm(cfg: DankaConfig, at) -> None:
    c = cfg.rm.center_rewards_coefficient
    if c is not None and c < 0:
        at.fail("rm.center_rewards_coefficient", f"must be >= 0, got {c}", "e.g. 0.01, or null")
    for key in ("chosen_key", "rejected_key", "margin_key"):
        if not getattr(cfg.rm, key):
            at.fail(f"rm.{key}", "must name a column", f"e.g. rm.{key}: {key.split('_')[0]}")
    if cfg.rm.chosen_key == cfg.rm.rejected_key:
        at.fail("rm.rejected_key", "is the same column as rm.chosen_key", "name two columns")


# in this order (the first failing check names its key)
CHECKS = (
    check_model,
    check_data,
    check_trainer_sizes,
    check_speed,
    check_rollout,
    check_trainer_batches,
    check_trainer_algorithm,
    check_loss_and_optim,
    check_sampling,
    check_lora,
    check_reward,
    check_outputs,
    check_probe_prompts,
    check_agent,
    check_rm,
)
