"""Concurrent, resumable evaluation over the one episode loop.

Each finished sample is appended to results.jsonl and fsynced before it is counted; a rerun
reads what is there and skips it; a half-written last line (a crash mid-write) is dropped
and that sample redone. A manifest pins the run's settings so a resume never mixes configs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from paravt.agent import EpisodeConfig, run_episode
from paravt.backends.base import Backend, BackendError
from paravt.eval.benchmarks import Sample
from paravt.eval.metrics import markdown, summarize
from paravt.rewards import accuracy_reward
from paravt.video import VideoError


class ManifestMismatch(RuntimeError):
    pass


def eval_config(**overrides) -> EpisodeConfig:
    """The paper's protocol: greedy, 2048 tokens per turn, forced final answer (SPEC §5)."""
    base = dict(temperature=0.0, max_new_tokens=2048, frames=64, max_turns=3, max_parallel=5)
    base.update(overrides)
    return EpisodeConfig(**base)


def read_results(path: Path) -> list[dict]:
    """Complete rows of results.jsonl; a torn last line is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    rows, good_end = [], 0
    pos = 0
    for line in data.split(b"\n"):
        end = pos + len(line) + 1
        if line.strip():
            try:
                rows.append(json.loads(line))
                good_end = min(end, len(data))
            except json.JSONDecodeError:
                break
        pos = end
    if good_end < len(data) and data[good_end:].strip():
        with open(path, "r+b") as f:  # drop the torn tail so appends stay line-aligned
            f.truncate(good_end)
    return rows


def _check_manifest(out: Path, manifest: dict, force: bool) -> None:
    path = out / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != manifest and not force:
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            raise ManifestMismatch(f"{out} holds a run with other settings ({', '.join(diff)}); "
                                   "use another --out or --force")
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


async def _one(backend: Backend, s: Sample, cfg: EpisodeConfig) -> dict:
    t = time.perf_counter()
    row = {"id": s.id, "bench": s.bench, "question_type": s.question_type, "answer": s.answer,
           "extras": s.extras, "error": None}
    try:
        ep = await run_episode(backend, s.video, s.question, cfg, question_type=s.question_type,
                               subtitles=s.subtitles)
        pred = ep.answer
        row.update(
            prediction=pred,
            score=accuracy_reward(pred, s.answer, s.question_type, options=s.options or None, question=s.question),
            n_calls=ep.n_parsed_calls, n_executed=ep.n_executed_calls, n_problems=ep.n_problems,
            main_visual_tokens=ep.main_visual_tokens,
            prompt_tokens=sum(t.generation.prompt_tokens for t in ep.turns),
            completion_tokens=sum(t.generation.completion_tokens for t in ep.turns)
            + sum(c.generation.completion_tokens for c in ep.subcalls() if c.generation),
            episode=ep.to_dict(),
        )
    except (VideoError, BackendError, asyncio.TimeoutError) as e:
        row.update(prediction=None, score=0.0, n_calls=0, error=f"{type(e).__name__}: {e}")
    row["latency_s"] = time.perf_counter() - t
    return row


async def run_eval_async(samples: list[Sample], backend: Backend, cfg: EpisodeConfig, out: str | Path, *,
                         concurrency: int = 4, limit: int | None = None, manifest: dict | None = None,
                         force: bool = False, progress=None, stop_after: int | None = None) -> dict:
    """Evaluate `samples` (up to `limit`), appending to out/results.jsonl; returns the summary.
    `stop_after` ends the run after that many new samples (tests use it to simulate a kill)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _check_manifest(out, {**(manifest or {}), "episode": asdict(cfg)}, force)
    todo_all = samples[:limit] if limit else samples
    results_path = out / "results.jsonl"
    done = {r["id"] for r in read_results(results_path)}
    todo = [s for s in todo_all if s.id not in done]
    task = progress.add_task("eval", total=len(todo_all), completed=len(todo_all) - len(todo)) if progress else None
    sem = asyncio.Semaphore(concurrency)
    lock = asyncio.Lock()
    new = 0
    stop = asyncio.Event()

    async def worker(s: Sample) -> None:
        nonlocal new
        if stop.is_set():
            return
        async with sem:
            if stop.is_set():
                return
            row = await _one(backend, s, cfg)
            async with lock:
                if stop.is_set():
                    return
                with open(results_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                new += 1
                if progress:
                    progress.update(task, advance=1)
                if stop_after is not None and new >= stop_after:
                    stop.set()

    await asyncio.gather(*[worker(s) for s in todo])
    return write_summary(out, {s.id for s in todo_all})


def write_summary(out: Path, ids: set[str] | None = None) -> dict:
    rows = read_results(out / "results.jsonl")
    if ids is not None:
        rows = [r for r in rows if r["id"] in ids]
    summary = summarize(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    (out / "summary.md").write_text(markdown(summary, f"eval {out.name}"))
    return summary


def run_eval(*args, **kwargs) -> dict:
    return asyncio.run(run_eval_async(*args, **kwargs))
