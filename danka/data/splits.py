"""The rows a run trains and evaluates on: a task generates both; files are read, the
held-out part given as its own file (never the training data read again) or split off the
end of the training rows (``data.eval_size``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from danka.data.formats import Columns, ReadOptions, load_prompt_rows
from danka.data.tasks import task_rows
from danka.errors import UserError
from danka.schema.sections import DankaConfig
from danka.types import PromptRow


def load_rows(cfg: DankaConfig, base_dir: Path, output_dir: Path) -> tuple[list, list]:
    """Training and held-out rows. A task generates both; files are read and split."""
    d = cfg.data
    if d.task:
        seed = cfg.trainer.seed
        kw = d.task_kwargs
        train = task_rows(d.task, d.task_train_size, seed=seed, split="train", kwargs=kw)
        held = []
        if d.eval_size:
            held = task_rows(d.task, d.eval_size, seed=seed, split="test", kwargs=kw)
        return train, held
    cols = Columns(d.format, d.prompt_key, d.response_key, d.reward_key, d.answer_key)
    read = ReadOptions(
        on_bad_row=d.on_bad_row,
        bad_rows_path=output_dir / "bad_rows.jsonl",
        base_dir=base_dir,
        dataset_type=d.dataset_type,
    )
    train = load_prompt_rows(
        d.train_dataset, cols, replace(read, limit=d.limit, split=d.train_split)
    ).rows
    if d.eval_dataset:
        check_eval_source(d, base_dir)
        held = load_prompt_rows(
            d.eval_dataset, cols, replace(read, limit=d.eval_size or None, split=d.eval_split)
        ).rows
        check_no_overlap(train, held, d.eval_dataset)
    elif d.eval_size:
        if d.eval_size >= len(train):
            raise UserError(
                f"data.eval_size ({d.eval_size}) leaves no training rows "
                f"(the file has {len(train)})",
                where="data.eval_size",
                fix="lower data.eval_size or give data.eval_dataset",
            )
        train, held = train[: -d.eval_size], train[-d.eval_size :]
    else:
        held = []
    return train, held


def check_eval_source(d, base_dir: Path) -> None:
    """Held-out data is never silently the training data: the same source read with the
    same split (e.g. a `danka data gsm8k` folder given for both with one split) is refused."""
    same = d.eval_dataset == d.train_dataset or (
        (base_dir / d.eval_dataset).resolve() == (base_dir / d.train_dataset).resolve()
    )
    if same and d.eval_split == d.train_split:
        raise UserError(
            f"data.eval_dataset is data.train_dataset read with the same split "
            f"({d.train_split!r}): the held-out accuracy would be measured on training rows",
            where="data.eval_split",
            fix="give a held-out file, or a folder/hub dataset with another split "
            "(data.eval_split: test), or use data.eval_size to split rows off",
        )


def check_no_overlap(train: list[PromptRow], held: list[PromptRow], where: str) -> None:
    """Exit 2 when a held-out prompt is also a training prompt (same prompt text/messages)."""
    seen = {json.dumps(r.prompt, sort_keys=True) for r in train}
    dup = [r for r in held if json.dumps(r.prompt, sort_keys=True) in seen]
    if dup:
        raise UserError(
            f"{len(dup)} of {len(held)} held-out prompts are also training prompts (first: "
            f"row {dup[0].index}): the held-out accuracy would not be held out",
            where=where,
            fix="remove them from one side, or check data.train_split / data.eval_split",
        )
