import pytest

from danka.data.formats import load_prompt_rows
from danka.data.tasks import (
    TASKS,
    arithmetic_rows,
    chain_expression,
    chain_key,
    chain_rows,
    chain_split,
    pair_split,
    task_rows,
    write_rows_jsonl,
)
from danka.errors import UserError


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


def test_arithmetic_template_through_task_kwargs():
    # the quickstart asks without "Reply with only the number.": its worked example shows the form
    rows = task_rows(
        "arithmetic", 5, seed=7, split="test", kwargs={"template": "What is {a} + {b}?"}
    )
    default = arithmetic_rows(5, seed=7, split="test")
    assert [r.prompt for r in rows] == [
        f"What is {r.extra['a']} + {r.extra['b']}?" for r in default
    ]  # the same problems, only the question's wording differs
    assert [r.ground_truth for r in rows] == [r.ground_truth for r in default]
    with pytest.raises(UserError, match="cannot be filled") as err:
        task_rows("arithmetic", 5, seed=7, split="test", kwargs={"template": "What is {x}?"})
    assert err.value.where == "data.task_kwargs.template"
    with pytest.raises(UserError, match="expected str"):
        task_rows("arithmetic", 5, seed=7, split="test", kwargs={"template": 3})


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


# ----------------------------------------------------------------------------- chain task


def test_chain_rows_are_right_and_worked_left_to_right():
    rows = chain_rows(40, seed=3, split="train", length=3, demo=(), template="What is {expr}?")
    for r in rows:
        terms = r.extra["terms"]
        assert r.ground_truth == str(sum(terms)) and len(terms) == 3
        assert all(10 <= abs(t) <= 99 for t in terms) and terms[0] > 0
        # every partial sum stays >= 0: "23 - 41 + 30" is never asked
        assert all(sum(terms[: k + 1]) >= 0 for k in range(3))
        assert r.prompt == f"What is {chain_expression(terms)}?"
    assert chain_expression([23, 41, -17]) == "23 + 41 - 17"
    again = chain_rows(40, seed=3, split="train", length=3, demo=(), template="What is {expr}?")
    assert [r.prompt for r in rows] == [r.prompt for r in again]


def test_default_chain_is_the_reasoning_example():
    # two two-digit terms, + or -, after the worked example "36 + 47 = 83 / #### 83"
    rows = chain_rows(200, seed=0, split="test")
    assert {len(r.extra["terms"]) for r in rows} == {2}
    assert {t[1] > 0 for t in (r.extra["terms"] for r in rows)} == {True, False}
    demo, answer, question = rows[0].prompt
    assert demo["content"].startswith("What is 36 + 47? Work it out one step per line")
    assert answer == {"role": "assistant", "content": "36 + 47 = 83\n#### 83"}
    assert question["content"].endswith('write the final answer after "####".')
    # the worked example is never a problem of either split
    train = chain_rows(3000, seed=0, split="train")
    assert not any(r.extra["terms"] == [36, 47] for r in rows + train)


def test_chain_train_and_test_are_disjoint_up_to_reordering():
    # 23 + 41 - 17 and 41 - 17 + 23 share the key [-17, 23, 41]: one split for both
    assert chain_key([23, 41, -17]) == chain_key([41, -17, 23]) == "-17,23,41"
    train = chain_rows(3000, seed=1, split="train", length=3)
    test = chain_rows(300, seed=2, split="test", length=3)
    keys = lambda rows: {chain_key(r.extra["terms"]) for r in rows}  # noqa: E731
    assert keys(train).isdisjoint(keys(test))
    assert all(chain_split(r.extra["terms"]) == "test" for r in test)
    assert len(keys(test)) == 300  # distinct while the pool lasts


def test_small_chain_pool_repeats_instead_of_looping_forever():
    # one-digit terms, length 2, addition only: 81 ordered pairs, ~20% of 45 keys in test
    rows = chain_rows(50, seed=0, split="test", length=2, low=1, high=9, subtract=False, demo=())
    assert len(rows) == 50 and len({r.prompt for r in rows}) < 50


def test_task_registry():
    assert {"arithmetic", "chain", "calculator"} <= set(TASKS)
    assert task_rows("chain", 3, seed=0, split="test")[0].data_source == "danka/chain"
    with pytest.raises(UserError, match="unknown task 'nope'") as err:
        task_rows("nope", 3, seed=0, split="test")
    assert err.value.where == "data.task" and "chain" in err.value.fix


