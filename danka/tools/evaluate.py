"""``danka eval``: accuracy of a model (+ adapter) on prompts, judged by a reward function.

K = 1: one greedy answer per prompt; accuracy = mean of ``correct``.
K > 1: K answers per prompt sampled at temperature 1 (``--temperature T``: at T, e.g. the
training temperature; ``accuracy`` = pass@1 = the mean accuracy of a sampled answer, the
held-out number a sampling policy moves while greedy may already be saturated); pass@k
for k = 1, 2, 4, ..., K with the unbiased estimator of Chen et al. 2021
(https://arxiv.org/abs/2107.03374, eq. 1)::

    pass@k = mean over prompts of 1 - C(n - c, k) / C(n, k)

(n samples, c of them correct). An answer is correct when the first reward function
scores it at least ``threshold`` (1.0: the score of a right answer for every builtin rule
reward): danka.rewards.scoring, the rule the trainer's held-out evaluation uses too.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.rewards.scoring import score_samples
from danka.types import PromptRow

KEEP_SAMPLES = 16


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k answers drawn without replacement from n (c of
    them correct) is correct: ``1 - C(n-c, k) / C(n, k)``, computed as the stable product
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(samples: int) -> list[int]:
    """k values to report: powers of two below ``samples``, and ``samples`` itself."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return [*ks, samples]


def summarize(
    correct: list[list[bool]],
    lengths: list[list[int]],
    truncated: list[list[bool]],
    scores: list[list[float]],
) -> dict[str, Any]:
    """Accuracy (greedy) or pass@k (sampled), mean reward, response length, truncation."""
    n_samples = len(correct[0]) if correct else 0
    flat = lambda xs: [x for row in xs for x in row]  # noqa: E731
    total = max(1, len(flat(correct)))
    result: dict[str, Any] = {
        "n": len(correct),
        "samples": n_samples,
        "accuracy": sum(flat(correct)) / total,
        "mean_reward": sum(flat(scores)) / total,
        "response_length": sum(flat(lengths)) / total,
        "truncation_rate": sum(flat(truncated)) / total,
    }
    if n_samples > 1:
        result["pass@k"] = {
            f"pass@{k}": sum(pass_at_k(len(c), sum(c), k) for c in correct) / len(correct)
            for k in ks_for(n_samples)
        }
        result["accuracy"] = result["pass@k"]["pass@1"]  # equals the mean of correct
    return result


