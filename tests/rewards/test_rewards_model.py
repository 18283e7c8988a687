"""Reward models on tiny random Llamas: a classifier with/without a trained head, a judge."""

import contextlib

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

from danka.errors import UserError
from danka.models.tiny import decoder_config
from danka.rewards.model import DEFAULT_JUDGE_TEMPLATE, ClassifierReward, JudgeReward

WORDS = "Question Answer Is this answer correct ? Yes or No . : what is 2 + 3 5 6 the".split()


def tiny_tokenizer():
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )


def tiny_config(**kw):
    torch.manual_seed(0)
    # vocab, hidden 32, MLP 64, 2 layers, 4 heads / 2 KV heads
    return decoder_config(LlamaConfig, len(WORDS) + 3, 32, 64, 2, 4, 2,
                          max_position_embeddings=128, pad_token_id=0, eos_token_id=2, **kw)  # fmt: skip


PROMPTS = ["what is 2 + 3 ?", "what is 2 + 3 + 2 + 3 ?"]
COMPLETIONS = ["5", "the answer is 6 . 6"]


def test_classifier_with_trained_head_loads_and_scores(tmp_path):
    model = LlamaForSequenceClassification(tiny_config(num_labels=1))
    tok = tiny_tokenizer()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    rm = ClassifierReward.from_pretrained(tmp_path)
    scores = rm(PROMPTS, COMPLETIONS)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    # num_labels == 1: the score is the raw logit of the unpadded text "prompt + completion"
    for i in range(2):
        ids = tok(PROMPTS[i] + COMPLETIONS[i], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = model(input_ids=ids).logits[0, 0]
        assert scores[i].item() == pytest.approx(expected.item(), abs=1e-5)


def test_classifier_two_labels_gives_positive_probability():
    model = LlamaForSequenceClassification(tiny_config(num_labels=2))
    tok = tiny_tokenizer()
    rm = ClassifierReward(model, tok, positive_label=1)
    scores = rm(PROMPTS[:1], COMPLETIONS[:1])
    ids = tok(PROMPTS[0] + COMPLETIONS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    # P(label 1) = e^l1 / (e^l0 + e^l1)
    expected = logits.exp()[1] / logits.exp().sum()
    assert scores.item() == pytest.approx(expected.item(), abs=1e-6)


def test_classifier_normalises_with_recorded_mean_and_std():
    # danka rm records the held-out reward mean/std in the config; the score is then
    # (logit - mean) / std, e.g. logit l, mean 0.5, std 2 -> (l - 0.5) / 2
    model = LlamaForSequenceClassification(tiny_config(num_labels=1))
    tok = tiny_tokenizer()
    raw = ClassifierReward(model, tok)(PROMPTS[:2], COMPLETIONS[:2])
    model.config.reward_mean, model.config.reward_std = 0.5, 2.0
    normalised = ClassifierReward(model, tok)(PROMPTS[:2], COMPLETIONS[:2])
    assert torch.allclose(normalised, (raw - 0.5) / 2.0, atol=1e-6)


def test_classifier_reads_as_many_tokens_as_it_was_trained_on():
    # danka rm / distill record the training max_length as config.reward_max_length; it
    # was ignored (4096 always), so a long rollout was scored on text it never saw in training
    model = LlamaForSequenceClassification(tiny_config(num_labels=1))
    tok = tiny_tokenizer()
    tok.truncation_side = "left"  # as danka saves its classifiers: the end is kept
    # no chat template: the text is prompt + completion, "what is 2 + 3 + 2 + 3 ?the answer
    # is 6 . 6" (14 tokens: "?the" is one); its last 4 tokens are "is 6 . 6"
    full = ClassifierReward(model, tok)
    assert full.max_length == 4096  # nothing recorded: the default
    long_score = full(PROMPTS[1:], COMPLETIONS[1:])
    tail_score = full(["is 6"], [" . 6"])
    model.config.reward_max_length = 4
    cut = ClassifierReward(model, tok)
    assert cut.max_length == 4
    assert torch.allclose(cut(PROMPTS[1:], COMPLETIONS[1:]), tail_score, atol=1e-6)
    assert not torch.allclose(long_score, tail_score, atol=1e-4)
    assert ClassifierReward(model, tok, max_length=7).max_length == 7  # explicit wins


def test_classifier_without_head_is_refused(tmp_path):
    # a causal LM checkpoint has no `score.*` weights: transformers would init them randomly
    LlamaForCausalLM(tiny_config()).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(UserError) as err:
        ClassifierReward.from_pretrained(tmp_path)
    msg = str(err.value)
    assert "untrained" in msg and "score.weight" in msg
    assert "distil" in msg and "rule reward" in msg and "judge" in msg


def judge_by_hand(model, tok, judge, prompt, completion):
    """P(Yes) / (P(Yes) + P(No)) from one unpadded forward pass."""
    ids = tok(judge.render(prompt, completion), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        p = model(input_ids=ids).logits[0, -1].softmax(-1)
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    return (p[yes] / (p[yes] + p[no])).item()


def test_judge_matches_hand_computation_with_left_padding():
    model = LlamaForCausalLM(tiny_config())
    tok = tiny_tokenizer()
    judge = JudgeReward(model, tok, batch_size=2)
    # "Yes" and " Yes" are the same word-level token: deduplicated
    assert judge.yes_ids == [tok.convert_tokens_to_ids("Yes")]
    model.train()
    scores = judge(PROMPTS, COMPLETIONS)  # different lengths: one row is left-padded
    assert model.training  # mode restored
    assert scores.shape == (2,)
    assert ((scores > 0) & (scores < 1)).all()
    for i in range(2):
        expected = judge_by_hand(model, tok, judge, PROMPTS[i], COMPLETIONS[i])
        assert scores[i].item() == pytest.approx(expected, abs=1e-5)


def test_judge_shares_actor_with_adapters_disabled():
    peft = pytest.importorskip("peft")
    model = LlamaForCausalLM(tiny_config())
    tok = tiny_tokenizer()
    base_scores = JudgeReward(model, tok)(PROMPTS, COMPLETIONS)

    actor = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # make the adapter matter (LoRA B starts at zero)
        for name, p in actor.named_parameters():
            if "lora_B" in name:
                p.normal_(std=1.0)
    with_adapter = JudgeReward(actor, tok)(PROMPTS, COMPLETIONS)
    judged_base = JudgeReward(actor, tok, disable_adapters=actor.disable_adapter)(
        PROMPTS, COMPLETIONS
    )
    assert not torch.allclose(with_adapter, base_scores, atol=1e-4)
    assert torch.allclose(judged_base, base_scores, atol=1e-5)


def test_judge_template_and_tokens_are_checked():
    model, tok = LlamaForCausalLM(tiny_config()), tiny_tokenizer()
    with pytest.raises(UserError, match="completion"):
        JudgeReward(model, tok, template="Is {prompt} right?")
    with pytest.raises(UserError, match="single token"):
        JudgeReward(model, tok, yes_words=["Yes please"])
    entered = []

    @contextlib.contextmanager
    def off():
        entered.append(True)
        yield

    JudgeReward(model, tok, disable_adapters=off)(PROMPTS[:1], COMPLETIONS[:1])
    assert entered == [True]


def test_judge_template_none_means_the_default_template():
    # issue 12: the seed's config sets reward_model_name_or_path and no reward: section, so
    # reward.judge_template is None; this was `TypeError: argument of type 'NoneType'`
    model, tok = LlamaForCausalLM(tiny_config()), tiny_tokenizer()
    judge = JudgeReward(model, tok, template=None, use_chat_template=False)
    assert judge.template == DEFAULT_JUDGE_TEMPLATE
    assert judge.render("what is 2 + 3", "5") == (
        "Question:\nwhat is 2 + 3\n\nAnswer:\n5\n\nIs this answer correct? Answer Yes or No."
    )
    scores = judge(PROMPTS, COMPLETIONS)
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()
    for i in range(2):
        expected = judge_by_hand(model, tok, judge, PROMPTS[i], COMPLETIONS[i])
        assert scores[i].item() == pytest.approx(expected, abs=1e-5)
