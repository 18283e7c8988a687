"""The result file ``danka eval`` keeps up to date: :class:`ResultFile` writes the result
atomically (the previous version or the new one, never half), after every batch (marked
``partial``) and at the end; a bad ``--output`` fails before any model loads.

A partial result never replaces a complete one: where ``--output`` holds a complete
result when the evaluation starts (an earlier run's), the partial results go beside it
(``NAME.partial.json``), and only this run's complete result replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from danka.io import prepare_output_file, read_json_object, write_text_atomic


def beside(path: Path) -> Path:
    """Where a partial result goes while ``path`` holds a complete one:
    ``eval.json`` -> ``eval.partial.json``."""
    return path.with_name(f"{path.stem}.partial{path.suffix}")


class ResultFile:
    """``write(result)``: ``header`` + ``result``, written atomically to ``output``, or
    beside it (:func:`beside`) for a partial result while ``output`` holds an earlier
    complete one; returns what it wrote. :attr:`last` is the file it wrote last. UserError
    now when ``output`` cannot be a file (a folder, a path through a file)."""

    def __init__(self, output: str | None, header: dict[str, Any], log: Any = None):
        self.header, self.log = header, log
        self.output = prepare_output_file(output) if output else None
        self.last: Path | None = None
        earlier = read_json_object(self.output) if self.output is not None else None
        complete = earlier is not None and earlier.get("partial") is not True
        self.keep = self.output if complete else None  # the earlier complete result

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        full = {**self.header, **result}
        if self.output is None:
            return full
        path = self.output
        if result.get("partial") and self.keep is not None:
            path = beside(self.output)
            if self.last != path and self.log is not None:
                kept = f"[eval] {self.output} holds an earlier complete result: kept"
                self.log(f"{kept}; this partial result goes to {path}")
        write_text_atomic(path, json.dumps(full, indent=2, ensure_ascii=False))
        if path == self.output and self.keep is not None:
            beside(self.output).unlink(missing_ok=True)  # complete now: the partial is stale
        self.last = path
        return full
