"""Shared prompts in packed passes: sequences of one pack that begin alike are computed once.

A GRPO group's rollouts share their whole prompt (the system prompt, the tool's schema, the K
overview frames, the question): at K = 64 some 8 k tokens, where a rollout's own tokens are a few
hundred. Packed one after another, every rollout computes that prompt again, forward and backward.
Here a pack lays out each prompt once: a *root* sequence whole, then each sequence that begins
like it as a *continuation*, its own tokens only, attending to the root's first `s` tokens (their
keys and values) and causally to itself. The hidden states, logprobs and gradients are the
unshared pass's (the prefix's hidden states are the same in every sequence that holds it, and
autograd sums the gradients that reach them from each continuation), in another summation order.

The layout travels in row 0 of the position ids (the text positions, which only the attention
reads; the M-RoPE rows keep each sequence's own positions): a root counts 0..L-1, as in any packed
row; continuation number c (1, 2, ...) counts c * OFFSET + s + j for its j-th token. A segment
starts wherever row 0 does not go up by one, and a continuation's first value gives its root (the
last root before it) and `s`. Checkpointed layers recompute their attention in the backward from
the same tensor, so no side channel has to reach the autograd threads.

Only train.attention's own attentions read this layout (sdpa per sequence, and torch's varlen kernel,
whose keys a continuation gathers); flash-attention's package kernel cannot (its sequences are
contiguous), so packs are shared only under those (`batches.shares_prompts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paravt.chat import Renderer, same_image
from paravt.train.sequences import TrainSequence

MIN_SHARED = 32  # a shorter common beginning is not worth a segment of its own
OFFSET = 1 << 32  # continuation c's row 0 starts at c * OFFSET + s (far above any sequence length)


@dataclass(frozen=True)
class Share:
    """How one sequence of a pack is laid out: whole (root = -1, shared = 0), or as a continuation
    of sequence `root` (an index into the pack) after its first `shared` tokens."""

    root: int = -1
    shared: int = 0
    images: int = 0  # the root's frames among those tokens, which this sequence's pass does not hold again


def image_runs(seq: TrainSequence, renderer: Renderer) -> list[tuple[int, int]]:
    """[start, end) of each image's placeholder tokens in `seq.ids`, in the images' order."""
    pads = np.flatnonzero(np.asarray(seq.ids) == renderer.image_pad)
    runs, i = [], 0
    for im in seq.images:
        n = renderer.image_tokens(im)
        if n == 0 or i + n > len(pads):
            break  # check_images reports the mismatch; shared images stop here
        runs.append((int(pads[i]), int(pads[i + n - 1]) + 1))
        i += n
    return runs


def shared_length(root: TrainSequence, root_runs: list[tuple[int, int]], seq: TrainSequence,
                  seq_runs: list[tuple[int, int]]) -> int:
    """How many of `root`'s first tokens `seq` can reuse: their common ids, no further than the
    token before seq's first trained one (its hidden state is the first that seq reads), cut before
    the first image the two do not hold alike (the same placeholders may stand for other frames)."""
    limit = min(len(root.ids), seq.mask.index(1) if 1 in seq.mask else 0)  # none trained: pack() says so
    a, b = np.asarray(root.ids[:limit]), np.asarray(seq.ids[:limit])
    differ = np.flatnonzero(a != b)
    s = int(differ[0]) if len(differ) else limit
    for j, (start, end) in enumerate(seq_runs):
        if start >= s:
            break
        if end > s or j >= len(root_runs) or root_runs[j] != (start, end) \
                or not same_image(root.images[j], seq.images[j]):
            return start
    return s


def best_root(seq: TrainSequence, runs: list[tuple[int, int]], roots: list[int], seqs: list[TrainSequence],
              all_runs: list[list[tuple[int, int]]], min_shared: int | None = None) -> Share:
    """The root among `roots` (indices into `seqs`) that `seq` shares the most with, at least
    `min_shared` tokens (default MIN_SHARED); Share() when none does."""
    min_shared = MIN_SHARED if min_shared is None else min_shared
    best = Share()
    for r in roots:
        s = shared_length(seqs[r], all_runs[r], seq, runs)
        if s >= min_shared and s > best.shared:
            best = Share(r, s, shared_images(runs, s))
    return best


def plan(seqs: list[TrainSequence], renderer: Renderer, min_shared: int | None = None) -> list[Share]:
    """Each sequence's layout in the pack: a continuation of the earlier root it shares the most
    with (at least `min_shared` tokens, default MIN_SHARED), else a root of its own."""
    runs = [image_runs(s, renderer) for s in seqs]
    roots: list[int] = []
    out: list[Share] = []
    for i, seq in enumerate(seqs):
        best = best_root(seq, runs[i], roots, seqs, runs, min_shared)
        if best.root < 0:
            roots.append(i)
        out.append(best)
    return out


def layout_order(shares: list[Share]) -> list[int]:
    """The pack's order: each root, then its continuations (a continuation's root is the last root
    before it)."""
    order = []
    for i, sh in enumerate(shares):
        if sh.root < 0:
            order.append(i)
            order += [j for j, c in enumerate(shares) if c.root == i]
    return order


def shared_images(runs: list[tuple[int, int]], shared: int) -> int:
    """How many of a sequence's images lie in its first `shared` tokens."""
    return sum(1 for _, end in runs if end <= shared)


def segments(row0: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """The segments of a packed row from its row-0 positions: (start, end, root start, shared),
    shared = 0 for a root (or any plain packed sequence)."""
    t = row0.shape[0]
    if t == 0:
        return []
    jumps = (torch.diff(row0) != 1).nonzero().flatten().add(1).tolist()
    starts = [0] + jumps
    firsts = row0[starts].tolist()
    out, root = [], 0
    for a, b, v in zip(starts, starts[1:] + [t], firsts):
        if v >= OFFSET:
            out.append((a, b, root, v % OFFSET))
        else:
            root = a
            out.append((a, b, a, 0))
    return out


def continuation_mask(n: int, shared: int, device) -> torch.Tensor:
    """(n, shared + n) bool: a continuation's token i sees all `shared` root tokens and its own
    tokens up to i."""
    return torch.ones(n, shared + n, dtype=torch.bool, device=device).tril(diagonal=shared)
