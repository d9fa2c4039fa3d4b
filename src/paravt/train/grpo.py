"""PARA-GRPO (SPEC §3): group rollouts through the episode loop, nFrames gating, hierarchical
token-exact sequences, group-normalized advantages, PPO-clip with a k3 KL to a frozen reference.

One step:
1. P prompts (a seeded permutation per epoch). nFrames gating draws K per prompt from
   {4, 8, 16, 32, 64} as a pure function of (seed, prompt id, epoch) — sha256, never Python's
   salted hash() (defect 3); all n rollouts of the prompt's group see the same K.
2. Rollouts: `run_episode` (the loop `ask` and `eval` use) at temperature τ, all P·n episodes
   launched together so the hf backend batches them; sub-agents of a turn batch too.
3. Rewards from `paravt.rewards` with the episode's executed-call record (defect 6); shaping
   r' = (R − bias)·scale; advantages normalized within each group, then optionally over the batch.
   Exploration Anchoring: `sequence` adds λ·anchor to R; `token` adds λ·anchor to the advantage
   at the structural tokens of each main turn only (defect 2); `off` neither.
4. Sequences (paravt.train.sequences): the main agent's turns as one token-exact sequence with
   generated tokens trained and prompt / tool-response / forced-prefix tokens masked (defect 5);
   each sub-agent generation as its own sequence carrying the episode's advantage (defect 4).
5. Update on the training engine (train.engine): token-mean of the PPO-clip surrogate + β·k3 KL
   over the sequences of all processes, AdamW, grad clip.

Several processes: `torchrun --nproc_per_node N -m paravt train grpo ...` (FSDP2 by default);
each process rolls out its share of the step's prompts with its own in-process backend over the
gathered weights, and the update is sharded. The default is one CPU process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from paravt.agent import EpisodeConfig
from paravt.rewards import RewardConfig
from paravt.train.checkpoint import TrainingDiverged  # noqa: F401  (raised by train_grpo; importable from here)
from paravt.train.config import ConfigError, check_finite, load_config, to_dict
from paravt.train.rollout import RolloutConfig
from paravt.train.sequences import Batch, TrainSequence
from paravt.video import MAX_FRAMES

if TYPE_CHECKING:
    from paravt.agent import Episode
    from paravt.data import RLSample

K_CHOICES = (4, 8, 16, 32, 64)


def _default_episode() -> EpisodeConfig:
    return EpisodeConfig(mode="parallel", max_turns=3, max_new_tokens=2048, think_prefix=True)


@dataclass
class GRPOConfig:
    model: str = "tiny"  # policy start and frozen reference: checkpoint dir (e.g. the SFT run's), hub id, "tiny"
    tiny_size: str = "tiny"
    data: str = "data/synth_train/rl.parquet"  # ParaVT-Parquet RL rows
    video_root: str | None = None  # default: the data file's directory
    out: str = "runs/grpo"
    steps: int = 100
    prompts_per_step: int = 7  # P
    rollouts_per_prompt: int = 8  # n (group size)
    temperature: float = 0.7  # τ (replaces episode.temperature)
    top_p: float = 1.0
    episode: EpisodeConfig = field(default_factory=_default_episode)  # episode.frames is replaced by K
    gating: bool = True  # nFrames gating; false -> K = fixed_k
    k_choices: list[int] = field(default_factory=lambda: list(K_CHOICES))
    fixed_k: int = 64
    anchoring: str = "token"  # token | sequence | off
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # in-process, or on inference servers
    include_subagents: bool = False  # sub-agent generations as extra sequences (release: off; docs/rl.md)
    adv_eps: float = 1e-5
    adv_norm: str = "token"  # token: over the batch's trained tokens (recipe) | episode: over its episodes | group
    clip_eps: float = 0.2
    behave_weight_cap: float = 5.0  # asynchronous rollouts: tokens with π_prox/π_behave above this get no gradient
    kl_coef: float = 0.01  # 0 -> no reference model
    kl_mode: str = "reward"  # reward: k1 in the per-token reward, clamped (recipe) | loss: k3 in the loss
    kl_clamp: float = 10.0  # |log π_old − log π_ref| per token in the KL reward
    lr: float = 2e-6
    lr_schedule: str = "constant"  # constant | cosine
    warmup_steps: int = 0
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1  # passes over a step's sequences
    minibatches: int = 1  # optimizer steps per pass
    micro_batch_size: int = 4  # sequences per forward pass
    strict_continuation: bool = False  # raise on re-templating drift instead of per-turn sequences
    rollout_batch: int = 64  # hf backend: most requests per generate batch
    dtype: str = "fp32"  # parameter dtype: fp32 | bf16
    mixed_precision: str = "no"  # no | bf16 (bf16 compute, fp32 weights and gradient reduction: train.engine)
    device: str = "auto"  # auto | cpu | cuda
    engine: str = "auto"  # auto | single | ddp | fsdp (auto: fsdp under torchrun with >1 process)
    activation_checkpointing: bool = False
    cpu_offload: bool = False  # fsdp only: parameters, gradients and optimizer state in host memory
    freeze_vision: bool = False
    threads: int = 0  # torch CPU threads for this run (0: torch default; 1 is fastest on a busy shared CPU)
    seed: int = 0
    log_every: int = 1
    save_every: int = 25
    keep_checkpoints: int = 0  # also keep the last N saves as OUT/step_<n> (model only)
    keep_best: str = ""  # a step metric (e.g. reward): OUT/best holds the save where it was highest
    max_nonfinite_steps: int = 3  # steps in a row whose update was skipped (non-finite loss/grad) before stopping
    warn_entropy_ratio: float = 2.0  # warn when the entropy passes this multiple of the run's first steps'
    warn_kl: float = 0.3  # warn when the KL to the reference (nats/token) passes this
    log_rollouts: bool = True  # OUT/rollouts.jsonl: one record per episode

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "ppo_epochs", "minibatches", "micro_batch_size", "rollout_batch",
                     "log_every", "save_every", "fixed_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rollouts_per_prompt < 2:
            raise ValueError("rollouts_per_prompt must be >= 2 (advantages are relative within a group)")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 for group sampling")
        if not self.k_choices or any(not 1 <= k <= MAX_FRAMES for k in self.k_choices):
            raise ValueError(f"k_choices must be frame counts in 1..{MAX_FRAMES}, got {self.k_choices}")
        if self.fixed_k > MAX_FRAMES:
            raise ValueError(f"fixed_k must be <= {MAX_FRAMES}, got {self.fixed_k}")
        check_finite(self)
        if not self.behave_weight_cap > 1:
            raise ValueError(f"behave_weight_cap must be > 1, got {self.behave_weight_cap}")
        if not (self.lr > 0 and self.grad_clip > 0 and self.clip_eps > 0 and self.adv_eps > 0 and self.kl_clamp > 0):
            raise ValueError("lr, grad_clip, clip_eps, adv_eps and kl_clamp must be > 0")
        if self.kl_coef < 0 or self.weight_decay < 0 or self.warmup_steps < 0 or self.keep_checkpoints < 0:
            raise ValueError("kl_coef, weight_decay, warmup_steps and keep_checkpoints must be >= 0")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        for name, value, choices in (("anchoring", self.anchoring, ("token", "sequence", "off")),
                                     ("adv_norm", self.adv_norm, ("token", "episode", "group")),
                                     ("kl_mode", self.kl_mode, ("reward", "loss")),
                                     ("lr_schedule", self.lr_schedule, ("constant", "cosine")),
                                     ("dtype", self.dtype, ("fp32", "bf16")),
                                     ("mixed_precision", self.mixed_precision, ("no", "bf16")),
                                     ("device", self.device, ("auto", "cpu", "cuda")),
                                     ("engine", self.engine, ("auto", "single", "ddp", "fsdp"))):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "GRPOConfig":
        return load_config(cls, path, overrides)


# ----------------------------------------------------------------------------------------------
# nFrames gating, prompt order, seeds: pure functions of the run seed


def _digest_int(*parts: object) -> int:
    text = "\x00".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def gate_k(seed: int, prompt_id: str, epoch: int, choices: tuple[int, ...] | list[int] = K_CHOICES) -> int:
    """K for a prompt group: uniform over `choices`, reproducible from (seed, prompt id, epoch)
    on any machine and under any PYTHONHASHSEED."""
    return int(choices[_digest_int("ngate", seed, epoch, prompt_id) % len(choices)])


def rollout_seed(seed: int, step: int, prompt_id: str, rollout: int) -> int:
    """Sampling seed of one rollout (distinct per rollout; the same on a resumed run)."""
    return _digest_int("rollout", seed, step, prompt_id, rollout) % (2**31 - 2048)


def prompt_schedule(step: int, per_step: int, n_prompts: int, seed: int) -> list[tuple[int, int]]:
    """(prompt index, epoch) of each prompt of `step`: epochs walk a fresh seeded permutation."""
    import numpy as np

    out = []
    perms: dict[int, Any] = {}
    for j in range(per_step):
        g = step * per_step + j
        epoch, pos = divmod(g, n_prompts)
        if epoch not in perms:
            perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n_prompts)
        out.append((int(perms[epoch][pos]), epoch))
    return out


# ----------------------------------------------------------------------------------------------
# advantages and loss (pure tensor code, tested on hand-built numbers)


def group_advantages(rewards: list[list[float]], eps: float = 1e-5, batch_norm: bool = True) -> list[list[float]]:
    """(r − mean_group) / (std_group + eps) per prompt group (unbiased std, as verl's GRPO), then,
    with batch_norm, the same over all episodes of the batch. A group whose rollouts all score
    the same gets zero advantage: it carries no preference."""
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
    """The recipe's KL regulariser as reward (AReaL): each trained token earns
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


def normalize_tokens(seqs: list[TrainSequence], eps: float, all_sum: Callable[[float], float] = float
                     ) -> tuple[float, float]:
    """The recipe's batch step: advantages minus their mean over every trained token of the batch (all
    processes: `all_sum`), divided by their unbiased std + eps, in place. Over tokens, not episodes,
    so the token-mean loss sees advantages that sum to zero even when length correlates with reward.
    Returns (mean, std)."""
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
    """Token-level PPO-clip surrogate + kl_coef·k3 KL to the reference, summed over trained tokens
    and divided by `n_tokens` (the trained tokens of the whole minibatch: token-mean).

    With `prox_logp` (asynchronous rollouts) it is the decoupled PPO objective the recipe trains with
    (AReaL's `use_decoupled_loss`): the trust region is around the proximal policy π_prox, the weights
    just before this update, and the behaviour policy that sampled the tokens (up to max_staleness
    versions older) enters as the constant importance weight π_prox/π_behave:
        w · max(−A·r, −A·clip(r, 1 ± ε)),  r = π_θ/π_prox,  w = π_prox/π_behave.
    Tokens whose w exceeds `behave_cap` get no gradient (counted in `behave_masked`); they stay in
    the token-mean's denominator, as in the recipe."""
    if prox_logp is None:
        ratio = torch.exp(logp - old_logp)
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
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1  # k3: unbiased, non-negative estimate of KL(π || π_ref)
        per_token = per_token + kl_coef * kl
        stats["kl"] = (kl * mask).sum().detach()
    loss = (per_token * mask).sum() / max(n_tokens, 1)
    return loss, stats


# ----------------------------------------------------------------------------------------------
# rollouts


@dataclass
class Job:
    group: int
    rollout: int
    sample: "RLSample"
    k: int
    epoch: int
    seed: int


async def run_rollouts(backend, jobs: list[Job], episode_cfg: EpisodeConfig, temperature: float,
                       top_p: float = 1.0) -> list["Episode | BaseException"]:
    """Every job's episode, all launched at once so the backend batches them. A failed episode
    comes back as its exception (the caller drops that prompt's group)."""
    readers: dict[str, Any] = {}
    try:
        return await play_jobs(backend, readers, jobs, episode_cfg, temperature, top_p)
    finally:
        await backend.aclose()
        for r in readers.values():
            r.close()


async def play_jobs(backend, readers: dict[str, Any], jobs: list[Job], episode_cfg: EpisodeConfig,
                    temperature: float, top_p: float = 1.0) -> list["Episode | BaseException"]:
    """The jobs' episodes through `run_episode`, concurrently, with video readers kept in `readers`."""
    from paravt.agent import run_episode
    from paravt.video import VideoReader

    async def one(job: Job):
        path = job.sample.video
        if path not in readers:
            readers[path] = VideoReader(path)
        cfg = replace(episode_cfg, frames=job.k, temperature=temperature, top_p=top_p, seed=job.seed)
        subs = job.sample.extra.get("subtitles")
        return await run_episode(backend, readers[path], job.sample.question, cfg,
                                 question_type=job.sample.question_type,
                                 subtitles=subs if isinstance(subs, str) else None, system=job.sample.system)

    return list(await asyncio.gather(*[one(j) for j in jobs], return_exceptions=True))


def episode_record(ep: "Episode", job: Job, breakdown, step: int) -> dict:
    """What the logs keep of an episode (compact; no ids)."""
    n_turns = len(ep.turns)
    return {
        "step": step, "prompt_id": job.sample.id, "group": job.group, "rollout": job.rollout, "k": job.k,
        "epoch": job.epoch, "reward": breakdown.total, "accuracy": breakdown.accuracy, "format": breakdown.format,
        "anchor": breakdown.anchor, "tool": breakdown.tool, "degenerate": breakdown.degenerate,
        "answer": ep.answer, "gold": job.sample.answer, "question_type": job.sample.question_type,
        "n_parsed_calls": ep.n_parsed_calls, "n_executed_calls": ep.n_executed_calls, "turns": n_turns,
        "problem_turns": sum(1 for t in ep.turns if t.parsed.get("problems")),
        "gen_tokens": sum(c.completion_tokens for c in ep.model_calls()),
        "main_texts": ep.main_texts(),
        "versions": sorted({int(c.weight_version) for c in ep.model_calls() if c.weight_version is not None}),
    }


def rollout_metrics(records: list[dict], k_choices: list[int]) -> dict[str, float]:
    """Step metrics of the rollouts: mean reward and terms, fτ (mean format reward), κ (tool calls
    per rollout), accuracy, parse-problem rate, K distribution, share of zero-signal groups."""
    if not records:
        return {}
    n = len(records)
    mean = lambda key: sum(float(r[key]) for r in records) / n  # noqa: E731
    groups: dict[tuple, list[float]] = {}
    ks: dict[tuple, int] = {}
    for r in records:
        groups.setdefault((r["step"], r["group"]), []).append(r["reward"])
        ks[(r["step"], r["group"])] = r["k"]
    turns = sum(r["turns"] for r in records)
    out = {
        "reward": mean("reward"), "accuracy": mean("accuracy"), "format": mean("format"), "f_tau": mean("format"),
        "anchor": mean("anchor"), "tool": mean("tool"), "degenerate_rate": mean("degenerate"),
        "kappa": mean("n_parsed_calls"), "executed_calls": mean("n_executed_calls"),
        "tool_use_rate": sum(1 for r in records if r["n_parsed_calls"] > 0) / n,
        "answered_rate": sum(1 for r in records if r["answer"] is not None) / n,
        "turns_per_rollout": turns / n, "parse_problem_rate": sum(r["problem_turns"] for r in records) / max(turns, 1),
        "zero_signal_groups": sum(1 for g in groups.values() if max(g) - min(g) < 1e-9) / len(groups),
        "k_mean": sum(ks.values()) / len(ks),
    }
    for k in k_choices:
        out[f"k_frac/{k}"] = sum(1 for v in ks.values() if v == k) / len(ks)
    return out


# ----------------------------------------------------------------------------------------------
# the trainer


def _load_samples(cfg: GRPOConfig) -> list["RLSample"]:
    from paravt import protocol as P
    from paravt.data import load_rl_rows

    path = Path(cfg.data)
    if not path.is_file():
        raise FileNotFoundError(f"RL data {path} does not exist (make it with `paravt synth --split train`)")
    samples = load_rl_rows(path, cfg.video_root)
    if not samples:
        raise ConfigError(f"{path} holds no rows")
    bad = sorted({s.question_type for s in samples} - set(P.QUESTION_TYPES))
    if bad:
        raise ConfigError(f"{path}: unknown question types {bad}; expected {P.QUESTION_TYPES}")
    missing = [s.video for s in samples if not Path(s.video).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} videos of {path} are missing, e.g. {missing[0]} "
                                "(set video_root to the directory the paths are relative to)")
    return samples


