from danka.data.calc_task import calc_rows, calc_split, write_calc_task


def test_problems_are_exact_deterministic_and_split_disjoint():
    train = calc_rows(300, seed=1, split="train")
    test = calc_rows(100, seed=2, split="test")
    assert calc_rows(300, seed=1, split="train") == train  # deterministic by seed
    assert calc_rows(5, seed=3, split="train") != train[:5]
    for r in train + test:
        a, b, op = r.extra["a"], r.extra["b"], r.extra["op"]
        assert 1000 <= a <= 9999 and 100 <= b <= 999
        if op == "*":
            assert r.prompt == f"What is {a} * {b}?" and r.ground_truth == str(a * b)
        else:
            assert r.prompt == f"What is {a * b} / {b}?" and r.ground_truth == str(a)
    pairs = lambda rows: {frozenset((r.extra["a"], r.extra["b"])) for r in rows}  # noqa: E731
    assert not pairs(train) & pairs(test)
    assert all(calc_split(r.extra["b"], r.extra["a"]) == "test" for r in test)  # mirror too
    assert len({r.prompt for r in train}) == 300


def test_write_jsonl(tmp_path):
    train, test = write_calc_task(tmp_path, train=3, test=2, seed=0)
    assert len(train.read_text().splitlines()) == 3 and len(test.read_text().splitlines()) == 2
