"""Every call danka makes into vLLM, in one small class (``VllmCalls``), written against
vLLM 0.26.0's offline ``LLM`` API; tests stand a fake ``vllm`` module in for it.

* ``LLM(model=DIR, ...)`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine
  core runs in-process, so ``apply_model`` reaches the model object itself), its memory
  ``gpu_memory_utilization`` x the card (vLLM: weights + activations + CUDA graphs + KV
  cache must fit that share, and the share must be free when it starts);
* ``generate([{"prompt_token_ids": ids}, ...], SamplingParams(...), lora_request=...)``:
  token ids in, token ids and each sampled token's log-prob out;
* ``apply_model(lambda model: model.load_weights(pairs))``: tensors under their HF names
  (vLLM's loader stacks q/k/v and gate/up itself), copied into the existing parameters, so
  captured CUDA graphs stay valid;
* ``LoRARequest(name, id, path)``: an adapter saved in peft's format; a fresh id per sync;
* ``reset_prefix_cache()`` after every weight change: cached prompt blocks were computed
  with the old weights.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from dataclasses import dataclass

import torch

from danka.errors import UserError
from danka.rollout.base import SamplingParams

INSTALL = (
    "pip install 'danka[vllm]' (vLLM 0.26 pins torch 2.11.0: install it into an environment "
    "with that torch), or use rollout.engine: fast (danka's own engine, no extra package)"
)
VLLM_BATCHED_TOKENS = 8192  # max_num_batched_tokens: prefill chunk (the plan prices it)
VLLM_BLOCK = 16  # tokens per KV-cache block (vLLM's default on CUDA)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
# set before vLLM is imported (a value already set wins): the engine core in this process
# (weights reachable, no worker processes in a sandbox), no usage reporting, only vLLM's
# warnings in the run's log (VLLM_LOGGING_LEVEL=INFO shows its start-up)
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}


def torch_pin_problem(requires: list[str], torch_version: str) -> str | None:
    """What is wrong when vLLM's ``torch==X`` pin (one of its ``Requires-Dist`` lines) is not
    the installed torch (a local tag such as ``+cu130`` ignored); None when it matches, or
    when vLLM pins no torch for every install (a line under an extra does not count)."""
    have = torch_version.split("+")[0]
    for line in requires:
        spec, _, marker = line.partition(";")
        m = re.fullmatch(r"\s*torch\s*==\s*([\w.]+)\s*", spec)
        if m and "extra" not in marker and m.group(1) != have:
            return f"vllm needs torch=={m.group(1)}, this environment has torch {torch_version}"
    return None


def check_vllm(device_type: str) -> None:
    """UserError (exit 2) with the install hint when ``rollout.engine: vllm`` cannot run
    here: no CUDA device, vLLM not installed, or its torch pin not met. vLLM is not
    imported here (seconds); the import itself is checked when the engine starts."""
    if device_type != "cuda":
        raise UserError(
            f"rollout.engine: vllm needs a CUDA GPU (this run is on {device_type})",
            where="rollout.engine",
            fix="use rollout.engine: auto (hf on a CPU)",
        )
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        raise UserError(
            "rollout.engine: vllm, but vLLM is not installed", "rollout.engine", INSTALL
        )
    try:
        requires = importlib.metadata.requires("vllm") or []
    except importlib.metadata.PackageNotFoundError:
        return  # a vllm module without package metadata (a source checkout): no pin to read
    problem = torch_pin_problem(requires, torch.__version__)
    if problem:
        raise UserError(f"rollout.engine: vllm, but {problem}", "rollout.engine", INSTALL)


def import_vllm():
    """The ``vllm`` module (the environment set first), or a UserError with the hint."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    try:
        return importlib.import_module("vllm")
    except Exception as err:  # noqa: BLE001 - a broken build raises anything (OSError, ABI)
        raise UserError(
            f"rollout.engine: vllm, but vLLM does not import: {type(err).__name__}: {err}",
            where="rollout.engine",
            fix=INSTALL,
        ) from err


