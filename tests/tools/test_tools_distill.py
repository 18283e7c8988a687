"""`danka distill`: a rule teacher's scores distilled into a small classifier that
danka then accepts as a reward model (its head is trained)."""

from __future__ import annotations

import json
import warnings

from danka.cli import main
from danka.models.tiny import save_tiny_model
from danka.rewards.model import ClassifierReward


def test_distill_gsm8k_rule_into_a_tiny_classifier(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    with data.open("w") as f:
        for i in range(40):
            right = i % 2 == 0  # half the responses answer, half refuse
            response = f"{i} + 1 = {i + 1}\n#### {i + 1}" if right else "I do not know."
            f.write(json.dumps({"prompt": f"What is {i} + 1?", "response": response,
                                "answer": str(i + 1)}) + "\n")  # fmt: skip
    student = save_tiny_model(tmp_path / "student")
    out = tmp_path / "rm"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["distill", "--data", str(data), "--teacher", "gsm8k", "--answer-key",
                     "answer", "--student", str(student), "--output", str(out), "--epochs", "4",
                     "--lr", "3e-3", "--batch-size", "8", "--max-length", "96"])  # fmt: skip
    assert code == 0
    # float() of a loss with grad warned once per batch ("Converting a tensor with requires_grad")
    assert not [w for w in caught if "requires_grad" in str(w.message)]
    result = json.loads((out / "distill_result.json").read_text())
    assert result["pairs"] == 40 and result["held_out"] == 4 and result["train"] == 36
    # teacher scores are 1/0 half and half: MSE of a near-zero head starts near 0.5
    assert result["held_out_mse_after"] < result["held_out_mse_before"]
    assert result["last_loss"] < result["first_loss"]
    rm = ClassifierReward.from_pretrained(out)  # accepted: the head is in the checkpoint
    assert rm.max_length == 96  # the length it was trained on (recorded in config.json)
    scores = rm(["What is 2 + 1?", "What is 2 + 1?"], ["2 + 1 = 3\n#### 3", "I do not know."])
    assert scores.shape == (2,) and bool(scores[0] > scores[1])


def test_distill_bad_input(tmp_path, capsys):
    student = save_tiny_model(tmp_path / "student")
    code = main(["distill", "--data", str(tmp_path / "none.jsonl"), "--teacher", "gsm8k",
                 "--student", str(student), "--output", str(tmp_path / "o")])  # fmt: skip
    assert code == 2 and "none.jsonl" in capsys.readouterr().err
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "x", "response": "y"}) + "\n")
    code = main(["distill", "--data", str(tmp_path / "p.jsonl"), "--student", str(student),
                 "--output", str(tmp_path / "o")])  # fmt: skip
    assert code == 2 and "no teacher given" in capsys.readouterr().err
