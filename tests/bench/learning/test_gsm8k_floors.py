"""bench.learning.gsm8k_floors: answers that do not reason, scored by danka's strict gsm8k rule."""

from __future__ import annotations

import json

from bench.learning import gsm8k_floors


def test_floors_by_hand(tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "A box of 2 and a box of 5.", "answer": "#### 5"},
        {"question": "Half of 10 is what?", "answer": "#### 5"},
        {"question": "1,200 minus 200?", "answer": "#### 1,000"},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    test = gsm8k_floors.load_test(path)
    assert [r.ground_truth for r in test] == ["7", "5", "5", "1000"]
    got = gsm8k_floors.floors(test)
    # the most common answer is 5 (twice): "#### 5" is right on 2 of 4 rows
    assert got["constant"] == {"answer": "#### 5", "times_right": 2, "strict": 0.5}
    # last numbers of the questions: 4, 5, 10, 200 -> right only on the second row
    assert got["last_number_of_question"]["strict"] == 0.25
