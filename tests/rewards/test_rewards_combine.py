"""The weighted sum of reward terms: weights, return types, devices/dtypes, check()."""

import textwrap

import numpy as np
import pytest
import torch

from danka.errors import UserError
from danka.rewards.combine import RewardSpec, build_reward_computer
from danka.types import PromptRow

# torch is slow to import, so the one function returning a tensor has its own file
# (each user function runs in its own worker process, which imports its file).
TORCH_CODE = """
import torch

def as_tensor(data_source, solution_str, ground_truth, extra_info=None):
    return torch.tensor(0.25)
"""

TYPES_CODE = """
import numpy as np

def as_numpy(data_source, solution_str, ground_truth, extra_info=None):
    return np.float64(0.5)

def as_int(data_source, solution_str, ground_truth, extra_info=None):
    return 2

def as_bool(data_source, solution_str, ground_truth, extra_info=None):
    return solution_str.endswith(ground_truth)

def trl_numpy(prompts, completions, **kwargs):
    return np.arange(len(completions), dtype=np.float32)

def not_a_number(data_source, solution_str, ground_truth, extra_info=None):
    return "yes"

def scalar_for_batch(prompts, completions, **kwargs):
    return 1.0

def crashes(data_source, solution_str, ground_truth, extra_info=None):
    return {}["missing"]

def uses_columns(prompts, completions, level, solution, **kwargs):
    return [lv + float(c == s) for c, lv, s in zip(completions, level, solution)]
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    (d / "my_rewards.py").write_text(textwrap.dedent(TYPES_CODE))
    (d / "torch_rewards.py").write_text(textwrap.dedent(TORCH_CODE))
    return d


def batch(gts=("7", "3")):
    rows = [
        PromptRow(index=i, prompt=f"q{i}", ground_truth=g, extra={"level": i})
        for i, g in enumerate(gts)
    ]
    return rows, [r.prompt for r in rows]


def test_weighted_sum_of_builtins(base):
    specs = [
        RewardSpec("gsm8k", weight=1.0, kwargs={"format_score": 0.1}),
        RewardSpec("format", weight=0.5),
        RewardSpec("length", weight=2.0, kwargs={"max_chars": 5}),
    ]
    rows, prompts = batch()
    completions = ["#### 7", "so #### 4 right"]  # len 6 and 15
    with build_reward_computer(specs, base_dir=base) as rc:
        out = rc(rows, prompts, completions, dtype=torch.float64)
    # sample 0: gsm8k 1.0; format 1.0; length -min(1, (6-5)/5) = -0.2
    #   1.0*1.0 + 0.5*1.0 + 2.0*(-0.2) = 1.1
    # sample 1: gsm8k format_score 0.1; format 0.0 (text after the number); length -min(1, 10/5) = -1
    #   0.1 + 0 + 2.0*(-1.0) = -1.9
    assert out.scores.tolist() == pytest.approx([1.1, -1.9])
    assert out.per_function["gsm8k"].tolist() == pytest.approx([1.0, 0.1])  # unweighted
    assert out.per_function["length"].tolist() == pytest.approx([-0.2, -1.0])
    assert out.valid.tolist() == [True, True] and out.num_errors == 0


def test_any_return_type_lands_on_requested_dtype(base):
    names = ["my_rewards.py:as_numpy", "torch_rewards.py:as_tensor", "my_rewards.py:as_int"]
    names += ["my_rewards.py:as_bool", "my_rewards.py:trl_numpy"]
    rows, prompts = batch()
    with build_reward_computer([RewardSpec(n) for n in names], base_dir=base) as rc:
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            out = rc(rows, prompts, ["#### 7", "#### 4"], device="cpu", dtype=dtype)
            assert out.scores.dtype == dtype and out.scores.device.type == "cpu"
            assert all(t.dtype == dtype for t in out.per_function.values())
            # 0.5 + 0.25 + 2 + bool + arange: [0.5+0.25+2+1+0, 0.5+0.25+2+0+1]
            assert out.scores.float().tolist() == pytest.approx([3.75, 3.75])
    assert out.per_function["as_bool"].tolist() == [1.0, 0.0]
    assert list(out.per_function) == ["as_numpy", "as_tensor", "as_int", "as_bool", "trl_numpy"]


def test_reward_model_term_and_numpy_output(base):
    def fake_rm(prompts, completions):  # returns numpy, as a careless RM might
        assert prompts == ["q0", "q1"]
        return np.array([0.5, -1.0])

    rows, prompts = batch()
    rc = build_reward_computer(
        [RewardSpec("gsm8k")], base_dir=base, reward_model=fake_rm, reward_model_weight=2.0
    )
    out = rc(rows, prompts, ["#### 7", "#### 3"])
    # [1 + 2*0.5, 1 + 2*(-1)] = [2, -1]
    assert out.scores.tolist() == [2.0, -1.0]
    assert out.per_function["reward_model"].tolist() == [0.5, -1.0]
    assert rc.names == ["gsm8k", "reward_model"]


def test_skip_sample_marks_invalid_and_counts_errors(base):
    rows, prompts = batch()
    with build_reward_computer(
        [RewardSpec("gsm8k"), RewardSpec("my_rewards.py:not_a_number")],
        base_dir=base,
        on_error="skip_sample",
    ) as rc:
        out = rc(rows, prompts, ["#### 7", "#### 3"])
    assert out.valid.tolist() == [False, False]
    assert out.num_errors == 2 and out.error_rate == 0.5  # 2 errors / (2 samples x 2 functions)
    assert out.scores.tolist() == [1.0, 1.0]  # the bad term contributes 0


def test_trl_function_gets_columns(base):
    rows, prompts = batch(("7", "3"))
    with build_reward_computer([RewardSpec("my_rewards.py:uses_columns")], base_dir=base) as rc:
        out = rc(rows, prompts, ["7", "4"])
    # level + (completion == solution): [0 + 1, 1 + 0]
    assert out.scores.tolist() == [1.0, 1.0]


def test_duplicate_names_get_suffixes(base):
    specs = [RewardSpec("gsm8k"), RewardSpec("gsm8k", kwargs={"method": "flexible"})]
    rc = build_reward_computer(specs, base_dir=base)
    assert rc.names == ["gsm8k", "gsm8k_2"]


def test_labels_name_the_terms(base):
    specs = [
        RewardSpec("gsm8k", label="strict"),
        RewardSpec("gsm8k", 0.0, {"method": "flexible"}, label="flexible"),
        RewardSpec("gsm8k", 0.0, {"method": "boxed"}),
    ]
    rows, prompts = batch(("72", "5"))
    with build_reward_computer(specs, base_dir=base) as rc:
        out = rc(rows, prompts, ["so 72, \\boxed{72}", "#### 5"])
    assert rc.names == ["strict", "flexible", "gsm8k"]
    # strict needs "#### 5"; flexible takes the last number; boxed reads the box
    assert out.per_function["strict"].tolist() == [0.0, 1.0]
    assert out.per_function["flexible"].tolist() == [1.0, 1.0]  # last number run: "72", "5"
    assert out.per_function["gsm8k"].tolist() == [1.0, 0.0]


def test_unknown_builtin_lists_choices(base):
    with pytest.raises(UserError) as err:
        build_reward_computer([RewardSpec("gsm8K")], base_dir=base)
    msg = str(err.value)
    # the real config key (was "rewards[0].name", a key that does not exist)
    assert "reward.functions[0].name" in msg and "gsm8k, last_number, length, math" in msg
    assert "did you mean 'gsm8k'" in msg and "file.py:function" in msg


def test_unknown_builtin_kwarg_is_refused(base):
    # a typo used to be swallowed by the builtins' **kwargs: strict scoring, silently
    with pytest.raises(UserError) as err:
        build_reward_computer(
            [RewardSpec("format"), RewardSpec("gsm8k", kwargs={"methd": "flexible"})],
            base_dir=base,
        )
    msg = str(err.value)
    assert "reward.functions[1].kwargs.methd" in msg
    assert "did you mean 'method'" in msg and "method, format_score, score" in msg
    assert err.value.exit_code == 2


TRL_NONE_CODE = """
def only_long(prompts, completions, **kwargs):
    # applies to long completions only (TRL: None = not applicable)
    return [float(len(c)) if len(c) > 3 else None for c in completions]

