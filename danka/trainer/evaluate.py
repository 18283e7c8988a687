"""Held-out evaluation: greedy answers scored by the reward function, next to what no
model needs (the guess floor of the held-out set, computed once at step 0), and the drift
probe: general prompts answered at every evaluation, to see whether the model still
answers them as it did before training."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from danka.agent.rewards import AgentCompletion
from danka.data.template import encode_prompts
from danka.diagnose.floors import guess_floors
from danka.diagnose.probe import PROBE_PROMPTS, mean_kl, probe_stats
from danka.rewards.combine import RewardComputer, RewardOutput
from danka.rollout.base import SamplingParams
from danka.trainer.forward import batched, policy_logprobs
from danka.trainer.run import PromptSet, Run
from danka.trainer.sample import SampleContext, sample
from danka.trainer.stages import forward_settings, sampling_context
from danka.types import PromptRow, RolloutBatch

CORRECT_AT = 1.0  # the score of a right answer for every builtin rule reward


def judge(
    out: RewardOutput, threshold: float = CORRECT_AT
) -> tuple[torch.Tensor, dict[str, float]]:
    """The one "correct" rule (training evaluation and ``danka eval``): a sample is
    correct when the FIRST reward function scores it at least ``threshold`` (the combined
    score if there is no function). Returns (correct (B,) bool, per-function accuracy
    ``name -> fraction``: a weight-0 function is a pure metric, e.g. GSM8K's flexible
    accuracy next to the strict one)."""
    primary = next(iter(out.per_function.values())) if out.per_function else out.scores
    correct = primary.float() >= threshold - 1e-6
    per_fn = {
        name: float((v.float() >= threshold - 1e-6).float().mean())
        for name, v in out.per_function.items()
    }
    return correct.cpu(), per_fn


def eval_context(run: Run, subset: int = 0) -> SampleContext:
    """Greedy sampling of the held-out prompts (eval_max_new_tokens), one answer each,
    ``rollout.generation_batch_size`` (or 256, also for auto) prompts at a time; ``subset``
    > 0: only the first ``subset`` prompts."""
    t = run.cfg.trainer
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=run.cfg.eval.max_new_tokens or t.max_new_tokens
    )
    prompts = run.eval
    if 0 < subset < len(prompts.rows):
        prompts = PromptSet(prompts.rows[:subset], prompts.texts[:subset], prompts.ids[:subset])
    ctx = sampling_context(run, prompts, params)
    per_call = run.cfg.rollout.generation_batch_size
    return dataclasses.replace(
        ctx, chunk=per_call if isinstance(per_call, int) and per_call else 256
    )


@torch.no_grad()
def evaluate(ctx: SampleContext, rewards: RewardComputer) -> dict:
    """Greedy accuracy on the prompts of ``ctx`` (through the agent loop when it has one:
    ``eval/agent/*`` are its metrics). Correct as :func:`judge` says; per function as
    ``eval/correct/<name>``."""
    prompts, n = ctx.prompts, len(ctx.prompts.rows)
    completions, lengths, truncated = [], [], []
    agent_metrics: dict[str, float] = {}
    for start in range(0, n, ctx.chunk):
        idx = list(range(start, min(start + ctx.chunk, n)))
        got = sample(ctx, idx)
        completions.extend(got.completions)
        lengths.extend(got.batch.response_mask.sum(1).tolist())
        truncated.extend(got.batch.truncated.tolist())
        for key, value in got.agent_stats.items():  # sample-weighted over the chunks
            agent_metrics[key] = agent_metrics.get(key, 0.0) + value * len(idx)
    out = rewards(prompts.rows, prompts.texts, completions)
    ok, per_fn = judge(out)
    correct = ok.float()
    return {
        **{f"eval/correct/{name}": value for name, value in per_fn.items()},
        "eval/accuracy": float(correct.mean()),
        "eval/reward": float(out.scores.float().mean()),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/truncated": sum(truncated) / max(1, len(truncated)),
        "eval/n": float(n),
        **{f"eval/{k}": v / max(1, n) for k, v in agent_metrics.items()},
        "_samples": [
            {
                "prompt": p,
                "completion": _shown(c),
                "ground_truth": r.ground_truth,
                "correct": bool(k),
            }
            for p, c, r, k in zip(
                prompts.texts[:16], completions[:16], prompts.rows[:16], correct[:16].tolist()
            )
        ],
    }


def _shown(completion: str) -> str | list:
    """What eval/step_N.json shows: an agent's trajectory (tool turns included), or the text."""
    return completion.messages if isinstance(completion, AgentCompletion) else completion


def guess_floors_of(run: Run) -> dict:
    """The held-out set's guess floors (danka/diagnose/floors.py), scored by the run's own
    reward functions: {"metrics": eval/guess_floor..., "detail": the guessed answers}."""
    floors = guess_floors(run.eval.rows, run.eval.texts, run.rewards, threshold=CORRECT_AT)
    return {"metrics": floors.metrics(), "detail": floors.to_json()}


@dataclass
class ProbeReference:
    """The step-0 answers to the probe prompts and their log-probs under the step-0
    policy: later evaluations measure how far the policy moved on them."""

    batch: RolloutBatch
    logprobs: torch.Tensor  # (B, R) log pi_0 of each answer token

    def save(self, path: Path) -> None:
        tensors = {f.name: getattr(self.batch, f.name) for f in dataclasses.fields(self.batch)}
        tensors = {k: v.contiguous() for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        save_file({**tensors, "logprobs": self.logprobs.contiguous()}, str(path))

    @classmethod
    def load(cls, path: Path) -> ProbeReference:
        t = load_file(str(path))
        logprobs = t.pop("logprobs")
        return cls(batch=RolloutBatch(**t), logprobs=logprobs)


def probe_prompts(run: Run) -> PromptSet:
    """The probe prompts as the model reads them: the chat template alone (no system
    prompt, no task instruction: they ask the model as a user would)."""
    texts = list(run.cfg.eval.probe_prompts or PROBE_PROMPTS)
    rows = [
        PromptRow(index=i, prompt=[{"role": "user", "content": t}]) for i, t in enumerate(texts)
    ]
    enc = encode_prompts(run.tokenizer, rows, max_prompt_length=run.cfg.trainer.max_length)
    return PromptSet(rows=enc.rows, texts=enc.texts, ids=enc.input_ids)


@torch.no_grad()
def probe(run: Run, reference: ProbeReference | None) -> tuple[dict, list, ProbeReference]:
    """The drift probe: greedy answers to the probe prompts, their statistics, and (given
    the step-0 reference) the mean KL per token of the current policy to the step-0
    answers. Returns (metrics ``probe/*``, the answers, the reference to keep)."""
    prompts = probe_prompts(run)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=run.cfg.eval.probe_max_new_tokens)
    ctx = dataclasses.replace(sampling_context(run, prompts, params), agent=None)
    got = sample(ctx, list(range(len(prompts.rows))))
    lengths = [int(n) for n in got.batch.response_mask.sum(1).tolist()]
    stats = probe_stats(got.completions, lengths)
    fwd = forward_settings(run)
    micro = run.state.micro_batch_size
    with run.models.actor() as policy:
        if reference is None:  # step 0: the answers and log-probs later ones compare to
            logp = batched(policy_logprobs, policy, got.batch, micro, settings=fwd)
            reference = ProbeReference(batch=got.batch, logprobs=logp)
        now = batched(policy_logprobs, policy, reference.batch, micro, settings=fwd)
    kl = mean_kl(now, reference.logprobs, reference.batch.response_mask)
    answers = [{"prompt": p, "answer": a} for p, a in zip(prompts.texts, got.completions)]
    return stats.metrics(kl), answers, reference
