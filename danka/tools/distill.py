"""``danka distill``: reward-model distillation (the single-card tutorial's section 5.3).

A teacher (a rule reward, your ``file.py:function``, or a reward model / judge) scores
prompt -> response pairs; a small student (any HF model loaded as a sequence classifier with
one output) is trained by mean squared error to predict those scores. The student is saved
as a standard HF folder with a TRAINED head, so ``model.reward_model_name_or_path: DIR``
(``reward_model_type: classifier``) uses it in place of the big teacher.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from danka.errors import UserError
from danka.types import PromptRow


def _completion(row: PromptRow, response_key: str) -> str:
    value = row.extra.get(response_key)
    if not isinstance(value, str):
        raise UserError(
            f"row {row.index} has no {response_key!r} text to score",
            where="--data",
            fix=f"give rows with a prompt and a {response_key!r} column (the seed format), "
            "or set --response-key",
        )
    return value


def teacher_scores(
    rows: list[PromptRow],
    completions: list[str],
    teacher: str,
    teacher_model: str | None,
    base_dir: Path,
) -> torch.Tensor:
    """The teacher's score of each (prompt, completion): a RewardComputer's combined score."""
    from danka.rewards.combine import RewardSpec, build_reward_computer
    from danka.rewards.model import ClassifierReward

    rm = ClassifierReward.from_pretrained(teacher_model) if teacher_model else None
    specs = [RewardSpec(name=teacher)] if teacher else []
    with build_reward_computer(specs, base_dir=base_dir, reward_model=rm) as computer:
        out = computer(rows, [str(r.prompt) for r in rows], completions)
    return out.scores.float().cpu()


def distill(
    *,
    data: str,
    teacher: str | None,
    teacher_model: str | None,
    student: str,
    output: Path,
    epochs: int = 3,
    lr: float = 5e-5,
    batch_size: int = 8,
    max_length: int = 512,
    limit: int | None = None,
    response_key: str = "response",
    answer_key: str | None = None,
    holdout: float = 0.1,
    seed: int = 0,
    log=print,
) -> dict:
    """Score ``data`` with the teacher, train the student on the scores, save it."""
    from danka.models.classifier import load_score_model, save_score_model
    from danka.rewards.model import ClassifierReward

    rows, completions = _read_pairs(
        data, teacher, teacher_model, output, limit, response_key, answer_key
    )
    t0 = time.perf_counter()
    scores = teacher_scores(rows, completions, teacher, teacher_model, Path.cwd())
    log(
        f"teacher scored {len(rows)} pairs in {time.perf_counter() - t0:.1f} s "
        f"(mean {scores.mean():.3f}, std {scores.std():.3f})"
    )

    model, tokenizer = load_score_model(student, seed=seed)
    scorer = ClassifierReward(model, tokenizer, batch_size=batch_size, max_length=max_length)
    texts = [scorer._text(r.prompt, c) for r, c in zip(rows, completions)]
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_held = max(1, int(len(rows) * holdout))
    held, train = order[:n_held], order[n_held:]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)

    def predict(idx: list[int]) -> torch.Tensor:
        return scorer([rows[i].prompt for i in idx], [completions[i] for i in idx]).cpu()

    def mse(idx: list[int]) -> float:
        return float(((predict(idx) - scores[idx]) ** 2).mean())

    before = mse(held)
    losses = _train_student(
        model, tokenizer, opt, texts, scores, train, epochs, batch_size, max_length, seed, log
    )
    after = mse(held)
    pred = predict(held)
    target = scores[held]
    corr = float(torch.corrcoef(torch.stack([pred, target]))[0, 1]) if len(held) > 1 else math.nan
    save_score_model(model, tokenizer, output, max_length=max_length)
    result = {
        "pairs": len(rows),
        "train": len(train),
        "held_out": len(held),
        "teacher": teacher or teacher_model,
        "student": student,
        "epochs": epochs,
        "held_out_mse_before": before,
        "held_out_mse_after": after,
        "held_out_pearson": None if math.isnan(corr) else corr,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    (output / "distill_result.json").write_text(json.dumps(result, indent=2))
    log(f"held-out mse {before:.4f} -> {after:.4f}, pearson {corr:.3f}; saved to {output}")
    return result


def _read_pairs(data, teacher, teacher_model, output: Path, limit, response_key, answer_key):
    """(rows, completions) to distil; UserError without a teacher, for a non-empty
    ``output``, for too few rows or a row without its response."""
    from danka.data.formats import Columns, ReadOptions, load_prompt_rows

    if not teacher and not teacher_model:
        raise UserError(
            "no teacher given",
            where="danka distill",
            fix="--teacher gsm8k (or path.py:function) and/or --teacher-model DIR",
        )
    if output.exists() and any(output.iterdir()):
        raise UserError(
            "output folder is not empty", where=str(output), fix="choose a new --output folder"
        )
    rows = load_prompt_rows(
        data,
        Columns(response_key=response_key, answer_key=answer_key),
        ReadOptions(limit=limit, base_dir=Path.cwd()),
    ).rows
    if len(rows) < 4:
        raise UserError(
            f"{len(rows)} rows are too few to distil",
            where=data,
            fix="give at least a few dozen scored pairs",
        )
    return rows, [_completion(r, response_key) for r in rows]


def _train_student(
    model, tokenizer, opt, texts, scores, train, epochs, batch, max_length, seed, log
):
    """``epochs`` passes of mean squared error to the teacher's ``scores`` over the rows
    ``train`` (reshuffled in place each epoch), ``batch`` rows a step; returns the loss of
    every step."""
    from danka.models.classifier import encode, score

    model.train()
    losses = []
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(train)
        for s in range(0, len(train), batch):
            idx = train[s : s + batch]
            pred = score(model, encode(tokenizer, [texts[i] for i in idx], max_length, "cpu"))
            loss = torch.nn.functional.mse_loss(pred, scores[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())  # (float() of a tensor with grad warns)
        log(f"epoch {epoch + 1}/{epochs}: train mse {sum(losses[-8:]) / len(losses[-8:]):.4f}")
    return losses
