"""The trainer's side of the rollout servers (rollout.engine `servers`): starting them, loading the
updated weights into them after each step (train.rollout does the HTTP; this decides who writes,
who asks, and what every process learns), and the asynchronous producer (train.producer) that keeps
them busy while the trainer updates, with what it adds to a step's log (docs/rl.md, "Asynchronous
rollouts").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from paravt.train.grpo.config import GRPOConfig
from paravt.train.grpo.rollouts import play_jobs
from paravt.train.grpo.schedule import plan_group

if TYPE_CHECKING:
    from paravt.data import RLSample


def start_servers(cfg: GRPOConfig, engine, source: str, out: Path):
    """Rank 0 starts (or connects to) the rollout servers; every process gets their URLs and the key
    they answer to (launched servers get a random one)."""
    from paravt.train.rollout import RolloutServers

    servers = RolloutServers.start(cfg.rollout, source, out / "servers") if engine.main else None
    urls, key = engine.broadcast((servers.urls, servers.api_key) if servers else None)
    return servers or RolloutServers(cfg.rollout, urls, api_key=key)


def start_producer(cfg: GRPOConfig, samples: list["RLSample"], servers, version: int, engine):
    """Asynchronous rollouts (train.producer) from step `version` of the schedule on. Each process
    has a producer of its own for its share of every step's prompts (positions j ≡ rank mod world, as
    in the synchronous step); its i-th group is step i div n's position mine[i mod n]."""
    from paravt.train.producer import RolloutProducer

    mine = [j for j in range(cfg.prompts_per_step) if j % engine.world == engine.rank]
    n = len(mine)
    return RolloutProducer(
        servers, cfg.rollout.max_staleness, n, version,
        pause=cfg.rollout.sync_pause,
        plan_group=lambda i: plan_group(cfg, samples, i // n, mine[i % n],
                                        number=(i // n) * cfg.prompts_per_step + mine[i % n]),
        run_group=lambda backend, readers, jobs: play_jobs(backend, readers, jobs, cfg.episode, cfg.temperature,
                                                           cfg.top_p))


def sync_weights(engine, servers, model, processor, out: Path, step: int, producer=None) -> float:
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


def async_metrics(cfg: GRPOConfig, engine, producer, servers, kept: list[list[tuple]], version: int,
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
