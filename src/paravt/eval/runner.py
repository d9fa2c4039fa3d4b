"""Concurrent, resumable evaluation over the one episode loop (paravt.agent.run_episode).

Results are never lost: each finished sample is one JSON line appended to results.jsonl and
fsynced before it is counted (paravt.eval.results). A rerun reads what is there and skips it (error
rows are retried unless told otherwise); a line torn by a crash mid-write is cut off and that sample
redone. A manifest pins the settings that change results (benchmark, model, episode config, scoring),
so a resume never mixes two configurations unless forced. Several backends (or one OpenAI backend over
several endpoints) are used at once: each episode goes to the least busy one.

The model server is checked before the run (a dead one fails it at once, nothing written), and
again after a sample's model call failed, so that the row names the cause ("cannot connect
(Connection refused)") rather than only the deadline the episode saw pass while the client retried.

A run directory that cannot be written (disk full, read-only, quota) raises OutputError naming
the file: the run stops taking samples, lets the episodes in flight end (cancelling one under a
running frame decode is unsafe), writes nothing more and keeps every row already written, so a
rerun with room resumes it. A row cut by the failing write is cut back off the file.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from paravt.agent import Episode, EpisodeConfig, run_episode
from paravt.backends.base import Backend, BackendError
from paravt.eval.benchmarks import BENCHMARKS, MissingVideo, Sample
from paravt.eval.media_root import held_video
from paravt.eval.metrics import markdown, normalized_prediction, score_prediction, summarize
from paravt.eval.results import (RESULTS, OutputError, ResultWriter, disk_errors, latest_rows, read_results,
                                 write_text, write_text_atomic)
from paravt.eval.run_dir import RunLock, input_digest, inputs_changed
from paravt.backends.reachable import check_servers, outage
from paravt.rewards import RewardConfig
from paravt.video import VideoError, VideoReader

MANIFEST = "manifest.json"


class ManifestMismatch(RuntimeError):
    """The run directory holds results made with other settings."""


class EvalAborted(RuntimeError):
    """The backend failed on too many samples in a row (a dead server): stop instead of
    writing an error row for every remaining sample."""


def eval_config(**overrides: Any) -> EpisodeConfig:
    """The paper's evaluation protocol: greedy, 2048 new tokens per turn, K = 64
    overview frames, 3 rounds with the last one a forced answer, 5 calls a turn. The forced turn
    keeps the think prefix and the whole budget (final_turn_think); with final_turn_think off it is
    the direct answer of 64 (MCQ) / 128 (grounding) tokens."""
    base: dict[str, Any] = dict(temperature=0.0, top_p=1.0, max_new_tokens=2048, frames=64, max_turns=3,
                                max_parallel=5, answer_max_new_tokens_mcq=64, answer_max_new_tokens_tvg=128)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return EpisodeConfig(**base)


# ----------------------------------------------------------------------------------------------
# manifest


def _compared(manifest: dict) -> dict:
    """The part of a manifest that must match on resume. Manifests of earlier versions kept the
    sample count at top level, had no scoring entry (token F1 was the only open-ended metric), and
    lack the episode settings added since (each added with the earlier behaviour as its default)."""
    d = {k: v for k, v in manifest.items() if k not in ("info", "n_samples")}
    d.setdefault("scoring", {"oe_metric": "f1"})
    if isinstance(d.get("episode"), dict):
        d["episode"] = {**asdict(EpisodeConfig()), **d["episode"]}
    return d


def setting_changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted setting, old value, new value) of every leaf that differs, so a refused resume names
    `episode.frames`, not a whole section."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += setting_changes(a, b, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", a, b))
    return out


def check_manifest(out: Path, manifest: dict, force: bool) -> None:
    """Write the run's manifest, or check a resumed run against it. Keys under "info" (times,
    sample counts, server URLs) may differ; everything else must match unless `force` (or the
    directory holds no result yet)."""
    path = out / MANIFEST
    new = _compared(manifest)
    if path.exists():
        try:
            with disk_errors(path):
                text = path.read_text()
            old_all = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            old_all = {}
        old = _compared(old_all)
        has_rows = bool(read_results(out / RESULTS, repair=False))
        if old == new:
            if has_rows:
                return  # same settings: keep the original manifest (its creation time)
        elif has_rows:
            if not force:
                diff = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, a, b in setting_changes(old, new))
                raise ManifestMismatch(f"{out} holds a run with other settings ({diff}); use another --out, or "
                                       "--force to mix them")
            manifest = {**manifest, "info": {**manifest.get("info", {}), "forced_over": old_all}}
    write_text_atomic(path, json.dumps(manifest, indent=1, sort_keys=True, default=str))


# ----------------------------------------------------------------------------------------------
# one sample


@dataclass
class _Pool:
    """Backends used at once; each episode takes the least busy one."""

    backends: list[Backend]
    busy: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.busy = [0] * len(self.backends)

    def take(self) -> int:
        i = min(range(len(self.backends)), key=lambda j: self.busy[j])
        self.busy[i] += 1
        return i

    def give(self, i: int) -> None:
        self.busy[i] -= 1


def sample_row(s: Sample, ep: Episode | None, error: str | None, latency_s: float, reward_cfg: RewardConfig,
               keep_ids: bool = False, backend: int = 0) -> dict:
    """The results.jsonl line of one sample."""
    row: dict[str, Any] = {"id": s.id, "bench": s.bench, "question_type": s.question_type, "answer": s.answer,
                           "video_path": s.video_path, "extras": s.extras, "backend": backend,
                           "inputs": input_digest(s)}
    if ep is not None and error is None and ep.error:
        error = ep.error
    if ep is None or error is not None:
        row.update(prediction=ep.answer if ep else None, parsed=None, score=0.0, n_calls=0, n_executed=0,
                   n_problems=0, n_turns=len(ep.turns) if ep else 0, error=error, latency_s=latency_s,
                   episode=ep.to_dict(tokens=keep_ids) if ep else None)
        return row
    gens = [t.generation for t in ep.turns]
    subs = [c.generation for c in ep.subcalls() if c.generation]
    row.update(
        prediction=ep.answer,
        parsed=normalized_prediction(ep.answer, s.question_type, s.options),
        score=score_prediction(ep.answer, s.answer, s.question_type, options=s.options, question=s.question,
                               cfg=reward_cfg),
        n_calls=ep.n_parsed_calls, n_executed=ep.n_executed_calls, n_problems=ep.n_problems, n_turns=len(ep.turns),
        error=None, latency_s=latency_s,
        main_visual_tokens=ep.main_visual_tokens, main_prompt_tokens_final=ep.main_prompt_tokens_final,
        prompt_tokens=sum(g.prompt_tokens for g in gens + subs),
        completion_tokens=sum(g.completion_tokens for g in gens + subs),
        sub_completion_tokens=sum(g.completion_tokens for g in subs),
        episode=ep.to_dict(tokens=keep_ids),
    )
    return row


async def _run_sample(pool: _Pool, s: Sample, cfg: EpisodeConfig, reward_cfg: RewardConfig,
                      keep_ids: bool, timeout_s: float | None, media_root: Path | None = None) -> tuple[dict, bool]:
    """(row, backend_failed). Failures of the sample's own video (one outside `media_root` too) or
    of the model, and a sample that outlives `timeout_s`, become an error row; anything else is a bug
    and propagates."""
    i = pool.take()
    t0 = time.perf_counter()
    ep, error, backend_failed, detail = None, None, False, None
    try:
        video = await asyncio.to_thread(held_video, media_root, s.video_path)  # where a row's video is opened
        if media_root is not None:  # opened here, checked as opened: the episode reads this descriptor
            video = await asyncio.to_thread(VideoReader, video, timeout_s=cfg.model_timeout_s, media_root=media_root)
        try:
            ep = await asyncio.wait_for(
                run_episode(pool.backends[i], video, s.question, cfg, question_type=s.question_type,
                            subtitles=s.subtitles), timeout_s)
        finally:
            if isinstance(video, VideoReader):
                video.close()
    except VideoError as e:
        error = f"VideoError: {e}"
    except BackendError as e:
        error, backend_failed = f"BackendError: {e}", True
        cause = await outage(pool.backends[i])  # the episode saw a deadline pass; was the server there?
        if cause is not None:
            error, detail = f"BackendError: {cause}", error
    except asyncio.TimeoutError:
        error = f"TimeoutError: the episode took longer than {timeout_s} s"
    finally:
        pool.give(i)
    if ep is not None and ep.error:  # the main agent's model returned an error completion
        backend_failed = True
    row = sample_row(s, ep, error, time.perf_counter() - t0, reward_cfg, keep_ids, i)
    if detail is not None:
        row["error_detail"] = detail
    return row, backend_failed


# ----------------------------------------------------------------------------------------------
# the run


BackendsArg = Backend | Sequence[Backend] | Callable[[], Backend | Sequence[Backend]]


def _make_progress(progress):
    if progress is True:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn()), True
    return (progress or None), False


def _run_manifest(bench, model, config: EpisodeConfig, reward_cfg: RewardConfig, manifest: dict | None,
                  n_samples: int, n_missing: int) -> dict:
    """What a rerun must match to resume into the same folder (check_manifest), and what it ran on."""
    extra = manifest or {}
    return {"bench": bench, "model": model, "episode": asdict(config), "scoring": {"oe_metric": reward_cfg.oe_metric},
            **{k: v for k, v in extra.items() if k != "info"},
            "info": {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "n_samples": n_samples,
                     "missing_videos": n_missing, **extra.get("info", {})}}


def finished_ids(done: dict[str, dict], targets: Sequence[Sample], retry_errors: bool) -> tuple[set[str], int]:
    """The ids whose rows stand (not an error to retry, the same inputs as now), and how many rows
    were left for their sample's inputs having changed."""
    finished, changed = set(), 0
    for s in targets:
        row = done.get(s.id)
        if row is None or (retry_errors and row.get("error")):
            continue
        if inputs_changed(row, s):
            changed += 1
        else:
            finished.add(s.id)
    return finished, changed


