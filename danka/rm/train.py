"""``danka rm CONFIG [key=value ...]``: train a reward model on preference pairs.

A causal LM's backbone gets a one-output score head (on a LoRA adapter by default, in full
with ``lora.enable_lora: false``) trained with the Bradley-Terry loss of
:func:`danka.rm.loss.bradley_terry_loss` so that r(prompt, chosen) > r(prompt, rejected).

1. load the pairs (``data.train_dataset``; held out: ``data.eval_dataset`` or the last
   ``data.eval_size`` shuffled pairs) with the bad-row policy ``data.on_bad_row``;
2. build the classifier (``model.actor_model_name_or_path``'s backbone, fresh head);
3. for each step, ``trainer.batch_size`` pairs in micro-batches of
   ``trainer.micro_batch_size`` pairs: loss, backward, clip, AdamW + schedule;
4. every ``eval.every_steps`` steps (and at the start and end) held-out pairwise
   accuracy, margin and reward mean/std -> train.log and metrics.jsonl;
5. save ``OUTPUT/model`` (safetensors, adapter merged, the trained head, the held-out
   reward mean/std and ``trainer.max_length`` as ``reward_max_length`` in config.json)
   and ``OUTPUT/rm_result.json``.

The saved folder is a reward model for RL: ``model.reward_model_name_or_path: OUTPUT/model``
with ``model.reward_model_type: classifier``. The texts are built exactly as
:class:`~danka.rewards.model.ClassifierReward` builds them when it scores rollouts, cut at
the same ``max_length``. At RL time the prompt it reads is the one the policy read
(``data.system_prompt``, ``data.instruction`` and ``data.examples`` applied, see
:class:`~danka.rewards.combine.RewardComputer`): write the pairs' prompts that way (as
``danka data gsm8k-pairs`` does with danka's GSM8K instruction).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch

from danka.data.files import write_text_atomic
from danka.data.formats import ReadOptions
from danka.data.pairs import PairColumns, PreferencePair, load_pairs
from danka.errors import UserError
from danka.rm.loss import bradley_terry_loss, pair_stats
from danka.schema.sections import DankaConfig

# Settings danka rm reads; any other key set to a non-default value is refused.
USED_KEYS = (
    "model.actor_model_name_or_path",
    "model.torch_dtype",
    "model.use_flash_attention_2",
    "model.attn_implementation",
    "model.trust_remote_code",
    "model.tokenizer_kwargs",
    "model.use_gradient_checkpointing",
    "model.gradient_checkpointing_kwargs",
    "model.device",
    "trainer.num_epochs",
    "trainer.total_steps",
    "trainer.max_train_minutes",
    "trainer.batch_size",
    "trainer.micro_batch_size",
    "trainer.max_length",
    "optim.lr",
    "optim.weight_decay",
    "optim.warmup_steps",
    "optim.lr_scheduler",
    "optim.max_grad_norm",
    "eval.every_steps",
    "trainer.seed",
    "lora",
    "data.train_dataset",
    "data.eval_dataset",
    "data.eval_size",
    "data.dataset_type",
    "data.prompt_key",
    "data.on_bad_row",
    "data.shuffle",
    "data.limit",
    "logging.log_interval",
    "output_dir",
    "rm",
)
# Filled in by validate() from other keys, so they differ from the bare defaults
# (max_new_tokens is set to 1 by the CLI: an RM generates nothing).
_DERIVED = {
    "trainer.advantage_estimator",
    "trainer.samples_per_prompt",
    "trainer.mini_batch_size",
    "loss.policy_loss",
    "data.max_prompt_length",
    "trainer.max_new_tokens",
}
_SCHEDULES = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}


def _leaves(obj: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in obj.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_rm_config(cfg: DankaConfig) -> None:
    """UserError for a setting danka rm would ignore (it must do what it says, or be refused)."""
    from danka.config.validate import validate

    base = DankaConfig()
    base.model.actor_model_name_or_path = base.data.train_dataset = "x"
    validate(base)
    ours, defaults = _leaves(dataclasses.asdict(cfg)), _leaves(dataclasses.asdict(base))
    for key, value in ours.items():
        used = any(key == k or key.startswith(k + ".") for k in USED_KEYS)
        if not used and key not in _DERIVED and value != defaults.get(key):
            raise UserError(
                f"{key} = {value!r} is not used by danka rm",
                where=f"config key {key}",
                fix="remove it from the reward-model config (danka rm reads model, lora, "
                "data files, the trainer's step sizes, optim, eval.every_steps, logging.log_interval "
                "and rm)",
            )
    t = cfg.trainer
    if not isinstance(t.micro_batch_size, int):  # auto plans a policy's step, not pairs
        raise UserError(
            f"danka rm takes a number of pairs for trainer.micro_batch_size, not "
            f"{t.micro_batch_size!r}",
            where="trainer.micro_batch_size",
            fix="set trainer.micro_batch_size to a divisor of trainer.batch_size, e.g. 4",
        )
    if t.batch_size % t.micro_batch_size:
        raise UserError(
            f"batch_size ({t.batch_size}) is not a multiple of micro_batch_size "
            f"({t.micro_batch_size})",
            where="trainer.micro_batch_size",
            fix="danka rm counts both in pairs: choose a micro_batch_size that divides batch_size",
        )
    if cfg.data.eval_dataset and cfg.data.eval_size:
        raise UserError(
            "both data.eval_dataset and data.eval_size are set; danka rm would use only one",
            where="data.eval_size",
            fix="keep data.eval_dataset (a held-out pairs file) or data.eval_size, not both",
        )
    if not cfg.data.eval_dataset and cfg.data.eval_size < 1:
        raise UserError(
            "danka rm needs held-out pairs to measure accuracy",
            where="data.eval_dataset",
            fix="set data.eval_dataset to a pairs file, or data.eval_size: 100 to hold out pairs",
        )


def _load_all(cfg: DankaConfig, base_dir: Path, out: Path):
    d, rm = cfg.data, cfg.rm
    cols = PairColumns(rm.chosen_key, rm.rejected_key, d.prompt_key, rm.margin_key)
    read = ReadOptions(
        on_bad_row=d.on_bad_row,
        bad_rows_path=out / "bad_rows.jsonl",
        base_dir=base_dir,
        dataset_type=d.dataset_type,
    )
    train, n_bad = load_pairs(d.train_dataset, cols, dataclasses.replace(read, limit=d.limit))
    if d.eval_dataset:
        held, n_bad_eval = load_pairs(d.eval_dataset, cols, dataclasses.replace(read, split="test"))
        n_bad += n_bad_eval
    else:
        random.Random(cfg.trainer.seed).shuffle(train)
        if len(train) <= d.eval_size:
            raise UserError(
                f"data.eval_size ({d.eval_size}) leaves no training pairs of {len(train)}",
                where="data.eval_size",
                fix="lower data.eval_size or give data.eval_dataset",
            )
        train, held = train[: -d.eval_size], train[-d.eval_size :]
    if len(train) < cfg.trainer.batch_size:
        raise UserError(
            f"{len(train)} training pairs are fewer than trainer.batch_size "
            f"({cfg.trainer.batch_size})",
            where=d.train_dataset,
            fix="give more pairs or lower trainer.batch_size",
        )
    return train, held, n_bad


def pair_text(scorer, prompt, answer) -> str:
    """The text the reward model reads for (prompt, answer), as ClassifierReward renders it;
    a multi-message answer is rendered as the whole conversation."""
    if isinstance(answer, str):
        return scorer._text(prompt, answer)
    if len(answer) == 1 and answer[0]["role"] == "assistant":
        return scorer._text(prompt, answer[0]["content"])
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    msgs = [m for m in msgs if m["content"]] + list(answer)
    if getattr(scorer.tokenizer, "chat_template", None):
        return scorer.tokenizer.apply_chat_template(msgs, tokenize=False)
    return "\n".join(m["content"] for m in msgs)


class _Pairs:
    """Rendered texts and margins of a list of pairs."""

    def __init__(self, pairs: list[PreferencePair], scorer):
        self.chosen = [pair_text(scorer, p.prompt, p.chosen) for p in pairs]
        self.rejected = [pair_text(scorer, p.prompt, p.rejected) for p in pairs]
        has_margin = any(p.margin is not None for p in pairs)
        self.margin = torch.tensor([p.margin or 0.0 for p in pairs]) if has_margin else None

    def __len__(self) -> int:
        return len(self.chosen)


def _rewards(model, tokenizer, pairs: _Pairs, idx: list[int], max_length: int, device):
    """(r_chosen, r_rejected), each (len(idx),): one forward over the 2 x len(idx) texts."""
    from danka.models.classifier import encode, score

    texts = [pairs.chosen[i] for i in idx] + [pairs.rejected[i] for i in idx]
    r = score(model, encode(tokenizer, texts, max_length, device))
    return r[: len(idx)], r[len(idx) :]


def evaluate_pairs(
    model,
    tokenizer,
    pairs: _Pairs,
    *,
    batch: int,
    max_length: int,
    device,
    center_coef: float | None = None,
    log=None,
) -> dict[str, float]:
    """Held-out accuracy / margin / reward mean and std / loss (see :func:`pair_stats`);
    ``log``: where progress lines go (``[rm eval] 120/747 pairs | ...``)."""
    from danka.logging.progress import WorkProgress

    was_training = model.training
    model.eval()
    rc, rr = [], []
    progress = WorkProgress(len(pairs), "rm eval", unit="pairs", log=log, enabled=log is not None)
    with torch.no_grad():
        for s in range(0, len(pairs), batch):
            c, r = _rewards(
                model,
                tokenizer,
                pairs,
                list(range(s, min(s + batch, len(pairs)))),
                max_length,
                device,
            )
            rc.append(c.cpu())
            rr.append(r.cpu())
            progress.advance(len(c))
    model.train(was_training)
    r_c, r_r = torch.cat(rc), torch.cat(rr)
    stats = pair_stats(r_c, r_r)
    stats["loss"] = float(bradley_terry_loss(r_c, r_r, pairs.margin, center_coef))
    return stats


def _build_model(cfg: DankaConfig, log):
    """``(model, tokenizer, scorer, device)``: the classifier, LoRA-wrapped unless
    ``lora.enable_lora`` is false; ``scorer`` renders texts as ClassifierReward does."""
    from danka.models.classifier import load_score_model
    from danka.models.loading import pick_device, resolve_dtype
    from danka.rewards.model import ClassifierReward

    m, lora = cfg.model, cfg.lora
    device = pick_device(m.device)
    model, tokenizer = load_score_model(
        m.actor_model_name_or_path,
        dtype=resolve_dtype(m.torch_dtype, device),
        device=device,
        attn_implementation=m.attn_implementation,
        trust_remote_code=m.trust_remote_code,
        tokenizer_kwargs={k: v for k, v in vars(m.tokenizer_kwargs).items() if v is not None},
        seed=cfg.trainer.seed,
        log=log,
    )
    scorer = ClassifierReward(model, tokenizer)
    if m.use_gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=vars(m.gradient_checkpointing_kwargs)
        )
    if lora.enable_lora:
        from danka.models.lora import apply_lora

        model = apply_lora(
            model,
            r=lora.lora_r,
            alpha=lora.lora_alpha,
            dropout=lora.lora_dropout,
            target_modules=lora.target_modules,
            task_type="SEQ_CLS",
        )
        if m.use_gradient_checkpointing:
            model.enable_input_require_grads()
    return model, tokenizer, scorer, device


def _train_step(model, tokenizer, train: _Pairs, idx: list[int], cfg: DankaConfig, device):
    """Gradients of one step's pairs ``idx``, accumulated over micro-batches (the caller
    steps the optimizer); returns the step's metrics."""
    t, ts = cfg.trainer, time.perf_counter()
    loss_sum, rc_all, rr_all = 0.0, [], []
    for s in range(0, len(idx), t.micro_batch_size):
        mi = idx[s : s + t.micro_batch_size]
        r_c, r_r = _rewards(model, tokenizer, train, mi, t.max_length, device)
        margin = train.margin[mi].to(device) if train.margin is not None else None
        loss = bradley_terry_loss(r_c, r_r, margin, cfg.rm.center_rewards_coefficient)
        (loss * len(mi) / len(idx)).backward()
        loss_sum += float(loss.detach()) * len(mi) / len(idx)
        rc_all.append(r_c.detach().cpu())
        rr_all.append(r_r.detach().cpu())
    stats = pair_stats(torch.cat(rc_all), torch.cat(rr_all))
    return {
        "loss": loss_sum,
        "reward": stats["mean"],
        "accuracy": stats["accuracy"],
        "margin": stats["margin"],
        "time/step": time.perf_counter() - ts,
    }


