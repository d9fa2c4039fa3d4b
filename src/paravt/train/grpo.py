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
from paravt.train.config import ConfigError, load_config, to_dict
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
    include_subagents: bool = True  # sub-agent generations as extra sequences
    adv_eps: float = 1e-6
    batch_norm_advantages: bool = True
    clip_eps: float = 0.2
    kl_coef: float = 0.01  # 0 -> no reference model
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
    keep_checkpoints: bool = False
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
        if not (self.lr > 0 and self.grad_clip > 0 and self.clip_eps > 0 and self.adv_eps > 0):
            raise ValueError("lr, grad_clip, clip_eps and adv_eps must be > 0")
        if self.kl_coef < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("kl_coef, weight_decay and warmup_steps must be >= 0")
        for name, value, choices in (("anchoring", self.anchoring, ("token", "sequence", "off")),
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


def group_advantages(rewards: list[list[float]], eps: float = 1e-6, batch_norm: bool = True) -> list[list[float]]:
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


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             n_tokens: int, clip_eps: float = 0.2, ref_logp: torch.Tensor | None = None,
             kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip surrogate + kl_coef·k3 KL to the reference, summed over trained tokens
    and divided by `n_tokens` (the trained tokens of the whole minibatch: token-mean)."""
    ratio = torch.exp(logp - old_logp)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    pg = torch.maximum(pg1, pg2)
    per_token = pg
    stats = {"pg": (pg * mask).sum().detach(), "clipped": ((pg2 > pg1).float() * mask).sum().detach(),
             "ratio": (ratio * mask).sum().detach()}
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
    from paravt.agent import run_episode
    from paravt.video import VideoReader

    readers: dict[str, Any] = {}

    async def one(job: Job):
        path = job.sample.video
        if path not in readers:
            readers[path] = VideoReader(path)
        cfg = replace(episode_cfg, frames=job.k, temperature=temperature, top_p=top_p, seed=job.seed)
        subs = job.sample.extra.get("subtitles")
        return await run_episode(backend, readers[path], job.sample.question, cfg,
                                 question_type=job.sample.question_type,
                                 subtitles=subs if isinstance(subs, str) else None, system=job.sample.system)

    try:
        return list(await asyncio.gather(*[one(j) for j in jobs], return_exceptions=True))
    finally:
        await backend.aclose()
        for r in readers.values():
            r.close()


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
        "gen_tokens": sum(t.generation.completion_tokens for t in ep.turns)
        + sum(c.generation.completion_tokens for c in ep.subcalls() if c.generation),
        "main_texts": ep.main_texts(),
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


def train_grpo(cfg: GRPOConfig, console=None, make_backend: Callable[..., Any] | None = None) -> dict:
    """Run (or resume) PARA-GRPO; returns the last step's metrics. Checkpoints, log.jsonl,
    TensorBoard events and rollouts.jsonl go to cfg.out.

    make_backend(model, processor, max_batch) -> Backend serves the rollouts (default: the
    in-process HFBackend over the policy being trained). It must report token ids and logprobs
    of the policy's own weights, or the sequences cannot be built."""
    from paravt.train.checkpoint import torch_threads

    with torch_threads(cfg.threads):
        return _train_grpo(cfg, console, make_backend)


def _train_grpo(cfg: GRPOConfig, console, make_backend) -> dict:
    from rich.console import Console
    from paravt.backends.hf import HFBackend, Renderer
    from paravt.rewards import score_episode, shape
    from paravt.train.checkpoint import (find_checkpoint, load_policy, make_optimizer, restore_optimizer,
                                         save_checkpoint)
    from paravt.train.logging import RunLogger
    from paravt.train.sequences import episode_sequences
    from paravt.train.sft import make_engine

    console = console or Console()
    engine = make_engine(cfg)
    world, rank = engine.world, engine.rank
    if cfg.prompts_per_step < world:
        raise ConfigError(f"prompts_per_step ({cfg.prompts_per_step}) must be >= the {world} processes")
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
    step = 0
    if resume:
        step = restore_optimizer(out, opt, sched, engine=engine, model=model)
        console.print(f"[dim]resuming from {resumed_from} at step {step}[/dim]")
    servers = None
    if cfg.rollout.engine == "servers":
        if make_backend is not None:
            raise ConfigError("make_backend serves in-process rollouts; rollout.engine servers uses the servers")
        servers = _start_servers(cfg, engine, source, out)
        sync_s = _sync(engine, servers, model, processor, out, step)  # the policy as it starts (fresh or resumed)
        console.print(f"[dim]rollouts on {len(servers.urls)} server(s): {', '.join(servers.urls)} "
                      f"(weights synced in {sync_s:.1f} s)[/dim]")
    else:
        backend = (make_backend or HFBackend)(base, processor, max_batch=cfg.rollout_batch)

    if engine.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        _truncate_jsonl(out / "rollouts.jsonl", step)
    log = RunLogger(out, "grpo", resume_step=step, enabled=engine.main)
    rollout_file = open(out / "rollouts.jsonl", "a") if engine.main and cfg.log_rollouts else None
    episode_cfg = cfg.episode
    k_choices = list(cfg.k_choices) if cfg.gating else [cfg.fixed_k]
    last: dict = {}
    try:
        while step < cfg.steps:
            t_step = time.perf_counter()
            # 1. this process's prompts and their K
            schedule = prompt_schedule(step, cfg.prompts_per_step, len(samples), cfg.seed)
            jobs = []
            for gi, (idx, epoch) in enumerate(schedule):
                if gi % world != rank:
                    continue
                s = samples[idx]
                k = gate_k(cfg.seed, s.id, epoch, cfg.k_choices) if cfg.gating else cfg.fixed_k
                jobs += [Job(gi, r, s, k, epoch, rollout_seed(cfg.seed, step, s.id, r))
                         for r in range(cfg.rollouts_per_prompt)]

            # 2. rollouts (policy in eval mode, whole weights under FSDP; the backend decodes without grad)
            base.eval()
            t0 = time.perf_counter()
            if servers is not None:
                gather_s = 0.0
                results = asyncio.run(run_rollouts(servers.backend(), jobs, episode_cfg, cfg.temperature, cfg.top_p))
                _check_served(results, servers, step)
            else:
                with engine.gathered(model) as gather_s:
                    results = asyncio.run(run_rollouts(backend, jobs, episode_cfg, cfg.temperature, cfg.top_p))
            rollout_s = time.perf_counter() - t0

            # 3. rewards and advantages, per group; a group with a failed episode is dropped
            by_group: dict[int, list[tuple[Job, Any]]] = {}
            for job, res in zip(jobs, results):
                by_group.setdefault(job.group, []).append((job, res))
            dropped = []
            kept: list[list[tuple[Job, Any, Any]]] = []
            for gi, items in by_group.items():
                errors = [res for _, res in items if isinstance(res, BaseException)]
                if errors:
                    dropped.append(f"prompt {items[0][0].sample.id}: {type(errors[0]).__name__}: {errors[0]}")
                    continue
                group = []
                for job, ep in items:
                    s = job.sample
                    bd = score_episode(ep.main_texts(), ep.answer, s.answer, s.question_type, ep.n_parsed_calls,
                                       ep.n_executed_calls, cfg.reward, prefix=ep.config.prefix,
                                       anchoring=cfg.anchoring, options=s.extra.get("options"), question=s.question)
                    group.append((job, ep, bd))
                kept.append(group)
            for d in dropped:
                console.print(f"[yellow]step {step + 1}: dropped a group ({d})[/yellow]")
            shaped = [[shape(bd.total, cfg.reward) for _, _, bd in g] for g in kept]
            advs = group_advantages(shaped, cfg.adv_eps, batch_norm=False)
            if cfg.batch_norm_advantages:  # over the whole batch, all processes together
                flat = engine.gather([a for g in advs for a in g])
                advs = [normalize(g, flat, cfg.adv_eps) for g in advs]

            # 4. sequences
            seqs: list[TrainSequence] = []
            drift = 0
            records = []
            for group, group_adv in zip(kept, advs):
                for (job, ep, bd), a in zip(group, group_adv):
                    ep_seqs, drifted = episode_sequences(
                        ep, a, renderer, include_subagents=cfg.include_subagents, anchoring=cfg.anchoring,
                        reward_cfg=cfg.reward, strict=cfg.strict_continuation, group=job.group, episode=job.rollout)
                    drift += int(drifted)
                    seqs += [q for q in ep_seqs if q.n_trained > 0]
                    rec = episode_record(ep, job, bd, step + 1)
                    rec["advantage"] = a
                    records.append(rec)
            if drift:
                console.print(f"[yellow]step {step + 1}: {drift} episodes broke the continuation property; "
                              "trained per turn[/yellow]")

            # 5. update
            base.train()
            t1 = time.perf_counter()
            upd = _update(cfg, engine, model, base, ref, renderer, opt, params, seqs, step)
            sched.step()
            update_s = time.perf_counter() - t1
            step += 1
            sync_s = _sync(engine, servers, model, processor, out, step) if servers is not None else 0.0

            # 6. metrics, logs, checkpoint
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
            metrics["sync_share"] = sync_s / max(metrics["step_time_s"], 1e-9)
            last = {"step": step, **metrics}
            if engine.main:
                if rollout_file:
                    for r in all_records:
                        rollout_file.write(json.dumps(r) + "\n")
                    rollout_file.flush()
                if step % cfg.log_every == 0 or step == cfg.steps:
                    log.log(step, metrics, histograms={"K": [r["k"] for r in all_records if r["rollout"] == 0]})
                    console.print(_step_line(last, cfg.steps))
            if step % cfg.save_every == 0 or step == cfg.steps:
                save_checkpoint(out, model, processor,
                                {"scheduler": sched.state_dict(), "step": step, "config": to_dict(cfg), "kind": "grpo"},
                                keep_as=f"step_{step:06d}" if cfg.keep_checkpoints else None,
                                engine=engine, optimizer=opt)
    finally:
        log.close()
        if rollout_file:
            rollout_file.close()
        if servers is not None:
            servers.close()
        engine.close()
    return last


def _start_servers(cfg: GRPOConfig, engine, source: str, out: Path):
    """Rank 0 starts (or connects to) the rollout servers; every process gets their URLs."""
    from paravt.train.rollout import RolloutServers

    servers = RolloutServers.start(cfg.rollout, source, out / "servers") if engine.main else None
    urls = engine.broadcast(servers.urls if servers else None)
    return servers or RolloutServers(cfg.rollout, urls)


def _sync(engine, servers, model, processor, out: Path, step: int) -> float:
    """The policy's weights to every rollout server, as version `step` (see train.rollout): written
    by all processes together, loaded by the servers at rank 0's request. Servers that failed are
    dropped everywhere. Returns the seconds it took."""
    from paravt.train.rollout import write_sync_weights

    t0 = time.perf_counter()
    weights = write_sync_weights(engine, model, processor, out, str(step))
    error = None
    if engine.main:
        try:
            servers.sync(weights, str(step))
        except Exception as e:  # noqa: BLE001 - every process must learn of it, not only rank 0
            error = str(e)
    state = engine.broadcast((error, servers.urls if engine.main else None, servers.version if engine.main else None))
    if state[0]:
        from paravt.backends.base import BackendError

        raise BackendError(f"weight sync of step {step} failed: {state[0]}")
    servers.urls, servers.version = list(state[1]), dict(state[2])
    return time.perf_counter() - t0


def _check_served(results: list, servers, step: int) -> None:
    """Every episode must come from the policy being updated (staleness 0): the servers that
    generated it hold version `step`. When every episode failed, say why (no server left, ...)."""
    eps = [r for r in results if not isinstance(r, BaseException)]
    if results and not eps:
        raise results[0]
    for ep in eps:
        for call in [t.generation for t in ep.turns] + [c.generation for c in ep.subcalls() if c.generation]:
            v = servers.version.get(call.served_by or "")
            if v != str(step):
                raise RuntimeError(f"an episode of step {step + 1} was generated by {call.served_by} holding weight "
                                   f"version {v!r}, not {step} (max_staleness 0)")


def _update(cfg: GRPOConfig, engine, model, base, ref, renderer, opt, params, seqs: list[TrainSequence],
            step: int) -> dict[str, float]:
    """PPO epochs x minibatches of optimizer steps over the step's sequences (this process's share;
    the loss is the token mean over all processes' sequences, see sft.backward_micro_batches)."""
    import numpy as np

    from paravt.train.sequences import micro_batches, token_logprobs
    from paravt.train.sft import backward_micro_batches

    if not seqs:
        raise RuntimeError(f"step {step + 1}: no trainable sequences on process {engine.rank} (every group was dropped)")
    n_mb = -engine.all_max(-min(cfg.minibatches, len(seqs)))  # every process takes the same optimizer steps
    rng = np.random.default_rng([cfg.seed, step, 7])
    totals = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "entropy": 0.0, "tokens": 0}
    drift = {"sum": 0.0, "tokens": 0}
    grad_norms = []
    first_pass = True
    t0 = time.perf_counter()
    seen_tokens = 0

    def surrogate(batch: Batch, real: bool) -> torch.Tensor:
        logp, ent = token_logprobs(model, batch, with_entropy=True)
        ref_logp = None
        if ref is not None:
            with torch.no_grad():
                ref_logp, _ = token_logprobs(ref, batch)
        loss, stats = ppo_loss(logp, batch.old_logprobs, batch.advantages, batch.mask, 1, cfg.clip_eps, ref_logp,
                               cfg.kl_coef)  # summed over the micro-batch's trained tokens
        if real:
            for k in ("pg", "clipped", "ratio", "kl"):
                if k in stats:
                    totals[k] += float(stats[k])
            totals["entropy"] += float((ent * batch.mask).sum())
            totals["tokens"] += batch.n_tokens
            if first_pass:  # before any update: rollout logprobs vs a fresh forward (numerics only)
                drift["sum"] += float(((logp.detach() - batch.old_logprobs).abs() * batch.mask).sum())
                drift["tokens"] += batch.n_tokens
        return loss

    for _ in range(cfg.ppo_epochs):
        order = rng.permutation(len(seqs))
        for mb in range(n_mb):
            mb_seqs = [seqs[i] for i in order[mb::n_mb]]
            n_tok = int(engine.all_sum(sum(q.n_trained for q in mb_seqs)))
            opt.zero_grad(set_to_none=True)
            totals["loss"] += backward_micro_batches(engine, model, base, renderer,
                                                     micro_batches(mb_seqs, cfg.micro_batch_size), n_tok, surrogate)
            seen_tokens += sum(len(q.ids) for q in mb_seqs)
            if not math.isfinite(totals["loss"]):
                raise FloatingPointError(f"GRPO loss is not finite at step {step + 1}")
            grad_norms.append(engine.clip_grad_norm(params, cfg.grad_clip))
            opt.step()
            first_pass = False
    totals = {k: engine.all_sum(v) for k, v in totals.items()}
    t = max(totals["tokens"], 1)
    return {"loss": totals["loss"] / t, "pg_loss": totals["pg"] / t, "kl": totals["kl"] / t,
            "clip_frac": totals["clipped"] / t, "ratio_mean": totals["ratio"] / t, "entropy": totals["entropy"] / t,
            "grad_norm": sum(grad_norms) / len(grad_norms), "trained_tokens": int(totals["tokens"]) // cfg.ppo_epochs,
            "logprob_drift": engine.all_sum(drift["sum"]) / max(engine.all_sum(drift["tokens"]), 1),
            "train_tokens_per_s": engine.all_sum(seen_tokens) / max(time.perf_counter() - t0, 1e-9)}


def _step_line(m: dict, total: int) -> str:
    ks = " ".join(f"{k.split('/')[1]}:{v:.0%}" for k, v in m.items() if k.startswith("k_frac/") and v > 0)
    return (f"step {m['step']}/{total}  R {m.get('reward', float('nan')):.3f}  acc {m.get('accuracy', 0):.2f}  "
            f"fτ {m.get('f_tau', 0):.2f}  κ {m.get('kappa', 0):.2f}  K[{ks}]  loss {m['loss']:.4f}  "
            f"kl {m['kl']:.4f}  {m['step_time_s']:.1f}s")