async def _preflight(out: Path, man: dict, pool: "_Pool", targets: list, missing: Sequence[MissingVideo],
                     force: bool, retry_errors: bool) -> None:
    """Servers checked (only when samples are left to run), the folder made, the manifest matched,
    the missing videos listed: every way the run can fail at once fails here, before a row is written."""
    done = latest_rows(read_results(out / RESULTS, repair=False))
    if len(finished_ids(done, targets, retry_errors)[0]) < len(targets):
        for b in pool.backends:
            await check_servers(b)
    with disk_errors(out):
        out.mkdir(parents=True, exist_ok=True)
    check_manifest(out, man, force)
    write_text(out / "missing_videos.jsonl", "".join(json.dumps(asdict(m)) + "\n" for m in missing))


@dataclass
class _Tally:
    """The running score of the progress bar: an error row counts as 0."""

    n: int = 0
    score: float = 0.0
    err: int = 0

    def add(self, row: dict) -> None:
        self.n += 1
        self.score += 0.0 if row.get("error") else float(row.get("score") or 0)
        self.err += bool(row.get("error"))

    def status(self) -> str:
        return f"score {100 * self.score / max(self.n, 1):.1f}% · errors {self.err}"


@dataclass
class _Run:
    """One run's shared state. Its workers take samples from `todo`, write each row before it counts,
    and take no more once `stop` is set: a failed write, `stop_after` rows, or `max_streak` samples in
    a row on which the model failed (a dead server)."""

    pool: _Pool
    config: EpisodeConfig
    reward_cfg: RewardConfig
    keep_ids: bool
    timeout_s: float | None
    todo: deque
    writer: ResultWriter
    tally: _Tally
    stop_after: int | None
    max_streak: int
    media_root: Path | None = None
    prog: Any = None
    task: Any = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    new: int = 0
    claimed: int = 0
    streak: int = 0
    last_error: str = ""

    @property
    def aborted(self) -> bool:
        return self.streak >= self.max_streak

    def stop_writing(self, e: OutputError) -> None:
        """Stop taking samples; the episodes in flight end on their own (see the module docstring)."""
        if not self.stop.is_set() and self.prog is not None:
            from rich.markup import escape

            self.prog.update(self.task, status=f"[red]cannot write {escape(str(e))}[/red]: ending the episodes "
                                               "in flight")
        self.stop.set()

    async def worker(self) -> None:
        while self.todo and not self.stop.is_set():
            s = self.todo.popleft()
            row, backend_failed = await _run_sample(self.pool, s, self.config, self.reward_cfg, self.keep_ids,
                                                    self.timeout_s, self.media_root)
            if self.stop_after is not None:
                if self.claimed >= self.stop_after:
                    return  # simulated kill: what was in flight is lost, as in a real one
                self.claimed += 1  # claimed before the write yields, so two workers cannot both pass
            try:
                await self.writer.write(row)  # on disk before it counts
            except OutputError as e:
                self.stop_writing(e)
                return
            self._count(row, backend_failed)

    def _count(self, row: dict, backend_failed: bool) -> None:
        self.new += 1
        self.tally.add(row)
        self.streak = self.streak + 1 if backend_failed else 0
        if backend_failed:
            self.last_error = row["error"]
        if self.prog is not None:
            self.prog.update(self.task, advance=1, status=self.tally.status())
        if (self.stop_after is not None and self.new >= self.stop_after) or self.aborted:
            self.stop.set()


