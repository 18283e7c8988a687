"""Loading user reward files: verl and TRL signatures, and every way loading can fail."""

import textwrap

import pytest

from danka.errors import UserError
from danka.rewards.custom import (
    detect_kind,
    is_custom_spec,
    load_reward_function,
    to_score,
    to_scores,
    trl_call_args,
    verl_call_args,
)
from danka.types import PromptRow


def write(tmp_path, name, code):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


def load_error(spec, base_dir) -> str:
    """The message of the UserError ``load_reward_function(spec, base_dir)`` raises."""
    with pytest.raises(UserError) as err:
        load_reward_function(spec, base_dir)
    return str(err.value)


def test_verl_signature(tmp_path):
    write(
        tmp_path,
        "sub/verl_reward.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str.strip() == ground_truth)
        """,
    )
    # relative to base_dir (the config's folder)
    reward = load_reward_function("sub/verl_reward.py:compute_score", tmp_path)
    assert reward.kind == "verl"
    assert reward.path == (tmp_path / "sub/verl_reward.py").resolve()
    assert reward.load()(data_source="x", solution_str=" 4", ground_truth="4") == 1.0


def test_trl_signature(tmp_path):
    path = write(
        tmp_path,
        "trl_reward.py",
        """
        def accuracy(prompts, completions, ground_truth, **kwargs):
            return [float(c == g) for c, g in zip(completions, ground_truth)]
        """,
    )
    reward = load_reward_function(f"{path}:accuracy", tmp_path / "elsewhere")  # absolute path
    assert reward.kind == "trl"
    assert reward.load()(prompts=["p", "p"], completions=["1", "2"], ground_truth=["1", "1"]) == [
        1.0,
        0.0,
    ]


def test_detect_kind():
    def verl(data_source, solution_str, ground_truth, extra_info=None, **kw): ...
    def trl_kwargs_only(**kwargs): ...
    def trl(completions, solution, **kwargs): ...
    def neither(x): ...
    def verl_extra_required(solution_str, ground_truth, data_source, scale): ...

    assert detect_kind(verl) == "verl"
    assert detect_kind(trl_kwargs_only) == "trl"
    assert detect_kind(trl) == "trl"
    assert detect_kind(neither) is None
    assert detect_kind(verl_extra_required) is None  # verl never passes `scale`


def test_missing_file(tmp_path):
    msg = load_error("nope.py:compute_score", tmp_path)
    assert "not found" in msg and "nope.py" in msg and "compute_score" in msg


def test_missing_function(tmp_path):
    write(tmp_path, "r.py", "def other(completions, **kw):\n    return [1.0]\n")
    msg = load_error("r.py:compute_score", tmp_path)
    assert "no function 'compute_score'" in msg and "r.py" in msg
    assert "other" in msg  # lists what the file does define
    assert "solution_str" in msg and "completions" in msg  # both expected signatures


def test_import_error_shows_last_traceback_line(tmp_path):
    write(tmp_path, "broken.py", "import danka_no_such_module_xyz\n")
    msg = load_error("broken.py:compute_score", tmp_path)
    assert "ModuleNotFoundError" in msg and "danka_no_such_module_xyz" in msg
    assert "broken.py" in msg and "compute_score" in msg


def test_wrong_signature(tmp_path):
    write(tmp_path, "bad.py", "def score(text, answer):\n    return 1.0\n")
    msg = load_error("bad.py:score", tmp_path)
    assert "neither the verl nor the TRL signature" in msg
    assert "bad.py:score" in msg
    assert "compute_score(data_source, solution_str, ground_truth" in msg
    assert "fn(prompts, completions, **kwargs)" in msg


def test_malformed_spec(tmp_path):
    with pytest.raises(UserError, match="path/to/file.py:function_name"):
        load_reward_function("reward.py", tmp_path)
    assert is_custom_spec("a/b.py:f") and not is_custom_spec("gsm8k")


def test_call_args():
    chat = PromptRow(
        index=3,
        prompt=[{"role": "user", "content": "2+2?"}],
        ground_truth="4",
        data_source="arith",
        extra={"extra_info": {"split": "train"}, "level": 1},
    )
    plain = PromptRow(index=4, prompt="3+3?", ground_truth="6", extra={"level": 2})
    args = verl_call_args(chat, "#### 4")
    assert args == {
        "data_source": "arith",
        "solution_str": "#### 4",
        "ground_truth": "4",
        "extra_info": {"split": "train"},
    }
    trl = trl_call_args([chat, plain], ["4", "6"])
    # TRL's conversational format: completions as assistant message lists
    assert trl["completions"] == [[{"role": "assistant", "content": "4"}], "6"]
    assert trl["prompts"] == [chat.prompt, "3+3?"]
    assert trl["ground_truth"] == trl["solution"] == ["4", "6"]
    assert trl["level"] == [1, 2]


def test_to_score():
    np = pytest.importorskip("numpy")
    import torch

    assert to_score(1) == 1.0 and to_score(True) == 1.0
    assert to_score(np.float32(0.5)) == 0.5
    assert to_score(torch.tensor([0.25])) == 0.25
    assert to_score({"score": 2, "acc": True}) == 2.0  # recent verl returns dicts
    assert to_score(None) is None
    with pytest.raises(TypeError, match="str"):
        to_score("1.0")
    with pytest.raises(TypeError, match="shape"):
        to_score(torch.ones(2))
    assert to_scores(np.array([1.0, 0.0]), 2) == [1.0, 0.0]
    with pytest.raises(TypeError, match="3 values for 2"):
        to_scores([1, 2, 3], 2)
    with pytest.raises(TypeError, match="expected a list"):
        to_scores(1.0, 2)
