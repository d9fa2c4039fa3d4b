"""Summary metrics of an eval run (SPEC §5): accuracy or mIoU with R@k, tool use, errors, latency."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def _pct(values, q):
    return float(np.percentile(values, q)) if values else 0.0


def summarize(results: list[dict]) -> dict:
    """`results`: rows of results.jsonl (score, question_type, n_calls, ...)."""
    ok = [r for r in results if not r.get("error")]
    out: dict = {"n": len(results), "errors": len(results) - len(ok)}
    mcq = [r["score"] for r in ok if r["question_type"] in ("mcq", "oe")]
    tvg = [r["score"] for r in ok if r["question_type"] == "tvg"]
    if mcq:
        out["accuracy"] = 100 * float(np.mean(mcq))
    if tvg:
        out["miou"] = 100 * float(np.mean(tvg))
        for k in (0.3, 0.5, 0.7):
            out[f"r@{k}"] = 100 * float(np.mean([s >= k for s in tvg]))
    calls = [r.get("n_calls", 0) for r in ok]
    out["mean_tool_calls"] = float(np.mean(calls)) if calls else 0.0
    out["tool_usage_rate"] = 100 * float(np.mean([c > 0 for c in calls])) if calls else 0.0
    out["parse_problem_rate"] = 100 * float(np.mean([r.get("n_problems", 0) > 0 for r in ok])) if ok else 0.0
    lat = [r.get("latency_s", 0.0) for r in ok]
    out["latency_p50_s"], out["latency_p90_s"], out["latency_p99_s"] = _pct(lat, 50), _pct(lat, 90), _pct(lat, 99)
    for key in ("main_visual_tokens", "prompt_tokens", "completion_tokens"):
        vals = [r.get(key, 0) for r in ok]
        out[f"mean_{key}"] = float(np.mean(vals)) if vals else 0.0
    for group in ("duration", "task"):
        buckets = defaultdict(list)
        for r in ok:
            g = (r.get("extras") or {}).get(group)
            if g is not None:
                buckets[str(g)].append(r["score"])
        if len(buckets) > 1 or (buckets and group == "duration"):
            out[f"by_{group}"] = {g: {"n": len(v), "score": 100 * float(np.mean(v))} for g, v in sorted(buckets.items())}
    return out


def headline(summary: dict) -> tuple[str, float]:
    if "accuracy" in summary:
        return "accuracy", summary["accuracy"]
    if "miou" in summary:
        return "mIoU", summary["miou"]
    return "score", 0.0


def markdown(summary: dict, title: str) -> str:
    lines = [f"# {title}", "", "| metric | value |", "|---|---|"]
    for k, v in summary.items():
        if isinstance(v, dict):
            continue
        lines.append(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")
    for group in ("by_duration", "by_task"):
        if group in summary:
            lines += ["", f"## {group.replace('_', ' ')}", "", "| group | n | score |", "|---|---|---|"]
            for g, d in summary[group].items():
                lines.append(f"| {g} | {d['n']} | {d['score']:.2f} |")
    return "\n".join(lines) + "\n"
