"""A tiny offline byte-level tokenizer with ChatML special tokens and chat template.

Every byte is one token (BPE with no merges), so token counts are byte counts plus one per
special token: easy to work out by hand in the tests.
"""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = chat_template
    return fast


@pytest.fixture(scope="session")
def chat_tokenizer() -> PreTrainedTokenizerFast:
    return _byte_tokenizer(CHATML)


@pytest.fixture(scope="session")
def plain_tokenizer() -> PreTrainedTokenizerFast:
    return _byte_tokenizer(None)
