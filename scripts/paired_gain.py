"""The gain of one eval run over another on the same questions, with a 95 % paired bootstrap interval,
over all the questions both scored and, with --by KEY, over each group of an extras key (SynthVT's
`needs_event`: the event questions, true, against the background-colour controls, false). Reads the
two runs' results.jsonl; prints a markdown table.

    python scripts/paired_gain.py runs/needs_event/sft__k4 runs/needs_event/rl__k4 --by needs_event
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paravt.eval.metrics import paired_gain, row_score
from paravt.eval.runner import latest_rows, read_results


def scores(run: Path, key: str | None) -> dict[str, tuple[float, str, int]]:
    """{sample id: (score, its group under `key`, crops run)} of a run's latest rows."""
    rows = latest_rows(read_results(run / "results.jsonl", repair=False))
    if not rows:
        raise SystemExit(f"error: no results.jsonl rows in {run}")
    return {i: (row_score(r), str((r.get("extras") or {}).get(key)) if key else "all", int(r.get("n_executed") or 0))
            for i, r in rows.items()}


def table(base: Path, new: Path, key: str | None, resamples: int = 4000) -> list[str]:
    a, b = scores(base, key), scores(new, key)
    groups = ["all"] + (sorted({v[1] for v in a.values()}) if key else [])
    lines = [f"| questions | n | {base.name} | {new.name} | gain, points [95 % paired bootstrap] | crops run a question |",
             "|---|---|---|---|---|---|"]
    for g in groups:
        sa = {i: v for i, v in a.items() if g == "all" or v[1] == g}
        sb = {i: v for i, v in b.items() if g == "all" or v[1] == g}
        mean, lo, hi, n = paired_gain({i: v[0] for i, v in sa.items()}, {i: v[0] for i, v in sb.items()}, resamples)
        if n == 0:
            continue
        both = set(sa) & set(sb)
        acc_a, acc_b = (100 * sum(x[i][0] for i in both) / n for x in (sa, sb))
        crops_a, crops_b = (sum(x[i][2] for i in both) / n for x in (sa, sb))
        label = "all" if g == "all" else f"{key} = {g}"
        lines.append(f"| {label} | {n} | {acc_a:.1f} | {acc_b:.1f} | {100 * mean:+.1f} [{100 * lo:+.1f}, "
                     f"{100 * hi:+.1f}] | {crops_a:.2f} / {crops_b:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", type=Path, help="the run gained over (e.g. the SFT start's eval)")
    p.add_argument("new", type=Path, help="the run whose gain is measured")
    p.add_argument("--by", default=None, help="an extras key to split by (SynthVT: needs_event, task)")
    p.add_argument("--resamples", type=int, default=4000)
    a = p.parse_args()
    print("\n".join(table(a.base, a.new, a.by, a.resamples)))


if __name__ == "__main__":
    main()
