"""Rule rewards: pure functions ``fn(completion, row, **kwargs) -> float``.

Every builtin has that ONE signature, so the combiner calls ``REWARDS[name](c, row, **kw)``
and never branches on the name. ``row.ground_truth`` holds the reference answer; extra
keyword arguments come from the config (``reward.functions: [{name: gsm8k, kwargs: {...}}]``);
a builtin takes no ``**kwargs``, so its signature is the list of valid kwargs that
:func:`danka.rewards.specs.check_reward_specs` checks before training.

Builtins run in the reward worker process under ``reward.timeout_s`` like user functions
(see guard.py): a user's ``format`` pattern can backtrack for minutes. This module imports no torch, so the reward worker process (see guard.py) stays light.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from danka.registry import Registry

if TYPE_CHECKING:  # danka.types imports torch; the reward worker must not
    from danka.types import PromptRow

RewardFn = Callable[..., float]
F = TypeVar("F", bound=RewardFn)

REWARDS: Registry[None] = Registry("reward")


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator adding a rule reward under ``name``; a taken name raises ValueError
    (two rewards silently shadowing each other is a programming bug)."""
    return REWARDS.register(name)


# verl's number pattern: optional minus, then digits, dots and commas.
_NUMBER = r"\-?[0-9\.\,]+"
# verl clips the text to its last 300 characters before searching (the answer sits at the
# end; long regex scans are slow). We keep the clip so that scores match verl's.
_SOLUTION_CLIP_CHARS = 300
GSM8K_METHODS = ("strict", "flexible", "lenient", "boxed")


def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """The answer verl's gsm8k scorer extracts (verl/utils/reward_score/gsm8k.py), on the
    text's last 300 characters.

    strict: the LAST match of ``#### (-?[0-9.,]+)`` with ``,`` removed, exactly as verl;
    None if there is none. So ``#### $18`` gives None (the regex needs a digit, ``-``,
    ``.`` or ``,`` right after ``#### ``) and ``#### 18.`` gives ``"18."``.
    flexible: the last ``-?[0-9.,]+`` in the text that is not ``""`` or ``"."``, NOT
    cleaned (as in verl); None if the text has no such run.
    lenient (danka's own, not verl's): the strict answer if there is one, else the last
    number in the text; either one normalised (``,``/``$`` removed, trailing ``.``
    dropped: ``"18."`` -> ``"18"``).
    boxed (danka's own): the content of the last ``\\boxed{...}``, as Qwen's instruct
    models write their final answer, cleaned of ``,``, ``$``, spaces, ``\\text{...}``
    units and a trailing ``.``; None without a closed box.
    """
    if method not in GSM8K_METHODS:
        raise ValueError(f"gsm8k method must be one of {GSM8K_METHODS}, got {method!r}")
    text = text[-_SOLUTION_CLIP_CHARS:]
    if method == "boxed":
        return _clean_boxed(_last_boxed(text))
    if method == "lenient":
        found = re.findall(r"####\s*\$?\s*(" + _NUMBER + ")", text)
        answer = found[-1] if found else last_number_in(text)
        if answer is None:
            return None
        answer = answer.replace(",", "").replace("$", "").rstrip(".")
        return answer or None
    if method == "strict":
        found = re.findall("#### (" + _NUMBER + ")", text)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    found = re.findall("(" + _NUMBER + ")", text)
    if not found:
        return None
    answer = found[0]
    # verl walks backwards and stops at the first valid run; if none is valid it is
    # left holding found[0] (e.g. "."), which then scores format_score. Mirror that.
    for answer in reversed(found):  # noqa: B007 - the loop variable is the result
        if answer not in ("", "."):
            break
    return answer


def answers_equal(answer: str, ground_truth: str) -> bool:
    """String equality after stripping whitespace (and ``,``/``$`` from the ground truth),
    or numerical equality when both parse as floats ("18" == "18.0" == "18.")."""
    a = answer.strip()
    g = str(ground_truth).strip().replace(",", "").replace("$", "")
    if a == g:
        return True
    try:
        x, y = float(a), float(g)
    except ValueError:
        return False
    return math.isfinite(x) and x == y


