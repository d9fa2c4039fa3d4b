"""What a paradox campaign runs: its run families (Table 2's, the gap 2×2's, Table 2 A–B on the collapse), the
`paravt train grpo` and `paravt eval run` command of each run and cell, and where each stands (scripts/paradox.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path

from paradox_read import done_scores, eval_dir, mean, read_jsonl

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


def run_label(a, name: str) -> str:
    """A run family's row label; the skip cold start's runs name it as --skip-label does."""
    text = LABELS[name][0]
    return text.replace("skip cold start", a.skip_label) if name in FROM_SKIP else text


# --testbed collapse: Table 2's blocks A and B again, on the 2×2's condition whose vanilla run loses its tools
# (its cold start is --cold, its reward --set; the first testbed's Table 2 is left as it is).
COLLAPSE_RUNS = {name: v for name, v in RUNS.items() if name not in LATE}


def testbed(a) -> str:
    return getattr(a, "testbed", "table2")


def families(a) -> dict:
    """The run families of the selected testbed: Table 2's, the gap 2×2's, or Table 2 A–B on the collapse;
    `--seeds FAMILY=1,2,3` gives a family more seeds (a third where two disagree) in every stage."""
    runs = {"gap": GAP_RUNS, "collapse": COLLAPSE_RUNS}.get(testbed(a), RUNS)
    more = dict(getattr(a, "seeds", None) or [])
    return {name: (label, sets, more.get(name, seeds)) for name, (label, sets, seeds) in runs.items()}


MODES = ("parallel", "sequential", "inline", "none")


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
    prefix forced, no anchor term ever fires (docs/rewards.md), so turning anchoring off or γ to 0 changes nothing
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


def family_seeds(text: str) -> tuple[str, tuple[int, ...]]:
    """`vanilla=1,2,3` → ("vanilla", (1, 2, 3)); a family the testbed does not have is an error at parse time."""
    name, sep, seeds = text.partition("=")
    if not sep or name not in LABELS:
        raise argparse.ArgumentTypeError(f"expected FAMILY=1,2,… with FAMILY one of {', '.join(LABELS)}; got {text!r}")
    try:
        return name, tuple(int(x) for x in seeds.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers: {text!r}") from None


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
