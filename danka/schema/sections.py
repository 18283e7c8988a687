"""The typed config. Every section is a dataclass; every field has help text.

Sections by concern: ``model``, ``trainer`` (the algorithm and the shape of a step),
``sampling``, ``optim``, ``loss``, ``checkpoint``, ``eval``, ``speed``, ``lora``,
``rollout``, ``agent``, ``data``, ``reward``, ``logging``, ``backend``, ``rm``. The
single-card tutorial's layout (``model``/``trainer``/``lora``/``backend``/``data``/
``logging``) is accepted as written: its keys are field names here; keys that moved (out
of ``trainer``, the agent's out of ``rollout``, packing out of ``data``) and the retired
``backend`` switches are read through danka/schema/moved.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A field with help text (shown by ``--print-config`` and in errors)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class TokenizerKwargs:
    model_max_length: int | None = _f(None, "override the tokenizer's maximum context length")
    padding_side: str = _f("left", "left (needed for batched generation) or right")


@dataclass
class GradientCheckpointingKwargs:
    use_reentrant: bool = _f(False, "torch.utils.checkpoint reentrant mode (False is recommended)")


@dataclass
class ModelConfig:
    actor_model_name_or_path: str = _f("", "hub id, local folder or .gguf file of the policy")
    critic_model_name_or_path: str | None = _f(
        None, "critic base for PPO; null or the actor's = a LoRA critic on the actor's base"
    )
    reward_model_name_or_path: str | None = _f(
        None, "reward model; the actor's own path = a judge sharing the actor's base weights"
    )
    reward_model_type: str = _f("auto", "auto | classifier (trained score head) | judge")
    torch_dtype: str = _f("auto", "auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16")
    use_flash_attention_2: bool = _f(False, "use flash-attention 2 (pip install danka[flash])")
    attn_implementation: str | None = _f(None, "sdpa (default) | eager | flash_attention_2")
    trust_remote_code: bool = _f(False, "run model code from the hub; off unless you trust it")
    load_in_4bit: bool = _f(False, "QLoRA: 4-bit NF4 frozen base (pip install danka[bnb]; GPU)")
    load_in_8bit: bool = _f(False, "8-bit frozen base (pip install danka[bnb]; GPU)")
    tokenizer_kwargs: TokenizerKwargs = field(default_factory=TokenizerKwargs)
    use_gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    gradient_checkpointing_kwargs: GradientCheckpointingKwargs = field(
        default_factory=GradientCheckpointingKwargs
    )
    device: str = _f("auto", "auto (cuda if available) | cpu | cuda | cuda:N")


@dataclass
class KLConfig:
    coef: float = _f(0.0, "KL coefficient (0 = no KL to the reference policy)")
    estimator: str = _f("k3", "k1 | k2 | k3 | abs")
    mode: str = _f("loss", "loss (added to the policy loss) | reward (subtracted from rewards)")
    adaptive: bool = _f(False, "adapt the coefficient towards target_kl (Ziegler et al. 2019)")
    target: float = _f(
        0.1, "target of the adaptive controller: mean KL per response token (as verl)"
    )
    horizon: int = _f(10000, "horizon of the adaptive controller")


@dataclass
class RolloutCorrectionConfig:
    mode: str = _f(
        "none",
        "rollout/trainer mismatch correction: none | token_tis (truncated importance "
        "weight per token, TRL) | seq_mask (drop sequences whose ratio is off, verl)",
    )
    cap: float | None = _f(
        None,
        "token_tis: largest token weight (null = 3.0, TRL); seq_mask: keep a sequence "
        "whose ratio pi_old/pi_rollout is within [1/cap, cap] (null = 2.0, verl)",
    )


@dataclass
class TrainerConfig:
    """The algorithm and the shape of a step (the tutorial's ``trainer`` keys live here)."""

    algorithm: str = _f(
        "grpo",
        "ppo (critic + GAE) | grpo | dr_grpo | rloo | reinforce_plus_plus | "
        "reinforce_plus_plus_baseline | gspo",
    )
    advantage_estimator: str | None = _f(None, "override the estimator the algorithm implies")
    num_epochs: int = _f(1, "passes over the training prompts")
    total_steps: int | None = _f(None, "stop after this many steps (overrides num_epochs)")
    max_train_minutes: float | None = _f(
        None, "end early (checkpoint + final eval) after this time"
    )
    batch_size: int = _f(8, "prompts per step")
    samples_per_prompt: int | None = _f(None, "responses per prompt (null: 1 for ppo, 8 otherwise)")
    mini_batch_size: int | None = _f(None, "prompts per optimizer step (null = batch_size)")
    micro_batch_size: int | str = _f(
        8,
        "sequences per forward/backward (gradient accumulation); auto = the largest the memory "
        "plan fits on the GPU (its free memory, or speed.gpu_memory), 8 on a CPU",
    )
    ppo_epochs: int = _f(1, "passes over each step's samples")
    max_length: int = _f(512, "prompt + response tokens")
    max_new_tokens: int = _f(128, "response tokens")
    gamma: float = _f(1.0, "discount")
    lam: float = _f(0.95, "GAE lambda")
    critic_warmup_steps: int = _f(
        0, "ppo: update only the critic for the first N steps (verl's critic_warmup)"
    )
    rollout_correction: RolloutCorrectionConfig = field(
        default_factory=lambda: RolloutCorrectionConfig()
    )
    max_bad_steps: int = _f(3, "non-finite steps in a row before the run stops")
    seed: int = _f(42, "random seed")


@dataclass
class SamplingConfig:
    """How rollouts sample (held-out evaluation is always greedy)."""

    temperature: float = _f(1.0, "sampling temperature for rollouts")
    top_p: float = _f(1.0, "nucleus sampling")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    dynamic_sampling: bool = _f(
        False,
        "DAPO dynamic sampling (verl filter_groups): drop groups whose rewards are all equal "
        "and sample more prompts until the step has batch_size informative groups",
    )
    max_sampling_rounds: int = _f(
        3,
        "dynamic_sampling: generation rounds per step at most (1 = no extra round); at the "
        "cap the step trains on the informative groups it has",
    )


@dataclass
class OptimConfig:
    """The optimisers (AdamW) and their schedule."""

    lr: float = _f(1e-5, "actor learning rate")
    critic_lr: float = _f(1e-5, "critic learning rate (ppo)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    warmup_steps: int = _f(0, "linear warm-up steps")
    lr_scheduler: str = _f("constant", "constant | cosine | linear")
    max_grad_norm: float = _f(1.0, "gradient clipping (0 = off)")


@dataclass
class LossConfig:
    """The policy and value losses, the KL term, which tokens train."""

    policy_loss: str = _f("vanilla", "vanilla (PPO clip) | gspo")
    agg_mode: str = _f(
        "token-mean",
        "token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm",
    )
    clip_ratio_low: float = _f(0.2, "PPO clip range below 1")
    clip_ratio_high: float = _f(0.2, "PPO clip range above 1 (clip-higher: raise it)")
    dual_clip_c: float | None = _f(3.0, "dual-clip constant for negative advantages (null = off)")
    value_clip: float = _f(0.2, "critic value clip range")
    vf_coef: float = _f(0.5, "weight of the value loss (ppo)")
    entropy_coef: float = _f(0.0, "entropy bonus")
    kl: KLConfig = field(default_factory=KLConfig)
    mask_truncated: bool = _f(
        False, "samples that hit max_new_tokens get no loss (TRL mask_truncated_completions)"
    )


@dataclass
class CheckpointConfig:
    save_steps: int | None = _f(
        None, "checkpoint every K steps (null = every 10% of the run; 0 = only at the end)"
    )
    save_minutes: float | None = _f(
        None, "also checkpoint when this many minutes passed since the last save (null = off)"
    )
    keep_last: int | None = _f(None, "keep only the newest N checkpoints")


@dataclass
class SpeedConfig:
    """Speed and memory; none of these changes what is computed beyond rounding."""

    logprob_chunk_size: int | str = _f(
        "auto",
        "tokens per chunk of the memory-lean log-prob head (a chunk's fp32 logits are "
        "chunk x vocabulary x 4 bytes); auto = on a GPU the largest of 1024, 512, 256, 128 "
        "whose logits take <= 640 MiB (1024 for a 152k vocabulary) that the memory plan fits, "
        "1024 on a CPU; the log-probs do not depend on it",
    )
    fused_logprob_head: bool = _f(
        True,
        "CUDA: run the log-prob head's per-chunk softmax work torch.compile'd (fewer passes "
        "over the float32 logits); false = the same maths eagerly",
    )
    shared_prefix_forward: bool = _f(
        True,
        "CPU: in the training forward, run a prompt prefix the rows of a micro-batch share "
        "(a GRPO group's prompt, a system turn) once; false = every row in full (same numbers "
        "up to rounding)",
    )
    auto_micro_batch: bool = _f(
        True,
        "on out-of-memory in the log-probs or the update, halve micro_batch_size and run the "
        "phase again (kept for the rest of the run); false = stop with the explanation",
    )
    gpu_memory: str | None = _f(
        None,
        "plan trainer.micro_batch_size: auto for a card of this size and cap this process to it "
        "(e.g. 24GiB: a smaller card on a larger one); null = the GPU's free memory at start",
    )
    packed_update: bool | None = _f(
        None,
        "null = on a CUDA GPU: the log-prob, value and update forwards run padding-free (a "
        "micro-batch's sequences end to end, varlen attention, micro_batch_size x the planned "
        "sequence length in real tokens, LoRA computed in the model's dtype); false = padded "
        "micro-batches of micro_batch_size sequences; true = padding-free on any device",
    )
    packing: bool = _f(False, "pack a micro-batch's sequences into rows without padding")
    max_packed_length: int = _f(4096, "tokens per packed row (speed.packing)")
    preflight: bool = _f(False, "run the worst-case shapes once before training")
    tf32: bool = _f(
        False, "TF32 matmuls on Ampere+ GPUs (torch.set_float32_matmul_precision('high'))"
    )
    compile: bool = _f(False, "torch.compile the training forward (CUDA; refused elsewhere)")
    cuda_graphs: bool = _f(
        False,
        "CUDA, padding-free forwards: each micro-batch's decoder body (forward and backward) "
        "replayed from a CUDA graph captured once per phase at the micro-batch's token budget, "
        "instead of launching every kernel from Python (H100, GSM8K step: the LoRA update 5-12% "
        "faster, full-parameter 4-12% slower); a micro-batch under half the budget runs "
        "eagerly; off with speed.compile or gradient checkpointing (refused off CUDA)",
    )
    cpu_threads: int | str = _f(
        "auto",
        "CPU threads torch computes with; auto = the CPUs this process may use (affinity, "
        "OMP_NUM_THREADS, cgroup quota), not following the load (the count changes results "
        "in their last bits; a run must repeat; sharing is done by how threads wait, see "
        "docs/memory_and_speed.md); N = exactly N",
    )


@dataclass
class LoraConfig:
    enable_lora: bool = _f(True, "train LoRA adapters on a frozen base")
    lora_r: int = _f(8, "LoRA rank")
    lora_alpha: float = _f(16, "LoRA alpha (scaling = alpha / r)")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    target_modules: list[str] | str = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names to adapt, or all-linear",
    )


@dataclass
class FsdpBackend:
    sharding: str = _f(
        "auto",
        "under torchrun (N > 1): auto = replicate models whose weights take <= 4 GiB (each "
        "rank a whole copy, gradients all-reduced once per optimiser step) and FSDP2-shard "
        "larger ones; shard = always FSDP2; replicate = never shard",
    )


@dataclass
class VllmBackend:
    enable_vllm: bool = _f(
        False,
        "true = the vLLM rollout engine (rollout.engine: vllm: colocated on the training GPU, "
        "the policy's weights synced into it every step; pip install 'danka[vllm]'); "
        "false = rollout.engine decides",
    )


@dataclass
class BackendConfig:
    fsdp: FsdpBackend = field(default_factory=FsdpBackend)
    vllm: VllmBackend = field(default_factory=VllmBackend)


@dataclass
class RolloutConfig:
    engine: str = _f(
        "auto",
        "auto (fast on GPU, hf on CPU) | hf | fast | vllm (optional package, colocated: "
        "its own weight copy and KV cache, asleep in updates unless rollout.keep_cache: true)",
    )
    generation_batch_size: int | str = _f(
        0,
        "sequences per generate call, in whole groups of samples_per_prompt (0 = all at "
        "once; the fast engine decodes 256 at a time); auto = the most the memory plan fits "
        "on the GPU (the KV cache is sized to it), 0 on a CPU",
    )
    keep_cache: bool | None = _f(
        None,
        "fast engine: keep its KV cache, buffers and CUDA graphs between calls (true), or free "
        "them before every update (null or false, the default: the update gets the memory; "
        "the next rollout captures its one graph again, milliseconds); vllm engine: null or "
        "false (the default) = vLLM's sleep mode, its KV cache and weights freed after every "
        "rollout and the weights sent again before the next (the update gets the memory), "
        "true = vLLM keeps its share all run; hf engine: null or false (it keeps no cache "
        "between calls; true is refused at start-up)",
    )
    compile: bool = _f(
        False,
        "fast engine: torch.compile its decode layer (fused elementwise kernels inside its CUDA "
        "graphs: 1.2-1.4x tok/s on an H200; the first call compiles, 7-10 s for SmolLM2); "
        "other engines refuse it",
    )
    shared_prefix: bool = _f(
        True,
        "HF engine: prefill the prompt tokens a call's rows share (a system turn, a GRPO "
        "group's prompt) once and reuse their cache; false = plain generate (same tokens)",
    )
    decode_attention: str = _f(
        "auto",
        "fast engine: the decode step's attention kernel: auto (triton on a CUDA GPU when the "
        "triton package imports, else sdpa) | sdpa (PyTorch's memory-efficient kernel with a "
        "mask) | triton (danka's split-K kernel over the live slots; CUDA + triton); other "
        "engines refuse a value set here",
    )
    lora_compute: str = _f(
        "auto",
        "fast engine, LoRA runs: the adapter's path in the rollout: auto (= base) | base (the "
        "low-rank matmuls in the model's bf16, unmerged: A folded into the projection's GEMM, "
        "B added by one kernel; no weight copy) | adapter (peft's fp32 low-rank matmuls, the "
        "training forward's arithmetic; slower) | merge (W + s*B@A merged into bf16 copies at "
        "every rollout: the speed of a plain model; bf16 rounds away part of small deltas, "
        "logged as rollout/logprob_gap; models up to ~1 GiB of copies). vllm engine: auto "
        "(= merge, adapter on a 4-bit base) | merge (W + s*B@A sent into vLLM's weights each "
        "step) | adapter (the adapter saved and loaded as a vLLM LoRA each step)",
    )


@dataclass
class AgentConfig:
    """Multi-turn rollouts: tools offered to the model, or an environment it acts in
    (docs/tools_and_agents.md); neither set = single-turn sampling."""

    tools: list[str] = _f(
        [], "tools offered to the model: calculator | python | path/to/file.py:function"
    )
    environment: str | None = _f(
        None, "multi-turn environment path/to/file.py:Class (reset(row), step(text))"
    )
    max_turns: int = _f(4, "assistant turns per sample with tools or an environment")
    max_tool_calls: int = _f(8, "tool calls per sample; a turn going over ends the sample")
    max_total_tokens: int = _f(
        0, "response tokens over all turns incl. tool responses (0 = trainer.max_new_tokens)"
    )
    tool_timeout_s: float = _f(10.0, "wall-clock limit per tool call (the worker is killed)")
    tool_sandbox: str = _f(
        "auto",
        "where the builtin python tool runs model-written code: auto (bwrap or Linux "
        "namespaces, whichever works; else unconfined with a loud warning) | bwrap | "
        "namespaces | none (unconfined: the code can read and write your files; you accept "
        "the risk)",
    )
    tool_max_chars: int = _f(2000, "tool responses longer than this are cut")
    tool_prompt: str = _f(
        "auto",
        "how the tools are offered: auto (the chat template's own tool format if it has one, "
        "else hermes) | hermes (Qwen2.5's system text) | smollm (SmolLM2-Instruct's) | your "
        "own system text with {schemas}",
    )
    tool_demo: str = _f(
        "auto",
        "worked examples (question, <tool_call>, <tool_response>, answer) before every prompt: "
        "auto (the builtin tools' own, e.g. calculator's) | none | path/to/demo.json (messages)",
    )
    kv_reuse: bool | None = _f(
        None,
        "multi-turn rollouts: keep each sample's KV cache across turns and prefill only the "
        "new tool/environment tokens (same tokens as a full re-prefill; fast engine only). "
        "null = on with the fast engine, off with others; true = refused without the fast "
        "engine; false = re-prefill every turn",
    )


@dataclass
class DataConfig:
    train_dataset: str = _f("", "jsonl/json/parquet file, saved dataset folder or hub name")
    eval_dataset: str | None = _f(None, "held-out prompts (null: none, or eval_size split off)")
    train_split: str = _f(
        "train", "split read from a dataset folder or hub name for training (files have none)"
    )
    eval_split: str = _f(
        "test", "split read from a dataset folder or hub name for evaluation (files have none)"
    )
    task: str | None = _f(None, "generate prompts offline instead: arithmetic | calculator")
    task_kwargs: dict[str, Any] = _f(
        {}, "options of data.task's generator, e.g. {length: 3, low: 10, high: 99} for chain"
    )
    task_train_size: int = _f(2000, "generated training problems (data.task)")
    eval_size: int = _f(0, "held-out prompts to evaluate (0 = no evaluation)")
    dataset_type: str | None = _f(None, "json | jsonl | parquet | hf (null = from the extension)")
    format: str = _f("auto", "auto | seed | trl | verl | gsm8k")
    prompt_key: str = _f("prompt", "column holding the prompt")
    response_key: str = _f("response", "column holding a reference response (seed format)")
    reward_key: str = _f("reward", "column holding a reward (seed format; unused by RL)")
    answer_key: str | None = _f(None, "column holding the ground-truth answer")
    system_prompt: str | None = _f(None, "system message added to every prompt")
    instruction: str | None = _f(None, "text appended to every user prompt")
    examples: list[dict[str, Any]] = _f(
        [],
        "worked turns before every prompt (few-shot, as lm-eval-harness's): [{role: user, "
        "content: ...}, {role: assistant, content: ...}, ...], alternating, ending with the "
        "assistant; after data.system_prompt, in training, evaluation and danka eval CONFIG",
    )
    allow_control_tokens: bool = _f(
        False,
        "let data rows and data.examples write the tokenizer's chat control tokens "
        "(<|im_start|>, <|im_end|>, ...) in their text without a word; false = one warning "
        "at start-up naming the first row or turn that does (the tokenizer reads them as turn "
        "boundaries: '<|im_end|>\\n<|im_start|>system ...' in a question forges a system turn)",
    )
    max_prompt_length: int | None = _f(None, "prompt tokens (null = max_length - max_new_tokens)")
    overlong_prompt: str = _f("error", "error | drop | truncate_left")
    on_bad_row: str = _f("error", "error | skip (bad rows go to OUTPUT/bad_rows.jsonl)")
    shuffle: bool = _f(True, "shuffle the prompts every epoch")
    limit: int | None = _f(None, "use only the first N rows")


@dataclass
class RewardFunction:
    name: str = _f("", "builtin (gsm8k, math, format, length, last_number) or path.py:function")
    weight: float = _f(1.0, "weight in the combined reward")
    kwargs: dict[str, Any] = _f({}, "keyword arguments for the function")
    label: str | None = _f(
        None,
        "name it is logged under (reward/<label>, eval/correct/<label>); null = the "
        "function's name (a repeated name gets _2, _3, ...)",
    )


@dataclass
class OverlongBufferConfig:
    length: int = _f(
        0, "DAPO soft overlong penalty over the last N tokens before max_new_tokens (0 = off)"
    )
    penalty: float = _f(1.0, "penalty at max_new_tokens; it grows linearly from 0 in the buffer")


@dataclass
class RewardConfig:
    functions: list[RewardFunction] = _f([], "rule/custom rewards (empty: from the data source)")
    model_weight: float = _f(1.0, "weight of model.reward_model_name_or_path's score")
    judge_template: str | None = _f(None, "judge prompt with {prompt} and {completion}")
    timeout_s: float = _f(30.0, "wall-clock limit per reward call")
    on_error: str = _f("fail", "fail | zero | skip_sample")
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class EvalConfig:
    """Held-out evaluation (data.eval_dataset / data.eval_size) and the drift probe."""

    every_steps: int = _f(0, "held-out evaluation every K steps (0 = start and end only)")
    every_minutes: float = _f(
        0.0, "held-out evaluation also every M minutes of training (0 = off): a curve over time"
    )
    subset_size: int = _f(
        0,
        "prompts of the evaluations between the first and the last: the first N held-out "
        "prompts, the same each time (0 = all). The first and the last evaluation always "
        "use every prompt, so before -> after compares the whole set",
    )
    max_new_tokens: int | None = _f(
        None, "response tokens at evaluation (null = trainer.max_new_tokens)"
    )
    probe_prompts: list[str] = _f(
        [],
        "general prompts answered greedily at every evaluation (the drift probe: length, "
        "empty / marker-only / looping answers, KL to the step-0 answers); empty = danka's "
        "built-in set",
    )
    probe_max_new_tokens: int | str = _f(
        "auto",
        "response tokens of a probe answer; auto = 96 on a GPU, 32 on a CPU (there the probe's "
        "few answers decode one token at a time and 96 of them cost more than the held-out "
        "evaluation; 32 still show looping and length)",
    )


@dataclass
class LoggingConfig:
    log_interval: int = _f(1, "write a train.log line every N steps")
    wandb_project: str | None = _f(None, "wandb project (null disables; pip install danka[wandb])")
    mlflow_experiment: str | None = _f(None, "mlflow experiment (pip install danka[mlflow])")
    tensorboard: bool = _f(True, "TensorBoard events under OUTPUT/tensorboard")
    save_completions: int = _f(8, "sample completions written per step (0 = none)")
    progress: bool = _f(True, "live progress display")
    verbose: bool = _f(
        False,
        "every metric in each step's train.log line, also on the console (danka train "
        "--verbose); false = a short line (loss, reward, kl, entropy, answer length, step "
        "time) in train.log, and on the console only the progress line. metrics.jsonl always "
        "holds every metric",
    )
    result_file: str = _f("result.json", "final held-out accuracy and timing, in OUTPUT")


@dataclass
class RMConfig:
    chosen_key: str = _f("chosen", "danka rm: column of the preferred answer (text or messages)")
    rejected_key: str = _f("rejected", "danka rm: column of the worse answer")
    margin_key: str = _f("margin", "danka rm: optional column with a per-pair margin (number)")
    center_rewards_coefficient: float | None = _f(
        None, "danka rm: weight of mean((r_c + r_r)^2), pulling rewards to mean 0 (TRL; 0.01)"
    )


@dataclass
class DankaConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    output_dir: str = _f("output", "where logs, metrics and checkpoints go")
    rm: RMConfig = field(default_factory=RMConfig)

    # typed configs from Python (danka.Config.from_dict / from_yaml)
    @classmethod
    def from_dict(cls, data: dict, overrides: list[str] | None = None) -> DankaConfig:
        """A validated, read-only config from a mapping laid out as the YAML is
        (``{"model": {...}, "trainer": {...}, "data": {...}}``) plus ``key=value``
        overrides; relative paths are read from the current folder."""
        return LOADERS["from_dict"](data, overrides)

    @classmethod
    def from_yaml(cls, path: str, overrides: list[str] | None = None) -> DankaConfig:
        """:meth:`from_dict` for a YAML file; relative paths are read from its folder."""
        return LOADERS["from_yaml"](path, overrides)[0]


# danka.config.load registers its loaders here (it imports this module, not the reverse;
# importing danka.schema.sections runs danka/config/__init__.py, which imports load first)
LOADERS: dict[str, Any] = {}
