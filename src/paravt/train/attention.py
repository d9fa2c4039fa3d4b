"""The text attention of packed passes: causal inside each packed sequence, none across, and a
continuation of a shared prompt (train.prompt_sharing) attending to its root's first tokens.

transformers 5.x (read in its source, v5.24): Qwen3VLTextModel takes position_ids of shape
(4, B, T), row 0 the text positions and rows 1-3 the M-RoPE (t, h, w) positions. With
attention_mask None, create_causal_mask (masking_utils._preprocess_mask_arguments ->
find_packed_sequence_indices) starts a new sequence wherever row 0 does not step by 1, and and-s
the causal mask with a block-diagonal one (sdpa, eager, flex); flash_attention_2 gets the same row
as position_ids and calls flash_attn_varlen_func with cu_seqlens made from it
(modeling_flash_attention_utils._is_packed_sequence / _prepare_from_posids). So each sequence gets
row 0 = 0..L-1 and keeps its own M-RoPE rows and frames (the vision tower already attends per
image through its own cu_seqlens). The sdpa path's (T, T) mask costs memory and the work of every
masked-out block, so the trainer registers attentions of its own (a custom attention gets no mask
from create_causal_mask, only the positions) and switches the text model to one around packed
passes (`varlen_attention`):

- `_varlen_sdpa` (VARLEN_SDPA): torch's sdpa once per sequence; any device, any dtype;
- `_torch_varlen` (TORCH_VARLEN, `packed_attention: varlen`): torch's own varlen kernel
  (`torch.nn.attention.varlen.varlen_attn`, flash-attention inside torch, with its backward), one
  call a layer for the whole pass; CUDA and 16-bit compute only, else `_varlen_sdpa` is used and
  the reason said once.

Both read the prompt-sharing layout from row 0 (`prompt_sharing.segments`); flash-attention's own
package (flash_attention_2, where installed) cannot, so it gets no shared prompts.
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from paravt.train.prompt_sharing import continuation_mask, segments

VARLEN_SDPA = "paravt_varlen_sdpa"  # registered with transformers' AttentionInterface on first use
TORCH_VARLEN = "paravt_torch_varlen"
CHOICES = ("auto", "sdpa", "varlen")  # the `packed_attention` config key
SHARING = (VARLEN_SDPA, TORCH_VARLEN)  # the attentions that read a shared prompt's layout


def unwrapped(model):
    """The module a DDP wrapper holds (FSDP2 shards in place: the model itself)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


@dataclass
class _Layout:
    """A packed row's segments as the varlen kernel takes them, computed once per pass."""

    cu_q: torch.Tensor  # (S + 1,) int32: where each segment's queries start
    cu_k: torch.Tensor  # (S + 1,) int32: the same for its keys (a continuation's: its root's prefix, then its own)
    max_q: int
    max_k: int
    gather: torch.Tensor | None  # the key rows of each segment in order (None: the keys as they are)


class _Seen:
    """The last pass's row 0 and what was read from it: every layer of a pass (and the backward's
    recomputes) gets the same position tensor, so its segments cost one host sync a pass, not one
    a layer."""

    pos: torch.Tensor | None = None
    segs: list[tuple[int, int, int, int]] = []
    layout: _Layout | None = None


def _segments(pos: torch.Tensor, t: int) -> list[tuple[int, int, int, int]]:
    """`prompt_sharing.segments` of the first `t` text positions of `pos` (a layer's position_ids)."""
    if _Seen.pos is not pos:
        _Seen.pos, _Seen.segs, _Seen.layout = pos, segments(pos.reshape(-1)[:t]), None
    return _Seen.segs


def _forget() -> None:
    _Seen.pos, _Seen.segs, _Seen.layout = None, [], None


def _layout(pos: torch.Tensor, t: int, device) -> _Layout:
    segs = _segments(pos, t)
    if _Seen.layout is None:
        q_lens = [b - a for a, b, _, _ in segs]
        k_lens = [shared + b - a for a, b, _, shared in segs]
        gather = None
        if any(shared for *_, shared in segs):
            gather = torch.cat([torch.cat([torch.arange(root, root + shared), torch.arange(a, b)]) if shared
                                else torch.arange(a, b) for a, b, root, shared in segs]).to(device)

        def cum(lens: list[int]) -> torch.Tensor:
            return torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(device=device, dtype=torch.int32)

        _Seen.layout = _Layout(cum(q_lens), cum(k_lens), max(q_lens), max(k_lens), gather)
    return _Seen.layout


def _varlen_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                 dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """flash_attn_varlen_func's job done with torch's sdpa: causal attention inside each packed
    sequence (a sequence starts where the text positions restart at 0), none across, and no
    (T, T) mask, nor the work of its masked-out blocks, that the sdpa path's block-diagonal mask
    costs. For CPUs and GPUs without flash-attn. Anything but one packed row: plain sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    pos = kwargs.pop("position_ids", None)
    if pos is None or query.shape[0] != 1 or attention_mask is not None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    outs = []
    for a, b, root, shared in _segments(pos, query.shape[2]):
        k, v, mask = key[:, :, a:b], value[:, :, a:b], None
        if shared:  # a continuation: the root's first `shared` tokens, then its own (train.prompt_sharing)
            k = torch.cat([key[:, :, root:root + shared], k], 2)
            v = torch.cat([value[:, :, root:root + shared], v], 2)
            mask = continuation_mask(b - a, shared, query.device)[None, None]
        outs.append(sdpa_attention_forward(module, query[:, :, a:b], k, v, mask, dropout=dropout, scaling=scaling,
                                           **kwargs)[0])
    return torch.cat(outs, 1), None


KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # flash-attention's (tests add fp32 for a reference kernel)


def _varlen_kernel() -> Callable | None:
    """torch's varlen attention (torch >= 2.10), None where this torch has none. Tests put a
    reference of its documented arithmetic here to check the wiring on a CPU."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _varlen_call(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lay: _Layout,
                 scaling: float | None) -> torch.Tensor:
    """One varlen call, causal, in the arguments this torch's varlen_attn takes: the causal flag
    was `is_causal` (2.9) and is `window_size=(-1, 0)` since; grouped-query heads need
    `enable_gqa` (2.12), else the K/V heads are repeated as transformers' repeat_kv does. Causal
    with fewer queries than keys (a continuation) is aligned to the last key, as flash-attention's
    is: query i sees the shared prefix and its own tokens up to i."""
    params = inspect.signature(fn).parameters
    kw: dict = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kw["scale"] = scaling
    elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-12:
        raise ValueError("this torch's varlen_attn takes no scale, and the model's is not 1/sqrt(head_dim)")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            n = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
    return fn(q, k, v, lay.cu_q, lay.cu_k, lay.max_q, lay.max_k, **kw)


