"""The drift probe's statistics and KL, by hand."""

import math

import pytest
import torch

from danka.diagnose.probe import (
    PROBE_PROMPTS,
    is_marker_only,
    is_repeated,
    mean_kl,
    probe_stats,
)


def test_probe_prompts_need_words():
    assert 6 <= len(PROBE_PROMPTS) <= 10 and not any(
        ch.isdigit() for p in PROBE_PROMPTS for ch in p
    )


def test_marker_only_and_repeated():
    assert is_marker_only("#### 5") and is_marker_only("14\n14") and is_marker_only("\\boxed{3}")
    assert (
        not is_marker_only("Paris") and not is_marker_only("") and not is_marker_only("#### 5 km")
    )
    assert is_repeated("#### 14\n14\n14\n14")  # the line "14" three times
    assert is_repeated("the sea is blue and the sea is blue and the sea is blue")  # 4-gram x3
    assert not is_repeated("The sea is blue. The sea is deep.\nThe sea is wide.")
    assert not is_repeated("Paris is the capital of France.")


def test_probe_stats():
    answers = ["Paris is the capital.", "", "#### 5", "#### 5\n#### 5\n#### 5"]
    s = probe_stats(answers, [5, 0, 3, 9])
    # mean length (5 + 0 + 3 + 9) / 4 = 4.25; empty 1/4; marker-only 2/4 (the last is also
    # repeated: 1/4); degenerate = any of them: 3/4
    assert (s.n, s.mean_length, s.empty_frac, s.marker_only_frac, s.repeated_frac,
            s.degenerate_frac) == (4, 4.25, 0.25, 0.5, 0.25, 0.75)  # fmt: skip
    m = s.metrics(kl=0.5)
    assert m["probe/degenerate_frac"] == 0.75 and m["probe/kl"] == 0.5
    assert probe_stats([], []).n == 0
    with pytest.raises(ValueError):
        probe_stats(["a"], [])


def test_mean_kl_is_k1_over_the_masked_tokens():
    ref = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    now = torch.tensor([[-1.5, -2.0], [-1.0, 9.0]])  # 9.0 sits on padding
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # log pi_0 - log pi_t on the three tokens: 0.5, 0.0, 0.5 -> mean 1/3
    assert math.isclose(mean_kl(now, ref, mask), 1 / 3, rel_tol=1e-9)
    assert mean_kl(now, ref, torch.zeros(2, 2)) == 0.0
    # more sure of the base's own answers: slightly negative
    assert mean_kl(ref + 0.1, ref, mask) == pytest.approx(-0.1)