def never(prompts, completions, **kwargs):
    return [None] * len(completions)
"""


def test_trl_none_is_left_out_of_the_sum(base):
    (base / "trl_none.py").write_text(TRL_NONE_CODE)
    specs = [
        RewardSpec("trl_none.py:only_long", weight=2.0),
        RewardSpec("trl_none.py:never", weight=5.0),
        RewardSpec("last_number", weight=1.0),
    ]
    with build_reward_computer(specs, base_dir=base) as rc:  # default on_error: fail
        rs, prompts = batch(("7", "7"))
        out = rc(rs, prompts, ["7", "it is 7"])
    # sample 0 ("7"): only_long None, never None, last_number 1 -> 1.0
    # sample 1 ("it is 7", 7 chars): 2*7 + (never: left out) + 1*1 = 15.0
    assert out.scores.tolist() == [1.0, 15.0]
    assert out.valid.tolist() == [True, True] and out.num_errors == 0
    assert out.applicable["only_long"].tolist() == [False, True]
    assert out.applicable["never"].tolist() == [False, False]
    assert out.num_not_applicable == 0


def test_no_function_applies_scores_zero_with_a_warning(base, caplog):
    (base / "trl_none.py").write_text(TRL_NONE_CODE)
    specs = [RewardSpec("trl_none.py:only_long"), RewardSpec("trl_none.py:never")]
    with build_reward_computer(specs, base_dir=base, on_error="fail") as rc:
        rs, prompts = batch()
        with caplog.at_level("WARNING", logger="danka.rewards"):
            out = rc(rs, prompts, ["ab", "abcdef"])
    assert out.scores.tolist() == [0.0, 6.0]  # sample 0: nothing applies -> 0
    assert out.valid.tolist() == [True, True] and out.num_not_applicable == 1
    assert "every reward function returned None for 1 of 2" in caplog.text


def test_empty_specs_refused(base):
    with pytest.raises(UserError, match="no reward"):
        build_reward_computer([], base_dir=base)


@pytest.mark.parametrize(
    "name, words",
    [
        ("not_a_number", ["returned a str", "not_a_number"]),
        ("scalar_for_batch", ["expected a list of 2 numbers"]),
        ("crashes", ["KeyError", "missing"]),
    ],
)
def test_check_catches_bad_functions_early(base, name, words):
    rows, _ = batch()
    with build_reward_computer(
        [RewardSpec(f"my_rewards.py:{name}")], base_dir=base, on_error="zero"
    ) as rc:
        with pytest.raises(UserError) as err:
            rc.check(rows)
    msg = str(err.value)
    assert "before training" in msg and "#### 7" in msg  # the plausible completion
    for word in words:
        assert word in msg


def test_check_passes_good_functions(base):
    rows, _ = batch()
    specs = [RewardSpec("gsm8k"), RewardSpec("math"), RewardSpec("my_rewards.py:as_bool")]
    with build_reward_computer(specs, base_dir=base) as rc:
        rc.check(rows)


class _PromptsSeen:
    """A reward model that records the prompts it is given and scores 0."""

    def __init__(self):
        self.prompts = []

    def __call__(self, prompts, completions):
        self.prompts += list(prompts)
        return [0.0] * len(completions)


def test_reward_model_reads_the_prompt_the_policy_read(base):
    # issue 16 follow-up: the RM got the raw row prompt, without data.system_prompt and
    # data.instruction, i.e. not the text an RM trained on the policy's prompts saw
    rm = _PromptsSeen()
    rows = [PromptRow(index=0, prompt="What is 2+3?", ground_truth="5")]
    computer = build_reward_computer(
        [], base_dir=base, reward_model=rm, system_prompt="Be brief.", instruction="End with ####."
    )
    computer(rows, ["rendered"], ["#### 5"])
    assert rm.prompts == [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+3? End with ####."},
        ]
    ]
    rm.prompts.clear()  # neither set: the row's own prompt, unchanged
    build_reward_computer([], base_dir=base, reward_model=rm)(rows, ["rendered"], ["#### 5"])
    assert rm.prompts == ["What is 2+3?"]


def test_rm_trained_on_gsm8k_pairs_scores_the_same_text_at_rl_time(tmp_path, base):
    """The text ``danka rm`` trains on for a ``danka data gsm8k-pairs`` pair equals the text
    the reward model scores during RL on the same question with data.instruction set to
    danka's GSM8K instruction (the plain question/answer jsonl layout)."""
    import json

    from danka.data.gsm8k import GSM8K_INSTRUCTION
    from danka.data.gsm8k_pairs import build_gsm8k_pairs
    from danka.models.tiny import tiny_tokenizer
    from danka.rewards.model import ClassifierReward
    from danka.rm.train import pair_text

    question, solution = "Tom has 3 apples and buys 4. How many?", "3+4=7\n#### 7"
    rows = [{"question": question, "answer": solution}, {"question": "1+1?", "answer": "#### 2"}]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_gsm8k_pairs(input_path=tmp_path / "gsm8k.jsonl", output_dir=tmp_path / "pairs")
    pairs = [
        json.loads(line)
        for split in ("train", "test")
        for line in (tmp_path / "pairs" / "refusal" / f"{split}.jsonl").read_text().splitlines()
    ]
    pair = next(p for p in pairs if p["chosen"] == solution)

    from types import SimpleNamespace

    # only the text matters here: a stand-in for the classifier (its config alone is read)
    model = SimpleNamespace(config=SimpleNamespace(num_labels=1, label2id={}, pad_token_id=0))
    scorer = ClassifierReward(model, tiny_tokenizer())
    trained_on = pair_text(scorer, pair["prompt"], pair["chosen"])

    rm = _PromptsSeen()
    computer = build_reward_computer(
        [], base_dir=base, reward_model=rm, instruction=GSM8K_INSTRUCTION
    )
    computer([PromptRow(index=0, prompt=question, ground_truth="7")], ["rendered"], [solution])
    assert scorer._text(rm.prompts[0], solution) == trained_on
    assert GSM8K_INSTRUCTION in trained_on


