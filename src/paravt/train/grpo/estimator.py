"""The PARA-GRPO estimator, step by step as docs/rl.md states it ("One step, as computed"): pure
functions of lists and tensors, with no model, engine or process group in them (as verl keeps its
PPO math in one file that every distributed strategy calls). Collectives come in as arguments
(`all_sum`), so the same code runs on one process or many, and the known-answer tests
(tests/test_rl_known_answers.py) check it on a bandit whose exact gradient is known.

docs/rl.md step → here:
1. Rollouts (log π_τ of every sampled token)   — not here: grpo.rollouts through the episode loop,
                                                  paravt.policy.policy_log_softmax for the logprobs.
2. Reward shaping r' = clip((R − 0.2)·10, ±20) — `shape_rewards` (paravt.rewards.shape per episode).
3. Group normalisation (r' − mean)/(std + eps) — `group_advantages`, `normalize` (unbiased std; also
                                                  adv_norm `episode`: over the batch's episodes).
4. Token anchoring (λ·anchor at structural      — not here: it needs each main turn's token positions,
   tokens)                                        so train.sequences.episode_sequences adds it while
                                                  building the sequences (paravt.rewards).
5. KL in the reward, −β·clamp(k1, ±10) summed   — `kl_reward_to_go` (one sequence), `add_kl_reward`
   to the end of the sequence                     (a batch, in place, with the k1/k3 sums logged).
6. Token-level batch normalisation              — `normalize_tokens`.
7. Update: token-mean PPO-clip (ε = 0.2), and   — `ppo_loss`; the optimizer steps around it (AdamW,
   decoupled PPO around π_prox with w capped      grad clip, skipping non-finite steps) are
   (asynchronous rollouts)                        grpo.update.update_policy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from paravt.rewards import RewardConfig, shape

if TYPE_CHECKING:
    from paravt.train.sequences import TrainSequence


def shape_rewards(totals: list[list[float]], cfg: RewardConfig) -> list[list[float]]:
    """Step 2: each episode's R, per prompt group, shaped as the recipe does: clip((R − bias)·scale,
    ±clip) (RewardConfig: 0.2, 10, 20). The shift and scale change nothing after step 3 except
    through the clip and eps; kept so that the numbers are the recipe's."""
    return [[shape(r, cfg) for r in g] for g in totals]


def group_advantages(rewards: list[list[float]], eps: float = 1e-5, batch_norm: bool = True) -> list[list[float]]:
    """Step 3: (r − mean_group) / (std_group + eps) per prompt group (unbiased std, as verl's GRPO),
    then, with batch_norm, the same over all episodes of the batch. A group whose rollouts all
    score the same gets zero advantage: it carries no preference."""
    out = [normalize(g, g, eps) for g in rewards]
    if batch_norm:
        flat = [a for g in out for a in g]
        out = [normalize(g, flat, eps) for g in out]
    return out


def normalize(values: list[float], population: list[float], eps: float) -> list[float]:
    """(v − mean) / (std + eps) with the mean and unbiased std of `population`; all zeros when the
    population has no spread (nothing to prefer)."""
    t = torch.tensor(population, dtype=torch.float64)
    v = torch.tensor(values, dtype=torch.float64)
    if t.numel() < 2 or float(t.max() - t.min()) == 0.0:
        return [0.0] * len(values)
    return ((v - t.mean()) / (t.std(unbiased=True) + eps)).tolist()


def kl_reward_to_go(old_logp: list[float], ref_logp: list[float], mask: list[int], coef: float,
                    clamp: float = 10.0) -> list[float]:
    """Step 5, one sequence: the recipe's KL regulariser as reward (AReaL): each trained token earns
    −coef · clamp(log π_old − log π_ref, ±clamp) (k1, the behaviour policy's tokens, no gradient), and
    a token's advantage gains the sum of these from it to the end of the sequence, the return with
    γ = λ = 1 and no critic (the scalar reward sits at the end, so every token gets all of it)."""
    out = [0.0] * len(mask)
    acc = 0.0
    for i in range(len(mask) - 1, -1, -1):
        if mask[i]:
            acc -= coef * max(-clamp, min(clamp, old_logp[i] - ref_logp[i]))
            out[i] = acc
    return out


