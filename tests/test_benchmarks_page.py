"""BENCHMARKS.md holds current tables, one per question (history goes to
bench/results/INDEX.md): it stays a page a reader finishes."""

from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
MAX_LINES = 400


def test_benchmarks_stays_a_page_of_current_tables():
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"BENCHMARKS.md has {len(lines)} lines (at most {MAX_LINES}): replace a table's rows "
        "with the current run and move what changed when to bench/results/INDEX.md's History"
    )
