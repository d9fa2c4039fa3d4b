"""Liger's Triton kernels in the training passes of Qwen3-VL, where they apply (`liger` config key):

    rms_norm   the text model's RMSNorms (final, per layer, q_norm and k_norm): fp32 inside, as HF's
    swiglu     each text MLP's silu(gate) * up in one kernel
    rope       the text attention's rotary embedding of q and k
    logprob    log π_τ at the trained positions fused with the output head's matmul
               (liger's fused linear cross-entropy, reduction none: small chunks of bf16 logits,
               never the vocabulary-wide fp32 ones)

Liger's own `apply_liger_kernel_to_qwen3_vl` patches transformers' classes for the whole process and
cannot be undone; here each part is put on the given models' modules for the duration of a block
(`liger_kernels`) and taken off after, so the reference, the rollout backend and a baseline in the
same process stay as they were. The rotary function is looked up in the modeling module by name, so
`rope` swaps that name for the block (every Qwen3-VL model in the process sees it meanwhile).

Liger needs CUDA and Triton: without them (a CPU, a machine without the wheel) the block runs the
model's own code and says why once. The vision tower is left alone (frozen or small beside the text).

The log-probability's arithmetic: log π_τ(y) = -CE(x/τ W^T + b, y), b = -inf at the never-sampled
ids (0 elsewhere), the same distribution as `policy.policy_log_softmax`, with x/τ rounded to the
compute dtype before the matmul instead of the logits after it. The entropy the update logs is
computed beside it without grad, a chunk of fp32 logits at a time (one more matmul of the head).
"""

from __future__ import annotations

import sys
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from paravt.train.attention import unwrapped

PARTS = ("rms_norm", "swiglu", "rope", "logprob")
FUSED_LOGPROB = "_paravt_linear_ce"  # the attribute the output head's hook (train.logprobs) looks for


@dataclass(frozen=True)
class Ops:
    """The kernels, by what they compute (tests put a torch reference of the same arithmetic here)."""

    rms_norm: Callable  # (x, weight, eps) -> weight * x / rms(x), computed in fp32, cast back as HF's
    swiglu: Callable  # (gate, up) -> silu(gate) * up
    rope: Callable  # (q, k, cos, sin) -> rotated (q, k), (B, heads, T, D) against (B, T, D)
    linear_ce: Callable  # (x (N, H), weight (V, H), target (N,), bias (V,) | None) -> (N,) fp32 per-token CE


def check_parts(parts: list[str]) -> list[str]:
    """The parts named, checked ("all": every part)."""
    parts = list(PARTS) if list(parts) == ["all"] else list(parts)
    bad = [p for p in parts if p not in PARTS]
    if bad or len(set(parts)) != len(parts):
        raise ValueError(f"liger takes parts among {', '.join(PARTS)} (or [all]), each once; got {parts}")
    return parts


def liger_unavailable(model) -> str | None:
    """Why Liger's kernels cannot run this model's passes here (None: they can)."""
    p = next(unwrapped(model).parameters())
    if p.device.type != "cuda":
        return f"Liger's Triton kernels run on CUDA only (the model is on {p.device.type})"
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, or its Triton does not load
        return f"liger_kernel does not import ({type(e).__name__}: {e}); pip install liger-kernel"
    return None


def liger_ops() -> Ops:
    """Liger's functional kernels (liger_kernel.transformers.functional)."""
    from liger_kernel.transformers import functional as F

    return Ops(rms_norm=lambda x, w, eps: F.liger_rms_norm(x, w, eps, 0.0, "llama", False),
               swiglu=F.liger_swiglu,
               rope=lambda q, k, cos, sin: F.liger_rope(q, k, cos, sin),
               linear_ce=lambda x, w, y, b: F.liger_fused_linear_cross_entropy(x, w, y, bias=b, reduction="none"))


_said: set[str] = set()


@contextmanager
def liger_kernels(*models, parts: list[str], ops: Ops | None = None) -> Iterator[list[str]]:
    """Within the block, `parts` of Liger's kernels on the text model of each of `models`; yields
    the parts put on (none where Liger cannot run: the reason is said once)."""
    parts = check_parts(parts)
    bases = list({id(b): b for b in (unwrapped(m) for m in models if m is not None)}.values())
    if not parts or not bases:
        yield []
        return
    if ops is None:
        why = liger_unavailable(bases[0])
        if why is not None:
            if why not in _said:
                _said.add(why)
                warnings.warn(f"liger: the model's own code runs instead: {why}", stacklevel=3)
            yield []
            return
        ops = liger_ops()
    with ExitStack() as undo:
        for base in bases:
            _put_on(base, parts, ops, undo)
        yield parts


def _instance(undo: ExitStack, module, name: str, value) -> None:
    """module.<name> = value for the block (an instance attribute over the class's)."""
    setattr(module, name, value)
    undo.callback(delattr, module, name)


def _put_on(base, parts: list[str], ops: Ops, undo: ExitStack) -> None:
    text = base.model.language_model
    if "rms_norm" in parts:
        for m in text.modules():
            if type(m).__name__.endswith("RMSNorm"):
                _instance(undo, m, "forward", lambda x, m=m: ops.rms_norm(x, m.weight, m.variance_epsilon))
    if "swiglu" in parts:
        act = getattr(text.config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"liger swiglu: the text MLP's activation is {act}, not silu")
        for layer in text.layers:
            mlp = layer.mlp
            _instance(undo, mlp, "forward", lambda x, mlp=mlp: mlp.down_proj(ops.swiglu(mlp.gate_proj(x), mlp.up_proj(x))))
    if "rope" in parts:
        modeling = sys.modules[type(text.layers[0].self_attn).__module__]
        before = modeling.apply_rotary_pos_emb
        if getattr(before, "_paravt_liger", False) is False:
            def rope(q, k, cos, sin, unsqueeze_dim=1):
                if unsqueeze_dim != 1:
                    return before(q, k, cos, sin, unsqueeze_dim)
                return ops.rope(q, k, cos, sin)

            rope._paravt_liger = True
            modeling.apply_rotary_pos_emb = rope
            undo.callback(setattr, modeling, "apply_rotary_pos_emb", before)
    if "logprob" in parts:
        _instance(undo, base, FUSED_LOGPROB, ops.linear_ce)


def fused_logprobs(linear_ce: Callable, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   targets: torch.Tensor, temperature: float, banned: torch.Tensor | None) -> torch.Tensor:
    """log π_τ(targets) of hidden states `h` (N, H) through the head (weight, bias) in one fused
    call (module doc): (N,) fp32, with grad."""
    scale = 1.0 / temperature if temperature > 0 and temperature != 1.0 else None
    x = h if scale is None else h * scale
    b = bias if bias is None or scale is None else bias * scale
    if banned is not None:
        zero = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        b = (zero if b is None else b.to(weight.dtype)).index_fill(0, banned, float("-inf"))
    return -linear_ce(x, weight, targets, b).float()
