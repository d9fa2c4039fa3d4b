"""What a paradox campaign's runs recorded, read back: each RL run's log and rollouts, each held-out cell's rows,
and the few statistics the tables are built from (scripts/paradox.py; docs/paradox_log.md).

Every reader takes the campaign's arguments `a` (its folder `a.out`, its steps, its K) and never writes: a run
still appending to a file is read up to its last whole line.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file a run may still be appending to (its log, its rollouts, an eval cell): a line
    that does not decode (the half-written last one) is skipped, and the file is never written to."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def tenths(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    n = max(1, len(rows) // 10)
    return rows[:n], rows[-n:]


def mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    d = 1 + z * z / n
    return ((c - h) / d, (c + h) / d)


def paired_gain(a: dict[str, float], b: dict[str, float], reps: int = 4000) -> tuple[float, float, float]:
    """Mean of a − b over the questions both answered, with a 95 % paired bootstrap interval."""
    ids = sorted(set(a) & set(b))
    d = [a[i] - b[i] for i in ids]
    if not d:
        return (math.nan, math.nan, math.nan)
    rng = random.Random(0)
    boots = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(reps))
    return (sum(d) / len(d), boots[int(0.025 * reps)], boots[int(0.975 * reps) - 1])


def seed_mean(cells: list[dict[str, float]]) -> dict[str, float]:
    """Per question, the mean score over the seeds that answered it."""
    ids = set().union(*cells) if cells else set()
    return {i: mean(c.get(i) for c in cells) for i in ids}


def run_summary(a, rid: str) -> dict | None:
    """fτ, κ and κ at the largest K over the first and the last tenth of a run's steps."""
    log = [r for r in read_jsonl(a.out / "rl" / rid / "log.jsonl") if "f_tau" in r]
    if not log:
        return None
    first, last = tenths(log)
    kmax = max(a.k_choices)
    rolls = read_jsonl(a.out / "rl" / rid / "rollouts.jsonl")
    last_steps = {r["step"] for r in last}
    return {"steps": log[-1]["step"],
            "f_first": mean(r["f_tau"] for r in first), "f_last": mean(r["f_tau"] for r in last),
            "k_first": mean(r["kappa"] for r in first), "k_last": mean(r["kappa"] for r in last),
            "k_max_last": mean(r["n_parsed_calls"] for r in rolls if r.get("k") == kmax and r["step"] in last_steps)}


def eval_dir(a, model: str, mode: str, k: int) -> Path:
    return a.out / "eval" / f"{model}__{mode}__k{k}"


def cell_rows(a, model: str, mode: str, k: int) -> list[dict]:
    """An eval cell's result rows, the latest of each question (a rerun appends)."""
    return list({r["id"]: r for r in read_jsonl(eval_dir(a, model, mode, k) / "results.jsonl")}.values())


def row_score(row: dict) -> float:
    return 0.0 if row.get("error") else float(row.get("score") or 0.0)  # an error row scores 0


def scores(a, model: str, mode: str, k: int) -> dict[str, float]:
    """Question id -> score of an eval cell."""
    return {r["id"]: row_score(r) for r in cell_rows(a, model, mode, k)}


def done_scores(a, model: str, mode: str, k: int) -> dict[str, float]:
    """A cell's scores once all its questions are scored, else nothing: claims and paired gains never
    read a cell that an eval stage is still filling."""
    s = scores(a, model, mode, k)
    return s if len(s) >= a.limit else {}


def advantage_gap(a, rid: str) -> dict[int, list[float | None]]:
    """Per K and per tenth of the run: mean group advantage (the trainer's own, as logged with each
    rollout) of the rollouts that called the tool minus that of those that skipped it, within the same
    group (the paper's mechanism: at large K the gap goes to zero, then below)."""
    rolls = read_jsonl(a.out / "rl" / rid / "rollouts.jsonl")
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in rolls:
        groups.setdefault((r["step"], r["group"]), []).append(r)
    steps = a.steps  # tenths of the full run: one still training fills only its first ones
    out: dict[int, list[list[float]]] = {}
    for (step, _), g in groups.items():
        tenth = min(9, (step - 1) * 10 // max(steps, 1))
        called = [r["advantage"] for r in g if r["n_parsed_calls"] > 0]
        skipped = [r["advantage"] for r in g if r["n_parsed_calls"] == 0]
        if called and skipped:
            out.setdefault(g[0]["k"], [[] for _ in range(10)])[tenth].append(mean(called) - mean(skipped))
    return {k: [mean(c) for c in cells] for k, cells in sorted(out.items())}