ERROR_RATE_CODE = """
def error_rate(prompts, completions, **kwargs):
    return [0.25] * len(completions)
"""


def test_an_unlabelled_function_named_like_a_metric_of_danka_gets_its_own_name(tmp_path):
    """A function called error_rate (no label) is logged as error_rate_2: reward/error_rate
    stays danka's share of failed calls."""
    (tmp_path / "r.py").write_text(ERROR_RATE_CODE)
    with build_reward_computer([RewardSpec("r.py:error_rate")], base_dir=tmp_path) as rc:
        assert rc.names == ["error_rate_2"]


HUGE_CODE = """
def huge(prompts, completions, **kwargs):
    return [1e10 if "big" in c else 1.0 for c in completions]
"""


def test_a_combined_reward_that_overflows_stops_naming_the_term_and_its_weight(tmp_path):
    """1e30 x 1e10 is finite in float64 but not in float32, the dtype training reads."""
    (tmp_path / "r.py").write_text(HUGE_CODE)
    specs = [RewardSpec("gsm8k", 2.0), RewardSpec("r.py:huge", 1e30, label="size")]
    rows, prompts = batch(("7", "3"))
    with build_reward_computer(specs, base_dir=tmp_path) as rc:
        ok = rc(rows, prompts, ["#### 7", "small"])
        assert ok.scores.tolist() == pytest.approx([2.0 + 1e30, 1e30])
        with pytest.raises(UserError) as err:
            rc(rows, prompts, ["#### 7", "big"])
    msg = str(err.value)
    assert err.value.where == "reward.functions[1].weight" and err.value.exit_code == 2
    assert "completion 1 (data row 1)" in msg and "not a finite float32" in msg
    assert "gsm8k: 2 x 0" in msg and "size: 1e+30 x 1e+10" in msg
