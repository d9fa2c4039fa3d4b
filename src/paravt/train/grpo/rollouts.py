"""Rollouts of a step: the planned jobs played through `run_episode` (the loop `ask` and `eval` use,
DESIGN: one episode loop) at the rollout temperature, in-process or on the rollout servers or from
the asynchronous producer; what the logs keep of each episode; the step's rollout metrics (fτ, κ,
the K mix). Failed episodes come back as their exceptions: the caller drops their groups.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from paravt.agent import EpisodeConfig
from paravt.aio import run
from paravt.train.grpo.config import GRPOConfig
from paravt.train.grpo.schedule import Job, plan_jobs

if TYPE_CHECKING:
    from paravt.agent import Episode
    from paravt.data import RLSample


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
        "stopped_on_bad_call": ep.stopped_on_bad_call is not None,
        "gen_tokens": sum(c.completion_tokens for c in ep.model_calls()),
        "main_texts": ep.main_texts(),
        "versions": sorted({int(c.weight_version) for c in ep.model_calls() if c.weight_version is not None}),
    }


def rollout_metrics(records: list[dict], k_choices: list[int]) -> dict[str, float]:
    """Step metrics of the rollouts: mean reward and terms, fτ (mean format reward), κ (tool calls
    per rollout), accuracy, parse-problem rate, episodes an unreadable call ended (episode.on_bad_call:
    end), K distribution, share of zero-signal groups."""
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
        "stopped_on_bad_call_rate": sum(1 for r in records if r.get("stopped_on_bad_call")) / n,
        "zero_signal_groups": sum(1 for g in groups.values() if max(g) - min(g) < 1e-9) / len(groups),
        "k_mean": sum(ks.values()) / len(ks),
    }
    for k in k_choices:
        out[f"k_frac/{k}"] = sum(1 for v in ks.values() if v == k) / len(ks)
    return out


def collect_rollouts(cfg: GRPOConfig, engine, model, samples: list["RLSample"], step: int, producer, servers,
                     backend) -> tuple[list[Job], list, list[str], float]:
    """This process's jobs of `step` and their episodes (or exceptions), the groups the producer
    dropped, and the seconds spent gathering the weights: from the asynchronous producer (finished
    groups, at most max_staleness versions old), the servers, or the in-process backend."""
    if producer is not None:
        groups, failed = producer.take(step)
        return [j for g in groups for j in g.jobs], [r for g in groups for r in g.results], failed, 0.0
    jobs = plan_jobs(cfg, samples, step, engine.world, engine.rank)
    if servers is not None:
        results = run(run_rollouts(servers.backend(), jobs, cfg.episode, cfg.temperature, cfg.top_p))
        check_served(results, servers, step)
        return jobs, results, [], 0.0
    with engine.gathered(model) as gather_s:
        results = run(run_rollouts(backend, jobs, cfg.episode, cfg.temperature, cfg.top_p))
    return jobs, results, [], gather_s


def check_served(results: list, servers, step: int) -> None:
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