def evaluate_rows(
    model: Any,
    tokenizer: Any,
    rows: list[PromptRow],
    rewards: Any,
    *,
    samples: int = 1,
    max_new_tokens: int = 256,
    system: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
    threshold: float = 1.0,
    seed: int = 0,
    batch_size: int = 16,
    tools: Any = None,
    base_dir: str | Path = ".",
    temperature: float | None = None,
    log: Any = None,
    on_progress: Any = None,
) -> dict[str, Any]:
    """Generate ``samples`` answers per row (greedy for 1, temperature 1 otherwise; or at
    ``temperature`` when given, top-p 1), ``batch_size`` sequences per generate call, score
    them, and summarize; ``completions`` holds the first rows' first answers. With
    ``tools`` (rollout settings) the answers come from the training's agent loop: rewards
    score the final answer (with the turns as ``messages``, as in training),
    and the result holds the ``agent/*`` metrics and each kept answer's ``messages``.
    ``log``: where progress lines go (``[eval] 48/200 prompts | ...``; None = silent).

    Each batch is scored as soon as it is generated, and ``on_progress(result)`` gets the
    summary so far (``partial``: true, ``answered`` of ``prompts``). A stop by signal
    (SIGTERM under the CLI: danka.interrupt; Ctrl-C) ends generation there and returns
    the partial result of the prompts answered, with ``stopped`` naming the signal."""
    from danka.interrupt import stop_code
    from danka.logging.progress import WorkProgress
    from danka.rollout.base import AnswerOptions
    from danka.tools.generate import generate_batch, tool_generate_batch

    gen = AnswerOptions(
        system=system,
        instruction=instruction,
        examples=tuple(dict(m) for m in examples),
        max_new_tokens=max_new_tokens,
        n=samples,
        seed=seed,
        temperature=(0.0 if samples == 1 else 1.0) if temperature is None else temperature,
        top_p=1.0,
        batch_size=max(1, batch_size // samples),
    )
    kind = "greedy" if gen.temperature <= 0 else f"{samples} sampled at T={gen.temperature:g}"
    if log is not None:
        log(f"[eval] {len(rows)} prompts, {kind}, up to {max_new_tokens} new tokens each")
    progress = WorkProgress(len(rows), "eval", unit="prompts", log=log, enabled=log is not None)
    done = _Answered(rewards, threshold, tools is not None, len(rows), on_progress)
    try:
        if tools is not None:
            items, done.metrics = tool_generate_batch(
                model, tokenizer, rows, tools, gen, base_dir=base_dir
            )
            progress.advance(len(rows))
            done.add(items)
        else:
            generate_batch(model, tokenizer, rows, gen, progress=progress, on_batch=done.add)
    except (KeyboardInterrupt, SystemExit) as stop:
        code = stop_code(stop)
        if code is None:  # an exit that is no signal
            raise
        return done.result(stopped=signal.Signals(code - 128).name)
    return done.result()


class _Answered:
    """The scored answers so far (one entry per prompt, in order) and the summary of them."""

    def __init__(self, rewards: Any, threshold: float, tools: bool, total: int, on_progress):
        self.rewards, self.threshold, self.tools, self.total = rewards, threshold, tools, total
        self.on_progress = on_progress
        self.items: list[tuple[dict, list[float], list[bool]]] = []
        self.per_fn: dict[str, float] = {}  # correct answers per reward function
        self.metrics: dict[str, float] = {}

    def add(self, items: list[dict[str, Any]]) -> None:
        scores, correct, per_fn = score_samples(
            [it["row"] for it in items],
            [it["prompt"] for it in items],
            [it["completions"] for it in items],
            self.rewards,
            self.threshold,
            messages=[it["trajectories"] for it in items] if self.tools else None,
        )
        answers = sum(len(c) for c in correct)
        for name, fraction in per_fn.items():
            self.per_fn[name] = self.per_fn.get(name, 0.0) + fraction * answers
        self.items += list(zip(items, scores, correct))
        if self.on_progress is not None and len(self.items) < self.total:
            self.on_progress(self.result())

    def result(self, stopped: str | None = None) -> dict[str, Any]:
        items = [it for it, _, _ in self.items]
        scores = [s for _, s, _ in self.items]
        correct = [c for _, _, c in self.items]
        result = summarize(
            correct,
            [it["response_tokens"] for it in items],
            [it["truncated"] for it in items],
            scores,
        )
        answers = max(1, sum(len(c) for c in correct))
        result["correct_per_function"] = {k: v / answers for k, v in self.per_fn.items()}
        result.update(self.metrics)
        result["completions"] = [
            {
                "index": it["index"],
                "prompt": it["prompt"],
                "completion": str(it["completions"][0]),
                **({"messages": it["trajectories"][0]} if self.tools else {}),
                "ground_truth": it["row"].ground_truth,
                "reward": s[0],
                "correct": c[0],
            }
            for it, s, c in self.items[:KEEP_SAMPLES]
        ]
        if len(self.items) < self.total:  # says so, in the result and in its file
            result.update(partial=True, answered=len(self.items), prompts=self.total)
        if stopped:
            result["stopped"] = stopped
        return result


def _from_config(config: str, overrides: list[str]) -> dict[str, Any]:
    from danka.config import load_config
    from danka.data.splits import load_rows
    from danka.rewards.combine import reward_specs

    cfg, base_dir = load_config(config, overrides)
    train, held = load_rows(cfg, base_dir, Path(cfg.output_dir))
    rows = held or train
    t = cfg.trainer
    return {
        "model": cfg.model.actor_model_name_or_path,
        "rows": rows,
        "base_dir": base_dir,
        "specs": reward_specs(cfg, rows),
        "system": cfg.data.system_prompt,
        "instruction": cfg.data.instruction,
        "examples": cfg.data.examples,
        "timeout_s": cfg.reward.timeout_s,
        "max_new_tokens": cfg.eval.max_new_tokens or t.max_new_tokens,
        "data": cfg.data.eval_dataset or cfg.data.task or cfg.data.train_dataset,
        "trust_remote_code": cfg.model.trust_remote_code,
        "agent": cfg.agent,
        "output_dir": cfg.output_dir,
    }


def _from_args(
    model: str | None,
    adapter: str | None,
    data: str | None,
    reward: str | None,
    split: str = "test",
) -> dict[str, Any]:
    from danka.data.formats import ReadOptions, load_prompt_rows
    from danka.rewards.combine import RewardSpec

    if data is None:
        raise UserError(
            "no data given",
            where="danka eval",
            fix="danka eval --model M --data FILE --reward gsm8k (or danka eval CONFIG)",
        )
    if reward is None:
        raise UserError(
            "no reward function given",
            where="danka eval",
            fix="--reward gsm8k | math | last_number | path/to/file.py:function",
        )
    if model is None and adapter is None:
        raise UserError("no model given", where="danka eval", fix="pass --model M (and --adapter)")
    # a dataset folder or hub name is read with its held-out split (files have none)
    rows = load_prompt_rows(data, read=ReadOptions(split=split)).rows
    return {
        "model": model,
        "rows": rows,
        "base_dir": Path.cwd(),
        "specs": [RewardSpec(name=reward)],
        "system": None,
        "instruction": None,
        "examples": [],
        "timeout_s": 30.0,
        "max_new_tokens": 256,
        "data": data,
        "trust_remote_code": False,
        "agent": None,
    }


def run_eval(
    *,
    config: str | None = None,
    overrides: list[str] | None = None,
    model: str | None = None,
    adapter: str | None = None,
    data: str | None = None,
    reward: str | None = None,
    n: int | None = None,
    samples: int = 1,
    max_new_tokens: int | None = None,
    output: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    seed: int = 0,
    split: str = "test",
    log: Any = print,
    tools: list[str] | None = None,
    max_turns: int | None = None,
    max_tool_calls: int | None = None,
    tool_prompt: str | None = None,
    tool_demo: str | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """Everything ``danka eval`` does: resolve inputs (a config, or model/data/reward),
    generate, score, write ``output`` (JSON) when given; returns the result dict.
    ``tools`` (and the tool limits) set or replace the config's ``agent.tools``; a
    config with ``agent.tools`` or ``agent.environment`` is evaluated through them."""
    from danka.tools.eval_result import ResultFile

    _check_sampling(samples, temperature)
    src, adapter, base_only = _inputs(config, overrides, model, adapter, data, reward, split, log)
    budget = max_new_tokens or src["max_new_tokens"]
    flags = {"max_turns": max_turns, "max_tool_calls": max_tool_calls}
    flags.update(tool_prompt=tool_prompt, tool_demo=tool_demo)
    agent = _agent_settings(src, tools, flags, budget)
    rows = src["rows"][:n] if n else src["rows"]
    header = {
        "model": src["model"],
        "adapter": adapter,
        "data": str(src["data"]),
        "reward": [s.name for s in src["specs"]],
        **({"scored": "base model"} if base_only else {}),
        **({"temperature": temperature} if temperature is not None else {}),
        **({"tools": list(agent.tools)} if agent is not None else {}),
    }
    write = ResultFile(output, header, log)  # a bad --output fails before the model loads
    gen = dict(samples=samples, max_new_tokens=budget, seed=seed, temperature=temperature)
    result = _load_and_score(src, adapter, rows, agent, write, gen, dtype, device, log)
    written = write(result)
    if write.last is not None:
        log(f"wrote {write.last}")
    return written


def _check_sampling(samples: int, temperature: float | None) -> None:
    """UserError for fewer than one sample, or a temperature without sampling."""
    if samples < 1:
        raise UserError(f"--samples must be >= 1, got {samples}", where="--samples")
    if temperature is not None and (samples == 1 or temperature <= 0):
        raise UserError(
            f"--temperature {temperature:g} needs --samples K > 1 and a temperature > 0",
            where="--temperature",
            fix="add --samples 4 (greedy, the default, takes no temperature)",
        )


def _inputs(config, overrides, model, adapter, data, reward, split, log):
    """(the inputs to score, the adapter, whether that is the config's base model): from
    the config or the model/data/reward arguments; says loudly when it is the base."""
    if adapter is not None:
        model, adapter = _scored_checkpoint(model, adapter, log)
    src = (
        _from_config(config, overrides or [])
        if config
        else _from_args(model, adapter, data, reward, split)
    )
    if config and model:
        src["model"] = model
    base_only = config is not None and adapter is None and model is None
    if base_only:
        log(_base_model_warning(config, src))
    return src, adapter, base_only


def _load_and_score(src, adapter, rows, agent, write, gen: dict, dtype, device, log):
    """Load the model, generate and score ``rows`` (``write`` gets the result so far after
    every batch); the reward functions are closed at the end."""
    from danka.rewards.combine import build_reward_computer
    from danka.tools.generate import load_for_inference

    rewards = build_reward_computer(
        src["specs"], base_dir=src["base_dir"], timeout_s=src["timeout_s"], on_error="fail"
    )
    try:
        net, tokenizer = load_for_inference(
            src["model"],
            adapter,
            dtype=dtype,
            device=device,
            trust_remote_code=src["trust_remote_code"],
            log=log,
        )
        return evaluate_rows(
            net,
            tokenizer,
            rows,
            rewards,
            **gen,
            system=src["system"],
            instruction=src["instruction"],
            examples=src["examples"],
            tools=agent,
            base_dir=src["base_dir"],
            log=log,
            on_progress=write,  # the result so far, after every batch (partial: true)
        )
    finally:
        rewards.close()


def _scored_checkpoint(model: str | None, adapter: str, log: Any) -> tuple[str | None, str | None]:
    """``--adapter``: (model, adapter) to score. A run folder means its newest checkpoint;
    a full-parameter checkpoint is a model, not an adapter."""
    from danka.tools.generate import read_adapter_config
    from danka.tools.locate import is_model, resolve_checkpoint

    found = resolve_checkpoint(adapter)
    if is_model(found):
        log(f"scoring the full-parameter checkpoint {found}")
        return str(found), None
    if str(found) != str(adapter):
        log(f"scoring the newest checkpoint of {adapter}: {found}")
    read_adapter_config(str(found))
    return model, str(found)


def _base_model_warning(config: str, src: dict[str, Any]) -> str:
    """``danka eval CONFIG`` alone scores the config's base model: say so, loudly, and
    how to score what training made."""
    from danka.tools.locate import latest_actor_checkpoint

    out = src.get("output_dir") or "OUTPUT"
    latest = latest_actor_checkpoint(out)
    found = f" (its newest checkpoint: {latest})" if latest else ""
    return (
        f"WARNING: no --adapter or --model: this scores the BASE model {src['model']}, "
        f"not a trained one. To score the run: danka eval {config} --adapter {out}{found}"
    )


def _agent_settings(src, tools, flags: dict, max_new_tokens: int):
    """The agent settings to evaluate through (None: single-turn), checked before any
    model loads: the config's ``agent`` with the command-line tool flags applied."""
    from danka.agent.setup import cli_agent_config, validate_agent

    base = src["agent"]
    from_config = base is not None and (base.tools or base.environment)
    if not tools and not from_config:
        if any(v is not None for v in flags.values()):
            raise UserError(
                "tool settings given without tools",
                where="danka eval",
                fix="add --tools calculator (or a config with agent.tools)",
            )
        return None
    cfg = cli_agent_config(tools or [], base=base, max_new_tokens=max_new_tokens, **flags)
    validate_agent(cfg, base_dir=src["base_dir"], max_new_tokens=max_new_tokens)
    return cfg


def format_result(result: dict[str, Any]) -> str:
    scored = " (the BASE model: no --adapter)" if result.get("scored") == "base model" else ""
    lines = [
        f"{result['n']} prompts x {result['samples']} sample(s): "
        f"accuracy {100 * result['accuracy']:.1f}%{scored}"
    ]
    if result.get("partial"):
        why = f"stopped by {result['stopped']}" if result.get("stopped") else "stopped"
        lines.insert(
            0,
            f"PARTIAL: {why} after {result['answered']} of {result['prompts']} "
            "prompts; the numbers below are over those",
        )
    for key, value in result.get("pass@k", {}).items():
        lines.append(f"  {key}: {100 * value:.1f}%")
    lines.append(
        f"mean reward {result['mean_reward']:.4f}, response length "
        f"{result['response_length']:.1f} tokens, truncated "
        f"{100 * result['truncation_rate']:.1f}%"
    )
    if "agent/tool_calls" in result:
        lines.append(
            f"tools: {result['agent/tool_calls']:.2f} calls per answer, "
            f"{100 * result.get('agent/valid_call_samples', 0.0):.1f}% of answers with a "
            f"valid call, valid-call rate {100 * result['agent/valid_call_rate']:.1f}%"
        )
    return "\n".join(lines)
