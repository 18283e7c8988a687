"""bench.learning.rm_tracking: RM score vs the logged rule reward, with hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.learning import rm_tracking

ROOT = Path(__file__).resolve().parents[3]


def test_pearson_by_hand_and_none_when_constant():
    # x = [1, 2, 3], y = [1, 0, 1]: means 2 and 2/3; sxy = (-1)(1/3) + 0 + (1)(1/3) = 0
    assert rm_tracking.pearson([1.0, 2.0, 3.0], [1.0, 0.0, 1.0]) == 0.0
    # y = 2x: perfectly correlated; y = -x: -1
    assert rm_tracking.pearson([1.0, 2.0, 4.0], [2.0, 4.0, 8.0]) == pytest.approx(1.0)
    assert rm_tracking.pearson([1.0, 2.0, 4.0], [-1.0, -2.0, -4.0]) == pytest.approx(-1.0)
    assert rm_tracking.pearson([1.0, 2.0], [0.0, 0.0]) is None  # no correct answer


def test_ranking_auc_counts_ties_as_half():
    # pos [2, 0], neg [1, 0]: pairs (2,1) win, (2,0) win, (0,1) loss, (0,0) tie -> 2.5 / 4
    assert rm_tracking.ranking_auc([2.0, 0.0], [1.0, 0.0]) == (0.625, 4)
    assert rm_tracking.ranking_auc([], [1.0]) == (None, 0)


def test_summarize_within_prompt_uses_only_pairs_of_one_prompt():
    samples = [
        {"prompt": "a", "rule": 1.0, "rm": 0.0},
        {"prompt": "a", "rule": 0.0, "rm": -1.0},  # within "a": correct 0 > wrong -1: 1/1
        {"prompt": "b", "rule": 0.0, "rm": 5.0},  # "b" has no correct answer: no pair
    ]
    s = rm_tracking.summarize(samples)
    assert s["auc_within_prompt"] == 1.0 and s["auc_within_prompt_pairs"] == 1
    # pooled: correct rm 0 vs wrong -1 (win) and 5 (loss) -> 1/2
    assert s["auc"] == 0.5 and s["auc_pairs"] == 2
    assert s["correct"] == 1 and s["rm_mean_wrong"] == 2.0  # (-1 + 5) / 2


def test_script_reads_completions_of_a_run(tmp_path):
    (tmp_path / "completions").mkdir()
    rows = [
        {"prompt": "p", "completion": "#### 1", "rewards": {"reward_model": 1.0, "gsm8k": 1.0}},
        {"prompt": "p", "completion": "#### 2", "rewards": {"reward_model": 0.0, "gsm8k": 0.0}},
        {"prompt": "p", "completion": "cut off", "rewards": {"reward_model": -3.0, "gsm8k": 0.0}},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "completions" / "step_3.jsonl").write_text(text)
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "bench", "rm-tracking", str(tmp_path), "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=60)
    got = json.loads(out.read_text())
    assert got["per_step"][0]["step"] == 3
    assert got["pooled"]["auc"] == 1.0  # 1.0 beats 0.0 and -3.0
    # rm [1, 0, -3] (mean -2/3) vs rule [1, 0, 0] (mean 1/3): deviations [5, 2, -7]/3 and
    # [2, -1, -1]/3; sxy = (10 - 2 + 7)/9 = 15/9, sxx = 78/9, syy = 6/9
    # -> r = 15 / sqrt(78 * 6) = 15 / 21.633 = 0.6934
    assert got["pooled"]["pearson"] == pytest.approx(0.6934, abs=1e-4)
    # only the two answers with "####": correct 1.0 vs wrong 0.0; the cut one's mean is -3
    assert got["pooled_with_marker"]["n"] == 2 and got["pooled_with_marker"]["auc"] == 1.0
    assert got["rm_mean_without_marker"] == -3.0
