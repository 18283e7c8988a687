"""The examples' comments and the GPU recipe page point to sections that exist: an example
that sends a user to BENCHMARKS.md "What a real model learns here" (a heading that was
renamed) leaves them searching."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUOTED = re.compile(r'([\w/.]+\.md),? "([^"]+)"')  # BENCHMARKS.md "A heading"
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)")  # [text](path.md#anchor)


def headings(path: Path) -> list[str]:
    return [ln.lstrip("#").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def comment_text(path: Path) -> str:
    """The comments of a YAML file, joined so that a quote may wrap over two lines."""
    lines = [ln.split("#", 1)[1].strip() for ln in path.read_text().splitlines() if "#" in ln]
    return " ".join(lines)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=str)
def test_example_comments_name_existing_files_and_headings(example):
    text = comment_text(example)
    for name, heading in QUOTED.findall(text):
        assert heading in headings(ROOT / name), f"{example.name}: no {heading!r} in {name}"
    for name in re.findall(r"\b(docs/[\w-]+\.md)\b", text):
        assert (ROOT / name).is_file(), f"{example.name}: {name} does not exist"


@pytest.mark.parametrize("page", ["docs/gsm8k_gpu.md", "README.md"])
def test_page_links_reach_a_file_and_its_heading(page):
    path = ROOT / page
    for target, anchor in LINK.findall(path.read_text()):
        linked = (path.parent / target).resolve()
        assert linked.is_file(), f"{page}: {target} does not exist"
        if anchor:
            assert anchor in {slug(h) for h in headings(linked)}, (
                f"{page}: no #{anchor} in {target}"
            )
