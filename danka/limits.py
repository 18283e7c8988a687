"""The range of every integer setting, every number on a command line, every template.

YAML and Python read integers of any size, and the type check accepts them: a
``trainer.seed`` of 2**70 passed validation and then broke ``torch.manual_seed`` (a
traceback); ``data.task_train_size: 10**12`` filled memory for minutes without a word;
``--print-config`` accepted a 400-digit ``total_steps``. Every integer setting therefore
has a range from what it counts, checked once after the type check
(:func:`check_limits`), and every number a command-line flag takes is checked the same
way (:func:`check_flag_numbers`): integers in range, floats finite. A duration (a
timeout, minutes) is at most a year: ``reward.timeout_s: 1e300`` is finite, but Python's
clocks overflow on it mid-run. A number written as text (a memory size) is read through
:func:`read_decimal`, and a ``str.format`` template's specs are bounded
(:func:`check_template`): ``{a:>20000000}`` is one short setting and a 20 MB prompt.

Lower bounds that mean something (a batch of at least 1) stay with the validation that
words them; the ranges here are what no setting of that kind can sensibly exceed.
Standard library only: the CLI checks its flags before anything heavy is imported.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from danka.errors import UserError

INT32 = 2**31 - 1  # any other count: steps, epochs, rows, characters
SEED = (0, 2**32 - 1)  # what torch, numpy and random all take
TOKENS = 1 << 24  # a sequence length: 16M tokens, beyond any model's context
BATCH = 1 << 20  # prompts or sequences in one batch
ROWS = 1_000_000  # problems a task generates (a million: 125k steps at batch 8)
RANK = 1 << 16  # LoRA rank: above any model's hidden size
TURNS = 1 << 16  # turns or tool calls of one sample

# dotted key -> (lowest, highest, what the number counts)
_TOKEN_KEYS = (
    "model.tokenizer_kwargs.model_max_length",
    "trainer.max_length",
    "trainer.max_new_tokens",
    "eval.max_new_tokens",
    "eval.probe_max_new_tokens",
    "agent.max_total_tokens",
    "data.max_prompt_length",
    "speed.max_packed_length",
    "reward.overlong_buffer.length",
    "speed.logprob_chunk_size",
)
_BATCH_KEYS = (
    "trainer.batch_size",
    "trainer.samples_per_prompt",
    "trainer.mini_batch_size",
    "trainer.micro_batch_size",
    "rollout.generation_batch_size",
    "logging.save_completions",
)
LIMITS: dict[str, tuple[int, int, str]] = {
    "trainer.seed": (*SEED, "a random seed"),
    "lora.lora_r": (0, RANK, "a LoRA rank"),
    "data.task_train_size": (-INT32, ROWS, "generated problems"),
    "data.eval_size": (-INT32, ROWS, "held-out prompts"),
    "agent.max_turns": (-INT32, TURNS, "turns per sample"),
    "agent.max_tool_calls": (-INT32, TURNS, "tool calls per sample"),
    **{k: (-INT32, TOKENS, "a number of tokens") for k in _TOKEN_KEYS},
    **{k: (-INT32, BATCH, "a batch size") for k in _BATCH_KEYS},
}
DEFAULT = (-INT32, INT32, "a count")
# float settings that become a wait: Python's clocks overflow past ~1e9 s (a traceback
# mid-run from a finite 1e300); a year is more than any of them means
YEAR_S = 365 * 24 * 3600.0
FLOAT_LIMITS: dict[str, tuple[float, str]] = {
    "reward.timeout_s": (YEAR_S, "seconds"),
    "agent.tool_timeout_s": (YEAR_S, "seconds"),
    "trainer.max_train_minutes": (YEAR_S / 60, "minutes"),
    "checkpoint.save_minutes": (YEAR_S / 60, "minutes"),
    "eval.every_minutes": (YEAR_S / 60, "minutes"),
}


def _number_settings(node: Any, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(dotted key, value) of every integer and float setting in the config ``node``."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _number_settings(value, key + ".")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from _number_settings(item, f"{key}[{i}].")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


def _digits(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def check_limits(config: Any, source: Any) -> None:
    """UserError naming the key (``source.where``: file and line) for the first integer
    setting outside its range, or a duration (a timeout, minutes) over a year."""
    for key, value in _number_settings(config):
        if isinstance(value, float):
            top, unit = FLOAT_LIMITS.get(key, (math.inf, ""))
            if abs(value) > top:
                raise UserError(
                    f"{value:g} {unit} is more than a year",
                    where=source.where(key),
                    fix=f"set {key} to at most {top:g}",
                )
            continue
        lo, hi, what = LIMITS.get(key, DEFAULT)
        if not lo <= value <= hi:
            span = f"{lo:,} to {hi:,}" if lo >= 0 else f"at most {hi:,}"
            raise UserError(
                f"{_digits(value)} is out of range for {what} ({span})",
                where=source.where(key),
                fix=f"set {key} between {max(lo, 0):,} and {hi:,}",
            )


# a number written as text (a memory size): longer than this it is no size anyone means,
# and float() reads 400 digits as inf (or 1e399), which overflows every integer it becomes
NUMBER_CHARS = 40


def read_decimal(text: str) -> float | None:
    """The finite number ``text`` writes (digits, a point), or None where it is none or
    longer than :data:`NUMBER_CHARS`: every numeric string a setting or flag holds is
    read through this, so none can overflow later."""
    if len(text) > NUMBER_CHARS:
        return None
    try:
        value = float(text)
    except ValueError:  # "1.2.3"
        return None
    return value if math.isfinite(value) else None


FORMAT_WIDTH = 1000  # the widest field (or most digits) a template's format spec asks
TEMPLATE_CHARS = 10_000  # a template asks one question; a document is data, not a setting


def check_template(key: str, text: str, names: Sequence[str]) -> None:
    """UserError naming ``key`` unless ``text`` is a ``str.format`` template of at most
    TEMPLATE_CHARS characters whose fields are plain ``names`` with format specs of at
    most FORMAT_WIDTH: ``{a:>20000000}`` makes every prompt 20 MB (2000 rows: past 3 GB
    in seconds); a field inside a spec (``{a:>{b}}``) takes its width from a value. What
    the template adds to its values, its text and its specs' widths and precisions, is at
    most TEMPLATE_CHARS as a whole: 1,100 fields ``{a:>999}`` fit in 8,800 characters
    and fill a 1.1 MB prompt."""
    import string

    fields = ", ".join("{" + n + "}" for n in names)

    def refuse(why: str) -> None:
        raise UserError(
            f"template {text[:60]!r} cannot be filled: {why}"[:300],
            where=key,
            fix=f"write the text with the placeholders {fields} (a format spec such as "
            f"{{{names[0]}:>4}} at most {FORMAT_WIDTH} wide); double a literal {{ or }}",
        )

    if len(text) > TEMPLATE_CHARS:
        refuse(f"{len(text):,} characters, more than {TEMPLATE_CHARS:,}")
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as err:  # an unmatched brace
        refuse(str(err))
    filled = 0  # characters the template adds to its values, at most
    for literal, field, spec, _ in parsed:
        filled += len(literal)
        if field is None:
            continue
        if field not in names:
            refuse(f"no placeholder {{{field}}} (it has {fields})")
        if "{" in spec:
            refuse(f"a field inside a format spec ({{{field}:{spec}}})")
        sizes = re.findall(r"\d+", spec)
        if any(len(n.lstrip("0")) > 4 or int(n) > FORMAT_WIDTH for n in sizes):
            refuse(f"its spec {spec[:20]!r}: a width or precision is at most {FORMAT_WIDTH}")
        filled += sum(int(n) for n in sizes)
    if filled > TEMPLATE_CHARS:
        refuse(
            f"its text and field widths come to {filled:,} characters filled, more than "
            f"{TEMPLATE_CHARS:,}"
        )


# command-line flags: an int flag is a count unless named here; a float must be finite
FLAG_LIMITS: dict[str, tuple[int, int, str]] = {
    "seed": (*SEED, "a random seed"),
    "max_new_tokens": (1, TOKENS, "a number of tokens"),
    "max_length": (1, TOKENS, "a number of tokens"),
    "batch_size": (1, BATCH, "a batch size"),
    "samples": (1, BATCH, "samples per prompt"),
    "max_turns": (-INT32, TURNS, "turns per sample"),  # >= 1: the agent settings say so
    "max_tool_calls": (-INT32, TURNS, "tool calls per sample"),
    "nproc": (1, 4096, "processes"),
    "epochs": (1, INT32, "epochs"),
    "limit": (0, INT32, "rows"),
    "n": (0, INT32, "prompts"),
}
# float flags with a range (bounds included); any other float flag only needs to be finite
FLOAT_FLAGS: dict[str, tuple[float, float, str]] = {
    "top_p": (1e-9, 1.0, "top-p (above 0, at most 1)"),
    "temperature": (0.0, 100.0, "a temperature (0 = greedy)"),
    "test_fraction": (0.0, 0.99, "a fraction"),
    "lr": (1e-12, 10.0, "a learning rate"),
}


def check_flag_numbers(args: Any) -> None:
    """UserError for the first number on the command line (an ``argparse`` namespace)
    out of range: an integer outside its flag's range, a float NaN or infinite."""
    for name, value in sorted(vars(args).items()):
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(
                f"must be a finite number, got {value}",
                where=flag,
                fix=f"give {flag} a finite number (NaN and infinity are never valid)",
            )
        if isinstance(value, float) and name in FLOAT_FLAGS:
            lo, hi, what = FLOAT_FLAGS[name]
            if not lo <= value <= hi:
                raise UserError(
                    f"{value:g} is out of range for {what}",
                    where=flag,
                    fix=f"give {flag} a number from {lo:g} to {hi:g}",
                )
        if isinstance(value, int) and not isinstance(value, bool):
            lo, hi, what = FLAG_LIMITS.get(name, DEFAULT)
            if not lo <= value <= hi:
                raise UserError(
                    f"{_digits(value)} is out of range for {what}",
                    where=flag,
                    fix=f"give {flag} a number between {max(lo, 0):,} and {hi:,}",
                )
