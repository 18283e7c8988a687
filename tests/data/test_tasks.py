from danka.data.formats import load_prompt_rows
from danka.data.tasks import arithmetic_rows, pair_split, write_rows_jsonl


def _pairs(rows):
    return {frozenset((r.extra["a"], r.extra["b"])) for r in rows}


def test_train_and_test_are_disjoint_across_seeds():
    train = arithmetic_rows(2000, seed=1, split="train")
    test = arithmetic_rows(500, seed=2, split="test")
    assert _pairs(train).isdisjoint(_pairs(test))  # also b + a mirrors
    assert all(pair_split(r.extra["a"], r.extra["b"]) == "test" for r in test)


def test_rows_are_correct_deterministic_and_distinct():
    rows = arithmetic_rows(50, seed=7)
    assert (
        rows[0].prompt
        == f"What is {rows[0].extra['a']} + {rows[0].extra['b']}? Reply with only the number."
    )
    assert all(r.ground_truth == str(r.extra["a"] + r.extra["b"]) for r in rows)
    assert all(10 <= r.extra["a"] <= 99 and r.data_source == "danka/arithmetic" for r in rows)
    assert [r.prompt for r in rows] == [r.prompt for r in arithmetic_rows(50, seed=7)]
    assert [r.prompt for r in rows] != [r.prompt for r in arithmetic_rows(50, seed=8)]
    assert len({r.prompt for r in rows}) == 50


def test_more_rows_than_pairs_repeats_the_pool():
    # operands 1..3: 9 ordered pairs in all, so 30 rows must repeat some
    rows = arithmetic_rows(30, seed=0, split="train", low=1, high=3) + arithmetic_rows(
        30, seed=0, split="test", low=1, high=3
    )
    assert len(rows) == 60


def test_write_rows_jsonl_round_trips(tmp_path):
    rows = arithmetic_rows(3, seed=0, split="test")
    path = write_rows_jsonl(rows, tmp_path / "test.jsonl")
    back = load_prompt_rows(str(path))
    assert back.format == "trl"
    assert [(r.prompt, r.ground_truth, r.data_source) for r in back.rows] == [
        (r.prompt, r.ground_truth, r.data_source) for r in rows
    ]
