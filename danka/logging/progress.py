"""Live progress: the training bar (a rich bar on a terminal, one plain line per step
otherwise), and :class:`WorkProgress` lines for the other waits (evaluation, generation,
reward-model training, export).

Reads these keys from the step's metrics when present: ``reward``; held-out accuracy
(first of :data:`ACCURACY_KEYS`); throughput (first of :data:`TOKENS_PER_S_KEYS`); every
``time/<phase>`` key (seconds). GPU memory comes from ``torch.cuda`` when CUDA is in use.
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO, Any

ACCURACY_KEYS = ("val/accuracy", "eval/accuracy", "val/acc", "eval/acc", "heldout/accuracy")
TOKENS_PER_S_KEYS = (
    "throughput/gen_tokens_per_s",  # what danka train logs: sampled tokens per rollout second
    "perf/tokens_per_s",
    "tokens_per_s",
    "throughput/tokens_per_s",
)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _num(value: Any) -> float | None:
    if hasattr(value, "item"):
        value = value.item()
    return float(value) if isinstance(value, (int, float)) else None


def _gpu_memory() -> str | None:
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        used = torch.cuda.max_memory_allocated() / 2**30
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        return f"gpu {used:.1f}/{total:.0f} GiB"
    except Exception:  # why: a progress display must never break training
        return None


def summarize(metrics: dict[str, Any]) -> list[str]:
    """The short ``"reward 0.512"``, ``"acc 0.430"``, ``"1234 tok/s"``,
    ``"rollout 3.1s"``... pieces shown next to the bar."""
    out = []
    reward = _num(metrics.get("reward"))
    if reward is not None:
        out.append(f"reward {reward:.3f}")
    for key in ACCURACY_KEYS:
        if _num(metrics.get(key)) is not None:
            out.append(f"acc {_num(metrics[key]):.3f}")
            break
    for key in TOKENS_PER_S_KEYS:
        if _num(metrics.get(key)) is not None:
            out.append(f"{_num(metrics[key]):.0f} tok/s")
            break
    for key in sorted(k for k in metrics if k.startswith("time/")):
        value = _num(metrics[key])
        if value is not None and value >= 0.05:  # a phase that did not run (0.0s) is noise
            out.append(f"{key.removeprefix('time/')} {value:.1f}s")
    mem = _gpu_memory()
    if mem:
        out.append(mem)
    return out


class TrainProgress:
    """``with TrainProgress(total_steps) as p: p.update(step, metrics)``.

    On a TTY a rich bar (step/total, elapsed, ETA, the :func:`summarize` pieces); otherwise
    one ``[progress] step 3/100 | reward 0.500 | ... | elapsed 0:01:02 | eta 0:30:00`` line
    per step on ``stream``. ``enabled=False`` turns everything into no-ops. ``start_step``
    is the step resumed from, so the ETA counts only steps run in this process.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        enabled: bool = True,
        stream: IO[str] | None = None,
        live: bool | None = None,
    ):
        self.total = int(total_steps)
        self.start_step = int(start_step)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._progress: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()

    def __enter__(self) -> TrainProgress:
        self._t0 = time.monotonic()
        if self.enabled and self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream),
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.start_step, info=""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def eta_seconds(self, step: int) -> float:
        """Mean time per step run in this process x steps left."""
        done = step - self.start_step
        if done <= 0:
            return float("nan")
        return (time.monotonic() - self._t0) / done * max(self.total - step, 0)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        """Show that ``step`` (1-based count of finished steps) finished with ``metrics``."""
        if not self.enabled:
            return
        pieces = summarize(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=" | ".join(pieces))
            return
        elapsed = time.monotonic() - self._t0
        line = " | ".join(
            [f"[progress] step {step}/{self.total}", *pieces]
            + [f"elapsed {_hms(elapsed)}", f"eta {_hms(self.eta_seconds(step))}"]
        )
        print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A one-off message (evaluation result, checkpoint saved) above the bar."""
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)


class WorkProgress:
    """Progress of a job of ``total`` items (prompts, pairs, steps) on ``stream`` (stderr):
    one ``[eval] 48/200 prompts | 12.0 prompts/s | 950 tok/s | elapsed 0:00:04 | eta
    0:00:13`` line after an update when ``every_s`` seconds passed since the last line
    (and always for the last item), so a wait longer than a few seconds is never silent.

    ``with WorkProgress(200, "eval", unit="prompts") as p: p.advance(16, tokens=310)``.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "items",
        stream: IO[str] | None = None,
        every_s: float = 5.0,
        enabled: bool = True,
        log: Any = None,
    ):
        self.total, self.label, self.unit = int(total), label, unit
        self.stream = stream
        self.every_s = every_s
        self.enabled = enabled
        self.log = log  # a callable taking the line, instead of the stream
        self.done = 0
        self.tokens = 0
        self._t0 = self._last = time.monotonic()

    def __enter__(self) -> WorkProgress:
        self._t0 = self._last = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _emit(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
        else:
            print(line, file=self.stream or sys.stderr, flush=True)

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        pieces = [f"[{self.label}] {self.done}/{self.total} {self.unit}"]
        if elapsed > 0 and self.done:
            rate = self.done / elapsed
            one = self.unit[:-1] if self.unit.endswith("s") else self.unit
            pieces.append(f"{rate:.1f} {self.unit}/s" if rate >= 1 else f"{1 / rate:.1f} s/{one}")
            if self.tokens:
                pieces.append(f"{self.tokens / elapsed:.0f} tok/s")
        pieces.append(f"elapsed {_hms(elapsed)}")
        if self.done < self.total:
            eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
            pieces.append(f"eta {_hms(eta)}")
        return " | ".join(pieces)

    def advance(self, n: int = 1, *, tokens: int = 0) -> None:
        """``n`` more items done (``tokens`` generated for them, for the tok/s piece)."""
        self.done = min(self.total, self.done + n)
        self.tokens += tokens
        if not self.enabled:
            return
        now = time.monotonic()
        if self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            self._emit(self.line())
