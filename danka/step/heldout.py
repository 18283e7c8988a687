"""Step 10, held-out evaluation, bound once like the other stages: greedy answers scored by
the reward functions (danka.rewards.scoring, the rule ``danka eval`` uses too), next to
what no model needs (the guess floor of the held-out set, fixed at the first evaluation),
and the drift probe: general prompts answered at every evaluation, to see whether the model
still answers them as it did before training. An evaluation returns one ``EvalResult``;
the run writes it."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from danka.data.template import encode_prompts
from danka.diagnose.floors import guess_floors
from danka.diagnose.probe import PROBE_PROMPTS, mean_kl, probe_stats
from danka.errors import UserError
from danka.io import atomic_path
from danka.limits import TOKENS
from danka.rewards.combine import RewardComputer
from danka.rewards.scoring import CORRECT_AT, judge
from danka.rollout.base import SamplingParams
from danka.step.answers import SampleContext, sample
from danka.step.forward import ForwardSettings, batched, policy_logprobs
from danka.step.model_set import ModelSet
from danka.step.prompt_set import PromptSet
from danka.types import PromptRow, RolloutBatch

SHOWN = 16  # answers written into eval/step_N.json
# eval.probe_max_new_tokens: auto. On a CPU the probe's 8 answers x 96 tokens took longer
# than the quickstart's 200 held-out answers x 16 tokens (96 decode steps at batch 8 against
# 16 at batch 200); 32 tokens still show an answer looping or shrinking
PROBE_TOKENS_GPU, PROBE_TOKENS_CPU = 96, 32


@dataclass(frozen=True)
class HeldOut:
    """Greedy answers to held-out prompts, scored."""

    metrics: dict[str, float]  # eval/accuracy, eval/correct/<fn>, eval/reward, ...
    samples: list[dict]  # the first SHOWN answers: prompt, completion, ground truth, correct


@dataclass(frozen=True)
class GuessFloors:
    """What guessing scores on the held-out set (danka/diagnose/floors.py), fixed at the
    first evaluation and kept in the run's history (its JSON: ``to_json``)."""

    metrics: dict[str, float]  # eval/guess_floor, eval/guess_floor/<fn>, eval/guess/...
    detail: dict  # the guessed answers, by name

    def to_json(self) -> dict:
        return {"metrics": self.metrics, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> GuessFloors:
        return cls(metrics=dict(data["metrics"]), detail=dict(data["detail"]))


@dataclass
class ProbeReference:
    """The step-0 answers to the probe prompts and their log-probs under the step-0
    policy: later evaluations measure how far the policy moved on them."""

    batch: RolloutBatch
    logprobs: torch.Tensor  # (B, R) log pi_0 of each answer token

    def save(self, path: Path) -> None:
        tensors = {f.name: getattr(self.batch, f.name) for f in dataclasses.fields(self.batch)}
        tensors = {k: v.contiguous() for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        with atomic_path(path) as tmp:  # danka's one file mode (safetensors makes 0600)
            save_file({**tensors, "logprobs": self.logprobs.contiguous()}, str(tmp))

    @classmethod
    def load(cls, path: Path) -> ProbeReference:
        t = load_file(str(path))
        logprobs = t.pop("logprobs")
        return cls(batch=RolloutBatch(**t), logprobs=logprobs)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: the numbers (``record``: what the history, trackers, callbacks and
    the run doctor read) and what eval/step_N.json shows besides them."""

    step: int
    metrics: dict[str, float]  # eval/*, the guess floors, eval/seconds|minutes, probe/*
    samples: list[dict]  # the first SHOWN held-out answers
    floors: GuessFloors
    probe_answers: list[dict]  # {"prompt", "answer"} per probe prompt
    probe_reference: ProbeReference  # the step-0 answers the probe compares to
    seconds: float

    @property
    def record(self) -> dict:
        return {"step": self.step, **self.metrics}

    @property
    def accuracy(self) -> float:
        return self.metrics["eval/accuracy"]


@torch.no_grad()
def held_out(ctx: SampleContext, rewards: RewardComputer, micro: int) -> HeldOut:
    """Greedy accuracy on the prompts of ``ctx``, ``ctx.chunk`` prompts a call (through the
    agent loop when it has one: ``eval/agent/*`` are its metrics). Correct as
    danka.rewards.scoring.judge says; per function as ``eval/correct/<name>``."""
    prompts, n = ctx.prompts, len(ctx.prompts.rows)
    completions, shown, messages, lengths, truncated = [], [], [], [], []
    agent_metrics: dict[str, float] = {}
    for start in range(0, n, ctx.chunk):
        idx = list(range(start, min(start + ctx.chunk, n)))
        got = sample(ctx, idx, micro)
        completions.extend(got.completions)
        shown.extend(got.shown)  # an agent's trajectory (tool turns included), or the text
        messages.extend(got.messages or [])
        lengths.extend(got.batch.response_mask.sum(1).tolist())
        truncated.extend(got.batch.truncated.tolist())
        for key, value in got.agent_stats.items():  # sample-weighted over the chunks
            agent_metrics[key] = agent_metrics.get(key, 0.0) + value * len(idx)
    turns = {"messages": messages} if messages else {}  # an agent's turns after the prompt
    out = rewards(prompts.rows, prompts.texts, completions, **turns)
    ok, per_fn = judge(out)
    correct = ok.float()
    metrics = {
        **{f"eval/correct/{name}": value for name, value in per_fn.items()},
        "eval/accuracy": float(correct.mean()),
        "eval/reward": float(out.scores.float().mean()),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/truncated": sum(truncated) / max(1, len(truncated)),
        "eval/n": float(n),
        **{f"eval/{k}": v / max(1, n) for k, v in agent_metrics.items()},
    }
    samples = [
        {"prompt": p, "completion": c, "ground_truth": r.ground_truth, "correct": bool(k)}
        for p, c, r, k in zip(
            prompts.texts[:SHOWN], shown[:SHOWN], prompts.rows[:SHOWN], correct[:SHOWN].tolist()
        )
    ]
    return HeldOut(metrics, samples)


@dataclass
class Evaluator:
    """Step 10 bound to what it needs: the held-out and probe sampling contexts, the
    rewards, the policy and the forward settings. Two things are fixed by the first
    evaluation and remembered (a resumed run gets them back: :meth:`remember`): the
    held-out set's guess floors and the step-0 probe answers."""

    held: SampleContext  # greedy over every held-out prompt
    probe: SampleContext  # greedy over the probe prompts (no agent loop)
    rewards: RewardComputer
    models: ModelSet
    forward: ForwardSettings
    log: logging.Logger
    subset_size: int = 0  # eval.subset_size: the middle evaluations on the first N prompts
    floors: GuessFloors | None = None
    reference: ProbeReference | None = None

    def remember(self, floors: dict | None, probe_file: Path) -> None:
        """A resumed run's floors (from its history) and step-0 probe answers (on disk)."""
        if self.floors is None and floors is not None:
            self.floors = GuessFloors.from_json(floors)
        if self.reference is None and probe_file.is_file():
            self.reference = ProbeReference.load(probe_file)

    def __call__(self, step: int, micro: int, *, full: bool, started: float) -> EvalResult:
        """Held-out accuracy at ``step`` (forwards of ``micro`` sequences) next to the
        set's guess floors, and the drift probe. ``full=False``: an evaluation between the
        first and the last, on the first ``subset_size`` prompts when that is set;
        ``started``: when ``danka train`` started (``eval/minutes``)."""
        ctx = self.held
        subset = 0 if full else self.subset_size
        if 0 < subset < len(ctx.prompts.rows):
            p = ctx.prompts
            ctx = dataclasses.replace(
                ctx, prompts=PromptSet(p.rows[:subset], p.texts[:subset], p.ids[:subset])
            )
        self.log.info(f"step {step} | evaluating {len(ctx.prompts.rows)} held-out prompts (greedy)")
        t0 = time.perf_counter()
        got = held_out(ctx, self.rewards, micro)
        metrics = dict(got.metrics)
        if self.floors is None:  # on the whole held-out set, scored by the run's rewards
            held = self.held.prompts
            found = guess_floors(held.rows, held.texts, self.rewards, threshold=CORRECT_AT)
            self.floors = GuessFloors(found.metrics(), found.to_json())
        metrics.update(self.floors.metrics)
        t_probe = time.perf_counter()
        probe_metrics, answers = self._probe(micro)
        metrics.update(probe_metrics)
        now = time.perf_counter()
        seconds = now - t0  # the whole evaluation: held-out answers, floors, drift probe
        metrics["eval/seconds"] = round(seconds, 2)
        metrics["eval/probe_seconds"] = round(now - t_probe, 2)  # the drift probe's part
        metrics["eval/minutes"] = round((now - started) / 60, 3)
        return EvalResult(step, metrics, got.samples, self.floors, answers, self.reference, seconds)

    @torch.no_grad()
    def _probe(self, micro: int) -> tuple[dict, list]:
        """The drift probe: greedy answers to the probe prompts, their statistics, and
        (given the step-0 reference) the mean KL per token of the current policy to the
        step-0 answers. Returns (metrics ``probe/*``, the answers); the first call keeps
        its answers as the reference."""
        prompts = self.probe.prompts
        got = sample(self.probe, list(range(len(prompts.rows))), micro)
        lengths = [int(n) for n in got.batch.response_mask.sum(1).tolist()]
        stats = probe_stats(got.completions, lengths)
        fwd = self.forward
        with self.models.actor() as policy:
            if self.reference is None:  # step 0: the answers and log-probs later ones compare to
                logp = batched(policy_logprobs, policy, got.batch, micro, settings=fwd)
                self.reference = ProbeReference(batch=got.batch, logprobs=logp)
            ref = self.reference
            now = batched(policy_logprobs, policy, ref.batch, micro, settings=fwd)
        kl = mean_kl(now, ref.logprobs, ref.batch.response_mask)
        answers = [{"prompt": p, "answer": a} for p, a in zip(prompts.texts, got.completions)]
        return stats.metrics(kl), answers


def probe_prompts(tokenizer, texts: list[str] | None, max_length: int) -> PromptSet:
    """The probe prompts as the model reads them: the chat template alone (no system
    prompt, no task instruction: they ask the model as a user would). One longer than
    ``max_length`` (trainer.max_length) tokens is refused naming eval.probe_prompts[i];
    the run calls this before the model loads (with the other prompt sets), after
    the config check bounded each prompt's characters."""
    own = bool(texts)
    texts = list(texts or PROBE_PROMPTS)
    rows = [
        PromptRow(index=i, prompt=[{"role": "user", "content": t}]) for i, t in enumerate(texts)
    ]
    enc = encode_prompts(tokenizer, rows, max_prompt_length=TOKENS, location="eval.probe_prompts")
    for i, ids in enumerate(enc.input_ids):
        if len(ids) > max_length:
            raise UserError(
                f"{'the' if own else 'the built-in'} probe prompt {i} is {len(ids)} tokens, "
                f"longer than trainer.max_length ({max_length})",
                where=f"eval.probe_prompts[{i}]" if own else "eval.probe_prompts",
                fix="shorten the probe prompt, or raise trainer.max_length"
                if own
                else "raise trainer.max_length, or give shorter eval.probe_prompts",
            )
    return PromptSet(rows=enc.rows, texts=enc.texts, ids=enc.input_ids)


HELD_PER_CALL = 256  # held-out prompts a call without a planned number (the fast engine's batch)


def build_evaluator(
    cfg, sampling, held: PromptSet, rewards, forward: ForwardSettings, log, per_call: int = 0
) -> Evaluator:
    """Step 10 for the run's held-out prompts: greedy, one answer each,
    ``eval.max_new_tokens`` (or trainer.max_new_tokens) tokens, ``per_call`` prompts a call:
    ``rollout.generation_batch_size`` (auto: the number the plan fitted, which priced that
    many rows' KV cache at the training lengths: at most ``HELD_PER_CALL`` when the evaluation's
    answers are longer), ``HELD_PER_CALL`` when it is 0 (all at once);
    ``sampling``: danka.step.stages.Sampling."""
    t = cfg.trainer
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens or t.max_new_tokens
    )
    chunk = per_call or HELD_PER_CALL
    if params.max_new_tokens > t.max_new_tokens:  # a longer KV cache than the plan priced
        chunk = min(chunk, HELD_PER_CALL)
    held_ctx = dataclasses.replace(sampling.context(cfg, held, params), chunk=chunk)
    probes = probe_prompts(sampling.tokenizer, cfg.eval.probe_prompts, t.max_length)
    on_gpu = next(sampling.models.policy.parameters()).device.type == "cuda"
    probe_tokens = cfg.eval.probe_max_new_tokens
    if probe_tokens == "auto":  # a CPU decodes the probe's 8 answers a token at a time
        probe_tokens = PROBE_TOKENS_GPU if on_gpu else PROBE_TOKENS_CPU
    probe_params = SamplingParams(n=1, temperature=0.0, max_new_tokens=probe_tokens)
    probe_ctx = dataclasses.replace(sampling.context(cfg, probes, probe_params), agent=None)
    return Evaluator(
        held_ctx,
        probe_ctx,
        rewards,
        sampling.models,
        forward,
        log,
        subset_size=cfg.eval.subset_size,
    )
