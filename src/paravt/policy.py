"""The policy's forward pass and its distribution: the batched model inputs of rendered rows
(ids, mask, pixels, Qwen3-VL's 3-D positions), log π_τ over the vocabulary, and the logprobs of
a completion under the current weights. The backend's sampler and the trainer's losses compute
log π_τ here, in one place (docs/rl.md).
"""

from __future__ import annotations

import numpy as np
import torch

from paravt.chat import Renderer


def model_inputs(model, renderer: Renderer, rows: list[list[int]], images: list[list[np.ndarray]], device=None,
                 pixels: dict | None = None) -> dict:
    """Left-padded batch inputs (ids, mask, mm token types, pixels, 3-D positions) for `rows`.

    `images[i]` are the frames of row i in the order their placeholders appear. `pixels`: their
    `Renderer.pixel_inputs`, already made (a packed pass's shared prompt: the grid of every frame,
    the pixels of those not already in the pass)."""
    device = device or model.device
    pad = renderer.tok.pad_token_id if renderer.tok.pad_token_id is not None else 0
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        attention[i, width - len(r):] = 1
    mm_types = (input_ids == renderer.image_pad).int() * attention
    flat_images = [im for per in images for im in per]
    pix = renderer.pixel_inputs(flat_images) if pixels is None else pixels
    inputs = {"input_ids": input_ids.to(device), "attention_mask": attention.to(device)}
    if pix.get("pixel_values") is not None:
        inputs["pixel_values"] = pix["pixel_values"].to(device=device, dtype=model.dtype)
    if pix.get("image_grid_thw") is not None:
        inputs["image_grid_thw"] = pix["image_grid_thw"].to(device)
    position_ids, _ = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=mm_types.to(device),
        image_grid_thw=inputs.get("image_grid_thw"),
        attention_mask=inputs["attention_mask"],
    )
    inputs["position_ids"] = position_ids
    inputs["mm_token_type_ids"] = mm_types.to(device)
    return inputs


# Below this a temperature is greedy (vLLM's _SAMPLING_EPS): logits / 1e-300 overflow to inf and the
# softmax to NaN, so a "temperature" of 1e-300 means what the user meant by it, argmax.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    return temperature < GREEDY_BELOW


def policy_log_softmax(logits: torch.Tensor, temperature: float = 1.0,
                       banned: torch.Tensor | list[int] | None = None) -> torch.Tensor:
    """log π_τ over the vocabulary: log_softmax(logits / τ) with the never-sampled tokens (vision
    placeholders) removed. This is the distribution rollouts sample from, so it is the one place
    behaviour logprobs (the backend), the trainer's ratio, KL and entropy, and drift checks are
    computed: a gradient of log π₁ under samples of π₀.₇ drifts the entropy step after step.
    τ below GREEDY_BELOW (greedy) reports the τ = 1 values. Top-p is not folded in (as verl, TRL and AReaL): the
    truncated tail only matters when top_p < 1, which the recipe does not use."""
    x = logits.float()
    if not is_greedy(temperature) and temperature != 1.0:
        x = x / temperature
    if banned is not None and len(banned):
        idx = banned if isinstance(banned, torch.Tensor) else torch.tensor(banned, dtype=torch.long)
        x = x.index_fill(-1, idx.to(x.device), float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sequence_logprobs(model, renderer: Renderer, prompt_ids: list[int], completion_ids: list[int],
                      images: list[np.ndarray], temperature: float = 1.0) -> torch.Tensor:
    """log π_τ(completion token | everything before it) under the model's current weights, from one
    full forward pass (with grad when grad is enabled): the quantity `Completion.logprobs` reports
    for a request sampled at `temperature`.

    The trainer calls this on exactly the ids a rollout fed and produced
    (`Completion.prompt_ids`, `Completion.token_ids`, and the request's frames in order)."""
    if not completion_ids:
        return torch.zeros(0)
    inputs = model_inputs(model, renderer, [list(prompt_ids) + list(completion_ids)], [images])
    out = model(**inputs, use_cache=False, logits_to_keep=len(completion_ids) + 1)
    logits = out.logits[0, :-1]
    target = torch.tensor(completion_ids, device=logits.device)
    return policy_log_softmax(logits, temperature, renderer.banned_ids).gather(-1, target[:, None])[:, 0]
