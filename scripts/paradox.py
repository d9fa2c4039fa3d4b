"""The paper's Table 2 on the paradox testbed (docs/paradox.md), end to end and resumable.

From the testbed's cold start (scripts/paradox_testbed.py: a base with its own tool habit, then a
short SFT onto paravt's format from an oracle that crops at every K), the RL runs of SPEC §5 Table 2:

    block A  vanilla GRPO (the release's: no gating, no anchoring, think prefix and answer suffix off),
             PARA-GRPO                                                      two seeds each
    block B  anchoring only (PARA-GRPO without gating), gating only (without anchoring),
             PARA-GRPO − R_tool (reward.w_tool=0), PARA-GRPO − γ (reward.gamma=0)     one seed each
    block C  the first PARA-GRPO seed's checkpoint dispatched parallel, sequential, inline, none
    after    PARA-GRPO under vanilla's prompt settings (no think prefix, no answer suffix)   one seed

Every block B run differs from PARA-GRPO in the component it names and nothing else: its prompt
keeps the think prefix and the answer suffix. Vanilla differs from PARA-GRPO in gating, anchoring
and those two prompt settings, as the public release's baseline does; its fτ at the first steps
shows what the prompt settings alone do (docs/paradox.md).

    python scripts/paradox.py --stage train --jobs 2        # the RL runs, two at a time
    python scripts/paradox.py --stage eval                  # held-out accuracy of each model
    python scripts/paradox.py --stage doc                   # tables, curves, claims -> docs/paradox.md
    python scripts/paradox.py --stage status                # where each run and eval cell stands

`--testbed gap` runs the second testbed's 2×2 instead (docs/paradox.md, issue #37): short vanilla GRPO
runs from {cold_400 (`paradox-cold`), the skip cold start (`--skip-cold`, scripts/paradox_testbed.py
--stage skip)} × {paravt's reward, the release's (`reward.release_compat=true`)}, 100 steps by default,
into runs/paradox_gap, its tables between their own markers in docs/paradox.md:

    python scripts/paradox.py --testbed gap --stage train --jobs 2
    python scripts/paradox.py --testbed gap --stage eval
    python scripts/paradox.py --testbed gap --stage doc

Another skip cold start's vanilla pair goes into its own folder and section (`--out`, `--skip-label`), e.g.
the skip rows' SFT on top of cold_400 (scripts/paradox_testbed.py --skip-start paradox-cold):

    python scripts/paradox.py --testbed gap --skip-cold runs/paradox_testbed/skiponcold_200 \
        --skip-label "skip-on-cold start" --out runs/paradox_gap_oncold --runs van_skip,van_skip_rel --stage train

`--testbed collapse` runs blocks A and B again on the 2×2's condition whose vanilla run loses its tools
(the skip cold start under the release's reward), into runs/paradox_collapse, under their own markers:

    python scripts/paradox.py --testbed collapse --cold runs/paradox_testbed/skipcold_400 \
        --set reward.release_compat=true --stage train --jobs 2

A campaign on another condition goes into its own folder, section and figures (`--out`), e.g. with calls read
as the release reads them (`episode.on_bad_call=end`):

    python scripts/paradox.py --testbed collapse --cold runs/paradox_testbed/skipcold_400 \
        --set reward.release_compat=true --set episode.on_bad_call=end --out runs/paradox_collapse_end --stage train

Each stage is a `paravt` command per cell (printed before it runs, so any cell can be rerun by
hand); all of them resume, so rerunning continues where a run stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name: (row label, overrides of grpo_tiny.yaml, seeds)
RUNS = {
    "vanilla": ("vanilla GRPO", ["gating=false", "anchoring=off", "episode.think_prefix=false",
                                 "reward.answer_suffix=false"], (1, 2)),
    "para": ("PARA-GRPO", [], (1, 2)),
    "anchoring_only": ("anchoring only", ["gating=false"], (1,)),
    "gating_only": ("gating only", ["anchoring=off"], (1,)),
    "no_tool": ("PARA-GRPO − R_tool", ["reward.w_tool=0"], (1,)),
    "no_gamma": ("PARA-GRPO − γ", ["reward.gamma=0"], (1,)),
    # added once gating only (no anchoring) had matched PARA-GRPO's fτ: with the think prefix forced, the
    # format needs no anchoring here, so this run asks whether anchoring repairs it where the prompt does
    # not force the opening tag (vanilla's prompt settings; it differs from vanilla in gating and anchoring)
    "para_no_prefix": ("PARA-GRPO, no think prefix", ["episode.think_prefix=false", "reward.answer_suffix=false"],
                       (1,)),
}
LATE = ("para_no_prefix",)  # trained after Table 2's eight runs
# The second testbed's 2×2 (--testbed gap): vanilla GRPO, the run whose tools the paper sees collapse, from
# two cold starts under two rewards. Whether a skip can out-earn a call at K = 64 needs a skip as well trained
# as a call (the skip cold start) and a reward that pays a call no more than the release did (release_compat).
VANILLA = RUNS["vanilla"][1]
GAP_RUNS = {
    "van_cold": ("vanilla GRPO, cold_400, paravt reward", VANILLA, (1,)),
    "van_cold_rel": ("vanilla GRPO, cold_400, release reward", [*VANILLA, "reward.release_compat=true"], (1,)),
    "van_skip": ("vanilla GRPO, skip cold start, paravt reward", VANILLA, (1,)),
    "van_skip_rel": ("vanilla GRPO, skip cold start, release reward", [*VANILLA, "reward.release_compat=true"],
                     (1,)),
}
FROM_SKIP = ("van_skip", "van_skip_rel")  # the runs that start from --skip-cold; the others from --cold
LABELS = {**RUNS, **GAP_RUNS}
GAP_START, GAP_END = "<!-- gap 2x2: scripts/paradox.py --testbed gap --stage doc -->", "<!-- end of gap 2x2 -->"


def own_markers(a, first_out: str, first: tuple[str, str], title: str) -> tuple[str, str]:
    """A testbed's section markers: the first campaign's (in `first_out`) as they were; one run into another
    folder (`--out`: another cold start or condition) gets its own, named after that folder."""
    if a.out.name == first_out:
        return first
    return (f"<!-- {title} ({a.out.name}): scripts/paradox.py --testbed {testbed(a)} --stage doc -->",
            f"<!-- end of {title} ({a.out.name}) -->")


def gap_markers(a) -> tuple[str, str]:
    return own_markers(a, "paradox_gap", (GAP_START, GAP_END), "gap 2x2")


def run_label(a, name: str) -> str:
    """A run family's row label; the skip cold start's runs name it as --skip-label does."""
    text = LABELS[name][0]
    return text.replace("skip cold start", a.skip_label) if name in FROM_SKIP else text


# --testbed collapse: Table 2's blocks A and B again, on the 2×2's condition whose vanilla run loses its tools
# (its cold start is --cold, its reward --set; the first testbed's Table 2 is left as it is).
COLLAPSE_RUNS = {name: v for name, v in RUNS.items() if name not in LATE}
COL_START = "<!-- collapse table 2: scripts/paradox.py --testbed collapse --stage doc -->"
COL_END = "<!-- end of collapse table 2 -->"


def collapse_markers(a) -> tuple[str, str]:
    return own_markers(a, "paradox_collapse", (COL_START, COL_END), "collapse table 2")


def testbed(a) -> str:
    return getattr(a, "testbed", "table2")


def families(a) -> dict:
    """The run families of the selected testbed: Table 2's, the gap 2×2's, or Table 2 A–B on the collapse;
    `--seeds FAMILY=1,2,3` gives a family more seeds (a third where two disagree) in every stage."""
    runs = {"gap": GAP_RUNS, "collapse": COLLAPSE_RUNS}.get(testbed(a), RUNS)
    more = dict(getattr(a, "seeds", None) or [])
    return {name: (label, sets, more.get(name, seeds)) for name, (label, sets, seeds) in runs.items()}
MODES = ("parallel", "sequential", "inline", "none")
START, END = "<!-- table 2: scripts/paradox.py --stage doc -->", "<!-- end of table 2 -->"


def run_ids(a) -> list[tuple[str, str, int]]:
    """(run id, family, seed) of the selected runs, in RUNS's order (the tables' and figures')."""
    out = []
    for name, (_, _, seeds) in families(a).items():
        for seed in seeds:
            rid = f"{name}_s{seed}"
            if not a.runs or rid in a.runs or name in a.runs:
                out.append((rid, name, seed))
    return out