@register_reward("gsm8k")
def gsm8k(
    completion: str,
    row: PromptRow,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """GSM8K answer reward, verl's ``gsm8k.compute_score`` (ReFT, Trung et al. 2024,
    https://arxiv.org/abs/2401.08967).

    0.0 if no answer is extracted (see :func:`extract_gsm8k_answer`), ``score`` if it
    equals the ground truth, else ``format_score``.

    ``strict`` and ``flexible`` are verl's, comparison included: the extracted string
    must equal the ground truth string exactly ("18." != "18", "18.0" != "18"), so
    accuracies measured with them are comparable with verl's published tables.
    ``lenient`` is danka's own and more generous (off by default): it also takes the last
    number when there is no ``####``, accepts ``#### $18``, and compares numerically
    (see :func:`answers_equal`); its accuracies are NOT comparable with verl's.
    ``boxed`` grades the last ``\\boxed{}`` numerically (slime's and Qwen's way of
    grading these models), also danka's own.
    """
    answer = extract_gsm8k_answer(completion, method)
    if answer is None or row.ground_truth is None:
        return 0.0
    if method in ("lenient", "boxed"):
        correct = answers_equal(answer, row.ground_truth)
    else:
        correct = answer == str(row.ground_truth)
    return float(score) if correct else float(format_score)


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_number_in(text: str) -> str | None:
    """The last number written in ``text`` (commas removed), or None."""
    found = _LAST_NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unbalanced: the completion was cut off inside the box


_BOXED_NOISE = re.compile(r"\\text\{[^{}]*\}|\\[,!;: ]|\\?\$|,|\s+")


def _clean_boxed(content: str | None) -> str | None:
    """``"\\$1,200"`` -> ``"1200"``, ``"18 \\text{ dollars}"`` -> ``"18"``; None stays None."""
    if content is None:
        return None
    answer = _BOXED_NOISE.sub("", content).rstrip(".")
    return answer or None


def _math_verify_timeout() -> int | None:
    # math-verify's timeout uses signal.alarm, which only works in the main thread;
    # elsewhere it raises, so we turn it off there (the guard's own timeout applies).
    return 5 if threading.current_thread() is threading.main_thread() else None


_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def gold_as_latex(gold: str) -> str:
    """The gold answer as text math-verify can parse: a gold that already has a
    ``\\boxed{}``/``\\fbox{}`` is kept; otherwise its outer math delimiters (``$...$``,
    ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``) are removed and it is wrapped in
    ``\\boxed{...}``, as verl's math-verify scorer does. math-verify finds nothing in
    MATH's unwrapped dollar-sign golds (``\\$18.90``) but parses ``\\boxed{\\$18.90}``.
    """
    text = str(gold).strip()
    if "\\boxed" in text or "\\fbox" in text:
        return text
    for left, right in _DELIMITERS:
        inner = text[len(left) : len(text) - len(right)]
        if (
            len(text) > len(left) + len(right)
            and text.startswith(left)
            and text.endswith(right)
            and not (right == "$" and inner.endswith("\\"))  # "$5\\$": an escaped dollar
        ):
            text = inner.strip()
            break
    return "\\boxed{" + text + "}"


@register_reward("math")
def math_reward(completion: str, row: PromptRow) -> float:
    """1.0 if the completion's answer is mathematically equal to the ground truth, else 0.0.

    Checked with math-verify (``parse`` + ``verify``, sympy-based: "\\frac{1}{2}" equals
    "0.5"). The gold goes through :func:`gold_as_latex` (boxed, as in verl), so MATH golds
    such as ``\\$18.90``, ``$4$`` and ``\\boxed{5}`` all parse; the completion's answer is
    its last ``\\boxed{}``, else its last number.
    """
    from math_verify import parse, verify  # heavy (sympy); imported on first use

    if row.ground_truth is None:
        return 0.0
    boxed = _last_boxed(completion)
    answer = boxed if boxed is not None else last_number_in(completion)
    if answer is None:
        return 0.0
    timeout = _math_verify_timeout()
    gold = parse(gold_as_latex(str(row.ground_truth)), parsing_timeout=timeout)
    pred = parse(f"${answer}$", parsing_timeout=timeout)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0


_DEFAULT_FORMAT = r"####\s*-?[\d,]*\.?\d+\s*$"


@register_reward("format")
def format_reward(completion: str, row: PromptRow, pattern: str = _DEFAULT_FORMAT) -> float:
    """1.0 if ``re.search(pattern, completion)`` matches, else 0.0. The default pattern
    asks for ``#### <number>`` at the very end (trailing whitespace allowed). Use
    ``^...$`` in your pattern to demand a full match; ``re.DOTALL`` is not set."""
    return 1.0 if re.search(pattern, completion) else 0.0


@register_reward("length")
def length_reward(
    completion: str,
    row: PromptRow,
    target_chars: int | None = None,
    max_chars: int | None = None,
) -> float:
    """A length penalty in [-1, 0], with L = len(completion) in characters.

    target_chars=T: ``-min(1, |L - T| / T)`` (0 at the target, -1 at 0 or 2T chars).
    max_chars=M:    ``-min(1, max(0, L - M) / M)`` (0 up to M, -1 from 2M chars on).
    Give exactly one of the two.
    """
    if (target_chars is None) == (max_chars is None):
        raise ValueError("length reward: give exactly one of target_chars or max_chars")
    n = len(completion)
    if target_chars is not None:
        if target_chars <= 0:
            raise ValueError("length reward: target_chars must be > 0")
        return -min(1.0, abs(n - target_chars) / target_chars)
    if max_chars <= 0:  # type: ignore[operator]
        raise ValueError("length reward: max_chars must be > 0")
    return -min(1.0, max(0, n - max_chars) / max_chars)  # type: ignore[operator]


@register_reward("last_number")
def last_number(completion: str, row: PromptRow, only_number_bonus: float = 0.0) -> float:
    """1.0 if the last number in the completion equals the ground truth (see
    :func:`answers_equal`), else 0.0; plus ``only_number_bonus`` when the stripped
    completion is nothing but that number (rewards terse answers in the quickstart)."""
    answer = last_number_in(completion)
    if answer is None or row.ground_truth is None:
        return 0.0
    if not answers_equal(answer, row.ground_truth):
        return 0.0
    only = completion.strip().replace(",", "") == answer
    return 1.0 + (float(only_number_bonus) if only else 0.0)


_DEFAULTS = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/math": "math",
    "digitallearninggmbh/math-lighteval": "math",
    "math": "math",
    "hendrycks/competition_math": "math",
}


@register_reward("tool_answer")
def tool_answer(completion: str, row: PromptRow, valid_call_bonus: float = 0.1) -> float:
    """1.0 for the right final number, plus ``valid_call_bonus`` x the share of well-formed
    tool calls (danka.agent.rewards.tool_answer_reward; with tools, ``row.messages`` holds
    the trajectory's messages after the prompt)."""
    from danka.agent.rewards import tool_answer_reward

    messages = [getattr(row, "messages", None)]
    return tool_answer_reward(
        [None], [completion], [row.ground_truth], valid_call_bonus, messages=messages
    )[0]


def default_reward_for(data_source: str) -> str | None:
    """The builtin verl would use for a ``data_source`` (case-insensitive), or None:
    "openai/gsm8k" -> "gsm8k"; "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
    "math" -> "math"."""
    return _DEFAULTS.get(str(data_source).strip().lower())


def load_builtin(name: str) -> RewardFn:
    """Builtin ``name``, with its heavy imports done now (the reward worker calls this
    while loading, under the load timeout, so the first scored sample does not pay
    sympy's import time under ``reward.timeout_s``)."""
    if name == "math":
        import math_verify  # noqa: F401
    return REWARDS[name]