def _open_pool(backends: BackendsArg) -> tuple[_Pool, bool]:
    """(the pool, whether its backends were made here from a factory and are to be closed here)."""
    created = not isinstance(backends, Backend) and callable(backends)
    made = backends() if created else backends
    pool = _Pool([made] if isinstance(made, Backend) else list(made))
    if not pool.backends:
        raise ValueError("no backend given")
    return pool, created


async def _close_pool(pool: _Pool, created: bool) -> None:
    if created:
        for b in pool.backends:
            await b.aclose()


async def _run_workers(run: _Run, n: int) -> None:
    """`n` workers until the samples are done or the run stops; an exception in one (a bug in a
    sample) stops the others before it propagates, so the file is closed after every write ended."""
    tasks = [asyncio.create_task(run.worker()) for _ in range(n)]
    try:
        finished_tasks, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in finished_tasks:
            if t.exception() is not None:
                raise t.exception()
    finally:
        for t in tasks:
            t.cancel()


async def _drive(run: _Run, progress: Any, title: str, total: int, concurrency: int, changed: int) -> None:
    """The run's samples through its workers, under a progress bar when asked; closes the results file."""
    prog, own_prog = _make_progress(progress)
    try:
        if prog is not None:
            if own_prog:
                prog.start()
            run.prog = prog
            run.task = prog.add_task(title, total=total, completed=total - len(run.todo), status=run.tally.status())
            if changed:
                prog.console.print(f"[yellow]{changed} sample(s) changed since they were scored (question, answer "
                                   "or video): running them again[/yellow]")
        await _run_workers(run, min(concurrency, max(len(run.todo), 1)))
    finally:
        run.writer.close()
        if own_prog:
            prog.stop()


