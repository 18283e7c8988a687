"""RunHistory: the evaluations so far and the guess floors, one owner, saved as the
checkpoint's ``history`` dict (the format earlier checkpoints hold)."""

from danka.trainer.history import RunHistory


def test_records_in_order_and_keeps_the_first_floors():
    h = RunHistory()
    h.add({"step": 0, "eval/accuracy": 0.25}, {"detail": "first"})
    h.add({"step": 4, "eval/accuracy": 0.5}, {"detail": "second"})  # floors fixed at step 0
    assert [e["step"] for e in h.evals] == [0, 4]
    assert h.to_json() == {
        "eval": [{"step": 0, "eval/accuracy": 0.25}, {"step": 4, "eval/accuracy": 0.5}],
        "floors": {"detail": "first"},
    }


def test_round_trips_a_checkpoints_history_and_reads_old_ones():
    saved = {"eval": [{"step": 0, "eval/accuracy": 0.1}], "floors": {"detail": "d"}}
    assert RunHistory.from_json(saved).to_json() == saved
    assert RunHistory.from_json({"eval": []}).to_json() == {"eval": []}  # no floors yet
    assert RunHistory.from_json(None).evals == []  # a checkpoint without history
    copy = RunHistory.from_json(saved)
    copy.add({"step": 2}, {})
    assert len(saved["eval"]) == 1  # the loaded dict is not the run's list
