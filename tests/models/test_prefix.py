"""The shared-prefix layout (danka/models/prefix.py) by hand."""

from __future__ import annotations

from danka.models import prefix

PROMPT = [11, 12, 13, 14, 15, 16, 20, 21, 22]


def test_common_prefix_len_by_hand():
    assert prefix.common_prefix_len([[1, 2, 3, 4], [1, 2, 5]]) == 2  # 1, 2 shared
    # identical prompts: all but the last token (generate must run >= 1 token per row)
    assert prefix.common_prefix_len([[7, 8, 9], [7, 8, 9]]) == 2
    # [1, 2] is a prefix of [1, 2, 3], capped at len([1, 2]) - 1 = 1
    assert prefix.common_prefix_len([[1, 2], [1, 2, 3]]) == 1
    assert prefix.common_prefix_len([[5, 6], [7, 6]]) == 0
    assert prefix.common_prefix_len([PROMPT]) == len(PROMPT) - 1  # one prompt


def test_layout_by_hand():
    # p = 2 ([1, 2]); remainders [3, 4] and [5]: width 2, the shorter one padded in the middle
    ids, mask, p = prefix.layout([[1, 2, 3, 4], [1, 2, 5]], pad_id=0)
    assert p == 2
    assert ids.tolist() == [[1, 2, 3, 4], [1, 2, 0, 5]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 1]]
