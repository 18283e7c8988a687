"""vLLM as a rollout engine, colocated: the engine lives in the training process, on the
training GPU, and follows the policy after every optimiser step.

Why: the single-card tutorial names vLLM as a rollout backend, and verl, TRL (``vllm_mode="colocate"``),
OpenRLHF and Unsloth all generate with it; this engine lets a run compare it with danka's
own fast engine on the same step. Optional: ``pip install 'danka[vllm]'``.

1. start (first ``generate``): ``LLM`` on a folder holding the policy's config only, with
   dummy weights (a 4-bit base: vLLM loads and quantises the base itself), its memory the
   share the memory plan gives it (``gpu_memory_utilization``, danka.rollout.vllm.memory),
   ``max_num_seqs`` = the planned sequences per call, ``max_model_len`` = prompt + new
   tokens;
2. sync (every ``generate``): what changed since the last one (danka.rollout.vllm.sync):
   the first time everything; then the tensors an optimiser stepped, LoRA adapters merged
   into their weights (``lora_compute: merge``, the default on a 16-bit base) or the adapter
   itself as a vLLM LoRA (``lora_compute: adapter``, the only way on a 4-bit base);
3. generate: token ids in, token ids and each sampled token's log-prob out, stopping at
   danka's stop ids; packed by ``finish_batch`` into the same ``RolloutBatch`` as every
   engine. The trainer computes its log-probs with its own forward as with every engine;
4. sleep (``rollout.keep_cache`` null or false, the default): after every generate vLLM's
   sleep mode frees its KV cache and weights (level 2: discarded; a 4-bit base that vLLM
   loaded itself is offloaded to the CPU instead, level 1), so the update has the memory;
   before the next generate the weights wake up and everything is sent again (as TRL's
   colocate mode does; BENCHMARKS.md has its peak against the fast engine's, asleep and
   awake). ``true``: vLLM keeps its share all run (only changed tensors sent).

Every vLLM call is in :mod:`danka.rollout.vllm.calls` (``VllmCalls``), which tests replace.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from danka.errors import UserError
from danka.models.dims import dims
from danka.models.unwrap import unwrap_causal_lm
from danka.rollout.base import RolloutEngine, Sampled, keeps_cache
from danka.rollout.vllm.calls import VllmCalls, VllmSpec, lora_rank
from danka.rollout.vllm.memory import GIB, vllm_share
from danka.rollout.vllm.sync import WeightSync, peft_model

# rollout.lora_compute for this engine: auto = merge on a 16/32-bit base, adapter on 4-bit
VLLM_LORA = ("auto", "merge", "adapter")


class VllmEngine(RolloutEngine):
    """Colocated vLLM; see the module docstring."""

    name = "vllm"

    def __init__(
        self,
        max_num_seqs: int = 0,
        lora_mode: str = "auto",
        gpu_memory_utilization: float = 0.0,
        max_model_len: int = 0,
        keep_cache: bool | None = None,
        enforce_eager: bool = False,
        attention_backend: str | None = "FLASH_ATTN",
        calls: type = VllmCalls,
    ):
        # max_num_seqs (rollout.generation_batch_size): sequences vLLM runs at once, 0 = a
        # call's all; gpu_memory_utilization and max_model_len: from the memory plan
        # (danka.planning.vllm), 0 = sized at the first call from the live model;
        # keep_cache (rollout.keep_cache): true = awake all run, else sleep between
        # rollouts (step 4 above);
        # enforce_eager: no CUDA graphs; attention_backend: vLLM's (None: it picks);
        # calls: the vLLM adapter (a fake in tests).
        if lora_mode not in VLLM_LORA:
            raise UserError(
                f"rollout.lora_compute: {lora_mode!r} is not a mode of the vllm engine",
                where="rollout.lora_compute",
                fix="use auto, merge (adapters merged into the weights vLLM holds) or adapter "
                "(vLLM's own LoRA kernels; the only mode on a 4-bit base)",
            )
        self.max_num_seqs = max(0, int(max_num_seqs))
        self.lora_mode = lora_mode
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.max_model_len = int(max_model_len)
        self.sleeps = not keeps_cache(keep_cache)
        self._asleep = False
        self.enforce_eager = enforce_eager
        self.attention_backend = attention_backend
        self._calls_cls = calls
        self.calls = None
        self.sync: WeightSync | None = None
        self.spec: VllmSpec | None = None
        self._dir: Path | None = None
        self.stats: dict[str, float] = {}

    def sample(self, model, prompt_ids, params, eos_ids, pad_id, generator) -> Sampled:
        if self.calls is None:
            self._start(model, prompt_ids, params, generator)
        t0 = time.perf_counter()
        if self._asleep:  # the weights' memory first: what the sync writes into
            self.calls.wake_up(["weights"])
            self.sync.forget()
        update = self.sync.update(model)
        self.calls.load_weights(update.tensors)
        if update.adapter_path is not None:
            self._lora = self.calls.adapter(update.adapter_path, self.sync.adapter_id)
        if self._asleep:
            self.calls.wake_up(["kv_cache"])
            self._asleep = False
        self.stats["synced_tensors"] = len(update.tensors)
        self.stats["sync_s"] = time.perf_counter() - t0  # host time; the copies may still run
        lora = self._lora if self.sync.lora_mode == "adapter" else None
        out = self.calls.generate(prompt_ids, params, eos_ids, lora)
        if self.sleeps:  # level 2 discards what the next sync sends again anyway
            self.calls.sleep(2 if self.spec.dummy_weights else 1)
            self._asleep = True
        return out

    def _start(self, model, prompt_ids, params, generator) -> None:
        hf = unwrap_causal_lm(model)
        mode, quantized = self._mode(model, hf)
        longest = max(len(p) for p in prompt_ids) + params.max_new_tokens
        limit = getattr(hf.config, "max_position_embeddings", None) or longest
        max_len = min(self.max_model_len or longest, limit)
        seqs = self.max_num_seqs or len(prompt_ids) * params.n
        peft = peft_model(model)
        rank = lora_rank(peft.peft_config[peft.active_adapter].r) if mode == "adapter" else 0
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())
        self._dir = Path(tempfile.mkdtemp(prefix="danka_vllm_"))
        self.spec = VllmSpec(
            model=self._model_dir(hf, quantized),
            dtype=str(hf.dtype).removeprefix("torch."),
            gpu_memory_utilization=self.gpu_memory_utilization
            or self._fraction(hf, seqs, max_len, rank),
            max_model_len=max_len,
            max_num_seqs=seqs,
            seed=seed,
            dummy_weights=not quantized,
            quantization="bitsandbytes" if quantized else None,
            lora_rank=rank,
            enforce_eager=self.enforce_eager,
            sleep=self.sleeps,
            attention_backend=self.attention_backend,
        )
        _check_free(self.spec, hf)
        self.calls = self._calls_cls(self.spec)
        self.sync = WeightSync(mode, send_base=not quantized)
        self._lora = None

    def _mode(self, model, hf) -> tuple[str, bool]:
        """("full" | "merge" | "adapter", whether the base is 4-bit)."""
        if getattr(hf, "is_loaded_in_8bit", False):
            raise UserError(
                "the vllm engine does not sample from an 8-bit base",
                where="rollout.engine",
                fix="use model.load_in_4bit (vLLM loads the base with bitsandbytes), or "
                "rollout.engine: hf",
            )
        quantized = bool(getattr(hf, "is_loaded_in_4bit", False))
        if peft_model(model) is None:
            return "full", quantized
        if quantized and self.lora_mode == "merge":
            raise UserError(
                "rollout.lora_compute: merge cannot merge an adapter into a 4-bit base",
                where="rollout.lora_compute",
                fix="set rollout.lora_compute: adapter (or auto)",
            )
        auto = "adapter" if quantized else "merge"
        return (auto if self.lora_mode == "auto" else self.lora_mode), quantized

    def _model_dir(self, hf, quantized: bool) -> str:
        """What vLLM starts from: the base's own files for a 4-bit base (vLLM quantises
        them), else a folder with the policy's config.json alone (dummy weights, the policy's
        come with the first sync)."""
        if quantized:
            return str(hf.config._name_or_path)
        config = hf.config.to_dict()
        config.pop("quantization_config", None)
        if not config.get("architectures"):  # a model built from a config: vLLM needs its class
            config["architectures"] = [type(hf).__name__]
        (self._dir / "config.json").write_text(json.dumps(config, default=str))
        return str(self._dir)

    def _fraction(self, hf, seqs: int, max_len: int, rank: int) -> float:
        """Without a plan (a benchmark, ``danka generate``): vLLM's share sized from the live
        model for this call's sequences."""
        device = next(hf.parameters()).device
        if device.type != "cuda":
            return 0.5  # a fake engine in a CPU test: any value
        d = torch.finfo(hf.dtype).bits // 8
        params = sum(p.numel() for n, p in hf.named_parameters() if "lora_" not in n)
        adapter = rank * sum(m.in_features + m.out_features for m in _adapted(hf)) * d
        share = vllm_share(
            dims(hf.config),
            dtype_bytes=d,
            weight_bytes=params * d,
            sequences=seqs,
            max_model_len=max_len,
            adapter_bytes=adapter,
        )
        return share.fraction(torch.cuda.mem_get_info(device)[1])

    def release(self) -> None:
        """Shut vLLM down and free its memory; the next ``generate`` starts it again."""
        if self.calls is not None:
            self.calls.close()
        if self.sync is not None:
            self.sync.close()
        self.calls = self.sync = None
        self._asleep = False
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _adapted(hf) -> list[torch.nn.Linear]:
    """The base linears of the LoRA-adapted modules (vLLM keeps one adapter slot for them)."""
    return [m.base_layer for m in hf.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


def _check_free(spec: VllmSpec, hf) -> None:
    """vLLM refuses to start when its share is not free; say so in danka's words first."""
    device = next(hf.parameters()).device
    if device.type != "cuda":
        return
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    need = spec.gpu_memory_utilization * total
    if free < need:
        raise UserError(
            f"vLLM's share of the GPU ({need / GIB:.1f} GiB, gpu_memory_utilization "
            f"{spec.gpu_memory_utilization}) is more than is free ({free / GIB:.1f} GiB)",
            where="rollout.engine",
            fix="lower rollout.generation_batch_size or trainer.max_new_tokens, or use "
            "rollout.engine: fast (no second copy of the weights)",
        )
