"""Which data a run trains and evaluates on, in one start-up line.

A config may name a file (``data.train_dataset``) and a generated task (``data.task``);
the file wins (``danka.config.validate.resolve_data_source``), so the data a user names
on the command line is the data the run trains on. This line says what was read.
"""

from __future__ import annotations

from typing import Any


def data_line(cfg: Any, train: list, held: list) -> str:
    """``Data: 1800 training prompts from my.jsonl; 200 held-out prompts split off ...``."""
    d = cfg.data
    if d.task:
        src = f"generated task {d.task}"
        held_src = f"generated task {d.task} (disjoint problems)"
    else:
        src = d.train_dataset + (f" (split {d.train_split})" if _has_splits(d) else "")
        if d.eval_dataset:
            held_src = d.eval_dataset
        else:
            held_src = f"the end of {d.train_dataset} (data.eval_size)"
    line = f"Data: {len(train)} training prompts from {src}"
    if held:
        line += f"; {len(held)} held-out prompts from {held_src}"
    else:
        line += "; no held-out prompts (set data.eval_size or data.eval_dataset to evaluate)"
    return line


def _has_splits(d: Any) -> bool:
    name = d.train_dataset
    return not name.endswith((".json", ".jsonl", ".parquet")) and d.train_split != "train"