def _torch_varlen(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                  dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """A packed pass's attention in one torch varlen call a layer: every segment's queries against
    its keys (a continuation's keys gathered: its root's first `shared`, then its own). Anything
    but one packed row goes to `_varlen_sdpa`, which hands it to plain sdpa."""
    pos = kwargs.get("position_ids")
    if pos is None or query.shape[0] != 1 or attention_mask is not None or query.shape[2] != key.shape[2]:
        return _varlen_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    half = KERNEL_DTYPES
    if query.dtype not in half:  # fp32 q/k (autocast keeps an RMSNorm's fp32 weight): as sdpa would, in autocast's dtype
        dt = torch.get_autocast_dtype(query.device.type) if torch.is_autocast_enabled(query.device.type) else None
        if dt not in half:
            return _varlen_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    lay = _layout(pos, query.shape[2], query.device)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, heads, head_dim)
    if lay.gather is not None:
        k, v = k.index_select(0, lay.gather), v.index_select(0, lay.gather)
    out = _varlen_call(_varlen_kernel(), q.contiguous(), k.contiguous(), v.contiguous(), lay, scaling)
    return out[None], None  # (1, T, heads, head_dim), as sdpa_attention_forward returns


def _register(name: str, fn: Callable) -> None:
    from transformers import AttentionInterface

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, fn)


def varlen_unavailable(model, bf16_compute: bool = False) -> str | None:
    """Why torch's varlen kernel cannot run this model's packed passes (None: it can)."""
    if _varlen_kernel() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    p = next(unwrapped(model).parameters())
    if p.device.type != "cuda":
        return f"torch's varlen attention runs on CUDA only (the model is on {p.device.type})"
    if not (bf16_compute or p.dtype in (torch.bfloat16, torch.float16)):
        return "torch's varlen attention needs 16-bit compute (bf16 weights or mixed_precision: bf16)"
    return None


_said: set[str] = set()


def packed_attention(model, bf16_compute: bool = False, choice: str = "auto") -> str:
    """The text attention for packed passes. auto: flash-attention's varlen kernel
    (flash_attention_2) where flash-attn is installed, the model is on a GPU and computes in 16
    bits (its weights, or `bf16_compute`: autocast / FSDP's mixed precision over fp32 weights;
    flash-attn has no fp32 kernel), else `_varlen_sdpa`; sdpa: `_varlen_sdpa`; varlen: torch's
    varlen kernel where it can run (`varlen_unavailable`), else `_varlen_sdpa`, said once."""
    import importlib.util

    if choice not in CHOICES:
        raise ValueError(f"packed_attention must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "sdpa":
        return VARLEN_SDPA
    if choice == "varlen":
        why = varlen_unavailable(model, bf16_compute)
        if why is None:
            return TORCH_VARLEN
        if why not in _said:
            _said.add(why)
            warnings.warn(f"packed_attention: varlen falls back to sdpa per sequence: {why}", stacklevel=2)
        return VARLEN_SDPA
    p = next(unwrapped(model).parameters())
    half = bf16_compute or p.dtype in (torch.bfloat16, torch.float16)
    if p.device.type == "cuda" and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return VARLEN_SDPA


@contextmanager
def varlen_attention(*models, impl: str | None = None, bf16_compute: bool = False, choice: str = "auto"
                     ) -> Iterator[str]:
    """Around packed passes (forward AND backward: checkpointed layers recompute their attention):
    the text model's attention set to `impl` (default `packed_attention(..., choice)`), restored
    after. The vision tower attends per image already (its own cu_seqlens): it goes to
    flash-attention's varlen kernel too when the text does (one call a layer instead of one per
    image), else keeps its own. impl "sdpa": transformers' own packed path, a block-diagonal mask
    from the positions. Yields the text implementation."""
    bases = [unwrapped(m) for m in models if m is not None]
    if not bases:
        yield impl or VARLEN_SDPA
        return
    impl = impl or packed_attention(bases[0], bf16_compute, choice)
    if impl == VARLEN_SDPA:
        _register(VARLEN_SDPA, _varlen_sdpa)
    elif impl == TORCH_VARLEN:
        _register(TORCH_VARLEN, _torch_varlen)
    want = {"text_config": impl}
    if impl.startswith("flash_attention"):
        want["vision_config"] = impl
    before = [{k: getattr(b.config, k)._attn_implementation for k in want} for b in bases]
    for b, was in zip(bases, before):
        if was != want:
            b.set_attn_implementation(want)
    try:
        yield impl
    finally:
        _forget()
        for b, was in zip(bases, before):
            if was != want:
                b.set_attn_implementation(was)