CPU = {"CUDA_VISIBLE_DEVICES": ""}  # the campaign's figures are CPU fp32 ones, wherever it runs


def run(cmd: list[str], log: Path, extra_env: dict[str, str] | None = None) -> int:
    """One command at one torch thread, its output appended to `log` (scripts/paradox_synthvt.py uses it too).
    It runs under paravt's process guard, so it stops (SIGTERM: the trainer keeps its checkpoint) when this
    script goes, even by SIGKILL, instead of training on as an orphan."""
    from paravt.procs import start_guarded

    print("$", shlex.join(cmd), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(extra_env or {})}
    with open(log, "a") as f:
        rc = start_guarded(cmd, log=f, env=env).wait()
    if rc:
        print(f"  failed ({rc}); see {log}", flush=True)
    return rc


FIRST = ("vanilla", "para", "no_tool")  # the runs the others are read against, and the test of R_tool's role


SILENT_ANCHOR = ("gating_only", "no_gamma")  # PARA-GRPO but for anchor terms (anchoring off; γ = 0)


def silent_twins(a) -> set[str]:
    """The families that would be PARA-GRPO again up to rounding: under the release's reward, with the think
    prefix forced, no anchor term ever fires (SPEC §6.2), so turning anchoring off or γ to 0 changes nothing
    (measured: a gating-only run drew PARA-GRPO's rollouts for 147 steps). Not trained unless --runs names
    them."""
    if a.runs or "reward.release_compat=true" not in a.set or "episode.think_prefix=false" in a.set \
            or testbed(a) == "gap":  # with --runs, run_ids already keeps exactly the runs named
        return set()
    return {n for n in SILENT_ANCHOR if n in families(a)}