def lora_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    fit = [v for v in LORA_RANKS if v >= r]
    if not fit:
        raise UserError(
            f"lora.lora_r {r} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}",
            where="lora.lora_r",
            fix=f"set lora.lora_r <= {LORA_RANKS[-1]}, or rollout.lora_compute: merge",
        )
    return fit[0]


def batched_tokens(max_num_seqs: int, max_model_len: int) -> int:
    """vLLM's ``max_num_batched_tokens``: ``VLLM_BATCHED_TOKENS``, but never more than all
    ``max_num_seqs`` sequences at full length, and never less than one sequence.

    vLLM's start-up (FlashInfer's autotune) runs one dummy batch of ``max_num_batched_tokens``
    tokens spread over at most ``max_num_seqs`` requests, whose block tables are only
    ``max_model_len`` long. With 32 sequences of 37 tokens each of them got 256 tokens, and
    that dummy run's FlashAttention call faulted (an illegal memory access, H200, 2026-12-03,
    with sleep mode or a LoRA adapter; vLLM warns "max_num_batched_tokens exceeds
    max_num_seqs * max_model_len")."""
    return max(max_model_len, min(VLLM_BATCHED_TOKENS, max_num_seqs * max_model_len))


@dataclass(frozen=True)
class VllmSpec:
    """How the vLLM engine is started (``LLM(...)``'s arguments)."""

    model: str  # a folder with the policy's config.json (dummy load) or the base's weights
    dtype: str  # "bfloat16" | "float16" | "float32": the policy's
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    seed: int
    dummy_weights: bool = True  # load_format "dummy": the weights come from the policy
    quantization: str | None = None  # "bitsandbytes": a 4-bit base loaded by vLLM itself
    lora_rank: int = 0  # > 0: enable_lora with this max_lora_rank
    enforce_eager: bool = False  # no CUDA graphs, no torch.compile
    sleep: bool = False  # enable_sleep_mode: weights and KV cache freed between rollouts
    attention_backend: str | None = "FLASH_ATTN"  # None: vLLM picks

    def llm_kwargs(self) -> dict:
        kw = dict(
            model=self.model,
            skip_tokenizer_init=True,  # token ids in and out
            generation_config="vllm",  # not the model's defaults (a repetition penalty...)
            dtype=self.dtype,
            seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=batched_tokens(self.max_num_seqs, self.max_model_len),
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=True,  # a group's n samples share their prompt's blocks
            logprobs_mode="processed_logprobs",  # after temperature, as the training forward
            load_format="dummy" if self.dummy_weights else "auto",
            enable_sleep_mode=self.sleep,
        )
        if self.quantization:
            kw["quantization"] = self.quantization
        if self.lora_rank:
            kw.update(enable_lora=True, max_lora_rank=self.lora_rank, max_loras=1)
        if self.attention_backend:
            kw["attention_config"] = {"backend": self.attention_backend}
        return kw


