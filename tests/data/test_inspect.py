from danka.data.inspect import describe_first_batch
from danka.data.template import encode_prompts
from danka.types import PromptRow


def test_describe_first_batch_shows_text_ids_specials_and_counts(chat_tokenizer):
    rows = [PromptRow(0, "a", "1"), PromptRow(1, "b" * 40), PromptRow(2, "c")]
    enc = encode_prompts(chat_tokenizer, rows, max_prompt_length=30, policy="drop")
    text = describe_first_batch(chat_tokenizer, rows, enc, n=1)
    assert "3 loaded, 2 kept, 1 dropped" in text and "chat template: applied" in text
    assert "eos: 256 '<|im_end|>'" in text and "pad: 257 '<|endoftext|>'" in text
    assert "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n" in text
    assert "ground truth '1'" in text and "ids: [258," in text and "more ..." in text
    assert "row 2" not in text  # only n=1 prompt shown
