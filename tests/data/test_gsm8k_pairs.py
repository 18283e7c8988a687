"""`danka data gsm8k-pairs`: reference vs wrong final number, reference vs refusal."""

from __future__ import annotations

import json
import random

from danka.cli import main
from danka.data.gsm8k import find_gsm8k_answer
from danka.data.gsm8k_pairs import REFUSALS, with_wrong_final_number
from danka.data.pairs import load_pairs


def _gsm8k(path, n=10):
    rows = [{"question": f"Tom has {i} apples and buys 3. How many?",
             "answer": f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}"} for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_wrong_final_number_keeps_the_reasoning():
    rng = random.Random(0)
    for answer in ("72", "0", "1.5", "-4"):
        solution = f"Some steps = {answer}\n#### {answer}"
        wrong = with_wrong_final_number(solution, rng)
        assert wrong.startswith("Some steps = " + answer + "\n#### ")
        assert float(find_gsm8k_answer(wrong)) != float(answer)


def test_cli_writes_two_pair_sets_with_one_split(tmp_path, capsys):
    rows = _gsm8k(tmp_path / "train.jsonl")
    out = tmp_path / "pairs"
    code = main(["data", "gsm8k-pairs", "--input", str(tmp_path / "train.jsonl"),
                 "--output", str(out), "--test-fraction", "0.2"])  # fmt: skip
    assert code == 0
    questions = {}
    for name in ("wrong_number", "refusal"):
        train, _ = load_pairs(str(out / name / "train.jsonl"))
        test, _ = load_pairs(str(out / name / "test.jsonl"))
        assert (len(train), len(test)) == (8, 2)
        questions[name] = [p.prompt[0]["content"] for p in test]
        assert not set(questions[name]) & {p.prompt[0]["content"] for p in train}
        for p in train + test:
            assert p.chosen in {r["answer"] for r in rows}
            if name == "refusal":
                assert p.rejected in REFUSALS
            else:
                assert find_gsm8k_answer(p.rejected) != find_gsm8k_answer(p.chosen)
    assert questions["wrong_number"] == questions["refusal"]  # the same held-out questions


def test_cli_bad_gsm8k_row_exits_2_with_line(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a\n#### 1"}) + "\n"
                    + json.dumps({"question": "q", "answer": "no final answer"}) + "\n")  # fmt: skip
    code = main(["data", "gsm8k-pairs", "--input", str(path), "--output", str(tmp_path / "o")])
    assert code == 2 and f"{path}:2" in capsys.readouterr().err