class VllmCalls:
    """The running vLLM engine: start, generate, load weights, add an adapter, close."""

    def __init__(self, spec: VllmSpec):
        vllm = import_vllm()
        self.spec = spec
        self._vllm = vllm
        # vLLM's engine creates a one-process torch.distributed group unless one exists
        self._owns_dist = not (
            torch.distributed.is_available() and torch.distributed.is_initialized()
        )
        self.llm = vllm.LLM(**spec.llm_kwargs())
        self._names: set[str] | None = None  # vLLM's parameter names (LoRA: base_layer)
        self._lora_request = importlib.import_module("vllm.lora.request").LoRARequest

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        eos_ids: list[int],
        lora=None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """``params.n`` samples per prompt, sample ``i * n + j`` answering prompt ``i``:
        (token ids, each token's log-prob). Stops at ``eos_ids`` only (the model's own EOS
        is ignored: danka's stop ids decide), the stop token included."""
        n = params.n
        if params.greedy:  # vLLM refuses n > 1 when greedy: repeat the prompts instead
            prompt_ids = [p for p in prompt_ids for _ in range(n)]
            n = 1
        sp = self._vllm.SamplingParams(
            n=n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=0 if params.greedy else params.top_k,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob
            ignore_eos=True,
            stop_token_ids=list(eos_ids),
            detokenize=False,
            skip_special_tokens=False,
        )
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outs = self.llm.generate(prompts, sp, use_tqdm=False, lora_request=lora)
        tokens: list[list[int]] = []
        logprobs: list[list[float]] = []
        for out in outs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                tokens.append(ids)
                logprobs.append(_sampled_logprobs(c.logprobs, ids))
        return tokens, logprobs

    def load_weights(self, pairs: list[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(HF name, tensor)`` pairs into the engine's model, then forget cached
        prompt blocks (computed with the old weights)."""
        if not pairs:
            return

        def load(model) -> None:
            named = pairs
            if self.spec.lora_rank:  # only vLLM's LoRA manager wraps (renames) the linears
                if self._names is None:  # the model's structure: walked once
                    self._names = {n for n, _ in model.named_parameters()}
                packed = getattr(model, "packed_modules_mapping", None) or {}
                named = lora_base_names(pairs, self._names, packed)
            model.load_weights(iter(named))

        self.llm.apply_model(load)
        self.llm.reset_prefix_cache()

    def adapter(self, path: str, adapter_id: int):
        """The request for the adapter saved at ``path`` under a fresh id (vLLM caches
        adapters by id: a new id loads the new weights); cached prompt blocks forgotten."""
        self.llm.reset_prefix_cache()
        return self._lora_request(f"danka-{adapter_id}", adapter_id, path)

    def sleep(self, level: int) -> None:
        """Free vLLM's KV cache and its weights (``level`` 2: discarded, to be sent again;
        1: offloaded to the CPU and back on waking) until ``wake_up``."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        """Map the memory of ``tags`` ("weights", "kv_cache") again; torch's cached free
        blocks are given back first (vLLM allocates outside torch's allocator)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=tags)

    def close(self) -> None:
        """Shut the engine down and give its GPU memory back."""
        llm, self.llm = self.llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        if self._owns_dist and "vllm.distributed.parallel_state" in sys.modules:
            # its process group and model-parallel state, so a later engine starts afresh
            sys.modules["vllm.distributed.parallel_state"].cleanup_dist_env_and_memory()


def lora_base_names(
    pairs: list[tuple[str, torch.Tensor]], names: set[str], packed: dict[str, list[str]]
) -> list[tuple[str, torch.Tensor]]:
    """``pairs`` under the names vLLM's ``load_weights`` finds. With ``enable_lora`` vLLM
    wraps its linears before danka loads the weights, so a base weight lives at
    ``...qkv_proj.base_layer.weight`` and the HF name ``...q_proj.weight`` is refused
    ("no module or parameter named"). ``names``: vLLM's parameter names; ``packed``: its
    ``packed_modules_mapping`` (``qkv_proj`` <- q/k/v_proj): an HF name gets
    ``.base_layer`` where vLLM's (packed) module has one; vLLM then packs it as usual."""
    out = []
    for name, tensor in pairs:
        module, _, leaf = name.rpartition(".")
        parent, _, sub = module.rpartition(".")
        vsub = next((k for k, subs in packed.items() if sub in subs), sub)
        wrapped = ".".join(x for x in (parent, vsub, "base_layer", leaf) if x)
        out.append((f"{module}.base_layer.{leaf}" if wrapped in names else name, tensor))
    return out


def _sampled_logprobs(lps, ids: list[int]) -> list[float]:
    """Each sampled token's log-prob from vLLM's per-position ``{token: Logprob}``."""
    if lps is None:
        return [0.0] * len(ids)
    return [float(lps[t][tok].logprob) for t, tok in enumerate(ids)]