def _truncate_jsonl(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(k + "\n" for k in kept))


def train_grpo(cfg: GRPOConfig, console=None, make_backend: Callable[..., Any] | None = None,
               reward_fn: Callable[["Episode", "RLSample"], float] | None = None) -> dict:
    """Run (or resume) PARA-GRPO; returns the last step's metrics. Checkpoints, log.jsonl,
    TensorBoard events and rollouts.jsonl go to cfg.out.

    make_backend(model, processor, max_batch) -> Backend serves the rollouts (default: the
    in-process HFBackend over the policy being trained). It must report token ids and logprobs
    of the policy's own weights, or the sequences cannot be built. reward_fn(episode, sample) -> R
    replaces the total of paravt.rewards (a task of your own; the terms are still logged)."""
    from paravt.train.checkpoint import torch_threads

    with torch_threads(cfg.threads):
        return _train_grpo(cfg, console, make_backend, reward_fn)


def _train_grpo(cfg: GRPOConfig, console, make_backend, reward_fn=None) -> dict:
    from rich.console import Console
    from paravt.backends.hf import HFBackend
    from paravt.chat import Renderer
    from paravt.train.checkpoint import diverged, find_checkpoint, load_policy, make_optimizer, restore_optimizer
    from paravt.train.logging import RunLogger
    from paravt.train.sft import make_engine

    console = console or Console()
    engine = make_engine(cfg)
    if cfg.prompts_per_step < engine.world:
        raise ConfigError(f"prompts_per_step ({cfg.prompts_per_step}) must be >= the {engine.world} processes")
    out = Path(cfg.out)
    samples = _load_samples(cfg)
    device = str(engine.device)

    # policy (resumed or fresh) and the frozen reference (always the run's starting weights)
    resumed_from = find_checkpoint(out)  # checkpoint, or what a crash mid-save left
    resume = resumed_from is not None
    torch.manual_seed(cfg.seed)
    initial = out / "initial"
    ref_source = cfg.model
    if cfg.model == "tiny":  # a fresh tiny model exists only in memory: keep its start as the reference
        ref_source = str(initial)
        if not resume and engine.main and not (initial / "config.json").exists():
            from paravt.models.tiny import save_pretrained

            m0, p0 = load_policy("tiny", seed=cfg.seed, tiny_size=cfg.tiny_size, device="cpu")
            save_pretrained(m0, p0, initial)
            del m0
        engine.barrier()
    source = str(resumed_from) if resume else ref_source
    model, processor = load_policy(source, seed=cfg.seed, tiny_size=cfg.tiny_size, device=device, dtype=cfg.dtype)
    if cfg.freeze_vision:
        model.model.visual.requires_grad_(False)
    model = engine.prepare(model)
    base = engine.unwrap(model)
    ref = None
    if cfg.kl_coef > 0:
        ref, _ = load_policy(ref_source, seed=cfg.seed, tiny_size=cfg.tiny_size, device=device, dtype=cfg.dtype)
        ref = engine.prepare(ref, frozen=True)
    renderer = Renderer(processor)
    params, opt, sched = make_optimizer(base, cfg, cfg.freeze_vision)
    run = _RunState()
    if resume:
        run.step = restore_optimizer(out, opt, sched, engine=engine, model=model)
        run.load(load_state_of(out))
        console.print(f"[dim]resuming from {resumed_from} at step {run.step}[/dim]")
    servers = producer = backend = None
    if cfg.rollout.engine == "servers":
        if make_backend is not None:
            raise ConfigError("make_backend serves in-process rollouts; rollout.engine servers uses the servers")
        servers = _start_servers(cfg, engine, source, out)
        servers.banned_ids = list(renderer.banned_ids)  # servers sample from the trainer's π_τ
        sync_s = _sync(engine, servers, model, processor, out, run.step)  # the policy as it starts (fresh or resumed)
        console.print(f"[dim]rollouts on {len(servers.urls)} server(s): {', '.join(servers.urls)} "
                      f"(weights synced in {sync_s:.1f} s)[/dim]")
        if cfg.rollout.max_staleness > 0:
            producer = _start_producer(cfg, samples, servers, run.step, engine)
            console.print(f"[dim]asynchronous rollouts: up to {cfg.rollout.max_staleness} versions behind the "
                          "policy, decoupled PPO[/dim]")
    else:
        backend = (make_backend or HFBackend)(base, processor, max_batch=cfg.rollout_batch)

    if engine.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        _truncate_jsonl(out / "rollouts.jsonl", run.step)
    log = RunLogger(out, "grpo", resume_step=run.step, enabled=engine.main)
    rollout_file = open(out / "rollouts.jsonl", "a") if engine.main and cfg.log_rollouts else None
    k_choices = list(cfg.k_choices) if cfg.gating else [cfg.fixed_k]
    last: dict = {}
    try:
        while run.step < cfg.steps:
            t_step = time.perf_counter()
            step = run.step

            # rollouts (policy in eval mode, whole weights under FSDP; the backend decodes without grad)
            base.eval()
            t0 = time.perf_counter()
            busy0 = producer.busy() if producer is not None else 0.0
            jobs, results, failed, gather_s = _rollouts(cfg, engine, model, samples, step, producer, servers, backend)
            rollout_s = time.perf_counter() - t0

            kept, dropped = _score_groups(cfg, jobs, results, reward_fn)
            dropped += failed
            for d in dropped:
                console.print(f"[yellow]step {step + 1}: dropped a group ({d})[/yellow]")
            seqs, records, drift = _build_sequences(cfg, engine, renderer, kept, step)
            if drift:
                console.print(f"[yellow]step {step + 1}: {drift} episodes broke the continuation property; "
                              "trained per turn[/yellow]")
            if not engine.all_max(len(seqs)):
                why = f" (first: {dropped[0]})" if dropped else ""
                raise RuntimeError(f"step {step + 1}: no trainable sequences: every group was dropped{why}")
            if producer is not None and (cfg.ppo_epochs > 1 or cfg.minibatches > 1):
                # decoupled PPO's proximal policy, the weights about to be updated, fixed over the
                # step's optimizer steps (with one, it is the update's own forward: see _update)
                reference_logprobs(engine, model, base, renderer, seqs, cfg.micro_batch_size, cfg.temperature,
                                   into="prox_logprobs")
            kl_stats = _advantages(cfg, engine, ref, base, renderer, seqs)

            base.train()
            t1 = time.perf_counter()
            upd = {**_update(cfg, engine, model, base, ref, renderer, opt, params, seqs, step,
                             decoupled=producer is not None), **kl_stats}
            sched.step()
            update_s = time.perf_counter() - t1
            run.step = step = step + 1
            run.nonfinite_streak = run.nonfinite_streak + 1 if upd["skipped_updates"] == upd["updates"] else 0
            sync_s = _sync(engine, servers, model, processor, out, step, producer) if servers is not None else 0.0

            all_records = engine.gather(records)
            n_gen = sum(r["gen_tokens"] for r in all_records)
            metrics = {**rollout_metrics(all_records, k_choices), **upd,
                       "lr": sched.get_last_lr()[0], "episodes": len(all_records),
                       "seqs_main": sum(1 for q in seqs if q.kind == "main"),
                       "seqs_sub": sum(1 for q in seqs if q.kind == "sub"),
                       "drift_episodes": drift, "dropped_groups": len(dropped),
                       "gen_tokens": n_gen, "rollout_tokens_per_s": n_gen / max(rollout_s, 1e-9),
                       "rollout_s": rollout_s, "update_s": update_s, "gather_s": gather_s, "sync_s": sync_s,
                       "step_time_s": time.perf_counter() - t_step}
            wall = max(metrics["step_time_s"], 1e-9)
            metrics["sync_share"] = sync_s / wall
            metrics["update_busy"] = (wall - rollout_s) / wall  # the trainer's share not spent waiting for rollouts
            metrics["rollout_busy"] = rollout_s / wall
            if producer is not None:
                metrics.update(_async_metrics(cfg, engine, producer, servers, kept, step - 1, busy0, wall))
            last = {"step": step, **metrics}
            if engine.main:
                if rollout_file:
                    for r in all_records:
                        rollout_file.write(json.dumps(r) + "\n")
                    rollout_file.flush()
                if step % cfg.log_every == 0 or step == cfg.steps:
                    log.log(step, metrics, histograms={"K": [r["k"] for r in all_records if r["rollout"] == 0]})
                    console.print(_step_line(last, cfg.steps))
                for w in run.warnings(metrics, cfg):
                    console.print(f"[yellow]step {step}: {w}[/yellow]")
            if run.nonfinite_streak >= cfg.max_nonfinite_steps:
                raise diverged(step, run.nonfinite_streak, upd["loss"], upd["grad_norm"], cfg.lr, out)
            run.track(metrics, cfg)
            if step % cfg.save_every == 0 or step == cfg.steps:
                _save(cfg, out, model, processor, sched, opt, engine, run, metrics)
    finally:
        log.close()
        if rollout_file:
            rollout_file.close()
        if producer is not None:
            producer.close()
        if servers is not None:
            servers.close()
        engine.close()
    return last