def add_kl_reward(seqs: list["TrainSequence"], coef: float, clamp: float) -> tuple[float, float, float]:
    """Step 5 over a batch, in place: every sequence's advantages gain `kl_reward_to_go` of its
    tokens (`old_logprobs` the behaviour policy's, `ref_logprobs` the frozen reference's, both at τ).
    Returns this process's sums over trained tokens of the k1 (log π_old − log π_ref) and k3
    (exp(d) − 1 − d, d = log π_ref − log π_old) estimates of KL(π_old ‖ π_ref), and their count, for
    the log; the caller sums them over processes."""
    k1 = k3 = n = 0.0
    for q in seqs:
        kl = kl_reward_to_go(q.old_logprobs, q.ref_logprobs, q.mask, coef, clamp)
        q.advantages = [a + k for a, k in zip(q.advantages, kl)]
        for m, old, r in zip(q.mask, q.old_logprobs, q.ref_logprobs):
            if m:
                d = r - old
                k1, k3, n = k1 - d, k3 + math.expm1(d) - d, n + 1
    return k1, k3, n


def normalize_tokens(seqs: list["TrainSequence"], eps: float, all_sum: Callable[[float], float] = float
                     ) -> tuple[float, float]:
    """Step 6, the recipe's batch step: advantages minus their mean over every trained token of the
    batch (all processes: `all_sum`), divided by their unbiased std + eps, in place. Over tokens, not
    episodes, so the token-mean loss sees advantages that sum to zero even when length correlates
    with reward. Returns (mean, std)."""
    vals = [a for q in seqs for a, m in zip(q.advantages, q.mask) if m]
    n = all_sum(len(vals))
    if n < 2:
        return 0.0, 0.0
    mean = all_sum(sum(vals)) / n
    var = max(all_sum(sum((v - mean) ** 2 for v in vals)) / (n - 1), 0.0)
    std = math.sqrt(var)
    for q in seqs:
        q.advantages = [(a - mean) / (std + eps) if m else 0.0 for a, m in zip(q.advantages, q.mask)]
    return mean, std


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             n_tokens: int, clip_eps: float = 0.2, ref_logp: torch.Tensor | None = None,
             kl_coef: float = 0.0, prox_logp: torch.Tensor | None = None,
             behave_cap: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Step 7: the token-level PPO-clip surrogate with ratio π_θ/π_old (log π_τ both), summed over
    trained tokens and divided by `n_tokens` (the trained tokens of the whole minibatch: token-mean);
    with `ref_logp` and kl_coef > 0 (kl_mode `loss`, paravt's earlier estimator) plus kl_coef·k3 KL
    to the reference per token.

    With `prox_logp` (asynchronous rollouts) it is the decoupled PPO objective the recipe trains with
    (AReaL's `use_decoupled_loss`): the trust region is around the proximal policy π_prox, the weights
    just before this update, and the behaviour policy that sampled the tokens (up to max_staleness
    versions older) enters as the constant importance weight π_prox/π_behave:
        w · max(−A·r, −A·clip(r, 1 ± ε)),  r = π_θ/π_prox,  w = π_prox/π_behave.
    Tokens whose w exceeds `behave_cap` get no gradient (counted in `behave_masked`); they stay in
    the token-mean's denominator, as in the recipe."""
    trained = mask > 0  # untrained positions (prompt, padding: an image placeholder's log π is −inf) stay out of
    # every term: −inf − −inf is NaN, and NaN·0 poisons the whole gradient
    if prox_logp is None:
        ratio = torch.exp(torch.where(trained, logp - old_logp, torch.zeros_like(logp)))
    else:
        # a token one of the policies cannot produce (log π = −inf: a never-sampled id a server did
        # sample) has no ratio: no gradient, counted with the masked ones (−inf − −inf is NaN, and
        # NaN·0 would poison the whole gradient)
        finite = torch.isfinite(prox_logp) & torch.isfinite(old_logp) & torch.isfinite(logp.detach())
        ratio = torch.exp(torch.where(finite, logp - prox_logp, torch.zeros_like(logp)))
        weight = torch.where(finite, torch.exp(prox_logp - old_logp), torch.zeros_like(old_logp)).detach()
        keep = mask * (finite & (weight <= behave_cap if behave_cap is not None else finite)).float()
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    pg = torch.maximum(pg1, pg2)
    stats = {"clipped": ((pg2 > pg1).float() * mask).sum().detach(), "ratio": (ratio * mask).sum().detach()}
    if prox_logp is not None:
        pg = torch.where(keep > 0, pg * weight, torch.zeros_like(pg))
        stats["behave_masked"] = (mask - keep).sum().detach()
        stats["behave_weight"] = (weight * keep).sum().detach()
    stats["pg"] = (pg * mask).sum().detach()
    per_token = pg
    if ref_logp is not None and kl_coef > 0:
        d = torch.where(trained, ref_logp - logp, torch.zeros_like(logp))
        kl = torch.exp(d) - d - 1  # k3: unbiased, non-negative estimate of KL(π || π_ref)
        per_token = per_token + kl_coef * kl
        stats["kl"] = (kl * mask).sum().detach()
    loss = (per_token * mask).sum() / max(n_tokens, 1)
    return loss, stats
