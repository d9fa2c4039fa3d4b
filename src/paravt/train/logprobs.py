"""log π_τ of a batch's targets under a model: the padded path through the model's logits, the
packed path inside the output head at the trained positions only (`_head_computes_logprobs`), in
fp32 chunks, or fused with the head's matmul by Liger's kernel where `train.kernels` turned it on.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from paravt.policy import policy_log_softmax
from paravt.train.attention import unwrapped
from paravt.train.batches import Batch
from paravt.train.kernels import FUSED_LOGPROB, fused_logprobs


def token_logprobs(model, batch: Batch, with_entropy: bool = False, temperature: float = 1.0,
                   banned: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_τ(target | context) at every target column, and optionally the per-token entropy of π_τ
    (no grad). GRPO passes the rollouts' temperature and the backend's never-sampled ids, so the
    ratio, KL and entropy are those of the policy that sampled (`policy_log_softmax`, the function
    the hf backend reports rollout logprobs with); SFT uses τ = 1. A packed batch goes through
    `packed_token_logprobs` (flat (N,) tensors)."""
    if batch.rows is not None:
        return packed_token_logprobs(model, batch, with_entropy, temperature, banned)

    out = model(**batch.inputs, use_cache=False, logits_to_keep=batch.keep)
    lsm = policy_log_softmax(out.logits[:, :-1], temperature, banned)
    logp = lsm.gather(-1, batch.targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            p = lsm.exp()
            entropy = -(p * lsm.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, entropy


def _chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                    temperature: float, banned: torch.Tensor | None, with_entropy: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """log π_τ(target) of a chunk of hidden states, and its entropy (no grad, zeros without
    `with_entropy`): the logits of these positions only, over the vocabulary in fp32, reduced at
    once (the same arithmetic as policy.policy_log_softmax)."""
    x = torch.nn.functional.linear(h, weight, bias).float()
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    if banned is not None:
        x = x.index_fill(-1, banned, float("-inf"))
    lse = torch.logsumexp(x, -1)
    logp = x.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(lse).detach()
    with torch.no_grad():
        lsm = x - lse[:, None]
        p = lsm.exp()
        ent = -(p * lsm.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, ent


@contextmanager
def _head_computes_logprobs(model, targets: torch.Tensor, temperature: float, banned: list[int] | None,
                            chunk: int, with_entropy: bool) -> Iterator[None]:
    """For one forward pass, the output head returns (1, N, 2): log π_τ of `targets` and the
    entropy, computed `chunk` positions at a time, instead of logits. Done inside the model's own
    forward, so DDP and FSDP2 see an ordinary forward (FSDP2's root parameters, the head's among
    them, are whole there). With grad, each chunk is recomputed in the backward (checkpoint), so
    no more than one chunk's fp32 logits is alive at a time. Where `train.kernels` put Liger's
    fused log-probability on the model, log π_τ comes from it instead (never the vocabulary-wide
    fp32 logits) and only the entropy, without grad, from the chunks."""
    base = unwrapped(model)
    head = base.get_output_embeddings()
    ban = torch.tensor(banned, dtype=torch.long, device=targets.device) if banned else None
    fused = getattr(base, FUSED_LOGPROB, None)

    def forward(h: torch.Tensor) -> torch.Tensor:
        h = h.reshape(-1, h.shape[-1])
        if fused is not None:
            lp = fused_logprobs(fused, h, head.weight, head.bias, targets, temperature, ban)
            ent = torch.zeros_like(lp)
            if with_entropy:
                with torch.no_grad():
                    ent = torch.cat([_chunk_logprobs(h[a:a + chunk], head.weight, head.bias, targets[a:a + chunk],
                                                     temperature, ban, True)[1] for a in range(0, h.shape[0], chunk)])
            return torch.stack([lp[None], ent[None]], -1)  # (1, N, 2), a tensor of its own (not a view)
        outs = []
        for a in range(0, h.shape[0], chunk):
            args = (h[a:a + chunk], head.weight, head.bias, targets[a:a + chunk], temperature, ban, with_entropy)
            if torch.is_grad_enabled():
                lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
            else:
                lp, ent = _chunk_logprobs(*args)
            outs.append(torch.stack([lp, ent.detach()], -1)[None])
        return torch.cat(outs, 1)  # (1, N, 2), not a view: FSDP2 warns of a view

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def packed_token_logprobs(model, batch: Batch, with_entropy: bool = False, temperature: float = 1.0,
                          banned: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` of a packed batch: flat (N,) over its trained tokens; logits only at the
    positions that are trained, chunk by chunk (see `_head_computes_logprobs`)."""
    with _head_computes_logprobs(model, batch.targets, temperature, banned, batch.chunk, with_entropy):
        out = model(**batch.inputs, use_cache=False, logits_to_keep=batch.rows)
    both = out.logits[0]
    return both[:, 0], (both[:, 1].detach() if with_entropy else None)



