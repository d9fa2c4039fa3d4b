"""Side-by-side comparison of eval runs (e.g. the four dispatch modes), as a table and a bar plot."""

from __future__ import annotations

import json
from pathlib import Path

from paravt.eval.metrics import headline

COLUMNS = {"n": "n", "errors": "err", "mean_tool_calls": "calls", "tool_usage_rate": "tool %",
           "parse_problem_rate": "parse %", "latency_p50_s": "p50 s", "mean_main_visual_tokens": "vis tok"}


def load_run(d: Path) -> tuple[str, dict]:
    summary = json.loads((d / "summary.json").read_text())
    manifest = json.loads((d / "manifest.json").read_text()) if (d / "manifest.json").exists() else {}
    mode = manifest.get("episode", {}).get("mode", "")
    return f"{d.name}" + (f" ({mode})" if mode and mode not in d.name else ""), summary


def compare(dirs: list[str | Path], plot: str | Path | None = None):
    from rich.table import Table

    runs = [load_run(Path(d)) for d in dirs]
    table = Table(title="eval runs")
    table.add_column("run", no_wrap=True)
    table.add_column("score", no_wrap=True)
    for label in COLUMNS.values():
        table.add_column(label)
    for name, s in runs:
        metric, value = headline(s)
        table.add_row(name, f"{metric} {value:.1f}", *[f"{s.get(c, 0):.1f}" if isinstance(s.get(c), float)
                                                        else str(s.get(c, "")) for c in COLUMNS])
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        names = [n for n, _ in runs]
        a1.bar(names, [headline(s)[1] for _, s in runs], color="tab:blue")
        a1.set_ylabel(headline(runs[0][1])[0] + " (%)")
        a2.bar(names, [s.get("mean_tool_calls", 0) for _, s in runs], color="tab:orange")
        a2.set_ylabel("mean tool calls")
        for a in (a1, a2):
            a.tick_params(axis="x", rotation=20, labelsize=8)
        fig.tight_layout()
        fig.savefig(plot, dpi=110)
        plt.close(fig)
    return table, runs
