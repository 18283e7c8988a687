"""A fake ``vllm`` package for CPU tests: the slice of vLLM 0.26's offline API that
danka.rollout.vllm.calls uses, backed by a plain HF model and a token-by-token decode loop.

``LLM(model=DIR, load_format="dummy", ...)`` builds its OWN model from ``DIR/config.json``
with random weights, so only what the weight sync sends makes it generate like the policy;
``apply_model(fn)`` hands ``fn`` an object whose ``load_weights`` copies ``(HF name,
tensor)`` pairs into that model and records them; a ``LoRARequest`` is applied by loading
the saved adapter with peft onto a copy of the model; ``sleep``/``wake_up`` drop the
adapters and (level 2) the weights as vLLM's sleep mode does. Install with :func:`install`.
"""

from __future__ import annotations

import copy
import sys
import types
from dataclasses import dataclass, field

import torch


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    logprobs: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 1e-5 and self.n > 1:  # as vLLM: greedy takes n = 1 only
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass
class Loaded:
    """What the fake received: every load_weights call's names, and the adapters."""

    weights: list[list[str]] = field(default_factory=list)
    adapters: list[LoRARequest] = field(default_factory=list)
    resets: int = 0
    calls: list[str] = field(default_factory=list)  # generate / sleep N / wake TAGS, in order


# vLLM's Qwen2/Llama packing and the linears its LoRA manager wraps (all of them)
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Model:
    """The model ``apply_model`` hands out, named as vLLM names it: q/k/v and gate/up
    packed, and with ``enable_lora`` every linear's weight under ``.base_layer`` (vLLM wraps
    them at start-up), where ``load_weights`` looks for it."""

    packed_modules_mapping = PACKED

    def __init__(self, llm: LLM):
        self.llm = llm

    def _wrapped(self, hf: str) -> bool:
        return bool(self.llm.kwargs.get("enable_lora")) and hf.split(".")[-2] in LINEARS

    def named_parameters(self):
        for hf, p in self.llm.model.named_parameters():
            module, _, leaf = hf.rpartition(".")
            parent, _, sub = module.rpartition(".")
            sub = next((k for k, v in PACKED.items() if sub in v), sub)
            yield f"{parent}.{sub}{'.base_layer' if self._wrapped(hf) else ''}.{leaf}", p

    def load_weights(self, weights) -> set[str]:
        state = dict(self.llm.model.named_parameters())
        names = []
        for name, tensor in weights:
            hf = name.replace(".base_layer.", ".")
            if hf not in state or (".base_layer." in name) != self._wrapped(hf):
                raise ValueError(f"There is no module or parameter named {name!r}")
            state[hf].data.copy_(tensor.to(state[hf].dtype))
            names.append(hf)
        self.llm.loaded.weights.append(names)
        return set(names)


class LLM:
    instances: list[LLM] = []

    def __init__(self, model: str, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.kwargs = kwargs
        self.loaded = Loaded()
        config = AutoConfig.from_pretrained(model)
        torch.manual_seed(1234)  # "dummy" weights: anything but the policy's
        dtype = getattr(torch, kwargs.get("dtype", "float32"))
        self.model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
        self.generator = torch.Generator().manual_seed(kwargs.get("seed", 0))
        self._adapters: dict[int, torch.nn.Module] = {}
        self.asleep: set[str] = set()
        LLM.instances.append(self)

    def apply_model(self, fn):
        if "weights" in self.asleep:  # vLLM writes into unmapped memory (TRL issue 5142)
            raise RuntimeError("load_weights while vLLM's weights sleep")
        return [fn(_Model(self))]

    def sleep(self, level: int = 1) -> None:
        """As vLLM's sleep mode: the KV cache is dropped (and with it every LoRA slot here),
        the weights offloaded (level 1) or discarded (level 2: random again)."""
        assert self.kwargs.get("enable_sleep_mode"), "sleep() needs enable_sleep_mode=True"
        self.loaded.calls.append(f"sleep {level}")
        self.asleep = {"weights", "kv_cache"}
        self._adapters = {}
        if level == 2:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(99))

    def wake_up(self, tags=None) -> None:
        tags = tags or ["weights", "kv_cache"]
        self.loaded.calls.append("wake " + ",".join(tags))
        self.asleep -= set(tags)

    def reset_prefix_cache(self, *args) -> bool:
        self.loaded.resets += 1
        return True

    def _with_adapter(self, req: LoRARequest | None) -> torch.nn.Module:
        if req is None:
            return self.model
        if req.lora_int_id not in self._adapters:
            from peft import PeftModel

            self.loaded.adapters.append(req)
            base = copy.deepcopy(self.model)
            self._adapters = {req.lora_int_id: PeftModel.from_pretrained(base, req.lora_path)}
        return self._adapters[req.lora_int_id]

    @torch.no_grad()
    def generate(self, prompts, sampling_params, *, use_tqdm=True, lora_request=None):
        if self.asleep:
            raise RuntimeError(f"generate while vLLM sleeps ({sorted(self.asleep)})")
        self.loaded.calls.append("generate")
        sp = sampling_params
        model = self._with_adapter(lora_request)
        stop = set(sp.stop_token_ids or [])
        out = []
        for prompt in prompts:
            comps = []
            for j in range(sp.n):
                ids = list(prompt["prompt_token_ids"])
                toks, lps = [], []
                for _ in range(sp.max_tokens):
                    logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                    if sp.temperature < 1e-5:
                        tok = int(logits.argmax())
                        lp = torch.log_softmax(logits, -1)[tok]
                    else:
                        logp = torch.log_softmax(logits / sp.temperature, -1)
                        tok = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                        lp = logp[tok]
                    toks.append(tok)
                    lps.append({tok: Logprob(float(lp))})
                    ids.append(tok)
                    if tok in stop:
                        break
                comps.append(CompletionOutput(j, toks, lps if sp.logprobs is not None else None))
            out.append(RequestOutput(list(reversed(comps))))  # any order: danka sorts by index
        return out


def install(monkeypatch) -> types.ModuleType:
    """Put the fake ``vllm``, ``vllm.lora`` and ``vllm.lora.request`` into sys.modules."""
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams, vllm.__version__ = LLM, SamplingParams, "0.26.0"
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    lora.request = request
    vllm.lora = lora
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    LLM.instances = []
    return vllm