@dataclass
class _RunState:
    """What the loop carries from step to step and a resumed run restores: the step, the run of
    skipped updates, the entropy of the first steps (the divergence warning's baseline) and the
    best value of `keep_best` saved so far."""

    step: int = 0
    nonfinite_streak: int = 0
    entropy_start: list[float] = field(default_factory=list)
    best: float | None = None
    since_save: list[float] = field(default_factory=list)

    def load(self, state: dict) -> None:
        run = state.get("run") or {}
        self.entropy_start = list(run.get("entropy_start", []))
        self.best = run.get("best")

    def to_dict(self) -> dict:
        return {"entropy_start": self.entropy_start, "best": self.best}

    def track(self, metrics: dict, cfg: GRPOConfig) -> None:
        ent = metrics.get("entropy")
        if ent is not None and math.isfinite(ent) and len(self.entropy_start) < 5:
            self.entropy_start.append(float(ent))
        if cfg.keep_best:
            if cfg.keep_best not in metrics:
                raise ConfigError(f"keep_best: no step metric {cfg.keep_best!r} (known: {', '.join(sorted(metrics))})")
            self.since_save.append(float(metrics[cfg.keep_best]))

    def warnings(self, metrics: dict, cfg: GRPOConfig) -> list[str]:
        """The signs of a diverging run that paravt's earlier RL runs showed some 15 steps before
        their accuracy fell: entropy doubling, the KL to the reference climbing."""
        out = []
        ent, kl = metrics.get("entropy"), metrics.get("kl")
        if self.entropy_start and ent is not None:
            start = sum(self.entropy_start) / len(self.entropy_start)
            if start > 0 and ent > cfg.warn_entropy_ratio * start:
                out.append(f"entropy {ent:.3f} is {ent / start:.1f}x the run's first steps' ({start:.3f}): the policy "
                           "may be diverging (lower lr, raise kl_coef, or evaluate a kept checkpoint)")
        if kl is not None and kl > cfg.warn_kl:
            out.append(f"KL to the reference {kl:.3f} nats/token is above warn_kl {cfg.warn_kl:g}")
        if metrics.get("skipped_updates"):
            out.append(f"{metrics['skipped_updates']} of {metrics['updates']} updates skipped: non-finite loss or "
                       f"gradient norm (grad_norm {metrics['grad_norm']})")
        return out