def train_jobs(a) -> list[tuple[list[str], Path, dict]]:
    """Every family's first seed before any second one (a campaign cut short has one run of each), FIRST's
    families first within a seed, LATE's after all of Table 2's; no silent twin of PARA-GRPO."""
    jobs, twins = [], silent_twins(a)
    order = sorted(run_ids(a), key=lambda r: (r[1] in LATE, r[2], r[1] not in FIRST))  # stable within each class
    for rid, name, seed in order:
        if name in twins:
            continue
        out = a.out / "rl" / rid
        start = a.skip_cold if name in FROM_SKIP else a.cold
        cmd = [*a.paravt, "train", "grpo", "--config", str(a.config), "-o", f"model={start}",
               "-o", f"data={a.train}/rl.parquet", "-o", f"out={out}", "-o", f"steps={a.steps}", "-o", "threads=1",
               "-o", f"seed={seed}"]
        for o in families(a)[name][1] + a.set:
            cmd += ["-o", o]
        jobs.append((cmd, out / "train.log", CPU))
    return jobs


def last_step(a, rid: str) -> int:
    rows = read_jsonl(a.out / "rl" / rid / "log.jsonl")
    return rows[-1]["step"] if rows else 0


def models(a) -> dict[str, str]:
    """The evaluated models: the base, the cold start and each finished run's last checkpoint (a run still
    training has a `checkpoint` too, its latest: evaluating it would leave that step's scores in a cell that
    resumes, never redone once the run finishes). A finished run restored from its records
    (scripts/paradox_archive.py) has eval cells and no checkpoint: it is one too, for the tables."""
    out = {"base": str(a.base), "cold": str(a.cold)}
    if testbed(a) == "gap":
        out["skip_cold"] = str(a.skip_cold)
    for rid, _, _ in run_ids(a):
        ckpt = a.out / "rl" / rid / "checkpoint"
        recorded = any((a.out / "eval").glob(f"{rid}__*"))
        if ((ckpt / "config.json").exists() or recorded) and last_step(a, rid) >= a.steps:
            out[rid] = str(ckpt)
    return out


def think_prefix(model: str) -> bool:
    """Each model is evaluated under the prompt it was trained with: the base (its own habit breaks under
    the forced prefix) and the runs whose rollouts went without it (vanilla, as the release's) begin their
    turns themselves; the cold start and every other run get paravt's `<think>` prefix."""
    overrides = LABELS.get(model.rsplit("_s", 1)[0], ("", [], ()))[1]
    return model != "base" and "episode.think_prefix=false" not in overrides


def eval_dir(a, model: str, mode: str, k: int) -> Path:
    return a.out / "eval" / f"{model}__{mode}__k{k}"


def eval_cells(a, ms: dict[str, str]) -> list[tuple[str, str, int]]:
    """(model, dispatch mode, K) of every cell: each model in parallel, plus block C."""
    cells = [(name, "parallel", k) for k in a.ks for name in ms]
    if "para_s1" in ms and testbed(a) == "table2":
        cells += [("para_s1", mode, k) for mode in MODES[1:] for k in a.ks]
    return cells


def eval_jobs(a) -> list[tuple[list[str], Path, dict]]:
    ms = models(a)
    jobs = []
    for name, mode, k in eval_cells(a, ms):
        out = eval_dir(a, name, mode, k)
        cmd = [*a.paravt, "eval", "run", "--bench", "synthvt", "--data", str(a.test), "--model", ms[name],
               "--mode", mode, "--frames", str(k), "--out", str(out), "--limit", str(a.limit),
               "--concurrency", "8", "--max-new-tokens", str(a.max_new_tokens)]
        if not think_prefix(name):
            cmd.append("--no-think-prefix")
        jobs.append((cmd, out / "eval.log", CPU))
    return jobs


# ---- what the runs measured


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


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    d = 1 + z * z / n
    return ((c - h) / d, (c + h) / d)


def num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def acc_cell(a, model: str, mode: str, k: int) -> str:
    """A table cell: accuracy with its Wilson interval, or how far an eval still being filled has got."""
    s = scores(a, model, mode, k)
    if not s:
        return "–"
    if len(s) < a.limit:  # still being evaluated: no figure that reads as final
        return f"{len(s)}/{a.limit} scored"
    p = sum(s.values()) / len(s)
    lo, hi = wilson(p, len(s))
    return f"{100 * p:.1f} [{100 * lo:.0f}, {100 * hi:.0f}]"


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


def status(a) -> list[list[str]]:
    """Per run: its step, its pace and time left over the last ten steps, fτ and κ over them, when it last
    logged a step and its last checkpoint; then the eval cells done. A campaign's state at a glance."""
    rows = []
    for rid, _, _ in run_ids(a):
        d = a.out / "rl" / rid
        log = [r for r in read_jsonl(d / "log.jsonl") if "f_tau" in r]
        if not log:
            rows.append([rid, "–", "", "", "", "", "", ""])
            continue
        recent, step = log[-10:], log[-1]["step"]
        pace = mean(r.get("step_time_s") for r in recent)
        left = "done" if step >= a.steps else f"{(a.steps - step) * pace / 3600:.1f} h" if pace else "–"
        age = (time.time() - (d / "log.jsonl").stat().st_mtime) / 60
        ckpts = [p.name.removeprefix("step_").lstrip("0") for p in d.glob("step_*")]
        rows.append([rid, f"{step}/{a.steps}", f"{pace:.0f} s" if pace else "–", left,
                     f"{mean(r['f_tau'] for r in recent):.2f}", f"{mean(r['kappa'] for r in recent):.2f}",
                     f"{age:.0f} min" if age < 600 else f"{age / 60:.0f} h", max(ckpts, key=int) if ckpts else "–"])
    cells = eval_cells(a, models(a))
    done = sum(bool(done_scores(a, *cell)) for cell in cells)
    rows.append(["eval cells", f"{done}/{len(cells)}", "", "", "", "", "", ""])
    return rows


