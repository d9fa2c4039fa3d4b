"""The hf backend's prefill: one forward pass over the new rows' prompts, left-padded together,
giving each row's KV cache, attention mask, next text position and the logits of its next token.

Two kinds of sharing cut the work without changing what a row gets (beyond the float rounding of
other shapes, as batching already has):
- rows with the same prompt (ids and frames) are computed once and copied: the rollouts of a GRPO
  group open on one prompt (vLLM shares such prompts through its prefix cache);
- rows that begin with the same text run that prefix once, as one row, and each row's remainder then
  attends to it through the cache. Every paravt prompt opens with its system prompt and the tool's
  schema: ~820 of the ~945 tokens of the shipped model's K = 4 prompt. The cache is then laid out as
  an ordinary left-padded batch, so the decode paths (eager and static) take it as they take any.
Sharing stays within one prefill call: nothing is kept between calls, so a cache can never outlive
the weights it was computed with (a training step updates them in place).

The cache is a DynamicCache whose layers keep room to grow (`kv_cache.RoomyLayer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paravt.backends.static_decode import cache_kwarg
from paravt.chat import Renderer, same_image
from paravt.policy import model_inputs

MIN_SHARED = 32  # a shorter common prefix is not worth a second forward pass


@dataclass
class Prefilled:
    cache: object  # transformers.DynamicCache, one row per prompt
    attention: torch.Tensor  # (B, L) long: 1 where a row has a token (left padding is 0)
    positions: torch.Tensor  # (B,) long: each row's next text position
    logits: torch.Tensor  # (B, vocab) float32: of each row's next token


def prefill(model, renderer: Renderer, rows: list[list[int]], images: list[list[np.ndarray]]) -> Prefilled:
    """The rows' prefill (`rows[i]`'s frames are `images[i]`), each distinct prompt computed once."""
    first = first_alike(rows, images)
    distinct = sorted(set(first))
    out = _forward(model, renderer, [rows[i] for i in distinct], [images[i] for i in distinct])
    if len(distinct) < len(rows):  # each row gets a copy of its prompt's cache, mask, position and logits
        idx = torch.tensor([distinct.index(f) for f in first], device=out.positions.device)
        map_cache(out.cache, lambda t: t.index_select(0, idx))
        out.attention, out.positions, out.logits = (
            t.index_select(0, idx) for t in (out.attention, out.positions, out.logits))
    return out


def first_alike(rows: list[list[int]], images: list[list[np.ndarray]]) -> list[int]:
    """For each row, the first row with the same ids and the same frames (itself if none). Frames
    are compared by content; the same array (a shared overview) is equal at once."""
    seen: dict[tuple[int, ...], list[int]] = {}
    first = []
    for i, (ids, frames) in enumerate(zip(rows, images)):
        alike = seen.setdefault(tuple(ids), [])
        match = next((j for j in alike if len(images[j]) == len(frames) and all(
            same_image(a, b) for a, b in zip(images[j], frames))), None)
        if match is None:
            alike.append(i)
        first.append(i if match is None else match)
    return first


def shared_text_prefix(rows: list[list[int]], renderer: Renderer) -> int:
    """How many leading tokens every row has in common, up to its first vision token (frames stay
    with the rows that hold them) and short of each row's last token (whose logits are wanted);
    0 below MIN_SHARED or for a single row."""
    if len(rows) < 2:
        return 0
    limit = min(len(r) for r in rows) - 1
    vision = {renderer.vision_start, renderer.image_pad}
    head = rows[0]
    n = 0
    while n < limit and head[n] not in vision and all(r[n] == head[n] for r in rows):
        n += 1
    return n if n >= MIN_SHARED else 0


def _forward(model, renderer: Renderer, rows: list[list[int]], images: list[list[np.ndarray]]) -> Prefilled:
    from paravt.backends.kv_cache import roomy_cache

    inputs = model_inputs(model, renderer, rows, images)
    position_ids = inputs.pop("position_ids")
    positions = position_ids.max(dim=-1).values.max(dim=0).values + 1  # (B,) next text position per row
    cache = roomy_cache(model.config.get_text_config())
    kw = {cache_kwarg(type(model)): cache, "use_cache": True, "logits_to_keep": 1}
    n = shared_text_prefix(rows, renderer)
    if n == 0:
        out = model(**inputs, position_ids=position_ids, **kw)
        return Prefilled(cache, inputs["attention_mask"], positions, out.logits[:, -1, :].float())

    ids, attention, mm = inputs["input_ids"], inputs["attention_mask"], inputs["mm_token_type_ids"]
    batch, width = ids.shape
    lengths = torch.tensor([len(r) for r in rows], device=ids.device)
    # 1. the shared prefix, once: row 0's first n tokens (text, so positions 0..n-1 on every axis)
    at = width - len(rows[0])
    model(input_ids=ids[:1, at:at + n], attention_mask=attention[:1, at:at + n],
          position_ids=position_ids[:, :1, at:at + n], mm_token_type_ids=mm[:1, at:at + n], **kw)
    map_cache(cache, lambda t: t.expand(batch, *t.shape[1:]))
    # 2. every row's remainder, right-aligned in the last `rest` columns; in a shorter row those
    # columns begin with the end of its own prefix (text, already cached), which the mask hides
    rest = width - n
    own = torch.arange(rest, device=ids.device).unsqueeze(0) >= (rest - (lengths - n)).unsqueeze(1)  # (B, rest)
    frames = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    out = model(input_ids=ids[:, n:], mm_token_type_ids=mm[:, n:], position_ids=position_ids[:, :, n:],
                attention_mask=torch.cat([attention.new_ones(batch, n), own.long()], dim=1), **frames, **kw)
    # 3. the cache as a left-padded batch: [prefix, masked gap, remainder] -> [gap, prefix, remainder]
    gap = rest - (lengths - n)  # (B,)
    if bool(gap.any()):
        col = torch.arange(width, device=ids.device).unsqueeze(0)  # new column j of row b holds old column:
        src = torch.where(col < gap.unsqueeze(1), col + n,  # the gap (masked either way)
                          torch.where(col < gap.unsqueeze(1) + n, col - gap.unsqueeze(1), col))  # prefix; remainder
        map_cache(cache, lambda t: t.gather(2, src.view(batch, 1, width, 1).expand(-1, t.shape[1], -1, t.shape[3])))
    return Prefilled(cache, attention, positions, out.logits[:, -1, :].float())


def map_cache(cache, fn) -> None:
    """Replace every layer's keys and values by `fn` of them (select rows, cut or move columns)."""
    for layer in cache.layers:
        layer.keys, layer.values = fn(layer.keys), fn(layer.values)
