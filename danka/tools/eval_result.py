"""The result file ``danka eval`` keeps up to date: :func:`result_writer` writes the
result atomically (the previous version or the new one, never half), after every batch
(marked ``partial``) and at the end; a bad ``--output`` fails before any model loads.
"""

from __future__ import annotations

import json
from typing import Any

from danka.io import prepare_output_file, write_text_atomic


def result_writer(output: str | None, header: dict[str, Any]):
    """``write(result)``: ``header`` + ``result``, written atomically to ``output`` (a
    reader sees the previous version or the new one, never half); returns what it wrote.
    UserError now when ``output`` cannot be a file (a folder, a path through a file)."""
    path = prepare_output_file(output) if output else None

    def write(result: dict[str, Any]) -> dict[str, Any]:
        full = {**header, **result}
        if path is not None:
            write_text_atomic(path, json.dumps(full, indent=2, ensure_ascii=False))
        return full

    return write