def test_chain_with_a_two_digit_start_and_a_worked_example_turn():
    demo = (("What is 36 + 7 - 4?", "36 + 7 = 43\n43 - 4 = 39\n#### 39"),)
    rows = chain_rows(20, seed=0, split="test", length=3, low=1, high=9, first=(10, 99),
                      demo=demo, template="What is {expr}?")  # fmt: skip
    for r in rows:
        t = r.extra["terms"]
        assert 10 <= t[0] <= 99 and all(1 <= abs(x) <= 9 for x in t[1:])
        # the example is an earlier exchange; the question is the last user turn
        assert [m["role"] for m in r.prompt] == ["user", "assistant", "user"]
        assert r.prompt[1]["content"].endswith("#### 39")
        assert r.prompt[2]["content"] == f"What is {chain_expression(t)}?"


@pytest.mark.parametrize(
    "template, word",
    [
        ("{a:>20000000}", "at most 1000"),  # before: past 3 GB in 8 s
        ("{a:>1001} + {b}", "at most 1000"),
        ("{a:.5000} + {b}", "at most 1000"),
        ("{a:" + "9" * 5000 + "}", "at most 1000"),  # no int() of 5000 digits either
        ("{a:>{b}}", "inside a format spec"),  # the width would come from a value
        ("{a.__class__}", "cannot be filled"),
        ("{a:>5", "cannot be filled"),
        ("x" * 20_000 + "{a}", "characters"),
    ],
    ids=[
        "width-20M",
        "width-1001",
        "precision",
        "5000-digits",
        "nested",
        "attribute",
        "unclosed",
        "long",
    ],
)
def test_a_template_is_bounded_before_any_row_is_made(template, word):
    """One row each (the old code made them: 20 MB at most); a run makes thousands."""
    with pytest.raises(UserError, match=word) as err:
        task_rows("arithmetic", 1, seed=0, split="train", kwargs={"template": template})
    assert err.value.where == "data.task_kwargs.template" and err.value.fix
    with pytest.raises(UserError, match=word):  # every str.format template alike
        kwargs = {"template": template.replace("a", "expr")}
        task_rows("chain", 1, seed=0, split="train", kwargs=kwargs)


def test_a_template_is_bounded_as_a_whole_not_only_field_by_field():
    """1,100 fields of width 999 fit in 8,800 characters, each spec under the per-field
    bound, and filled they are a 1.1 MB prompt (2,200 rows: 2.4 GB). What a template
    adds to its values (text and widths) is bounded as a whole; checked, not filled."""
    from danka.limits import TEMPLATE_CHARS, check_template

    with pytest.raises(UserError, match="field widths") as err:
        check_template("data.task_kwargs.template", "{a:>999}" * 1100 + "{b}", ["a", "b"])
    assert err.value.where == "data.task_kwargs.template"
    assert f"{TEMPLATE_CHARS:,}" in err.value.what
    check_template("k", "{a:>999}" * 9 + "{b:.3}", ["a", "b"])  # 9k of padding is fine


def test_a_template_with_modest_specs_is_filled():
    rows = task_rows("arithmetic", 3, seed=0, split="train", kwargs={"template": "{a:>4}+{b:03d}="})
    assert all(r.prompt == f"{r.extra['a']:>4}+{r.extra['b']:03d}=" for r in rows)


def test_a_template_is_refused_at_config_validation(tmp_path):
    """Before: the config loaded, and the run grew past 3 GB making the rows."""
    from danka.config import load_config
    from tests.config.bad_config import BASE, write_config

    text = BASE + 'data:\n  task: arithmetic\n  task_kwargs:\n    template: "{a:>20000000}"\n'
    path = write_config(tmp_path, text.replace("data:\n  train_dataset: rows.jsonl\n", ""))
    with pytest.raises(UserError, match="at most 1000") as err:
        load_config(path)
    assert f"{path}:8: key data.task_kwargs.template" in str(err.value), str(err.value)


def test_the_tool_prompt_and_the_judge_template_are_bounded_alike(tmp_path):
    from danka.agent.chat import check_tool_prompt
    from danka.config import load_config
    from tests.config.bad_config import write_config

    with pytest.raises(UserError, match="at most 1000") as err:
        check_tool_prompt("Tools: {schemas:>90000000}")
    assert err.value.where == "agent.tool_prompt"
    check_tool_prompt("Tools: {schemas}")
    with pytest.raises(UserError, match="at most 1000") as err:
        load_config(
            write_config(tmp_path), ["reward.judge_template={prompt:>90000000} {completion}"]
        )
    assert "reward.judge_template" in str(err.value)
