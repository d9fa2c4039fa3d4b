"""The model passes of a step, on the training engine (train.engine: one process, DDP or FSDP2):
the reference's (and decoupled PPO's proximal) logprobs over the rollout tokens, the per-token
advantages they complete (docs/rl.md steps 5 and 6), and the update (step 7): PPO epochs ×
minibatches of optimizer steps around `estimator.ppo_loss`. The arithmetic is the estimator's;
this module only decides which forward passes feed it and keeps every process in step (the same
number of passes and optimizer steps everywhere: sharded models' collectives must match).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from paravt.train.attention import varlen_attention
from paravt.train.batches import Batch, make_batch, plan_micro_batches, sequence_rows, shares_prompts
from paravt.train.grpo.config import GRPOConfig
from paravt.train.grpo.estimator import add_kl_reward, normalize_tokens, ppo_loss
from paravt.train.kernels import liger_kernels
from paravt.train.logprobs import token_logprobs
from paravt.train.sequences import TrainSequence
from paravt.train.sft import backward_micro_batches
from paravt.train.vision_cache import VisionFeatures, step_features


def reference_logprobs(engine, ref, base, renderer, seqs: list[TrainSequence], cfg: GRPOConfig,
                       into: str = "ref_logprobs", vision: VisionFeatures | None = None) -> None:
    """log π_τ of `ref` (the reference, or the policy itself for decoupled PPO's π_prox) at every
    sequence's tokens (packed: its trained tokens, the only ones read), into `TrainSequence.<into>`,
    without grad; every process runs the same number of passes (sharded models: collectives must
    match). The passes are the update's: packed by cfg.token_budget, or cfg.micro_batch_size padded.
    `vision`: the step's vision features (train.vision_cache), reused where a pass's frames have them."""
    bf16 = engine.mixed_precision == "bf16"
    share = shares_prompts(ref, cfg.packing, bf16, cfg.packed_attention)
    groups = plan_micro_batches(seqs, cfg.packing, cfg.micro_batch_size, cfg.token_budget, renderer if share else None)
    n = engine.all_max(len(groups))
    with torch.no_grad(), varlen_attention(ref, bf16_compute=bf16, choice=cfg.packed_attention) if cfg.packing \
            else nullcontext():
        for gi in range(n):
            real = gi < len(groups)
            group = groups[gi if real else 0]
            batch = make_batch(base, renderer, group, cfg.packing, chunk=cfg.logprob_chunk, share_prompts=share,
                               vision=vision)
            with engine.autocast():
                lp, _ = token_logprobs(ref, batch, temperature=cfg.temperature, banned=renderer.banned_ids)
            if real:
                for q, row in zip(group, sequence_rows(group, batch, lp.float())):
                    setattr(q, into, row)


def train_passes(cfg: GRPOConfig, engine, model, base, ref, renderer, opt, params, seqs: list[TrainSequence],
                 step: int, decoupled: bool = False, prox: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """A step's model passes after its rollouts, under the update's switches (docs/gpu.md: Liger's
    kernels on the policy's and the reference's passes, a frozen vision tower's features computed
    once for all of them; the packed attention and activation checkpointing are the passes' own):
    with `prox`, decoupled PPO's π_prox over the rollouts, then the advantages (`token_advantages`,
    the reference's forward under kl_mode reward), then the update (`update_policy`, the policy in
    train mode). Returns (the KL statistics, the update's metrics with `update_s`, its seconds)."""
    agree = lambda need: engine.all_max(int(need)) > 0  # noqa: E731 - every process's passes run the tower alike
    with liger_kernels(model, ref, parts=cfg.liger), \
            step_features(model, ref, enabled=cfg.vision_cache, agree=agree) as vision:
        if prox:
            reference_logprobs(engine, model, base, renderer, seqs, cfg, into="prox_logprobs", vision=vision)
        kl_stats = token_advantages(cfg, engine, ref, base, renderer, seqs, vision)
        t0 = time.perf_counter()
        base.train()
        upd = update_policy(cfg, engine, model, base, ref, renderer, opt, params, seqs, step, decoupled, vision)
        upd["update_s"] = time.perf_counter() - t0
    return kl_stats, upd


def token_advantages(cfg: GRPOConfig, engine, ref, base, renderer, seqs: list[TrainSequence],
                     vision: VisionFeatures | None = None) -> dict[str, float]:
    """Per-token advantages as the recipe forms them, in place: with kl_mode `reward`, the KL
    reward-to-go from a reference pass over the rollout tokens (step 5); with adv_norm `token`, the
    batch normalisation over trained tokens (step 6). Returns the KL statistics (k3 and k1 per token)."""
    stats: dict[str, float] = {}
    if ref is not None and cfg.kl_mode == "reward":
        reference_logprobs(engine, ref, base, renderer, seqs, cfg, vision=vision)
        k1, k3, n = add_kl_reward(seqs, cfg.kl_coef, cfg.kl_clamp)
        n = max(engine.all_sum(n), 1.0)
        stats = {"kl": engine.all_sum(k3) / n, "kl_k1": engine.all_sum(k1) / n}
    if cfg.adv_norm == "token":
        mean, std = normalize_tokens(seqs, cfg.adv_eps, engine.all_sum)
        stats.update({"adv_token_mean": mean, "adv_token_std": std})
    return stats


@dataclass
class _Totals:
    """What the update's forward passes add up (this process's trained tokens), for its log."""

    sums: dict[str, float] = field(default_factory=lambda: {
        "loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "entropy": 0.0, "tokens": 0,
        "behave_masked": 0.0, "behave_weight": 0.0})
    drift_sum: float = 0.0
    drift_tokens: float = 0
    first_pass: bool = True  # no optimizer step taken yet: the weights the rollouts' logprobs are of


def _surrogate(cfg: GRPOConfig, model, ref, renderer, decoupled: bool, totals: _Totals
               ) -> Callable[[Batch, bool], torch.Tensor]:
    """The loss of one micro-batch (`backward_micro_batches` calls it; `real` false for the padding
    passes that keep processes in step), which also adds to `totals`."""
    kl_in_loss = ref is not None and cfg.kl_mode == "loss"

    def surrogate(batch: Batch, real: bool) -> torch.Tensor:
        logp, ent = token_logprobs(model, batch, with_entropy=True, temperature=cfg.temperature,
                                   banned=renderer.banned_ids)
        ref_logp = None
        if kl_in_loss:
            with torch.no_grad(), varlen_attention(ref, bf16_compute=cfg.mixed_precision == "bf16",
                                                   choice=cfg.packed_attention) \
                    if batch.rows is not None else nullcontext():
                ref_logp, _ = token_logprobs(ref, batch, temperature=cfg.temperature, banned=renderer.banned_ids)
        prox = batch.prox_logprobs
        if decoupled and prox is None:
            prox = logp.detach()
        loss, stats = ppo_loss(logp, batch.old_logprobs, batch.advantages, batch.mask, 1, cfg.clip_eps, ref_logp,
                               cfg.kl_coef if kl_in_loss else 0.0, prox_logp=prox,
                               behave_cap=cfg.behave_weight_cap)  # summed over the micro-batch's trained tokens
        if real:
            for k in ("pg", "clipped", "ratio", "kl", "behave_masked", "behave_weight"):
                if k in stats:
                    totals.sums[k] += float(stats[k])
            totals.sums["entropy"] += float((ent * batch.mask).sum())
            totals.sums["tokens"] += batch.n_tokens
            if totals.first_pass:  # before any update: the rollout logprobs of the weights being updated (or
                # the recomputed π_prox) vs a fresh forward: numerics only
                before, w = batch.old_logprobs, batch.mask * batch.fresh
                if batch.prox_logprobs is not None:
                    before, w = batch.prox_logprobs, batch.mask
                gap = torch.where(w > 0, (logp.detach() - before).abs(), torch.zeros_like(w))
                totals.drift_sum += float((gap * w).sum())
                totals.drift_tokens += float(w.sum())
        return loss

    return surrogate


def update_policy(cfg: GRPOConfig, engine, model, base, ref, renderer, opt, params, seqs: list[TrainSequence],
                  step: int, decoupled: bool = False, vision: VisionFeatures | None = None) -> dict[str, float]:
    """PPO epochs x minibatches of optimizer steps over the step's sequences (this process's share;
    the loss is the token mean over all processes' sequences, see sft.backward_micro_batches).
    Every logprob is log π_τ at the rollouts' temperature. An optimizer step whose loss or gradient
    norm is not finite is skipped (as the recipe's engine does) and counted: applying it would
    write NaN into every weight. `decoupled` (asynchronous rollouts): the decoupled PPO loss around
    π_prox, the sequences' `prox_logprobs`, or, when the step takes a single optimizer step, this
    forward's own log π_θ detached (the same weights: one pass fewer, the same gradient). `vision`:
    the step's vision features (train.vision_cache)."""
    import numpy as np

    share_with = renderer if shares_prompts(model, cfg.packing, engine.mixed_precision == "bf16",
                                            cfg.packed_attention) else None

    n_mb = -engine.all_max(-min(cfg.minibatches, len(seqs)))  # every process takes the same optimizer steps
    rng = np.random.default_rng([cfg.seed, step, 7])
    totals = _Totals()
    surrogate = _surrogate(cfg, model, ref, renderer, decoupled, totals)
    grad_norms, skipped = [], 0
    t0 = time.perf_counter()
    seen_tokens = 0
    for _ in range(cfg.ppo_epochs):
        order = rng.permutation(len(seqs))
        for mb in range(n_mb):
            mb_seqs = [seqs[i] for i in order[mb::n_mb]]
            n_tok = int(engine.all_sum(sum(q.n_trained for q in mb_seqs)))
            opt.zero_grad(set_to_none=True)
            groups = plan_micro_batches(mb_seqs, cfg.packing, cfg.micro_batch_size, cfg.token_budget, share_with)
            mb_loss = engine.all_sum(backward_micro_batches(engine, model, base, renderer, groups, n_tok, surrogate,
                                                            cfg.packing, cfg.logprob_chunk, cfg.packed_attention,
                                                            vision))
            totals.sums["loss"] += mb_loss
            seen_tokens += sum(len(q.ids) for q in mb_seqs)
            gnorm = engine.clip_grad_norm(params, cfg.grad_clip)  # the global norm: every process agrees
            grad_norms.append(gnorm)
            totals.first_pass = False
            if not (math.isfinite(mb_loss) and math.isfinite(gnorm)):
                opt.zero_grad(set_to_none=True)
                skipped += 1
                continue
            opt.step()
    return _update_metrics(cfg, engine, totals, grad_norms, skipped, seen_tokens, t0,
                           kl_in_loss=ref is not None and cfg.kl_mode == "loss", decoupled=decoupled)


def _update_metrics(cfg: GRPOConfig, engine, totals: _Totals, grad_norms: list[float], skipped: int,
                    seen_tokens: int, t0: float, kl_in_loss: bool, decoupled: bool) -> dict[str, float]:
    """The update's log: token means over every process's trained tokens (the loss is already
    summed over processes), the gradient norm (nan when a step was skipped), the logprob drift,
    the training throughput since `t0`."""
    sums = {k: v if k == "loss" else engine.all_sum(v) for k, v in totals.sums.items()}
    t = max(sums["tokens"], 1)
    finite = [g for g in grad_norms if math.isfinite(g)]
    out = {"loss": sums["loss"] / t, "pg_loss": sums["pg"] / t,
           "clip_frac": sums["clipped"] / t, "ratio_mean": sums["ratio"] / t, "entropy": sums["entropy"] / t,
           "grad_norm": sum(finite) / len(finite) if len(finite) == len(grad_norms) else float("nan"),
           "updates": len(grad_norms), "skipped_updates": skipped,
           "trained_tokens": int(sums["tokens"]) // cfg.ppo_epochs,
           "logprob_drift": engine.all_sum(totals.drift_sum) / max(engine.all_sum(totals.drift_tokens), 1),
           "logprob_drift_tokens": int(engine.all_sum(totals.drift_tokens)),
           "train_tokens_per_s": engine.all_sum(seen_tokens) / max(time.perf_counter() - t0, 1e-9)}
    if kl_in_loss:
        out["kl"] = sums["kl"] / t
    if decoupled:  # the behaviour weights π_prox/π_behave
        out["behave_masked_tokens"] = int(sums["behave_masked"]) // cfg.ppo_epochs
        out["behave_weight_mean"] = sums["behave_weight"] / max(t - sums["behave_masked"], 1)
    return out
