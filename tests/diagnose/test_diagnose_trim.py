"""fixtures/trim.py turns a run folder into a fixture the doctor reads the same way."""

import importlib.util
from pathlib import Path

from danka.diagnose import diagnose, read_run_dir

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_trim_keeps_what_the_doctor_reads(tmp_path):
    spec = importlib.util.spec_from_file_location("trim", FIXTURES / "trim.py")
    trim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trim)
    trim.trim(FIXTURES / "quickstart_cpu", tmp_path / "q", floor=0.5, completions=2)
    before, after = read_run_dir(FIXTURES / "quickstart_cpu"), read_run_dir(tmp_path / "q")
    assert [m["step"] for m in after.metrics] == [m["step"] for m in before.metrics]
    assert [s for s, _ in after.completions] == [7, 8]
    assert all(len(rows) == 16 for _, rows in after.completions)
    assert after.evals[0]["eval/guess_floor"] == 0.025  # an existing floor is kept
    assert [f.id for f in diagnose(after)] == [f.id for f in diagnose(before)]