def load_state_of(out: Path) -> dict:
    from paravt.train.checkpoint import load_state

    return load_state(out)


def _save(cfg: GRPOConfig, out: Path, model, processor, sched, opt, engine, run: _RunState, metrics: dict) -> None:
    """OUT/checkpoint (resume), the last `keep_checkpoints` step snapshots, and OUT/best when the
    `keep_best` metric's mean since the last save beats every earlier save's."""
    from paravt.train.checkpoint import prune_snapshots, save_checkpoint, snapshot

    value = sum(run.since_save) / len(run.since_save) if run.since_save else None
    is_best = bool(cfg.keep_best) and value is not None and (run.best is None or value > run.best)
    if is_best:
        run.best = value
    run.since_save = []
    state = {"scheduler": sched.state_dict(), "step": run.step, "config": to_dict(cfg), "kind": "grpo",
             "run": run.to_dict(), "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
    final = save_checkpoint(out, model, processor, state,
                            keep_as=f"step_{run.step:06d}" if cfg.keep_checkpoints else None, engine=engine,
                            optimizer=opt)
    if engine.main:
        prune_snapshots(out, cfg.keep_checkpoints)
        if is_best:
            snapshot(final, out / "best")
            (out / "best" / "best.json").write_text(json.dumps({"step": run.step, cfg.keep_best: value}))


def _plan_jobs(cfg: GRPOConfig, samples: list["RLSample"], step: int, world: int, rank: int) -> list[Job]:
    """This process's rollouts of `step`: its prompts (a seeded schedule), each with its K
    (nFrames gating) and n rollout seeds."""
    return [job for j in range(cfg.prompts_per_step) if j % world == rank
            for job in _plan_group(cfg, samples, step, j, number=j)]


def _plan_group(cfg: GRPOConfig, samples: list["RLSample"], step: int, j: int, number: int) -> list[Job]:
    """The n rollouts of prompt j of `step` (the seeded schedule), with its K and seeds, as group
    `number` (its place in the step; asynchronous rollouts number the run's groups)."""
    idx, epoch = prompt_schedule(step, cfg.prompts_per_step, len(samples), cfg.seed)[j]
    s = samples[idx]
    k = gate_k(cfg.seed, s.id, epoch, cfg.k_choices) if cfg.gating else cfg.fixed_k
    return [Job(number, r, s, k, epoch, rollout_seed(cfg.seed, step, s.id, r)) for r in range(cfg.rollouts_per_prompt)]


def _score_groups(cfg: GRPOConfig, jobs: list[Job], results: list, reward_fn=None
                  ) -> tuple[list[list[tuple]], list[str]]:
    """Each group's (job, episode, reward breakdown); a group with a failed episode is dropped
    (its reason returned), since its advantages would compare unlike things."""
    from paravt.rewards import score_episode

    by_group: dict[int, list[tuple[Job, Any]]] = {}
    for job, res in zip(jobs, results):
        by_group.setdefault(job.group, []).append((job, res))
    dropped, kept = [], []
    for items in by_group.values():
        errors = [res for _, res in items if isinstance(res, BaseException)]
        if errors:
            dropped.append(f"prompt {items[0][0].sample.id}: {type(errors[0]).__name__}: {errors[0]}")
            continue
        group = []
        for job, ep in items:
            s = job.sample
            bd = score_episode(ep.main_texts(), ep.answer, s.answer, s.question_type, ep.n_parsed_calls,
                               ep.n_executed_calls, cfg.reward, prefix=ep.config.prefix, anchoring=cfg.anchoring,
                               options=s.extra.get("options"), question=s.question)
            if reward_fn is not None:
                bd = replace(bd, total=float(reward_fn(ep, s)))
            group.append((job, ep, bd))
        kept.append(group)
    return kept, dropped


def _build_sequences(cfg: GRPOConfig, engine, renderer, kept: list[list[tuple]], step: int
                     ) -> tuple[list[TrainSequence], list[dict], int]:
    """Token-exact sequences carrying their episode's group-normalised (shaped, clipped) reward
    (+ the token anchors), the episodes' log records, and how many episodes drifted. With
    adv_norm `episode` the values are normalised again over the batch's episodes here."""
    from paravt.rewards import shape
    from paravt.train.sequences import episode_sequences

    shaped = [[shape(bd.total, cfg.reward) for _, _, bd in g] for g in kept]
    advs = group_advantages(shaped, cfg.adv_eps, batch_norm=False)
    if cfg.adv_norm == "episode":  # over the whole batch's episodes, all processes together
        flat = engine.gather([a for g in advs for a in g])
        advs = [normalize(g, flat, cfg.adv_eps) for g in advs]
    seqs: list[TrainSequence] = []
    records = []
    drift = 0
    for group, group_adv in zip(kept, advs):
        for (job, ep, bd), a in zip(group, group_adv):
            ep_seqs, drifted = episode_sequences(
                ep, a, renderer, include_subagents=cfg.include_subagents, anchoring=cfg.anchoring,
                reward_cfg=cfg.reward, strict=cfg.strict_continuation, group=job.group, episode=job.rollout)
            drift += int(drifted)
            rec = episode_record(ep, job, bd, step + 1)
            for q in ep_seqs:  # asynchronous rollouts: some episodes are older than the weights updated
                q.fresh = not rec["versions"] or rec["versions"][0] == step
            seqs += [q for q in ep_seqs if q.n_trained > 0]
            rec["advantage"] = a
            records.append(rec)
    return seqs, records, drift


def _advantages(cfg: GRPOConfig, engine, ref, base, renderer, seqs: list[TrainSequence]) -> dict[str, float]:
    """Per-token advantages as the recipe forms them, in place: with kl_mode `reward`, the KL
    reward-to-go from a reference pass over the rollout tokens; with adv_norm `token`, the batch
    normalisation over trained tokens. Returns the KL statistics (k3 and k1 per token)."""
    stats: dict[str, float] = {}
    if ref is not None and cfg.kl_mode == "reward":
        reference_logprobs(engine, ref, base, renderer, seqs, cfg.micro_batch_size, cfg.temperature)
        k1 = k3 = n = 0.0
        for q in seqs:
            kl = kl_reward_to_go(q.old_logprobs, q.ref_logprobs, q.mask, cfg.kl_coef, cfg.kl_clamp)
            q.advantages = [a + k for a, k in zip(q.advantages, kl)]
            for m, old, r in zip(q.mask, q.old_logprobs, q.ref_logprobs):
                if m:
                    d = r - old
                    k1, k3, n = k1 - d, k3 + math.expm1(d) - d, n + 1
        n = max(engine.all_sum(n), 1.0)
        stats = {"kl": engine.all_sum(k3) / n, "kl_k1": engine.all_sum(k1) / n}
    if cfg.adv_norm == "token":
        mean, std = normalize_tokens(seqs, cfg.adv_eps, engine.all_sum)
        stats.update({"adv_token_mean": mean, "adv_token_std": std})
    return stats


def reference_logprobs(engine, ref, base, renderer, seqs: list[TrainSequence], micro_batch_size: int,
                       temperature: float, into: str = "ref_logprobs") -> None:
    """log π_τ of `ref` (the reference, or the policy itself for decoupled PPO's π_prox) at every
    sequence's tokens, into `TrainSequence.<into>`, without grad; every process runs the same number
    of passes (sharded models: collectives must match)."""
    from paravt.train.sequences import collate, micro_batches, per_sequence, token_logprobs

    groups = micro_batches(seqs, micro_batch_size)
    n = engine.all_max(len(groups))
    with torch.no_grad():
        for gi in range(n):
            real = gi < len(groups)
            group = groups[gi if real else 0]
            batch = collate(base, renderer, group)
            with engine.autocast():
                lp, _ = token_logprobs(ref, batch, temperature=temperature, banned=renderer.banned_ids)
            if real:
                for q, row in zip(group, per_sequence(group, lp.float())):
                    setattr(q, into, row)


def _start_servers(cfg: GRPOConfig, engine, source: str, out: Path):
    """Rank 0 starts (or connects to) the rollout servers; every process gets their URLs."""
    from paravt.train.rollout import RolloutServers

    servers = RolloutServers.start(cfg.rollout, source, out / "servers") if engine.main else None
    urls = engine.broadcast(servers.urls if servers else None)
    return servers or RolloutServers(cfg.rollout, urls)


def _start_producer(cfg: GRPOConfig, samples: list["RLSample"], servers, version: int, engine):
    """Asynchronous rollouts (train.producer) from step `version` of the schedule on. Each process
    has a producer of its own for its share of every step's prompts (positions j ≡ rank mod world, as
    in the synchronous step); its i-th group is step i div n's position mine[i mod n]."""
    from paravt.train.producer import RolloutProducer

    mine = [j for j in range(cfg.prompts_per_step) if j % engine.world == engine.rank]
    n = len(mine)
    return RolloutProducer(
        servers, cfg.rollout.max_staleness, n, version,
        pause=cfg.rollout.sync_pause,
        plan_group=lambda i: _plan_group(cfg, samples, i // n, mine[i % n],
                                         number=(i // n) * cfg.prompts_per_step + mine[i % n]),
        run_group=lambda backend, readers, jobs: play_jobs(backend, readers, jobs, cfg.episode, cfg.temperature,
                                                           cfg.top_p))


def _async_metrics(cfg: GRPOConfig, engine, producer, servers, kept: list[list[tuple]], version: int,
                   busy0: float, wall: float) -> dict[str, float]:
    """What asynchronous rollouts add to a step's log (docs/rl.md): staleness of the batch trained at
    `version`, this process's share of the step with a request in flight, and the producer's counts."""
    return {**staleness_stats(kept, version, cfg.include_subagents, engine.gather),
            "rollout_busy": min((producer.busy() - busy0) / wall, 1.0), "server_sync_s": producer.server_sync_s,
            "stale_groups": engine.all_sum(producer.stale_groups), "resent_calls": engine.all_sum(producer.resent()),
            "server_restarts": servers.restarts}


def staleness_stats(kept: list[list[tuple]], version: int, include_subagents: bool,
                    gather: Callable[[list], list] = list) -> dict[str, float]:
    """How many versions the trained calls lag the policy they update: the largest, and the mean
    over generated tokens (main turns; sub-agent calls too when they are trained), over the calls
    of every process (`gather`)."""
    pairs = []
    for group in kept:
        for _, ep, _ in group:
            calls = ep.model_calls() if include_subagents else [t.generation for t in ep.turns]
            for c in calls:
                pairs.append((version - int(c.weight_version), max(c.completion_tokens, 1)))
    pairs = gather(pairs)
    if not pairs:
        return {}
    lags, weights = [a for a, _ in pairs], [w for _, w in pairs]
    return {"staleness_max": max(lags), "staleness_mean": sum(a * w for a, w in zip(lags, weights)) / sum(weights)}


def _sync(engine, servers, model, processor, out: Path, step: int, producer=None) -> float:
    """The policy's weights to every rollout server, as version `step` (see train.rollout): written
    by all processes together, loaded by the servers at rank 0's request (through the producer,
    cutting the generations in flight, with asynchronous rollouts). A launched server that died is
    started again; a given one that failed is dropped everywhere. With asynchronous rollouts on one
    process the servers load the weights in the background. Returns the seconds the trainer spent."""
    from paravt.train.rollout import write_sync_weights

    t0 = time.perf_counter()
    if producer is not None and engine.world == 1:
        # in the background: the trainer goes on with the next step while the servers drain and load
        producer.wait_sync()  # the previous one (its weights directory must outlive it)
        producer.request_sync(write_sync_weights(engine, model, processor, out, str(step), protect=servers.in_use), step)
        return time.perf_counter() - t0
    weights = write_sync_weights(engine, model, processor, out, str(step), protect=servers.in_use)
    if producer is not None:  # every process's calls end and its gates close before rank 0 pauses the servers
        producer.close_gates()
        engine.barrier()
    error = None
    if engine.main:
        try:
            if producer is not None:
                producer.sync(weights, step)
            else:
                servers.sync(weights, str(step))
        except Exception as e:  # noqa: BLE001 - every process must learn of it, not only rank 0
            error = str(e)
    state = engine.broadcast((error, servers.urls if engine.main else None, servers.version if engine.main else None))
    if state[0]:
        from paravt.backends.base import BackendError

        raise BackendError(f"weight sync of step {step} failed: {state[0]}")
    servers.urls, servers.version = list(state[1]), dict(state[2])
    if producer is not None and not engine.main:
        producer.reopen(servers.urls, step)
    return time.perf_counter() - t0


def _rollouts(cfg: GRPOConfig, engine, model, samples: list["RLSample"], step: int, producer, servers, backend
              ) -> tuple[list[Job], list, list[str], float]:
    """This process's jobs of `step` and their episodes (or exceptions), the groups the producer
    dropped, and the seconds spent gathering the weights: from the asynchronous producer (finished
    groups, at most max_staleness versions old), the servers, or the in-process backend."""
    if producer is not None:
        groups, failed = producer.take(step)
        return [j for g in groups for j in g.jobs], [r for g in groups for r in g.results], failed, 0.0
    jobs = _plan_jobs(cfg, samples, step, engine.world, engine.rank)
    if servers is not None:
        results = asyncio.run(run_rollouts(servers.backend(), jobs, cfg.episode, cfg.temperature, cfg.top_p))
        _check_served(results, servers, step)
        return jobs, results, [], 0.0
    with engine.gathered(model) as gather_s:
        results = asyncio.run(run_rollouts(backend, jobs, cfg.episode, cfg.temperature, cfg.top_p))
    return jobs, results, [], gather_s


def _check_served(results: list, servers, step: int) -> None:
    """Every episode must come from the policy being updated (staleness 0): the servers that
    generated it hold version `step`. When every episode failed, say why (no server left, ...)."""
    eps = [r for r in results if not isinstance(r, BaseException)]
    if results and not eps:
        raise results[0]
    for ep in eps:
        for call in ep.model_calls():
            v = servers.version.get(call.served_by or "")
            if v != str(step):
                raise RuntimeError(f"an episode of step {step + 1} was generated by {call.served_by} holding weight "
                                   f"version {v!r}, not {step} (max_staleness 0)")


def _update(cfg: GRPOConfig, engine, model, base, ref, renderer, opt, params, seqs: list[TrainSequence],
            step: int, decoupled: bool = False) -> dict[str, float]:
    """PPO epochs x minibatches of optimizer steps over the step's sequences (this process's share;
    the loss is the token mean over all processes' sequences, see sft.backward_micro_batches).
    Every logprob is log π_τ at the rollouts' temperature. An optimizer step whose loss or gradient
    norm is not finite is skipped (as the recipe's engine does) and counted: applying it would
    write NaN into every weight. `decoupled` (asynchronous rollouts): the decoupled PPO loss around
    π_prox, the sequences' `prox_logprobs`, or, when the step takes a single optimizer step, this
    forward's own log π_θ detached (the same weights: one pass fewer, the same gradient)."""
    import numpy as np

    from paravt.train.sequences import micro_batches, token_logprobs
    from paravt.train.sft import backward_micro_batches

    n_mb = -engine.all_max(-min(cfg.minibatches, len(seqs)))  # every process takes the same optimizer steps
    rng = np.random.default_rng([cfg.seed, step, 7])
    totals = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "entropy": 0.0, "tokens": 0,
              "behave_masked": 0.0, "behave_weight": 0.0}
    drift = {"sum": 0.0, "tokens": 0}
    grad_norms, skipped = [], 0
    first_pass = True
    t0 = time.perf_counter()
    seen_tokens = 0
    kl_in_loss = ref is not None and cfg.kl_mode == "loss"

    def surrogate(batch: Batch, real: bool) -> torch.Tensor:
        logp, ent = token_logprobs(model, batch, with_entropy=True, temperature=cfg.temperature,
                                   banned=renderer.banned_ids)
        ref_logp = None
        if kl_in_loss:
            with torch.no_grad():
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
                    totals[k] += float(stats[k])
            totals["entropy"] += float((ent * batch.mask).sum())
            totals["tokens"] += batch.n_tokens
            if first_pass:  # before any update: the rollout logprobs of the weights being updated (or the
                # recomputed π_prox) vs a fresh forward: numerics only
                before, w = batch.old_logprobs, batch.mask * batch.fresh
                if batch.prox_logprobs is not None:
                    before, w = batch.prox_logprobs, batch.mask
                gap = torch.where(w > 0, (logp.detach() - before).abs(), torch.zeros_like(w))
                drift["sum"] += float((gap * w).sum())
                drift["tokens"] += float(w.sum())
        return loss

    for _ in range(cfg.ppo_epochs):
        order = rng.permutation(len(seqs))
        for mb in range(n_mb):
            mb_seqs = [seqs[i] for i in order[mb::n_mb]]
            n_tok = int(engine.all_sum(sum(q.n_trained for q in mb_seqs)))
            opt.zero_grad(set_to_none=True)
            mb_loss = engine.all_sum(backward_micro_batches(engine, model, base, renderer,
                                                            micro_batches(mb_seqs, cfg.micro_batch_size), n_tok,
                                                            surrogate))
            totals["loss"] += mb_loss
            seen_tokens += sum(len(q.ids) for q in mb_seqs)
            gnorm = engine.clip_grad_norm(params, cfg.grad_clip)  # the global norm: every process agrees
            grad_norms.append(gnorm)
            first_pass = False
            if not (math.isfinite(mb_loss) and math.isfinite(gnorm)):
                opt.zero_grad(set_to_none=True)
                skipped += 1
                continue
            opt.step()
    totals = {k: v if k == "loss" else engine.all_sum(v) for k, v in totals.items()}
    t = max(totals["tokens"], 1)
    finite = [g for g in grad_norms if math.isfinite(g)]
    out = {"loss": totals["loss"] / t, "pg_loss": totals["pg"] / t,
           "clip_frac": totals["clipped"] / t, "ratio_mean": totals["ratio"] / t, "entropy": totals["entropy"] / t,
           "grad_norm": sum(finite) / len(finite) if len(finite) == len(grad_norms) else float("nan"),
           "updates": len(grad_norms), "skipped_updates": skipped,
           "trained_tokens": int(totals["tokens"]) // cfg.ppo_epochs,
           "logprob_drift": engine.all_sum(drift["sum"]) / max(engine.all_sum(drift["tokens"]), 1),
           "logprob_drift_tokens": int(engine.all_sum(drift["tokens"])),
           "train_tokens_per_s": engine.all_sum(seen_tokens) / max(time.perf_counter() - t0, 1e-9)}
    if kl_in_loss:
        out["kl"] = totals["kl"] / t
    if decoupled:  # the behaviour weights π_prox/π_behave
        out["behave_masked_tokens"] = int(totals["behave_masked"]) // cfg.ppo_epochs
        out["behave_weight_mean"] = totals["behave_weight"] / max(t - totals["behave_masked"], 1)
    return out


def _step_line(m: dict, total: int) -> str:
    ks = " ".join(f"{k.split('/')[1]}:{v:.0%}" for k, v in m.items() if k.startswith("k_frac/") and v > 0)
    return (f"step {m['step']}/{total}  R {m.get('reward', float('nan')):.3f}  acc {m.get('accuracy', 0):.2f}  "
            f"fτ {m.get('f_tau', 0):.2f}  κ {m.get('kappa', 0):.2f}  K[{ks}]  loss {m['loss']:.4f}  "
            f"kl {m.get('kl', 0.0):.4f}  H {m.get('entropy', 0.0):.3f}  {m['step_time_s']:.1f}s")
