"""One LoRA-adapted linear layer as one autograd function, in the base's dtype.

peft computes an adapted linear as ``y = base(x) + B(A(x)) * s``: besides the three GEMMs,
the scale and the sum are each a pass over the (tokens, out) output, forward and backward,
and the adapters' fp32 masters are cast per call by separate modules. At the GSM8K step's
shape (Qwen2.5-0.5B, 168 adapted linears) those passes took more GPU time than the GEMMs
(elementwise 422 ms against 449 ms of GEMMs, H100; BENCHMARKS "the actor update alone"), so a
LoRA update ran slower than a full-parameter one.

Here, for ``x`` (T, in), frozen ``W`` (out, in) and bias ``b``, adapters ``A`` (r, in) and
``B`` (out, r) (fp32 masters, used in ``x``'s dtype), scale ``s``::

    xa = x A^T                      (T, r)
    y  = x W^T + b;  y += s xa B^T  (the sum and the scale inside one GEMM's epilogue)

    backward, g = dL/dy:
    gb = g B                        (T, r)
    dL/dx = g W + s gb A            (the second term added by the same GEMM call)
    dL/dA = s gb^T x,  dL/dB = s g^T xa   (to the masters' dtype)

No (T, out) elementwise pass is left: every big tensor is written once, by a GEMM. It saves
``x`` (which the frozen GEMM needs anyway) and the small ``xa``. The numbers are peft's up to
bf16 rounding: the low-rank product is added to ``x W^T`` before one final rounding instead of
rounded, scaled and rounded again (tests/models/test_lora_linear.py).
"""

from __future__ import annotations

import torch
from torch import nn

from danka.models import class_swap


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scale: float):
        dtype = x.dtype
        a_, b_ = a.to(dtype), b.to(dtype)
        x2 = x.reshape(-1, x.shape[-1])
        xa = x2 @ a_.t()
        y = torch.addmm(bias, x2, weight.t()) if bias is not None else x2 @ weight.t()
        y.addmm_(xa, b_.t(), alpha=scale)
        ctx.save_for_backward(x2, xa, weight, a_, b_)
        ctx.scale, ctx.x_shape, ctx.masters = scale, x.shape, (a.dtype, b.dtype)
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, gy):
        x2, xa, weight, a_, b_ = ctx.saved_tensors
        s = ctx.scale
        g = gy.reshape(-1, gy.shape[-1])
        gb = g @ b_
        gx = None
        if ctx.needs_input_grad[0]:
            gx = (g @ weight).addmm_(gb, a_, alpha=s).view(ctx.x_shape)
        ga = _scaled(gb.t() @ x2, s, ctx.masters[0])
        gbw = _scaled(g.t() @ xa, s, ctx.masters[1])
        return gx, None, None, ga, gbw, None


def _scaled(grad: torch.Tensor, s: float, dtype: torch.dtype) -> torch.Tensor:
    """``s * grad`` in the master's ``dtype``: the scale and the cast in one kernel (the
    eager update is bound by launches: 168 adapted linears x every micro-batch)."""
    return torch.mul(grad, s, out=torch.empty(grad.shape, dtype=dtype, device=grad.device))


def lora_linear(x, weight, bias, a, b, scale: float) -> torch.Tensor:
    """``x W^T + bias + scale * (x A^T) B^T`` (module docstring), differentiable in ``x``,
    ``a`` and ``b`` (``weight`` and ``bias`` frozen)."""
    return _LoraLinear.apply(x, weight, bias, a, b, scale)


def fusable(module: nn.Module) -> bool:
    """A peft LoRA layer whose base is a plain frozen ``nn.Linear`` (not a 4-bit one)."""
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or base.weight.requires_grad:
        return False
    return base.bias is None or not base.bias.requires_grad


def _adapter(module: nn.Module, x: torch.Tensor, args, kwargs) -> str | None:
    """The one active plain-LoRA adapter this call can fuse, else None (peft's path)."""
    if args or kwargs or module.disable_adapters or module.merged:
        return None
    names = [n for n in module.active_adapters if n in module.lora_A]
    if len(names) != 1 or names[0] in getattr(module, "lora_variant", {}):
        return None
    name = names[0]
    dropout = module.lora_dropout[name]
    if module.training and not isinstance(dropout, nn.Identity) and dropout.p > 0:
        return None
    return name if x.dtype == module.base_layer.weight.dtype else None


class _Fused:
    """Mixed into a peft LoRA layer's class by :func:`install`
    (:mod:`danka.models.class_swap`): ``forward`` through :func:`lora_linear` where it
    applies."""

    _danka_base: type

    def forward(self, x: torch.Tensor, *args, **kwargs):
        name = _adapter(self, x, args, kwargs)
        if name is None:
            return self._danka_base.forward(self, x, *args, **kwargs)
        base = self.base_layer
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        return lora_linear(x, base.weight, base.bias, a, b, self.scaling[name])


def install(module: nn.Module) -> None:
    """Route ``module``'s forward through :func:`lora_linear` where it applies (one active
    adapter, no dropout in training, not merged, adapters on); peft's forward otherwise.
    ``module`` keeps its class's behaviour otherwise (a subclass: peft's isinstance checks,
    merging and saving see the same layer)."""
    class_swap.swap_in(module, _Fused)


def uninstall(module: nn.Module) -> None:
    class_swap.swap_out(module, _Fused)
