"""Made-up GRPO groups for the packing and update tests (rollouts of one prompt, the shape a packed
pass shares its prompt across), and one packed pass of the loss over them."""

from __future__ import annotations

import numpy as np

from paravt.chat import Renderer
from paravt.messages import ImagePart, Message, TextPart
from paravt.train.sequences import TrainSequence


def group_rollouts(r: Renderer, rng, frames: list[np.ndarray], lengths: list[int], turns: int = 1,
                   group: int = -1) -> list[TrainSequence]:
    """Rollouts of one prompt (these frames): the prompt's ids and frames, then each its own
    generated tokens (and, with turns > 1, a tool response between its turns), old logprobs and
    advantages drawn from `rng`."""
    parts = []
    for i, im in enumerate(frames):
        parts += [TextPart(f"<{i}.0 seconds>"), ImagePart(im, float(i))]
    parts.append(TextPart("What colour is the circle?"))
    rd = r.render([Message("system", "You watch videos and answer questions about them."), Message("user", parts)])
    out = []
    for n in lengths:
        ids, mask = list(rd.ids), [0] * len(rd.ids)
        for t in range(turns):
            gen = [int(x) for x in rng.integers(200, len(r.tok) - 200, n)]
            ids, mask = ids + gen, mask + [1] * n
            if t < turns - 1:
                resp = r.encode("<tool_response>a red circle</tool_response>")
                ids, mask = ids + resp, mask + [0] * len(resp)
        old = [float(-rng.uniform(0.5, 3.0)) if m else 0.0 for m in mask]
        adv = [float(rng.normal()) if m else 0.0 for m in mask]
        out.append(TrainSequence(ids, mask, old, adv, list(rd.images), "main", group=group))
    return out


def packed_pass(model, r: Renderer, seqs: list[TrainSequence], impl: str, share: bool):
    """One packed pass over `seqs` (chunks of 7 rows, τ = 0.7) with its backward: the batch, log π_τ at the
    trained tokens, their entropy and the PPO loss with a k3 KL term against made-up reference logprobs."""
    from paravt.train.attention import varlen_attention
    from paravt.train.batches import pack
    from paravt.train.grpo import ppo_loss
    from paravt.train.logprobs import token_logprobs

    n_tok = sum(s.n_trained for s in seqs)
    with varlen_attention(model, impl=impl):
        b = pack(model, r, seqs, chunk=7, share_prompts=share)
        lp, ent = token_logprobs(model, b, with_entropy=True, temperature=0.7, banned=r.banned_ids)
        loss, _ = ppo_loss(lp, b.old_logprobs, b.advantages, b.mask, n_tok, 0.2, lp.detach() - 0.05, 0.1)
        loss.backward()
    return b, lp, ent, loss