def print_status(a) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("run", "step", "s/step", "left", "fτ", "κ", "logged", "ckpt",
              title=f"{a.out}: fτ, κ, pace over the last 10 steps")
    for row in status(a):
        t.add_row(*row)
    Console(width=max(100, Console().width)).print(t)


# ---- the doc


def main_table(a) -> tuple[list[str], dict]:
    kcols = " | ".join(f"acc K={k}" for k in a.ks)
    kmax = max(a.k_choices)
    lines = [f"| run | seed | steps | fτ first | fτ last | κ first | κ last | κ K={kmax} last | {kcols} |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(a.ks)]
    summaries = {}
    starts = [("base", "base"), ("cold", "SFT cold start")]
    if testbed(a) == "gap":
        starts += [("skip_cold", a.skip_label)]
    for name, label in starts:
        accs = " | ".join(acc_cell(a, name, "parallel", k) for k in a.ks)
        lines.append(f"| {label} | – | – | – | – | – | – | – | {accs} |")
    for rid, name, seed in run_ids(a):
        s = run_summary(a, rid)
        if s is None:
            continue
        summaries[rid] = s
        accs = " | ".join(acc_cell(a, rid, "parallel", k) for k in a.ks)
        lines.append(f"| {run_label(a, name)} | {seed} | {s['steps']} | {num(s['f_first'])} | {num(s['f_last'])} | "
                     f"{num(s['k_first'])} | {num(s['k_last'])} | {num(s['k_max_last'])} | {accs} |")
    return lines, summaries


def task_table(a) -> list[str]:
    """Held-out accuracy per kind of question, and calls per question, of every finished eval cell: the
    event-colour questions need the moment of the event (a crop's summary, or an overview that holds it),
    the others read the background. The overall figure cannot tell a model that reads its crops from one
    that has learnt to answer every question with the background's colour."""
    lines = ["| model | " + " | ".join(f"K={k}: event colour / other / calls" for k in a.ks) + " |",
             "|---|" + "---|" * len(a.ks)]
    labels = {"base": "base", "cold": "SFT cold start", "skip_cold": a.skip_label}
    for name in models(a):
        cells = []
        for k in a.ks:
            rows = cell_rows(a, name, "parallel", k)
            if len(rows) < a.limit:
                cells.append("–")
                continue
            needs_event = [bool((r.get("extras") or {}).get("needs_event")) for r in rows]
            acc = [mean(row_score(r) for r, e in zip(rows, needs_event) if e == want) for want in (True, False)]
            calls = mean(float(r.get("n_calls") or 0) for r in rows)
            cells.append(f"{num(None if acc[0] is None else 100 * acc[0], 1)} / "
                         f"{num(None if acc[1] is None else 100 * acc[1], 1)} / {num(calls, 1)}")
        rid = name.rsplit("_s", 1)
        label = labels.get(name) or f"{run_label(a, rid[0])} {rid[1]}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def block_c(a) -> list[str]:
    lines = ["| dispatch | " + " | ".join(f"acc K={k}" for k in a.ks) + " |", "|---|" + "---|" * len(a.ks)]
    for mode in MODES:
        accs = " | ".join(acc_cell(a, "para_s1", mode, k) for k in a.ks)
        lines.append(f"| {mode} | {accs} |")
    return lines


def call_vs_skip(a, first: bool = False) -> list[str]:
    """At the largest K, over the last third of each run's steps (`first`: its first tenth, the cold start's
    rollouts before RL has moved it far): the rollouts that called against those that skipped, by accuracy,
    format reward, total reward and share with a parse problem. What decides whether GRPO keeps the tools is
    what a skip earns against a call, not the accuracy alone: R_fmt itself pays 0.3 for a think before a
    parseable call, so a call out-earns an equally right, well-formed skip by 0.2 (0.3 with the answer suffix
    off) without any R_tool."""
    kmax = max(a.k_choices)
    rows, stops = [], False
    for rid, name, seed in run_ids(a):
        rolls = read_jsonl(a.out / "rl" / rid / "rollouts.jsonl")
        if not rolls:
            continue
        stops = stops or any(r.get("stopped_on_bad_call") for r in rolls)
        steps = max(r["step"] for r in rolls)
        part = (lambda t: 10 * (t - 1) // steps == 0) if first else (lambda t: 3 * (t - 1) // steps == 2)
        sel = [r for r in rolls if r["k"] == kmax and part(r["step"])]
        if sel:
            rows.append((f"{run_label(a, name)} {seed}", sel))
    # stops (episode.on_bad_call=end): the share of calling rollouts that an unreadable call ended unanswered
    lines = ["| run | rollouts | skip | acc call / skip | R_fmt call / skip | R call / skip | "
             "parse problem call / skip |" + (" calls stopped by a bad call |" if stops else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if stops else "")]
    for label, sel in rows:
        call = [r for r in sel if r["n_parsed_calls"] > 0]
        skip = [r for r in sel if r["n_parsed_calls"] == 0]
        pair = lambda f: " / ".join("–" if not g else f"{mean(f(r) for r in g):.2f}" for g in (call, skip))  # noqa: E731
        stopped = f" {num(mean(float(bool(r.get('stopped_on_bad_call'))) for r in call))} |" if stops else ""
        lines.append(f"| {label} | {len(sel)} | {len(skip) / len(sel):.2f} | "
                     f"{pair(lambda r: r['accuracy'])} | {pair(lambda r: r['format'])} | {pair(lambda r: r['reward'])} | "
                     f"{pair(lambda r: float(r['problem_turns'] > 0))} |{stopped}")
    return lines


def family(summaries: dict, name: str, key: str) -> float | None:
    return mean(s[key] for rid, s in summaries.items() if rid.rsplit("_s", 1)[0] == name)


def claims(a, summaries: dict) -> list[str]:
    """SPEC §5's shape, claim by claim, on the runs above (seed means where a family has more than one seed)."""
    g = lambda name, key: family(summaries, name, key)  # noqa: E731
    out = []

    def claim(text: str, ok: bool | None, measured: str) -> None:
        mark = "not measured yet" if ok is None else ("reproduced" if ok else "**not reproduced**")
        out.append(f"- {text}: {mark} ({measured})")

    def have(*xs) -> bool:
        return all(x is not None for x in xs)

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{round(100 * x)} %"  # an int: no "-0 %" for a hair below zero

    k0, k1, f0, f1 = (g("vanilla", k) for k in ("k_first", "k_last", "f_first", "f_last"))
    claim("vanilla GRPO loses the tools: κ last ≤ 0.1 × κ first (> 0)",
          k0 > 0 and k1 <= 0.1 * k0 if have(k0, k1) else None,
          f"κ {num(k0)} → {num(k1)}")
    # The format claims compare the share of the gap to fτ = 1 that RL closes, (last − first) / (1 − first):
    # the runs start from different prompts (vanilla without the think prefix at fτ ≈ 0.2, the others
    # with it at ≈ 0.8), so neither levels nor absolute gains compare (a run starting at 0.8 can gain 0.2).
    closed = lambda f0, f1: (f1 - f0) / (1 - f0) if have(f0, f1) and f0 < 1 else None  # noqa: E731
    cv = closed(f0, f1)
    claim("vanilla GRPO does not repair the format: closes < ¼ of its gap to fτ = 1",
          cv < 0.25 if cv is not None else None, f"fτ {num(f0)} → {num(f1)}: {pct(cv)} of the gap")
    for name in (n for n in ("anchoring_only", "para", "para_no_prefix") if n in families(a)):
        a0, a1 = g(name, "f_first"), g(name, "f_last")
        c = closed(a0, a1)
        claim(f"{RUNS[name][0]} repairs the format: closes ≥ ½ of its gap to fτ = 1, and more of it than vanilla",
              c >= 0.5 and c > cv if have(c, cv) else None,
              f"fτ {num(a0)} → {num(a1)}: {pct(c)} of the gap; vanilla {pct(cv)}")
    for name in ("gating_only", "para"):
        x = g(name, "k_last")
        claim(f"{RUNS[name][0]} keeps more of the tools than vanilla: κ last ≥ 3 × vanilla's (and > 0)",
              x > 0 and x >= 3 * k1 if have(x, k1) else None,
              f"{num(x)} vs {num(k1)}")
    go, pa = g("gating_only", "f_last"), g("para", "f_last")
    claim("gating only's fτ last below PARA-GRPO's", go < pa if have(go, pa) else None,
          f"{num(go, 3)} vs {num(pa, 3)}")  # three decimals: the two can agree to two
    nt, pk = g("no_tool", "k_last"), g("para", "k_last")
    claim("PARA-GRPO − R_tool loses the tools: κ last ≤ ½ × PARA-GRPO's (the paper: 0.04 against 0.21)",
          nt <= 0.5 * pk if have(nt, pk) else None, f"{num(nt)} vs {num(pk)}")
    ao = g("anchoring_only", "k_last")
    claim("anchoring only keeps fewer of the tools than PARA-GRPO: κ last below PARA-GRPO's",
          ao < pk if have(ao, pk) else None, f"{num(ao)} vs {num(pk)}")
    for i, k in enumerate(a.ks):
        para = seed_mean([done_scores(a, f"para_s{s}", "parallel", k) for s in families(a)["para"][2]])
        van = seed_mean([done_scores(a, f"vanilla_s{s}", "parallel", k) for s in families(a)["vanilla"][2]])
        d, lo, hi = paired_gain(para, van)
        if i == 0:
            claim(f"PARA-GRPO above vanilla at K = {k} (paired 95 % interval above 0)",
                  lo > 0 if para and van else None,
                  f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points" if para and van else "–")
        else:
            claim(f"PARA-GRPO not below vanilla at K = {k} (paired interval's upper end ≥ 0)",
                  hi >= 0 if para and van else None,
                  f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points" if para and van else "–")
    if testbed(a) != "table2":  # block C is the first testbed's
        return out
    par = [done_scores(a, "para_s1", "parallel", k) for k in a.ks]
    seq = [done_scores(a, "para_s1", "sequential", k) for k in a.ks]
    if all(par) and all(seq):
        vals = [(sum(p.values()) / len(p), sum(q.values()) / len(q)) for p, q in zip(par, seq)]
        claim("block C: parallel ≥ sequential at every K", all(p >= q for p, q in vals),
              ", ".join(f"K={k}: {100 * p:.1f} vs {100 * q:.1f}" for k, (p, q) in zip(a.ks, vals)))
    else:
        claim("block C: parallel ≥ sequential at every K", None, "–")
    return out


def plot(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kmax = max(a.k_choices)
    keys = [("reward", "reward"), ("f_tau", "fτ"), ("kappa", "κ (calls per rollout)"), ("k_max", f"κ at K = {kmax}"),
            ("entropy", "entropy (nats/token)"), ("kl", "KL to the reference")]
    colors = {rid: f"C{i}" for i, (rid, _, _) in enumerate(run_ids(a))}  # one colour a run in both figures
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for rid, name, _ in run_ids(a):
        log = [r for r in read_jsonl(a.out / "rl" / rid / "log.jsonl") if "f_tau" in r]
        if not log:
            continue
        by_step: dict[int, list[int]] = {}
        for r in read_jsonl(a.out / "rl" / rid / "rollouts.jsonl"):
            if r.get("k") == kmax:
                by_step.setdefault(r["step"], []).append(r["n_parsed_calls"])
        for ax, (key, title) in zip(axes.flat, keys):
            if key == "k_max":
                xs = sorted(by_step)
                ys = [mean(by_step[x]) for x in xs]
            else:
                xs, ys = [r["step"] for r in log], [r.get(key) for r in log]
            ax.plot(xs, smooth(ys, a.smooth), label=rid, color=colors[rid], linestyle="--" if name == "vanilla" else "-")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("RL step")
    axes.flat[0].legend(fontsize=7)
    what = {"gap": f"The gap 2×2 ({a.skip_label})",  # each collapse campaign names its run folder
            "collapse": f"Table 2 A–B, skip cold start ({a.out.name})"}.get(testbed(a), "Table 2")
    fig.suptitle(f"{what}: RL runs on the paradox testbed (moving average over {a.smooth} steps)")
    fig.tight_layout()
    fig.savefig(a.docs / f"{figure_prefix(a)}_curves.png", dpi=100)
    plt.close(fig)

    gaps = {rid: advantage_gap(a, rid) for rid, _, _ in run_ids(a)}
    ks = sorted({k for g in gaps.values() for k in g})
    if ks:
        fig, axes = plt.subplots(1, len(ks), figsize=(3.2 * len(ks), 3.2), squeeze=False)
        for ax, k in zip(axes[0], ks):
            for rid, g in gaps.items():
                if k in g:
                    ax.plot(range(1, 11), [float("nan") if v is None else v for v in g[k]], marker=".", label=rid,
                            color=colors[rid])
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_title(f"K = {k}", fontsize=10)
            ax.set_xlabel("tenth of the run")
            ax.set_xlim(0.5, 10.5)
        axes[0][0].set_ylabel("advantage: called − skipped")
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(a.docs / f"{figure_prefix(a)}_advantage.png", dpi=100)
        plt.close(fig)


def smooth(xs: list, w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - w + 1):i + 1] if x is not None]
        out.append(sum(win) / len(win) if win else float("nan"))
    return out


def shown(path: Path) -> str:
    """A path as the doc shows it: relative to the repository, never this machine's."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def figure_prefix(a) -> str:
    return a.out.name if testbed(a) in ("gap", "collapse") else "paradox"


def gap_lines(a) -> list[str]:
    """Per run of the 2×2, the advantage of calling over skipping at the largest K (the trainer's own, group
    standard deviations) in the first and the last tenth of the run: the Tool Necessity Gap's own measure."""
    kmax = max(a.k_choices)
    lines = [f"| run | advantage call − skip, K = {kmax}, first tenth | last tenth |", "|---|---|---|"]
    for rid, name, seed in run_ids(a):
        g = advantage_gap(a, rid).get(kmax)
        if g is not None:
            lines.append(f"| {run_label(a, name)} {seed} | {num(g[0])} | {num(g[-1])} |")
    return lines


COLLAPSE = 0.1  # issue #37: vanilla's tools collapse when κ over the last tenth is at most this share of the first's


def collapse_lines(a, summaries: dict) -> list[str]:
    """Per run of the 2×2, whether vanilla's tool use collapsed (κ last ≤ COLLAPSE × κ first): the 2×2's question.
    A run still training says where it is instead of a verdict."""
    lines = []
    for rid, name, seed in run_ids(a):
        s = summaries.get(rid)
        if s is None:
            continue
        what = f"- {run_label(a, name)}, seed {seed}: κ {num(s['k_first'])} → {num(s['k_last'])}"
        if s["steps"] < a.steps:
            lines.append(f"{what} at step {s['steps']} of {a.steps}: still training, no verdict")
            continue
        ratio = s["k_last"] / s["k_first"] if s["k_first"] else math.nan
        verdict = "**collapses**" if s["k_last"] <= COLLAPSE * s["k_first"] else "does not collapse"
        digits = 3 if abs(ratio - COLLAPSE) < 0.005 else 2  # 0.101 is not 0.10: the verdict's own digit shown
        lines.append(f"{what} (last/first {num(ratio, digits)}): {verdict} (κ last ≤ {COLLAPSE:g} × κ first)")
    return lines


def sets_list(a) -> str:
    """The runs' own overrides (`--set`), as the docs name them."""
    return ", ".join(f"`{x}`" for x in a.set)


def write_gap_doc(a) -> str:
    """The 2×2's tables between their own markers (Table 2's section is left as it is)."""
    plot(a)
    table, summaries = main_table(a)
    start, end = gap_markers(a)
    body = [start, f"Vanilla GRPO runs of {a.steps} steps (config `{shown(a.config)}`, vanilla's overrides: no "
            f"gating, no anchoring, no think prefix, no answer suffix), from `{shown(a.cold)}` (cold_400) and "
            f"`{shown(a.skip_cold)}` ({a.skip_label}), under paravt's reward and under `reward.release_compat`"
            + (f" (every run also: {sets_list(a)})" if a.set else "") + f"; held-out accuracy on the first {a.limit} "
            f"questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson interval (the runs and "
            "the base without the think prefix, the cold starts with it, as each was trained). fτ, κ: means over the "
            "first and the last tenth of the steps (τ = 0.7 rollouts).", "", *table, "",
            "Held-out accuracy per kind of question (event colour / the background's colour) and calls per question:",
            "", *task_table(a), "", "Which conditions collapse:", "",
            *collapse_lines(a, summaries), "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps: the rollouts that call "
            "against those that skip (R: the episode's reward before shaping, under the run's own reward).", "",
            *call_vs_skip(a), "", "The same over the first tenth of each run's steps, where the cold start has "
            "barely moved:", "", *call_vs_skip(a, first=True), "", *gap_lines(a), "",
            f"![curves]({figure_prefix(a)}_curves.png)", "", f"![advantage gap]({figure_prefix(a)}_advantage.png)", end]
    text = "\n".join(body)
    write_between(a.docs / "paradox.md", start, end, text)
    return text


def seeds_note(a) -> str:
    """The seeds `--seeds` gave a family beyond its default ones, as the section's run line names them."""
    given = getattr(a, "seeds", None) or []
    more = [f"{run_label(a, name)} seeds {', '.join(map(str, seeds))}" for name, seeds in given if name in families(a)]
    return f"; {'; '.join(more)}" if more else ""


def write_collapse_doc(a) -> str:
    """Table 2 A–B on the collapse: its table, curves and claims between their own markers."""
    plot(a)
    table, summaries = main_table(a)
    sets = sets_list(a) or "none"
    start, end = collapse_markers(a)
    prefix = figure_prefix(a)
    said = claims(a, {rid: s for rid, s in summaries.items() if s["steps"] >= a.steps})
    if a.runs:  # a campaign of some families (e.g. a longer vanilla pair): only the claims its runs measure
        said = [c for c in said if "not measured yet" not in c] or ["- none yet: no selected run has finished"]
    body = [start, f"Runs of {a.steps} steps from `{shown(a.cold)}` (config `{shown(a.config)}`, RL rows "
            f"`{shown(a.train)}`; every run also: {sets}{seeds_note(a)}); held-out accuracy on the first {a.limit} "
            f"questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson interval; vanilla "
            "evaluated without the think prefix, as it was trained. fτ, κ: means over the first and the last tenth of "
            "the steps (τ = 0.7 rollouts).", "", *table, "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps (τ = 0.7): the rollouts "
            "that call against those that skip (R: the episode's reward before shaping).", "", *call_vs_skip(a), "",
            *gap_lines(a), "", "Held-out accuracy per kind of question (event colour: what colour was the shape; "
            "other: the background's colour), and tool calls per question, parallel dispatch:", "", *task_table(a), "",
            f"![curves]({prefix}_curves.png)", "",
            f"![advantage gap]({prefix}_advantage.png)", "",
            "What reproduced (finished runs only, seed means where a family has more than one):", "",
            *said, end]
    text = "\n".join(body)
    write_between(a.docs / "paradox.md", start, end, text)
    return text


def write_between(path: Path, start: str, end: str, text: str) -> None:
    """`text` (which opens with `start` and closes with `end`) in place of the page's section between
    those markers, or at the page's end."""
    doc = path.read_text() if path.exists() else ""
    if start in doc:
        head, rest = doc.split(start, 1)
        doc = head + text + rest.split(end, 1)[1]
    else:
        doc += "\n" + text + "\n"
    path.write_text(doc)


def write_doc(a) -> str:
    a.docs.mkdir(parents=True, exist_ok=True)  # --docs may name a folder to try the page in first
    if testbed(a) == "gap":
        return write_gap_doc(a)
    if testbed(a) == "collapse":
        return write_collapse_doc(a)
    plot(a)
    table, summaries = main_table(a)
    bare = "the base and the runs " + " and ".join(f"“{RUNS[n][0]}”" for n in RUNS if not think_prefix(f"{n}_s1"))
    body = [START, f"Runs of {a.steps} steps from `{shown(a.cold)}` (config `{shown(a.config)}`); held-out accuracy on "
            f"the first {a.limit} questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson "
            f"interval; {bare} are evaluated without the think prefix, as they were trained. "
            "fτ, κ: means over the first and the last tenth of the steps (τ = 0.7 rollouts).", "", *table, "",
            "Block C, the first PARA-GRPO seed's checkpoint by dispatch mode:", "", *block_c(a), "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps (τ = 0.7): the rollouts "
            "that call against those that skip (R: the episode's reward before shaping).", "", *call_vs_skip(a), "",
            "![curves](paradox_curves.png)", "", "![advantage gap](paradox_advantage.png)", "",
            f"What reproduced (finished runs only, seed means where a family has more than one; claims on a run still "
            "training read \"not measured yet\"):", "",
            *claims(a, {rid: s for rid, s in summaries.items() if s["steps"] >= a.steps}), END]
    text = "\n".join(body)
    write_between(a.docs / "paradox.md", START, END, text)
    return text


def family_seeds(text: str) -> tuple[str, tuple[int, ...]]:
    """`vanilla=1,2,3` → ("vanilla", (1, 2, 3)); a family the testbed does not have is an error at parse time."""
    name, sep, seeds = text.partition("=")
    if not sep or name not in LABELS:
        raise argparse.ArgumentTypeError(f"expected FAMILY=1,2,… with FAMILY one of {', '.join(LABELS)}; got {text!r}")
    try:
        return name, tuple(int(x) for x in seeds.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers: {text!r}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, default=ROOT / "src/paravt/assets/paradox-base")
    p.add_argument("--cold", type=Path, default=ROOT / "src/paravt/assets/paradox-cold")
    p.add_argument("--testbed", choices=["table2", "gap", "collapse"], default="table2",
                   help="table2: the first testbed's Table 2 runs; gap: the second testbed's vanilla 2×2 (issue #37); "
                        "collapse: Table 2 A–B from --cold under --set, the 2×2's condition whose tools collapse")
    p.add_argument("--skip-cold", type=Path, default=Path("runs/paradox_testbed/skipcold_400"),
                   help="the skip cold start (scripts/paradox_testbed.py --stage skip), for --testbed gap")
    p.add_argument("--skip-label", default="skip cold start",
                   help="--testbed gap: how the tables name --skip-cold and its runs")
    p.add_argument("--train", type=Path, default=None,
                   help="RL rows (default: data/paradox_train; gap: data/paradox_skip_train, the same questions)")
    p.add_argument("--test", type=Path, default=Path("data/paradox_test"))
    p.add_argument("--out", type=Path, default=None,
                   help="default: runs/paradox (gap: runs/paradox_gap, collapse: runs/paradox_collapse)")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    p.add_argument("--config", type=Path, default=ROOT / "src/paravt/configs/grpo_tiny.yaml")
    p.add_argument("--steps", type=int, default=None, help="RL steps a run (default 300; gap: 100)")
    p.add_argument("--set", action="append", default=[], help="an override for every RL run (KEY=VALUE)")
    p.add_argument("--runs", type=lambda s: s.split(","), default=[], help="run ids or families (default: all)")
    p.add_argument("--seeds", type=family_seeds, action="append", default=[],
                   help="FAMILY=1,2,3: that family's seeds (default: the testbed's own)")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    p.add_argument("--k-choices", dest="k_choices", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4, 8, 16, 32, 64])
    p.add_argument("--limit", type=int, default=200, help="held-out questions per accuracy cell")
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--jobs", type=int, default=2, help="commands at once (one torch thread each)")
    p.add_argument("--smooth", type=int, default=10)
    p.add_argument("--stage", choices=["all", "train", "eval", "doc", "status"], default="all")
    a = p.parse_args()
    second = a.testbed in ("gap", "collapse")  # the second testbed's questions, the skip oracle's rows
    a.train = a.train or Path("data/paradox_skip_train" if second else "data/paradox_train")
    a.out = a.out or Path({"gap": "runs/paradox_gap", "collapse": "runs/paradox_collapse"}.get(a.testbed, "runs/paradox"))
    a.steps = a.steps or (100 if a.testbed == "gap" else 300)
    script = Path(sys.executable).parent / "paravt"
    a.paravt = [str(script)] if script.exists() else [sys.executable, "-m", "paravt"]
    if a.stage == "status":
        return print_status(a)
    failed = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        if a.stage in ("all", "train"):
            for name in sorted(silent_twins(a)):
                print(f"not training {name}: under the release's reward no anchor term fires (SPEC §6.2), so it "
                      "would be PARA-GRPO again (--runs names it to train it anyway)", flush=True)
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), train_jobs(a)))
        if a.stage in ("all", "eval"):
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), eval_jobs(a)))
    if a.stage in ("all", "doc"):
        print(write_doc(a))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
