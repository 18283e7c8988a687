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


# More than half of the training prompts repeating another: each step samples the same few
# questions again (a file written by a loop, the wrong data.prompt_key, a task pool too small).
REPEAT_SHARE = 0.5


def repeats_warning(train: list) -> str | None:
    """A warning when over half the training prompts repeat another, else None."""
    import json
    from collections import Counter

    if len(train) < 2:
        return None
    counts = Counter(json.dumps(r.prompt, sort_keys=True) for r in train)
    repeats = len(train) - len(counts)
    if repeats <= REPEAT_SHARE * len(train):
        return None
    text, top = counts.most_common(1)[0]
    return (
        f"{repeats} of {len(train)} training prompts repeat another ({len(counts)} distinct; "
        f"the most common appears {top} times: {text[:80]}): the run trains on the same few "
        "questions; deduplicate the data, check data.prompt_key, or widen data.task_kwargs"
    )
