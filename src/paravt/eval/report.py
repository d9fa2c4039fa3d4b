"""Runs side by side (e.g. the four dispatch modes, or checkpoints): a table, Markdown, and a bar
plot of the headline score, mean tool calls and, where every run has it, the score by duration."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paravt.eval.metrics import headline

COLUMNS = {  # summary key -> column label (console table; the Markdown has them all)
    "n": "n", "errors": "err", "mean_tool_calls": "calls", "tool_usage_rate": "tool %",
    "parse_problem_rate": "parse %", "latency_p50_s": "p50 s", "mean_main_visual_tokens": "vis tok",
}
MORE_COLUMNS = {"answered_rate": "answered %", "latency_p90_s": "p90 s", "mean_completion_tokens": "gen tok"}


class ReportError(ValueError):
    """A run that cannot be read or an output that cannot be written; the CLI prints it as one line."""


@contextmanager
def io_errors(path: str | Path):
    """An OSError on `path` as a ReportError `<path>: <cause>`."""
    try:
        yield
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or e}") from None


@dataclass
class Run:
    label: str
    path: Path
    summary: dict
    manifest: dict


def load_run(d: str | Path) -> Run:
    d = Path(d)
    if not (d / "summary.json").is_file():
        raise ReportError(f"{d} has no summary.json (not an eval run directory, or not finished once)")
    summary = _read_json(d / "summary.json")
    manifest = _read_json(d / "manifest.json") if (d / "manifest.json").is_file() else {}
    mode = (manifest.get("episode") or {}).get("mode", "")
    label = d.name + (f" ({mode})" if mode and mode not in d.name else "")
    return Run(label, d, summary, manifest)


def _read_json(path: Path) -> dict:
    with io_errors(path):
        text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ReportError(f"{path}: not valid JSON (rerun the eval to rewrite it)") from None


def _cell(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v))


def _rows(runs: list[Run], full: bool) -> tuple[list[str], list[list[str]]]:
    cols = {**COLUMNS, **MORE_COLUMNS} if full else COLUMNS
    names = {headline(r.summary)[0] for r in runs}
    same = len(names) == 1
    head = ["run", names.pop() if same else "score"] + list(cols.values())
    rows = []
    for r in runs:
        name, value = headline(r.summary)
        score = f"{value:.1f}" if same else f"{name} {value:.1f}"
        rows.append([r.label, score] + [_cell(r.summary.get(k)) for k in cols])
    return head, rows


def _breakdown(runs: list[Run], key: str) -> tuple[list[str], list[list[str]]] | None:
    if not all(key in r.summary for r in runs):
        return None
    groups = sorted({g for r in runs for g in r.summary[key]})
    return ["run"] + groups, [[r.label] + [_cell(r.summary[key].get(g, {}).get("score")) for g in groups] for r in runs]


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def compare(dirs: list[str | Path], plot: str | Path | None = None, md: str | Path | None = None):
    """(rich tables, runs). Writes the plot (PNG) and the Markdown when paths are given."""
    from rich.table import Table

    if not dirs:
        raise ReportError("give at least one run directory")
    runs = [load_run(d) for d in dirs]
    benches = sorted({str(r.summary.get("bench") or r.manifest.get("bench") or "?") for r in runs})
    title = f"eval runs ({', '.join(benches)})"
    breakdowns = []
    for key in ("by_duration", "by_task"):
        b = _breakdown(runs, key)
        if b and len(b[0]) > 2:
            breakdowns.append((f"score {key.replace('_', ' ')}", b))
    tables = []
    for name, (head, rows) in [(title, _rows(runs, full=False))] + breakdowns:
        t = Table(title=name)
        for i, h in enumerate(head):
            t.add_column(h, no_wrap=i == 0, justify="left" if i == 0 else "right")
        for row in rows:
            t.add_row(*row)
        tables.append(t)
    if md:
        sections = [(title, _rows(runs, full=True))] + breakdowns
        with io_errors(md):
            Path(md).write_text("\n".join(f"## {name}\n\n{markdown_table(h, r)}" for name, (h, r) in sections))
    if plot:
        with io_errors(plot):
            _plot(runs, Path(plot))
    return tables, runs


def _plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    by_dur = _breakdown(runs, "by_duration")
    panels = 3 if by_dur and len(by_dur[0]) > 2 else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.8))
    names = [r.label for r in runs]
    x = np.arange(len(runs))
    metric = headline(runs[0].summary)[0]
    bars = axes[0].bar(x, [headline(r.summary)[1] for r in runs], color="tab:blue")
    axes[0].bar_label(bars, fmt="%.1f", fontsize=8)
    axes[0].set_ylabel(f"{metric} (%)")
    bars = axes[1].bar(x, [r.summary.get("mean_tool_calls", 0.0) for r in runs], color="tab:orange")
    axes[1].bar_label(bars, fmt="%.2f", fontsize=8)
    axes[1].set_ylabel("mean tool calls per sample")
    if panels == 3:
        groups = by_dur[0][1:]
        w = 0.8 / len(runs)
        for i, r in enumerate(runs):
            axes[2].bar(np.arange(len(groups)) + i * w, [r.summary["by_duration"].get(g, {}).get("score", 0.0)
                                                         for g in groups], w, label=r.label)
        axes[2].set_xticks(np.arange(len(groups)) + 0.4 - w / 2, groups)
        axes[2].set_ylabel("score by duration (%)")
        axes[2].legend(fontsize=7)
    for a in axes:
        top = max((b.get_height() for b in a.patches), default=0.0)
        a.set_ylim(0, max(1.0, 1.15 * top))  # all-zero runs still get a readable axis
    for a in axes[:2]:
        a.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:  # also when the path cannot be written: no figure left open
        plt.close(fig)


def wilson_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion `p` (0..1) over `n` samples: unlike p ± 1.96 SE
    it stays inside 0..1 and is honest at the small n of a quick run (n = 8 at 62.5 %: 31-86 %).
    For a mean of partial scores (token F1, IoU) it is the interval of that mean read as a rate, an
    approximation. n = 0 gives (0, 1): nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, p))
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