async def run_eval_async(
    samples: Sequence[Sample],
    backends: BackendsArg,
    config: EpisodeConfig,
    out_dir: str | Path,
    *,
    concurrency: int = 4,
    limit: int | None = None,
    progress: Any = None,
    model: str | None = None,
    manifest: dict | None = None,
    force: bool = False,
    missing: Sequence[MissingVideo] = (),
    retry_errors: bool = True,
    reward_cfg: RewardConfig | None = None,
    keep_token_ids: bool = False,
    max_consecutive_backend_errors: int = 20,
    sample_timeout_s: float | None = 1800.0,
    stop_after: int | None = None,
    media_root: str | Path | None = None,
) -> dict:
    """Evaluate `samples[:limit]` into out_dir; returns the summary (also written as
    summary.json / summary.md).

    backends: one Backend, several (used at once), or a zero-argument factory called inside the
    event loop (what it builds is closed at the end). progress: True for a rich bar, or a rich
    Progress to add a task to. missing: samples skipped for want of a video (reported).
    sample_timeout_s: an episode running longer becomes an error row (retried on rerun) instead
    of stalling the run.
    stop_after: end the run after that many new rows (tests use it to simulate a kill).
    media_root: open only videos under this folder (eval.media_root); a row naming another file is
    that sample's error row.
    When samples are left to run, each backend's model servers are checked first (servers.py): a
    backend none of whose servers answers raises BackendError before anything is written."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    reward_cfg = reward_cfg or RewardConfig()
    out = Path(out_dir)
    targets = list(samples[:limit] if limit is not None else samples)
    bench = targets[0].bench if targets else (samples[0].bench if samples else (manifest or {}).get("bench"))
    man = _run_manifest(bench, model, config, reward_cfg, manifest, len(samples), len(missing))
    pool, created = _open_pool(backends)
    try:  # before anything is written: a dead server fails the run at once, with its cause
        await _preflight(out, man, pool, targets, missing, force, retry_errors)
        lock = RunLock(out).acquire()  # one run writes here at a time
    except BaseException:
        await _close_pool(pool, created)
        raise
    try:
        done = latest_rows(read_results(out / RESULTS))
        finished, changed = finished_ids(done, targets, retry_errors)
        tally = _Tally()
        for s in targets:
            if s.id in finished:
                tally.add(done[s.id])
        run = _Run(pool, config, reward_cfg, keep_token_ids, sample_timeout_s,
                   deque(s for s in targets if s.id not in finished), ResultWriter(out / RESULTS), tally, stop_after,
                   max_consecutive_backend_errors, Path(media_root) if media_root is not None else None)
        await _drive(run, progress, f"{bench} · {config.mode}", len(targets), concurrency, changed)
    finally:
        lock.release()
        await _close_pool(pool, created)
    if run.writer.failed is not None:
        raise run.writer.failed
    if run.aborted:
        raise EvalAborted(f"the model failed on {run.streak} samples in a row (last: {run.last_error}); results so "
                          f"far are in {out / RESULTS}; rerun to resume")
    events = [e for b in pool.backends for e in getattr(b, "endpoint_events", [])]
    return write_summary(out, [s.id for s in targets], bench=bench, missing=len(missing), endpoint_events=events,
                         inputs_changed=changed)


def write_summary(out: str | Path, ids: Sequence[str] | None = None, bench: str | None = None,
                  missing: int | None = None, endpoint_events: list[dict] | None = None,
                  inputs_changed: int | None = None) -> dict:
    """Summarise results.jsonl (the latest row of each id in `ids`, or all) into summary.json/md;
    `endpoint_events`: model servers this run took out of the rotation (and back), named in both;
    `inputs_changed`: samples this run scored again because their inputs changed (run_dir)."""
    out = Path(out)
    rows_by_id = latest_rows(read_results(out / RESULTS, repair=False))
    rows = [rows_by_id[i] for i in ids if i in rows_by_id] if ids is not None else list(rows_by_id.values())
    if bench is None and rows:
        bench = rows[0].get("bench")
    spec = BENCHMARKS.get(bench or "")
    summary = summarize(rows, spec.breakdowns if spec else ("duration", "task"), spec.headline if spec else None)
    summary["bench"] = bench
    if ids is not None:
        summary["pending"] = len(ids) - len(rows)
    if missing is not None:
        summary["missing_videos"] = missing
    if endpoint_events:
        summary["endpoint_events"] = endpoint_events
    if inputs_changed is not None:
        summary["inputs_changed"] = inputs_changed
    write_text(out / "summary.json", json.dumps(summary, indent=1, sort_keys=True))
    write_text(out / "summary.md", markdown(summary, f"{bench or 'eval'} · {out.name}"))
    return summary


def run_eval(samples: Sequence[Sample], backends: BackendsArg, config: EpisodeConfig, out_dir: str | Path,
             **kwargs: Any) -> dict:
    """`run_eval_async` in a fresh event loop (scripts, tests)."""
    return asyncio.run(run_eval_async(samples, backends, config, out_dir, **kwargs))
