"""A frozen vision tower's features of a step's frames, computed once and reused by every pass of
the step (`vision_cache: true`, which needs `freeze_vision: true`).

With the tower frozen, the policy's, π_prox's and the reference's vision towers are the same
weights (the reference is the run's start, and the policy's tower never moves), and a frame's
features do not depend on the other frames of its pass (the tower attends within each image, by
its own cu_seqlens, and merges each image's patches apart). So a step's first pass over a frame
computes it through the model as always, a hook on the tower keeps that frame's merged embeddings
and DeepStack features, and a later pass whose frames all have theirs hands them to the model as
transformers' `mm_encoder_outputs` (transformers >= 5.24) instead of pixels: the tower does not run
again for the reference's pass, π_prox's, the policy's forward, nor a second PPO epoch. A pass
with any frame not yet seen takes its pixels and runs the tower as before (whose outputs are then
kept too). Nothing outlives the step (`step_features`).

Frames are keyed by content (shape and a hash of the pixels), so the same frame decoded twice for
two rollouts is computed once as well. Several processes (FSDP: the tower's blocks all-gather their
weights) decide each pass together: the tower runs in every process's pass where one needs it.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from paravt.train.attention import unwrapped


def frame_key(im: np.ndarray) -> bytes:
    """A frame's identity by content."""
    a = np.ascontiguousarray(im)
    return hashlib.blake2b(a.tobytes(), digest_size=16, person=str(a.shape).encode()[:16]).digest()


def cache_unavailable(model) -> str | None:
    """Why this model's forward cannot take precomputed vision features (None: it can)."""
    base = unwrapped(model)
    if "mm_encoder_outputs" not in inspect.signature(type(base).forward).parameters:
        import transformers

        return f"transformers {transformers.__version__}'s Qwen3-VL takes no mm_encoder_outputs (5.24 does)"
    if any(p.requires_grad for p in base.model.visual.parameters()):
        return "the vision tower is trained (freeze_vision: false): its features change with every step"
    return None


class VisionFeatures:
    """The step's frames' features (module doc): `inputs` swaps a pass's pixels for them."""

    def __init__(self, agree: Callable[[bool], bool] | None = None) -> None:
        self.agree = agree or (lambda need: need)  # (this process needs the tower) -> does every process run it
        self.store: dict[bytes, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._keys: dict[int, tuple[np.ndarray, bytes]] = {}  # id -> (the array, kept alive; its key)
        self._pending: list[bytes] | None = None  # the frames of the pass about to run the tower
        self.computed = 0  # frames the tower ran on
        self.reused = 0  # frames a pass took from the store

    def key(self, im: np.ndarray) -> bytes:
        hit = self._keys.get(id(im))
        if hit is None or hit[0] is not im:
            hit = self._keys[id(im)] = (im, frame_key(im))
        return hit[1]

    def inputs(self, inputs: dict, images: list[np.ndarray]) -> dict:
        """A pass's model inputs: with its frames' stored features in place of its pixels when every
        frame has them (in every process); else as they are, the tower's outputs to be kept."""
        has = "pixel_values" in inputs and bool(images)
        keys = [self.key(im) for im in images] if has else []
        run_tower = self.agree(has and not all(k in self.store for k in keys))  # every process asks, every pass
        if not has:
            return inputs
        if run_tower:  # a frame not seen yet (here, or in another process's pass): the pixels, and keep what comes
            self._pending = keys
            return inputs
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        self.reused += len(keys)
        layers = len(self.store[keys[0]][1])
        feats = BaseModelOutputWithDeepstackFeatures(
            pooler_output=tuple(self.store[k][0] for k in keys),
            deepstack_features=[tuple(self.store[k][1][j] for k in keys) for j in range(layers)])
        out = {k: v for k, v in inputs.items() if k != "pixel_values"}
        out["mm_encoder_outputs"] = {"image": feats}
        return out

    def _keep(self, module, args, kwargs, output) -> None:
        """The tower's forward hook: each pending frame's slice of its outputs, kept."""
        keys, self._pending = self._pending, None
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        if keys is None or grid is None or len(keys) != len(grid):
            return
        sizes = (grid.prod(-1) // module.spatial_merge_size ** 2).tolist()
        embeds = torch.split(output.pooler_output.detach(), sizes)
        deep = [torch.split(d.detach(), sizes) for d in output.deepstack_features]
        for i, k in enumerate(keys):
            self.store.setdefault(k, (embeds[i], [d[i] for d in deep]))
        self.computed += len(keys)


@contextmanager
def step_features(*models, enabled: bool, agree: Callable[[bool], bool] | None = None
                  ) -> Iterator[VisionFeatures | None]:
    """A step's vision features over the vision towers of `models` (the policy, the reference):
    None when not enabled, or where a model cannot take them (said). `agree`: several processes'
    decision, each pass, whether the tower runs (default: this process's own)."""
    bases = [unwrapped(m) for m in models if m is not None]
    if not enabled or not bases:
        yield None
        return
    why = next((w for w in map(cache_unavailable, bases) if w), None)
    if why is not None:
        warnings.warn(f"vision_cache: every pass runs the vision tower: {why}", stacklevel=3)
        yield None
        return
    feats = VisionFeatures(agree)
    hooks = [b.model.visual.register_forward_hook(feats._keep, with_kwargs=True) for b in bases]
    try:
        yield feats
    finally:
        for h in hooks:
            h.remove()
