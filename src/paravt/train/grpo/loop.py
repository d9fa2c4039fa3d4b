"""The PARA-GRPO run: `train_grpo` builds the trainer once (`_setup`: engine, policy and frozen
reference, optimizer, rollout engine, logs; resumed from OUT/checkpoint when there is one), then
runs steps, each as named stages (docs/rl.md, "One step, as computed"):

    rollouts → score → sequences → advantages → update → sync → log / save

- rollouts (`_rollout_stage`): this process's prompt groups played through the episode loop
  (grpo.rollouts; on the servers or from the asynchronous producer: grpo.servers);
- score (`_score_groups`): each episode's reward breakdown; a group with a failed episode is dropped;
- sequences (`_build_sequences`): shaped, group-normalised rewards (estimator steps 2–3) carried by
  token-exact sequences with the token anchors (step 4, train.sequences);
- advantages and update (`_passes_stage`, grpo.update.train_passes): the KL reward and the token
  normalisation (steps 5–6), then the PPO optimizer steps (step 7), under the update's switches;
- sync (`grpo.servers.sync_weights`): the new weights to the rollout servers;
- log / save (`_step_metrics`, `_log_step`, `_save`): log.jsonl, TensorBoard, rollouts.jsonl, warnings,
  checkpoints; `_RunState` is what a resumed run restores besides the weights and the optimizer.

Several processes: `torchrun --nproc_per_node N -m paravt train grpo ...` (FSDP2 by default); each
process rolls out its share of the step's prompts, and the update is sharded.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from paravt.train.checkpoint import step_schedule
from paravt.train.config import ConfigError, to_dict
from paravt.train.grpo.config import GRPOConfig
from paravt.train.grpo.estimator import group_advantages, normalize, shape_rewards
from paravt.train.grpo.rollouts import collect_rollouts, episode_record, rollout_metrics
from paravt.train.grpo.schedule import Job, load_samples
from paravt.train.grpo.servers import async_metrics, start_producer, start_servers, sync_weights
from paravt.train.grpo.update import train_passes
from paravt.train.sequences import TrainSequence, episode_sequences

if TYPE_CHECKING:
    from paravt.agent import Episode
    from paravt.data import RLSample


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
    t = _setup(cfg, console, make_backend, reward_fn)
    last: dict = {}
    try:
        while t.run.step < cfg.steps:
            last = _step(t)
    finally:
        _close(t)
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


@dataclass
class _Trainer:
    """What `_setup` builds once and every stage of a step uses."""

    cfg: GRPOConfig
    console: Any
    engine: Any  # train.engine.Engine
    out: Path
    samples: list["RLSample"]
    model: Any  # the policy as the engine wraps it (DDP / FSDP2) ...
    base: Any  # ... and unwrapped (the backend generates with it, sequences collate with it)
    processor: Any
    ref: Any  # the frozen reference (None without a KL term)
    renderer: Any
    params: list
    opt: Any
    sched: Any
    run: _RunState
    reward_fn: Callable[["Episode", "RLSample"], float] | None = None
    servers: Any = None  # train.rollout.RolloutServers (rollout.engine servers)
    producer: Any = None  # train.producer.RolloutProducer (max_staleness > 0)
    backend: Any = None  # the in-process backend (rollout.engine in_process)
    log: Any = None
    rollout_file: Any = None

    @property
    def k_choices(self) -> list[int]:
        return list(self.cfg.k_choices) if self.cfg.gating else [self.cfg.fixed_k]


# ----------------------------------------------------------------------------------------------
# setup


def _setup(cfg: GRPOConfig, console, make_backend, reward_fn) -> _Trainer:
    """The engine, the data, the policy (resumed or fresh) and its reference, the optimizer (and
    the run state of a resumed run), the rollout engine and the logs, in that order."""
    from rich.console import Console

    from paravt.chat import Renderer
    from paravt.train.checkpoint import claim_run_dir, make_optimizer, restore_optimizer
    from paravt.train.sft import make_engine

    console = console or Console()
    engine = make_engine(cfg)
    if cfg.prompts_per_step < engine.world:
        raise ConfigError(f"prompts_per_step ({cfg.prompts_per_step}) must be >= the {engine.world} processes")
    out = Path(cfg.out)
    samples = load_samples(cfg)
    claim_run_dir(out, "grpo", engine.main)  # refuses a folder that is not a run before anything is written
    model, base, processor, ref, source, resumed_from = _load_models(cfg, engine, out)
    renderer = Renderer(processor)
    params, opt, sched = make_optimizer(base, cfg, cfg.freeze_vision)
    run = _RunState()
    if resumed_from is not None:
        run.step = restore_optimizer(out, opt, sched, engine=engine, model=model)
        run.load(load_state_of(out))
        console.print(f"[dim]resuming from {resumed_from} at step {run.step}[/dim]")
    t = _Trainer(cfg, console, engine, out, samples, model, base, processor, ref, renderer, params, opt, sched, run,
                 reward_fn)
    _start_rollouts(t, source, make_backend)
    _open_logs(t)
    return t


def _load_models(cfg: GRPOConfig, engine, out: Path) -> tuple[Any, Any, Any, Any, str, Path | None]:
    """The policy (from OUT's checkpoint when resuming, else cfg.model), wrapped by the engine and
    unwrapped, its processor, and the frozen reference, which is always the run's starting weights
    (None when kl_coef is 0); also where the policy came from and the checkpoint resumed, if any."""
    from paravt.train.checkpoint import find_checkpoint, load_policy

    device = str(engine.device)
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
    return model, base, processor, ref, source, resumed_from


def _start_rollouts(t: _Trainer, source: str, make_backend) -> None:
    """The rollout engine: the in-process backend over the policy, or the servers (loaded with the
    policy as it starts, fresh or resumed) and, with max_staleness > 0, the asynchronous producer."""
    cfg, console = t.cfg, t.console
    if cfg.rollout.engine != "servers":
        from paravt.backends.hf import HFBackend

        t.backend = (make_backend or HFBackend)(t.base, t.processor, max_batch=cfg.rollout_batch)
        return
    if make_backend is not None:
        raise ConfigError("make_backend serves in-process rollouts; rollout.engine servers uses the servers")
    t.servers = start_servers(cfg, t.engine, source, t.out)
    t.servers.banned_ids = list(t.renderer.banned_ids)  # servers sample from the trainer's π_τ
    sync_s = sync_weights(t.engine, t.servers, t.model, t.processor, t.out, t.run.step)
    console.print(f"[dim]rollouts on {len(t.servers.urls)} server(s): {', '.join(t.servers.urls)} "
                  f"(weights synced in {sync_s:.1f} s)[/dim]")
    if cfg.rollout.max_staleness > 0:
        t.producer = start_producer(cfg, t.samples, t.servers, t.run.step, t.engine)
        console.print(f"[dim]asynchronous rollouts: up to {cfg.rollout.max_staleness} versions behind the "
                      "policy, decoupled PPO[/dim]")


def _open_logs(t: _Trainer) -> None:
    """OUT/config.json, log.jsonl and TensorBoard (train.logging), rollouts.jsonl (back to the resumed
    step, the steps after it rolled out again; the earlier file kept whole: train.logging.resume_jsonl)."""
    from paravt.train.logging import RunLogger, resume_jsonl, resume_note

    if t.engine.main:
        t.out.mkdir(parents=True, exist_ok=True)
        (t.out / "config.json").write_text(json.dumps(to_dict(t.cfg), indent=1))
        kept_in = resume_jsonl(t.out / "rollouts.jsonl", t.run.step)
        if kept_in is not None:
            t.console.print(f"[dim]{resume_note(t.out / 'rollouts.jsonl', kept_in, t.run.step)}[/dim]", highlight=False)
    t.log = RunLogger(t.out, "grpo", resume_step=t.run.step, enabled=t.engine.main, console=t.console)
    t.rollout_file = open(t.out / "rollouts.jsonl", "a") if t.engine.main and t.cfg.log_rollouts else None


def _close(t: _Trainer) -> None:
    t.log.close()
    if t.rollout_file:
        t.rollout_file.close()
    if t.producer is not None:
        t.producer.close()
    if t.servers is not None:
        t.servers.close()
    t.engine.close()


# ----------------------------------------------------------------------------------------------
# one step


def _step(t: _Trainer) -> dict:
    """One step, stage by stage; returns its metrics (with "step": the steps done)."""
    cfg, engine, run, console = t.cfg, t.engine, t.run, t.console
    t_step = time.perf_counter()
    step = run.step
    roll = _rollout_stage(t, step)
    kept, dropped = _score_groups(cfg, roll.jobs, roll.results, t.reward_fn)
    dropped += roll.failed
    for d in dropped:
        console.print(f"[yellow]step {step + 1}: dropped a group ({d})[/yellow]")
    seqs, records, drift = _build_sequences(cfg, engine, t.renderer, kept, step)
    if drift:
        console.print(f"[yellow]step {step + 1}: {drift} episodes broke the continuation property; "
                      "trained per turn[/yellow]")
    if not engine.all_max(len(seqs)):
        why = f" (first: {dropped[0]})" if dropped else ""
        raise RuntimeError(f"step {step + 1}: no trainable sequences: every group was dropped{why}")
    kl_stats, upd = _passes_stage(t, seqs, step)
    upd = {**upd, **kl_stats}
    update_s = upd.pop("update_s")
    run.step = step = step + 1
    run.nonfinite_streak = run.nonfinite_streak + 1 if upd["skipped_updates"] == upd["updates"] else 0
    sync_s = 0.0
    if t.servers is not None:
        sync_s = sync_weights(engine, t.servers, t.model, t.processor, t.out, step, t.producer)
    all_records = engine.gather(records)
    metrics = _step_metrics(t, roll, kept, seqs, all_records, upd, drift=drift, n_dropped=len(dropped),
                            update_s=update_s, sync_s=sync_s, t_step=t_step)
    last = {"step": step, **metrics}
    _log_step(t, last, metrics, all_records)
    if run.nonfinite_streak >= cfg.max_nonfinite_steps:
        from paravt.train.checkpoint import diverged

        raise diverged(step, run.nonfinite_streak, upd["loss"], upd["grad_norm"], cfg.lr, t.out)
    run.track(metrics, cfg)
    if step % cfg.save_every == 0 or step == cfg.steps:
        _save(cfg, t.out, t.model, t.processor, t.sched, t.opt, engine, run, metrics)
    return last


@dataclass
class _Rollouts:
    """The rollout stage's result: this process's jobs and their episodes (or exceptions), the
    groups the producer dropped, and its timings."""

    jobs: list[Job]
    results: list
    failed: list[str]
    gather_s: float  # FSDP: gathering the whole weights for in-process generation
    rollout_s: float
    busy0: float  # the producer's busy seconds before the step (asynchronous rollouts)


def _rollout_stage(t: _Trainer, step: int) -> _Rollouts:
    """Rollouts with the policy in eval mode (whole weights under FSDP; the backend decodes without
    grad), in-process, on the servers, or taken from the asynchronous producer."""
    t.base.eval()
    t0 = time.perf_counter()
    busy0 = t.producer.busy() if t.producer is not None else 0.0
    jobs, results, failed, gather_s = collect_rollouts(t.cfg, t.engine, t.model, t.samples, step, t.producer,
                                                       t.servers, t.backend)
    return _Rollouts(jobs, results, failed, gather_s, time.perf_counter() - t0, busy0)


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
    (estimator steps 2–3) plus the token anchors (step 4, added by episode_sequences), the episodes'
    log records, and how many episodes drifted. With adv_norm `episode` the values are normalised
    again over the batch's episodes here."""

    shaped = shape_rewards([[bd.total for _, _, bd in g] for g in kept], cfg.reward)
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


def _passes_stage(t: _Trainer, seqs: list[TrainSequence], step: int) -> tuple[dict, dict]:
    """The advantages and the update (grpo.update.train_passes), then the lr schedule's step. With
    asynchronous rollouts and more than one optimizer step, decoupled PPO's proximal policy first:
    the weights about to be updated, fixed over the step's optimizer steps (with one, it is the
    update's own forward: see update_policy)."""
    cfg = t.cfg
    prox = t.producer is not None and (cfg.ppo_epochs > 1 or cfg.minibatches > 1)
    out = train_passes(cfg, t.engine, t.model, t.base, t.ref, t.renderer, t.opt, t.params, seqs, step,
                       decoupled=t.producer is not None, prox=prox)
    step_schedule(t.sched)
    return out


def _step_metrics(t: _Trainer, roll: _Rollouts, kept: list[list[tuple]], seqs: list[TrainSequence],
                  all_records: list[dict], upd: dict, *, drift: int, n_dropped: int, update_s: float,
                  sync_s: float, t_step: float) -> dict[str, float]:
    """The step's log (docs/rl.md): rollout metrics over every process's episodes, the update's,
    counts, and where the step's time went."""
    n_gen = sum(r["gen_tokens"] for r in all_records)
    metrics = {**rollout_metrics(all_records, t.k_choices), **upd,
               "lr": t.sched.get_last_lr()[0], "episodes": len(all_records),
               "seqs_main": sum(1 for q in seqs if q.kind == "main"),
               "seqs_sub": sum(1 for q in seqs if q.kind == "sub"),
               "drift_episodes": drift, "dropped_groups": n_dropped,
               "gen_tokens": n_gen, "rollout_tokens_per_s": n_gen / max(roll.rollout_s, 1e-9),
               "rollout_s": roll.rollout_s, "update_s": update_s, "gather_s": roll.gather_s, "sync_s": sync_s,
               "step_time_s": time.perf_counter() - t_step}
    wall = max(metrics["step_time_s"], 1e-9)
    metrics["sync_share"] = sync_s / wall
    metrics["update_busy"] = (wall - roll.rollout_s) / wall  # the trainer's share not spent waiting for rollouts
    metrics["rollout_busy"] = roll.rollout_s / wall
    if t.producer is not None:
        metrics.update(async_metrics(t.cfg, t.engine, t.producer, t.servers, kept, t.run.step - 1, roll.busy0, wall))
    return metrics


def _log_step(t: _Trainer, last: dict, metrics: dict, all_records: list[dict]) -> None:
    """Rank 0 appends the episodes to rollouts.jsonl, logs the step every log_every steps (and the
    last) and prints the warnings of a diverging run."""
    if not t.engine.main:
        return
    step, cfg = last["step"], t.cfg
    if t.rollout_file:
        for r in all_records:
            t.rollout_file.write(json.dumps(r) + "\n")
        t.rollout_file.flush()
    if step % cfg.log_every == 0 or step == cfg.steps:
        t.log.log(step, metrics, histograms={"K": [r["k"] for r in all_records if r["rollout"] == 0]})
        t.console.print(_step_line(last, cfg.steps))
    for w in t.run.warnings(metrics, cfg):
        t.console.print(f"[yellow]step {step}: {w}[/yellow]")


def _step_line(m: dict, total: int) -> str:
    ks = " ".join(f"{k.split('/')[1]}:{v:.0%}" for k, v in m.items() if k.startswith("k_frac/") and v > 0)
    return (f"step {m['step']}/{total}  R {m.get('reward', float('nan')):.3f}  acc {m.get('accuracy', 0):.2f}  "
            f"fτ {m.get('f_tau', 0):.2f}  κ {m.get('kappa', 0):.2f}  K[{ks}]  loss {m['loss']:.4f}  "
            f"kl {m.get('kl', 0.0):.4f}  H {m.get('entropy', 0.0):.3f}  {m['step_time_s']:.1f}s")


# ----------------------------------------------------------------------------------------------
# run state, save and resume


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
             "run": run.to_dict(), "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}}
    final = save_checkpoint(out, model, processor, state,
                            keep_as=f"step_{run.step:06d}" if cfg.keep_checkpoints else None, engine=engine,
                            optimizer=opt)
    if engine.main:
        prune_snapshots(out, cfg.keep_checkpoints)
        if is_best:
            snapshot(final, out / "best")
            (out / "best" / "best.json").write_text(json.dumps({"step": run.step, cfg.keep_best: value}))