def train_reward_model(cfg: DankaConfig, base_dir: Path) -> dict:
    """Run steps 1-5 of the module docstring; returns the rm_result.json content."""
    from danka.logging.metrics import MetricsWriter
    from danka.logging.runlog import close_run_logger, setup_run_logger

    check_rm_config(cfg)
    t = cfg.trainer
    out = Path(cfg.output_dir)
    if (out / "model").exists() or (out / "rm_result.json").exists():
        raise UserError(
            "the output folder already holds a trained reward model",
            where=str(out),
            fix="choose a new output_dir (or delete the old one)",
        )
    log = setup_run_logger(out, console=True).info
    t0 = time.perf_counter()

    # 1. pairs, 2. model
    train_pairs, held_pairs, n_bad = _load_all(cfg, base_dir, out)
    log(f"{len(train_pairs)} training pairs, {len(held_pairs)} held out, {n_bad} bad rows")
    model, tokenizer, scorer, device = _build_model(cfg, log)
    train, held = _Pairs(train_pairs, scorer), _Pairs(held_pairs, scorer)
    params = [p for p in model.parameters() if p.requires_grad]
    log(
        f"training {sum(p.numel() for p in params) / 1e6:.2f}M parameters "
        f"({'LoRA + score head' if cfg.lora.enable_lora else 'full'})"
    )

    # 3./4. optimisation with periodic held-out evaluation
    total = t.total_steps or t.num_epochs * (len(train) // t.batch_size)
    update = _optimizer(cfg, params, total)
    metrics = MetricsWriter(out)
    evaluate = _evaluator(model, tokenizer, held, cfg, device, metrics, log)
    before = evaluate(0)
    step = _train_loop(
        model, tokenizer, train, cfg, device, update, total, t0, metrics, evaluate, log
    )
    final = evaluate(step)
    metrics.close()

    # 5. save: the merged model (temp folder + rename: never half a model) and the result
    _save_model(model, tokenizer, out, final, t.max_length)
    result = {
        **{k: final[k] for k in ("accuracy", "n", "mean", "std", "margin", "loss")},
        "accuracy_before": before["accuracy"],
        "steps": step,
        "train_pairs": len(train),
        "bad_rows": n_bad,
        "minutes": (time.perf_counter() - t0) / 60,
        "model": str(out / "model"),
    }
    write_text_atomic(out / "rm_result.json", json.dumps(result, indent=2))
    log(
        f"held-out accuracy {before['accuracy']:.3f} -> {final['accuracy']:.3f} on "
        f"{final['n']} pairs; reward mean {final['mean']:.3f} std {final['std']:.3f}; "
        f"saved {out / 'model'}"
    )
    close_run_logger()
    return result


def _optimizer(cfg: DankaConfig, params: list, total: int):
    """``update()``: clip the gradients, step AdamW and the schedule, zero the gradients;
    returns the learning rate now."""
    from transformers import get_scheduler

    o = cfg.optim
    opt = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
    sched = get_scheduler(
        _SCHEDULES[o.lr_scheduler], opt, num_warmup_steps=o.warmup_steps, num_training_steps=total
    )

    def update() -> float:
        if o.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, o.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return sched.get_last_lr()[0]

    return update


def _evaluator(model, tokenizer, held: _Pairs, cfg: DankaConfig, device, metrics, log):
    """``evaluate(step)``: the held-out stats, logged and written to metrics.jsonl."""
    t = cfg.trainer
    ev = dict(
        batch=t.micro_batch_size,
        max_length=t.max_length,
        device=device,
        center_coef=cfg.rm.center_rewards_coefficient,
    )

    def evaluate(step: int) -> dict:
        log(f"eval step {step} | scoring {len(held)} held-out pairs")
        stats = evaluate_pairs(model, tokenizer, held, **ev, log=log)
        log(f"eval step {step} | " + ", ".join(f"{k}: {v:.4f}" for k, v in stats.items()))
        metrics.write(step, {f"eval/{k}": v for k, v in stats.items()})
        return stats

    return evaluate


def _train_loop(model, tokenizer, train, cfg, device, update, total, t0, metrics, evaluate, log):
    """Steps 3 and 4: ``total`` steps (or until ``trainer.max_train_minutes`` after ``t0``)
    over epochs in seeded order, a held-out evaluation every ``eval.every_steps``; returns
    the number of steps made."""
    from danka.logging.metrics import format_step_line

    t = cfg.trainer
    steps_per_epoch = len(train) // t.batch_size
    model.train()
    step, order = 0, []
    deadline = t0 + 60 * t.max_train_minutes if t.max_train_minutes else math.inf
    while step < total and time.perf_counter() < deadline:
        if len(order) < t.batch_size:  # a new epoch: seeded order, the tail is dropped
            epoch = step // max(1, steps_per_epoch)
            order = list(range(len(train)))
            if cfg.data.shuffle:
                random.Random(t.seed + epoch).shuffle(order)
        idx, order = order[: t.batch_size], order[t.batch_size :]
        row = _train_step(model, tokenizer, train, idx, cfg, device)
        if not math.isfinite(row["loss"]):
            raise UserError(
                f"the loss is {row['loss']} at step {step + 1}; no update was made",
                where="optim.lr",
                fix="lower optim.lr (or use model.torch_dtype: float32)",
            )
        row["lr"] = update()
        step += 1
        metrics.write(step, row)
        if step % cfg.logging.log_interval == 0:
            log(format_step_line(step, row))
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < total:
            evaluate(step)
    return step


def _save_model(model, tokenizer, out: Path, final: dict, max_length: int) -> None:
    """``OUTPUT/model`` with the held-out reward mean/std, written to a temporary folder
    and renamed (never half a model)."""
    from danka.models.classifier import save_score_model

    tmp = out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_score_model(
        model,
        tokenizer,
        tmp,
        reward_mean=final["mean"],
        reward_std=final["std"],
        max_length=max_length,
    )
    tmp.rename(out / "model")
