"""Data: read files, convert row formats to PromptRow, render chat templates, encode.

Pipeline: ``load_prompt_rows`` (files.py + formats.py) -> ``encode_prompts``
(template.py) -> ``left_pad`` per batch. ``gsm8k.py`` converts the official GSM8K files
to verl's layout; ``tasks.py`` generates offline tasks for the quickstart.
"""

from danka.data.files import read_records
from danka.data.formats import (
    FORMATS,
    Columns,
    LoadResult,
    ReadOptions,
    detect_format,
    load_prompt_rows,
    to_prompt_row,
)
from danka.data.gsm8k import (
    GSM8K_INSTRUCTION,
    convert_gsm8k,
    find_gsm8k_answer,
    reference_answer,
)
from danka.data.inspect import describe_first_batch
from danka.data.tasks import arithmetic_rows, write_rows_jsonl
from danka.data.template import (
    OVERLONG_POLICIES,
    EncodedPrompts,
    encode_prompts,
    left_pad,
    render_prompt,
)

__all__ = [
    "FORMATS",
    "GSM8K_INSTRUCTION",
    "OVERLONG_POLICIES",
    "Columns",
    "EncodedPrompts",
    "LoadResult",
    "ReadOptions",
    "arithmetic_rows",
    "convert_gsm8k",
    "describe_first_batch",
    "detect_format",
    "encode_prompts",
    "reference_answer",
    "find_gsm8k_answer",
    "left_pad",
    "load_prompt_rows",
    "read_records",
    "render_prompt",
    "to_prompt_row",
    "write_rows_jsonl",
]
