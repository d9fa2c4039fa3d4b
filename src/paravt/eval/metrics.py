"""Scoring one prediction and summarising a run (how benchmarks' own scorers differ: docs/lmms_eval.md).

Accuracy (MCQ, open-ended) or mIoU with R@0.3/0.5/0.7 (grounding), tool use, parse problems,
errors, latency percentiles and token counts, with breakdowns by duration class / task / subject.
A sample that failed (error row) counts as wrong in every score, so errors can never raise a
figure; its latency and tokens are left out of those statistics.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from paravt.rewards import RewardConfig, accuracy_reward, mcq_letter, parse_span

RECALL_IOUS = (0.3, 0.5, 0.7)
TOP_CAUSES = 5  # error causes kept in a summary, most frequent first


def score_prediction(prediction: str | None, answer: str, question_type: str, *, options: list[str] | None = None,
                     question: str = "", cfg: RewardConfig | None = None) -> float:
    """R_acc of docs/rewards.md (the same function the trainer rewards with): option-letter match for
    MCQ, temporal IoU of the first span for grounding, token F1 (or exact / judge) for open-ended."""
    return float(accuracy_reward(prediction, answer, question_type, cfg, options=options or None, question=question))


def normalized_prediction(prediction: str | None, question_type: str, options: list[str] | None = None):
    """What the scorer read from the prediction (a letter, a [s, e] span, or the text): kept in
    results.jsonl so a wrong score can be traced to the extraction or to the model."""
    if question_type == "mcq":
        return mcq_letter(prediction, options or None)
    if question_type == "tvg":
        span = parse_span(prediction)
        return list(span) if span else None
    return prediction


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _groups(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def row_score(row: dict) -> float:
    """A results.jsonl row's score; a failed sample (error row) scores 0."""
    return 0.0 if row.get("error") else float(row.get("score") or 0.0)


def paired_gain(base: dict[str, float], new: dict[str, float], resamples: int = 4000,
                seed: int = 0) -> tuple[float, float, float, int]:
    """(mean of new − base, 95 % interval low, high, n) over the sample ids both runs scored: a paired
    percentile bootstrap (seeded), so the question-to-question variance both runs share drops out of the
    interval of their difference. NaNs and n = 0 when no id is shared."""
    ids = sorted(set(base) & set(new))
    if not ids:
        return math.nan, math.nan, math.nan, 0
    d = np.array([new[i] - base[i] for i in ids])
    boot = np.random.default_rng(seed).choice(d, size=(resamples, len(d))).mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi), len(d)


def error_cause(row: dict) -> str:
    """A row's error with its own video's path taken out, so that one failure on many samples
    (an unreadable video format, a server gone) counts as one cause."""
    error = str(row.get("error") or "")
    video = row.get("video_path")
    return (error.replace(str(video), "<video>") if video else error)[:300]


def summarize(rows: list[dict], breakdowns: tuple[str, ...] = ("duration", "task"),
              headline: str | None = None) -> dict:
    """Summary of results.jsonl rows (one per sample). Percentages are in %, 0..100.

    breakdowns: extras keys (or "question_type") to break the score down by; a list-valued key
    (LVBench's categories) counts the sample in each of its groups, as the official script does."""
    n = len(rows)
    ok = [r for r in rows if not r.get("error")]
    score = [row_score(r) for r in rows]
    out: dict = {"n": n, "errors": n - len(ok), "error_rate": 100 * (n - len(ok)) / n if n else 0.0}
    causes = Counter(error_cause(r) for r in rows if r.get("error"))
    out["error_causes"] = dict(causes.most_common(TOP_CAUSES))  # a dict: left out of the metric tables
    by_type: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(rows, score):
        by_type[r.get("question_type", "mcq")].append(s)
    acc = by_type.get("mcq", []) + by_type.get("oe", [])
    if acc:
        out["accuracy"] = 100 * _mean(acc)
    if by_type.get("tvg"):
        ious = by_type["tvg"]
        out["miou"] = 100 * _mean(ious)
        for k in RECALL_IOUS:
            out[f"r@{k}"] = 100 * _mean([s >= k for s in ious])
    out["score"] = 100 * _mean(score)
    out["answered_rate"] = 100 * _mean([r.get("prediction") is not None for r in ok]) if ok else 0.0
    calls = [int(r.get("n_calls") or 0) for r in ok]
    out["mean_tool_calls"] = _mean(calls)
    out["mean_executed_calls"] = _mean([int(r.get("n_executed") or 0) for r in ok])
    out["tool_usage_rate"] = 100 * _mean([c > 0 for c in calls])
    out["parse_problem_rate"] = 100 * _mean([int(r.get("n_problems") or 0) > 0 for r in ok])
    out["mean_turns"] = _mean([int(r.get("n_turns") or 0) for r in ok])
    lat = [float(r.get("latency_s") or 0.0) for r in ok]
    for q in (50, 90, 99):
        out[f"latency_p{q}_s"] = _pct(lat, q)
    for key in ("main_visual_tokens", "prompt_tokens", "completion_tokens"):
        out[f"mean_{key}"] = _mean([float(r.get(key) or 0) for r in ok])
    for key in breakdowns:
        buckets: dict[str, list[float]] = defaultdict(list)
        for r, s in zip(rows, score):
            value = r.get("question_type") if key == "question_type" else (r.get("extras") or {}).get(key)
            for g in _groups(value):
                buckets[g].append(s)
        if buckets:
            out[f"by_{key}"] = {g: {"n": len(v), "score": 100 * _mean(v)} for g, v in sorted(buckets.items())}
    if headline == "task_mean_accuracy" and "by_task" in out:  # MLVU's M-Avg: the mean of per-task accuracies
        out["task_mean_accuracy"] = _mean([d["score"] for d in out["by_task"].values()])
    metric = headline if headline in out else next(m for m in ("accuracy", "miou", "score") if m in out)
    out["headline"] = {"metric": metric, "value": out[metric]}
    return out


