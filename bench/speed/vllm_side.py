"""The ``vllm`` side of ``python -m bench rollout`` and the prompts of its EOS-on cells.

``side_vllm`` runs danka's vllm engine (colocated vLLM, danka.rollout.vllm.engine) on the
side's model in this fresh process: the first call (vLLM starts: profiling, torch.compile,
CUDA-graph capture, the first weight sync), then a timed call, the log-prob gap to a
training forward and greedy tokens for the agreement with HF. ``vllm-lora-merge`` and
``vllm-lora-adapter`` run the same with a live LoRA adapter, merged into vLLM's weights or
loaded as a vLLM LoRA (one engine per process: vLLM is not restarted in one). ``vllm_skip_reason`` says why the side cannot run here (vLLM missing,
its torch pin not met, no GPU), so a comparison records the side as skipped.
"""

from __future__ import annotations

import torch

from danka.errors import UserError
from danka.rollout.base import SamplingParams


def vllm_skip_reason(device: str) -> str | None:
    """Why the vllm side cannot run on ``device`` (the engine's own start-up check), or
    None."""
    from danka.rollout.vllm.calls import check_vllm

    try:
        check_vllm(torch.device(device).type)
    except UserError as err:
        return f"{err.what} ({err.fix})"
    return None


QUESTION = (
    "{a} students each bring {b} pencils to class and {c} of the pencils break. How many "
    "pencils are still whole? Let's think step by step and output the final answer after "
    '"####".'
)


def eos_prompts(model_name: str, count: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """``count`` chat-formatted GSM8K-style questions for the model's tokenizer and its stop
    ids: prompts a model answers and ends, so the EOS-on cells time real answer lengths."""
    from danka.models.loading import load_tokenizer, stop_ids

    tok = load_tokenizer(model_name, log=lambda *_: None)
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        a, b, c = torch.randint(3, 60, (3,), generator=g).tolist()
        msgs = [{"role": "user", "content": QUESTION.format(a=a, b=b, c=c)}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return prompts, stop_ids(tok)


# side -> the LoRA mode it runs (None: the plain model); one vLLM engine per process
VLLM_SIDES = {"vllm": None, "vllm-lora-merge": "merge", "vllm-lora-adapter": "adapter"}


def side_vllm(args, model, prompts, modes, res: dict, logprob_gap, add_lora) -> None:
    """The vllm engine on ``model`` (with a live LoRA adapter on the ``vllm-lora-*`` sides):
    first call, a timed call per EOS mode (``modes``: rollout.py's ``eos_modes``, key
    prefix and end ids), log-prob gap, greedy tokens. ``logprob_gap(model, batch) ->
    (mean, max)`` and ``add_lora(model)`` are rollout.py's."""
    from bench.lib.common import timed_call
    from danka.rollout.vllm.engine import VllmEngine

    mode = VLLM_SIDES[args.side]
    m = add_lora(model) if mode else model
    engine = VllmEngine(max_num_seqs=len(prompts), lora_mode=mode or "auto")
    res["sleeps"] = engine.sleeps  # the default: asleep between calls, woken and re-sent
    sample = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens)

    def run(params, eos=()):
        return engine.generate(m, prompts, params, eos_ids=list(eos), pad_id=0)

    res["first_call_s"], _ = timed_call(lambda: run(sample), args.device)
    res["first_sync_s"] = engine.stats["sync_s"]  # every weight, into vLLM's dummy ones
    for tag, eos in modes:
        res[tag + "s"], batch = timed_call(lambda eos=eos: run(sample, eos), args.device)
        res[tag + "tokens"] = int(batch.response_mask.sum())
        res[tag + "tok_s"] = res[tag + "tokens"] / res[tag + "s"]
    res["gpu_memory_utilization"] = engine.spec.gpu_memory_utilization
    res["sync_s"] = engine.stats["sync_s"]  # the timed call's (nothing changed: near 0)
    res["logprob_mean_abs_diff"], res["logprob_max_abs_diff"] = logprob_gap(m, batch)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.agree_tokens)
    res["greedy_tokens"] = run(greedy).response_ids.tolist()
    engine.release()
