"""Reward models: a trained sequence classifier, or a causal LM used as a Yes/No judge.

Both are callables ``rm(prompts, completions) -> Tensor (B,)`` (float32, on the model's
device), where ``prompts[i]`` is the row's raw prompt (a string or chat messages) and
``completions[i]`` the generated text. Batched, under ``torch.no_grad()``, in eval mode
(the previous train/eval mode is restored, so the actor's model can be shared).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from danka.data.template import left_pad
from danka.errors import UserError

Prompt = str | list[dict[str, str]]


def _messages(prompt: Prompt) -> list[dict[str, str]]:
    return list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


def _plain(prompt: Prompt) -> str:
    """A chat prompt as plain text (single user turn: its content; else "role: content")."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1:
        return prompt[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


class _EvalMode:
    """no_grad + eval() for the duration, restoring the model's train/eval mode."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()
        self.model.eval()

    def __exit__(self, *exc: Any) -> None:
        self.model.train(self.was_training)
        self.no_grad.__exit__(*exc)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


DEFAULT_MAX_LENGTH = 4096  # tokens a classifier reads when its config records no length


class ClassifierReward:
    """Score = the classifier's output on (prompt, completion).

    ``num_labels == 1``: the logit (a Bradley-Terry reward, Ouyang et al. 2022,
    https://arxiv.org/abs/2203.02155), normalised as ``(logit - reward_mean) / reward_std``
    when the model's config records them (``danka rm`` does), else raw. ``num_labels >= 2``: the PROBABILITY (softmax,
    in [0, 1]) of ``positive_label`` (an index, or a name looked up in
    ``config.label2id``). The text is the tokenizer's chat template over
    [user: prompt, assistant: completion] when it has one, else ``prompt + completion``,
    cut to ``max_length`` tokens: by default the length it was trained on
    (``config.reward_max_length``, which ``danka rm`` and ``danka distill`` record), else
    :data:`DEFAULT_MAX_LENGTH`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        positive_label: int | str = 1,
        batch_size: int = 8,
        max_length: int | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        if max_length is None:
            max_length = getattr(model.config, "reward_max_length", None) or DEFAULT_MAX_LENGTH
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        num_labels = int(model.config.num_labels)
        if isinstance(positive_label, str):
            label2id = {str(k): int(v) for k, v in (model.config.label2id or {}).items()}
            if positive_label not in label2id:
                raise UserError(
                    f"positive label {positive_label!r} is not one of the model's labels",
                    fix=f"use one of {sorted(label2id)} or a label index",
                )
            positive_label = label2id[positive_label]
        if num_labels >= 2 and not 0 <= positive_label < num_labels:
            raise UserError(f"positive_label {positive_label} out of range for {num_labels} labels")
        self.positive_label = int(positive_label)
        std = float(getattr(model.config, "reward_std", None) or 1.0)
        self.reward_mean = float(getattr(model.config, "reward_mean", None) or 0.0)
        self.reward_std = std if std > 0 else 1.0
        if tokenizer.pad_token_id is None:  # batching needs a pad token
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            # decoder classifiers read the score at the last non-pad token
            model.config.pad_token_id = tokenizer.pad_token_id

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> ClassifierReward:
        """Load a classifier whose head was TRAINED; UserError if the checkpoint lacks
        the head weights (transformers would initialise them randomly: scores = noise)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model, info = AutoModelForSequenceClassification.from_pretrained(
            str(path), output_loading_info=True, dtype=dtype, trust_remote_code=trust_remote_code
        )
        prefix = getattr(model, "base_model_prefix", "") or ""
        head_missing = [
            k for k in info.get("missing_keys", []) if not (prefix and k.startswith(prefix + "."))
        ]
        if head_missing:
            raise UserError(
                "the reward model's classification head is untrained: its weights "
                f"({', '.join(sorted(head_missing)[:4])}) are not in the checkpoint, so they "
                "would be random and the rewards pure noise",
                where=str(path),
                fix="train a head first (distil one with `danka distill`, or any "
                "reward-model trainer), or use a rule reward (rewards: gsm8k / "
                "math / your file.py:function) or an LLM judge instead",
            )
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        return cls(model.to(device), tokenizer, **kwargs)

    def _text(self, prompt: Prompt, completion: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            msgs = _messages(prompt) + [{"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(msgs, tokenize=False)
        return _plain(prompt) + completion

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> torch.Tensor:
        """Scores (B,) float32 on the model's device."""
        texts = [self._text(p, c) for p, c in zip(prompts, completions)]
        device = _model_device(self.model)
        out = []
        with _EvalMode(self.model):
            for s in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[s : s + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(device)
                logits = self.model(
                    input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]
                ).logits.float()
                if logits.shape[-1] == 1:
                    out.append((logits[:, 0] - self.reward_mean) / self.reward_std)
                else:
                    out.append(logits.softmax(-1)[:, self.positive_label])
        return torch.cat(out) if out else torch.zeros(0, device=device)


DEFAULT_JUDGE_TEMPLATE = (
    "Question:\n{prompt}\n\nAnswer:\n{completion}\n\nIs this answer correct? Answer Yes or No."
)


class JudgeReward:
    """A causal LM as a generative judge (LLM-as-a-judge, Zheng et al. 2023,
    https://arxiv.org/abs/2306.05685).

    The judging prompt is ``template.format(prompt=..., completion=...)`` (``template=None``,
    the config's default, means :data:`DEFAULT_JUDGE_TEMPLATE`: "Question:\\n{prompt}\\n\\n
    Answer:\\n{completion}\\n\\nIs this answer correct? Answer Yes or No."), wrapped in the
    tokenizer's chat template (user turn + generation prompt) when it has one. With
    p = softmax(next-token logits), the score is

        P(Yes) / (P(Yes) + P(No)),

    where P(Yes) sums p over the distinct single-token ids of ``yes_words`` (default
    "Yes" and " Yes"), likewise for No. In (0, 1); 0.5 means undecided.

    Sharing the actor: pass the (peft) model and ``disable_adapters=peft_model.disable_adapter``
    (a context manager factory) to judge with the base weights.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        template: str | None = None,
        disable_adapters: Callable[[], AbstractContextManager[Any]] | None = None,
        yes_words: Sequence[str] = ("Yes", " Yes"),
        no_words: Sequence[str] = ("No", " No"),
        batch_size: int = 8,
        max_length: int = 4096,
        use_chat_template: bool | None = None,
    ):
        if template is None:  # reward.judge_template: null (the seed's config has no reward:)
            template = DEFAULT_JUDGE_TEMPLATE
        for key in ("{prompt}", "{completion}"):
            if key not in template:
                raise UserError(
                    f"the judge template has no {key} placeholder", fix="add it to the template"
                )
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.disable_adapters = disable_adapters
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        if use_chat_template is None:
            use_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = use_chat_template
        self.yes_ids = self._single_token_ids(yes_words, "yes_words")
        self.no_ids = self._single_token_ids(no_words, "no_words")
        if set(self.yes_ids) & set(self.no_ids):
            raise UserError("the judge's Yes and No words share a token")

    def _single_token_ids(self, words: Sequence[str], key: str) -> list[int]:
        ids = []
        for w in words:
            toks = self.tokenizer.encode(w, add_special_tokens=False)
            if len(toks) == 1 and toks[0] not in ids:
                ids.append(int(toks[0]))
        if not ids:
            raise UserError(
                f"none of the judge's {key} {list(words)} is a single token for this tokenizer"
            )
        return ids

    def render(self, prompt: Prompt, completion: str) -> str:
        """The judging prompt text for one sample."""
        text = self.template.format(prompt=_plain(prompt), completion=completion)
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        return text

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> torch.Tensor:
        """Scores (B,) float32 in (0, 1) on the model's device."""
        texts = [self.render(p, c) for p, c in zip(prompts, completions)]
        device = _model_device(self.model)
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        yes = torch.tensor(self.yes_ids, device=device)
        no = torch.tensor(self.no_ids, device=device)
        out = []
        adapters_off = self.disable_adapters() if self.disable_adapters else nullcontext()
        with adapters_off, _EvalMode(self.model):
            for s in range(0, len(texts), self.batch_size):
                ids, mask = self._left_pad(texts[s : s + self.batch_size], pad_id, device)
                # positions count real tokens only, so left padding does not shift them
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
                logp = logits[:, -1, :].float().log_softmax(-1)
                log_yes = logp[:, yes].logsumexp(-1)
                log_no = logp[:, no].logsumexp(-1)
                # P(Yes) / (P(Yes) + P(No)) = sigmoid(log P(Yes) - log P(No))
                out.append(torch.sigmoid(log_yes - log_no))
        return torch.cat(out) if out else torch.zeros(0, device=device)

    def _left_pad(
        self, texts: list[str], pad_id: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Left padding puts every sample's last real token at position -1; the judge's
        # answer is read there. Padded by hand: tokenizers differ in padding_side defaults.
        seqs = [
            self.tokenizer.encode(t, add_special_tokens=not self.use_chat_template)[
                -self.max_length :
            ]
            for t in texts
        ]
        return left_pad(seqs, pad_id, device=device)