HEADLINE_NAMES = {"accuracy": "accuracy", "miou": "mIoU", "task_mean_accuracy": "M-Avg", "score": "score"}


def headline(summary: dict) -> tuple[str, float]:
    h = summary.get("headline") or {}
    metric = h.get("metric") or next((m for m in ("accuracy", "miou", "score") if m in summary), "score")
    return HEADLINE_NAMES.get(metric, metric), float(summary.get(metric, h.get("value", 0.0)))


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def flat_items(summary: dict) -> list[tuple[str, str]]:
    return [(k, _fmt(v)) for k, v in summary.items() if not isinstance(v, (dict, list))]


def score_line(summary: dict, bold: str = "") -> str:
    """The headline with what it is over: 'accuracy: 66.67 over 6 samples, 2 of them failed (scored 0)'
    (or '..., no errors'); `bold` wraps the headline (markdown's '**'). A score that counts failures as
    wrong answers must say so where it is read."""
    name, value = headline(summary)
    n, errors = summary.get("n", 0), summary.get("errors", 0)
    failed = f"{errors} of them failed (scored 0)" if errors else "no errors"
    return f"{bold}{name}: {value:.2f}{bold} over {n} sample{'s' if n != 1 else ''}, {failed}"


def endpoint_lines(summary: dict) -> list[str]:
    """Model servers taken out of the rotation during the run (no answer), and whether they came back."""
    lines = []
    for e in summary.get("endpoint_events") or []:
        if e.get("event") == "out":
            lines.append(f"{e['endpoint']} was taken out of the rotation at {e.get('time', '?')} ({e.get('why', '')})")
        else:
            lines.append(f"{e['endpoint']} answered its health check again at {e.get('time', '?')}: back in the rotation")
    return lines


def markdown(summary: dict, title: str) -> str:
    lines = [f"# {title}", "", score_line(summary, bold="**")]
    lines += [f"- {line}" for line in endpoint_lines(summary)]
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in flat_items(summary)]
    for key, groups in summary.items():
        if key.startswith("by_") and isinstance(groups, dict):
            lines += ["", f"## {key[3:].replace('_', ' ')}", "", "| group | n | score |", "|---|---|---|"]
            lines += [f"| {g} | {d['n']} | {d['score']:.2f} |" for g, d in groups.items()]
    return "\n".join(lines) + "\n"


def summary_tables(summary: dict, title: str) -> list:
    """Rich tables: the metrics, then one per breakdown."""
    from rich.table import Table

    main = Table(title=f"{title} · {score_line(summary)}")
    main.add_column("metric")
    main.add_column("value", justify="right")
    for k, v in flat_items(summary):
        main.add_row(k, v)
    tables = [main]
    for key, groups in summary.items():
        if key.startswith("by_") and isinstance(groups, dict):
            t = Table(title=key.replace("_", " "))
            for c in ("group", "n", "score"):
                t.add_column(c, justify="left" if c == "group" else "right")
            for g, d in groups.items():
                t.add_row(g, str(d["n"]), f"{d['score']:.2f}")
            tables.append(t)
    return tables
