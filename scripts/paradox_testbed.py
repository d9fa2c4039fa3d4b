"""The Tool Prior Paradox's testbed, built and measured before any RL (docs/paradox.md).

The paradox needs two preconditions (the paper, arXiv 2605.20342): a pretrained tool prior that competes with the
cold-started format, and a cold start that calls tools where they are not needed, on a task where
skipping them is a shortcut at large K. This script makes them and measures them:

1. data: `paravt synth --preset paradox` (the SynthVT-mini task: at K = 64 the overview shows the
   event in nearly every video, at K = 4 in few; the oracle crops at every K with a tool prior of
   0.9; prior.parquet holds the same episodes in another tool layout, synth.prior).
2. base: frame captions, then SFT at length on prior.parquet: a model whose own tool habit is
   one call a turn, no think, answers without tags (Qwen3-VL's pretrained tool use, in miniature).
3. cold start: a short SFT of the base on paravt's format (sft.parquet), checkpoints kept along it.
   (contrast: the same cold start from the captions checkpoint, without the prior; not part of `all`.)
4. measure each model: greedy and τ = 0.7 episodes at K = 4, 16, 64 (parallel dispatch), and K = 64
   with tools skipped (mode none): format reward (fτ at τ = 0.7 against greedy's), the parse-problem
   rate, κ (crop calls per episode) overall and at K = 64, accuracy; at K = 64 and τ = 0.7 the rollouts
   that call against those that skip (accuracy, parse problems, R_fmt, and R under paravt's reward and
   under the release's, `reward.release_compat`), over `--k64-samples` seeds.

The second testbed (docs/paradox.md, issue #37) adds `--stage skip`: a cold start from the same base,
the same steps and lr, on the rows of `paravt synth --preset paradox-skip`, whose oracle answers
directly in 30 % of the episodes whose overview shows the event (skipcold_<steps>). `--base` names the
base when this testbed's own (OUT/base) is absent: the shipped `paradox-base` by default; a model name
that is not under OUT is looked up in src/paravt/assets (`paradox-cold` is cold_400).

    python scripts/paradox_testbed.py                       # everything, resumable
    python scripts/paradox_testbed.py --stage measure --models base,cold_100

Every stage is a `paravt` command or an in-process eval (printed before it runs); a rerun goes on
where it stopped. Results: OUT/measure/<model>.json and the table printed (and --write-doc).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "src/paravt/configs"
ASSETS = Path(__file__).resolve().parents[1] / "src/paravt/assets"
KS = (4, 16, 64)


def run(cmd: list[str], log: Path) -> None:
    print("$", shlex.join(cmd), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"failed ({rc}); see {log}")


def stage_data(a) -> None:
    for split, n, extra in (("train", a.n_train, ["--captions", "16"]), ("test", a.n_test, [])):
        d = a.data / f"paradox_{split}"
        if not (d / "rl.parquet").exists():
            run([*a.paravt, "synth", "--preset", "paradox", "--out", str(d), "--n", str(n), "--split", split,
                 "--seed", "0", *extra], a.out / "logs" / f"synth_{split}.log")


def base_checkpoint(a) -> Path:
    """This testbed's base (OUT/base) when it was built here, else --base (the shipped paradox-base)."""
    own = a.out / "base" / "checkpoint"
    return own if (own / "config.json").exists() else Path(a.base)


def k64_cell(np: str, seed: int) -> str:
    """The measured cell of τ = 0.7 rollouts at K = 64 for one seed; `np` is "_np" without the think prefix.
    Seed 0 is the cell the first table reads, the others feed the call-vs-skip split."""
    return f"t07_k64{np}" + (f"_s{seed}" if seed else "")


def model_path(a, name: str) -> Path:
    """A model by its name: this testbed's (OUT/<name>), else a shipped one (src/paravt/assets/<name>)."""
    path = a.out / name
    return ASSETS / name if not path.exists() and (ASSETS / name).exists() else path


def sft(a, config: str, model: str, data: Path, out: Path, steps: int, *extra: str) -> None:
    run([*a.paravt, "train", "sft", "--config", str(CONFIGS / config), "-o", f"model={model}", "-o", f"data={data}",
         "-o", f"out={out}", "-o", f"steps={steps}", *extra], out.parent / f"{out.name}.log")


def stage_base(a) -> None:
    train = a.data / "paradox_train"
    caps, base = a.out / "captions", a.out / "base"
    sft(a, "sft_tiny_captions.yaml", "tiny", train / "captions.parquet", caps, 600)
    sft(a, "sft_tiny.yaml", str(caps / "checkpoint"), train / "prior.parquet", base, a.base_steps)


def cold_start(a, start: Path, run: str, steps: list[int], data: Path | None = None) -> None:
    """SFT of `start` on paravt's rows in increments at a constant lr (cumulative: OUT/<run> resumes), each
    increment's checkpoint kept as OUT/<run>_<steps>; the cold start and its contrast share it, so they
    differ in their start and nothing else."""
    import shutil

    out = a.out / run
    for n in steps:
        keep = a.out / f"{run}_{n}"
        if (keep / "config.json").exists():
            continue
        sft(a, "sft_tiny.yaml", str(start), data or a.data / "paradox_train" / "sft.parquet", out, n,
            "-o", "lr_schedule=constant", "-o", f"lr={a.cold_lr}", "-o", "warmup_steps=0", *a.sft_set)
        shutil.copytree(out / "checkpoint", keep, ignore=shutil.ignore_patterns("dcp", "*.pt", "checkpoint_complete"))


def stage_cold(a) -> None:
    cold_start(a, a.out / "base" / "checkpoint", "cold", a.cold_steps)


def stage_skip(a) -> None:
    """The second cold start: the same base, steps and lr as cold_<steps>, on the rows of an oracle that
    answers directly in 30 % of the episodes whose overview shows the event (preset paradox-skip), so
    that a skip at K = 64 is a trained path, not the untrained one of cold_400 (issue #37)."""
    d = a.data / f"paradox_{a.skip_name}_train"
    if not (d / "sft.parquet").exists():
        dial = ["--tool-prior-at-k", a.skip_prior] if a.skip_prior else []
        run([*a.paravt, "synth", "--preset", "paradox-skip", *dial, "--out", str(d), "--n", str(a.n_train), "--split",
             "train", "--seed", "0"], a.out / "logs" / f"synth_{a.skip_name}_train.log")
    start = base_checkpoint(a) if not a.skip_start else model_path(a, a.skip_start)
    cold_start(a, start, a.skip_run or f"{a.skip_name}cold", a.cold_steps, d / "sft.parquet")


def stage_contrast(a) -> None:
    """The paper's cross-model contrast in miniature: the same cold start from the captions checkpoint, a
    model that never learned the prior's tool habit; measured as `noprior_<steps>`."""
    cold_start(a, a.out / "captions" / "checkpoint", "noprior", [max(a.cold_steps)])


def stage_ship(a) -> None:
    """The base and the chosen cold start into src/paravt/assets (weights and processor files only;
    each model card, README.md, is written by hand from the measured table and kept)."""
    import shutil

    for src, name in ((a.out / "base" / "checkpoint", "paradox-base"), (a.out / a.ship_cold, "paradox-cold")):
        dst = ASSETS / name
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and f.name not in ("trainer_state.pt", "checkpoint_complete", "README.md"):
                shutil.copy2(f, dst / f.name)
        print(f"{src} -> {dst}")


def measure(a, name: str) -> dict:
    """Greedy and sampled episodes of one model on the test split; the numbers of the precondition table."""
    import asyncio

    from paravt import protocol as P
    from paravt.agent import Episode
    from paravt.backends.hf import HFBackend
    from paravt.eval.benchmarks import load_benchmark
    from paravt.eval.runner import eval_config, read_results, run_eval_async
    from paravt.models import load_model
    from paravt.rewards import RewardConfig, format_reward, score_episode

    path = model_path(a, name) if name != "sft" else Path(a.sft)
    out = a.out / "measure" / name
    samples = load_benchmark("synthvt", str(a.data / "paradox_test")).samples[: a.limit]
    model, processor = load_model(str(path / "checkpoint") if (path / "checkpoint").exists() else str(path))
    backend = HFBackend(model, processor, max_batch=16)
    cells = [(f"greedy_k{k}", dict(frames=k), "parallel") for k in KS] + \
            [(f"t07_k{k}", dict(frames=k, temperature=a.temperature, seed=0), "parallel") for k in KS] + \
            [("none_k64", dict(frames=64), "none")]
    # the same without the forced think prefix: the vanilla baseline's rollouts (the release's setting)
    if a.np_models is None or name in a.np_models:
        cells += [(f"{c}_np", {**o, "think_prefix": False}, m) for c, o, m in cells if c != "none_k64"]
    # more τ = 0.7 rollouts at K = 64 (other seeds), for the call-vs-skip split
    cells += [(k64_cell(np, seed), dict(frames=64, temperature=a.temperature, seed=seed, **over), "parallel")
              for seed in range(1, a.k64_samples) for np, over in (("", {}), ("_np", {"think_prefix": False}))
              if not np or a.np_models is None or name in a.np_models]
    if a.cells:  # only these (a model measured so is left out of the full tables, kept in the split)
        cells = [c for c in cells if c[0] in a.cells]
    by_id = {s.id: s for s in samples}
    result = {}
    for cell, over, mode in cells:
        cfg = eval_config(mode=mode, max_new_tokens=a.max_new_tokens, **over)
        d = out / cell
        print(f"  {name} {cell}", flush=True)
        asyncio.run(run_eval_async(samples, backend, cfg, d, concurrency=8, model=str(path)))
        rows = [r for r in read_results(d / "results.jsonl") if r.get("episode")]
        fmt, calls, acc, problems, split = [], [], [], [], []
        for r in rows:
            ep = Episode.from_dict(r["episode"])
            fmt.append(format_reward(ep.main_texts(), RewardConfig(), prefix=cfg.prefix))
            calls.append(ep.n_executed_calls)
            acc.append(float(r.get("score") or 0.0))
            problems.append(bool(r.get("n_problems")))
            s = by_id.get(r.get("id"))
            if s is not None and cell.startswith("t07_k64"):
                # R as vanilla GRPO scores it (no anchor): paravt's reward and the release's
                totals = [score_episode(ep.main_texts(), ep.answer, s.answer, s.question_type, ep.n_parsed_calls,
                                        ep.n_executed_calls, RewardConfig(release_compat=rel), prefix=cfg.prefix,
                                        anchoring="off", options=s.options or None, question=s.question).total
                          for rel in (False, True)]
                tagged = any(tag in t for t in ep.main_texts() for tag in (P.TOOL_CALL_OPEN, P.TOOL_CODE_OPEN))
                split.append({"call": ep.n_parsed_calls > 0, "attempt": ep.n_parsed_calls == 0 and tagged,
                              "accuracy": acc[-1], "parse_problem": problems[-1],
                              "format": fmt[-1], "r_paravt": totals[0], "r_release": totals[1]})
        n = max(len(rows), 1)
        result[cell] = {"n": len(rows), "format": sum(fmt) / n, "kappa": sum(calls) / n, "accuracy": sum(acc) / n,
                        "parse_problems": sum(problems) / n}
        if split:
            result[cell]["rollouts"] = split
    # cells measured before (another --cells) stay: the summary is the model's, not this call's
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    result = {**old, **result}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    return result


def common_cells(r: dict, suffix: str = "") -> str:
    """fτ, greedy format, parse problems, κ and κ at K = 64 of one model's cells (`_np`: without the prefix)."""
    t07, greedy = [r[f"t07_k{k}{suffix}"] for k in KS], [r[f"greedy_k{k}{suffix}"] for k in KS]
    mean = lambda cells, key: sum(c[key] for c in cells) / len(cells)  # noqa: E731
    return (f"{mean(t07, 'format'):.2f} | {mean(greedy, 'format'):.2f} | "
            f"{mean(t07, 'parse_problems'):.2f} / {mean(greedy, 'parse_problems'):.2f} | {mean(t07, 'kappa'):.2f} | "
            f"{r[f't07_k64{suffix}']['kappa']:.2f}")


def acc_cells(r: dict, suffix: str = "") -> str:
    return " | ".join(f"{100 * r[f'greedy_k{k}{suffix}']['accuracy']:.1f}" for k in KS)


COMMON = "fτ (τ = 0.7) | format, greedy | parse problems τ = 0.7 / greedy | κ (τ = 0.7, K mix) | κ K=64 (τ = 0.7)"


def table_np(results: dict[str, dict]) -> str:
    """Without the think prefix (the vanilla baseline's rollouts)."""
    head = f"| model | {COMMON} | " + " | ".join(f"acc K={k}" for k in KS) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    lines += [f"| {name} | {common_cells(r, '_np')} | {acc_cells(r, '_np')} |"
              for name, r in results.items() if all(f"{c}_k{k}_np" in r for c in ("greedy", "t07") for k in KS)]
    return "\n".join(lines)


def table(results: dict[str, dict]) -> str:
    head = (f"| model | questions | {COMMON} | acc K=64, tools | acc K=64, none | "
            + " | ".join(f"acc K={k}" for k in KS) + " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in results.items():
        if not all(f"{c}_k{k}" in r for c in ("greedy", "t07") for k in KS) or "none_k64" not in r:
            continue  # measured on some cells only (--cells): in the split table
        n = min(c["n"] for key, c in r.items() if not key.endswith("_np"))
        lines.append(f"| {name} | {n} | {common_cells(r)} | {100 * r['greedy_k64']['accuracy']:.1f} | "
                     f"{100 * r['none_k64']['accuracy']:.1f} | {acc_cells(r)} |")
    return "\n".join(lines)


def pooled_k64(r: dict, suffix: str = "") -> list[dict]:
    """The τ = 0.7 rollouts at K = 64 of every seed (cells t07_k64<suffix> and t07_k64<suffix>_s<seed>)."""
    return [x for key, c in r.items() if key == f"t07_k64{suffix}" or key.startswith(f"t07_k64{suffix}_s")
            for x in c.get("rollouts", [])]


def split_table(results: dict[str, dict]) -> str:
    """At K = 64, τ = 0.7: the rollouts that call (a parseable call) against those that skip, with the think
    prefix and without it (the vanilla baseline's rollouts); R with anchoring off, as vanilla GRPO scores it."""
    head = ("| model | prefix | rollouts | κ | skip | skip, a broken call | skip, well-formed | acc call / skip | "
            "parse problems call / skip | R_fmt call / skip | R paravt call / skip | R release call / skip |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in results.items():
        for suffix, label in (("", "think"), ("_np", "none")):
            rows = pooled_k64(r, suffix)
            if not rows:
                continue
            call, skip = [x for x in rows if x["call"]], [x for x in rows if not x["call"]]
            pair = lambda key: " / ".join("–" if not g else f"{sum(x[key] for x in g) / len(g):.2f}"  # noqa: E731
                                          for g in (call, skip))
            kappa = [c["kappa"] for key, c in r.items()
                     if key == f"t07_k64{suffix}" or key.startswith(f"t07_k64{suffix}_s")]
            broken = sum(x.get("attempt", False) for x in skip) / len(rows)
            clean = sum(not x["parse_problem"] for x in skip) / len(rows)
            lines.append(f"| {name} | {label} | {len(rows)} | {sum(kappa) / len(kappa):.2f} | "
                         f"{len(skip) / len(rows):.2f} | {broken:.2f} | {clean:.2f} | {pair('accuracy')} | "
                         f"{pair('parse_problem')} | {pair('format')} | {pair('r_paravt')} | {pair('r_release')} |")
    return "\n".join(lines)


def expected_cells(a, name: str) -> set[str]:
    if a.cells:
        return set(a.cells)
    np = a.np_models is None or name in a.np_models
    cells = {f"{c}_k{k}" for c in ("greedy", "t07") for k in KS} | {"none_k64"}
    cells |= {f"{c}_np" for c in cells if c != "none_k64"} if np else set()
    cells |= {k64_cell(x, seed) for seed in range(1, a.k64_samples) for x in ("", "_np") if np or not x}
    return cells


def cell_rows(a, name: str, cell: str) -> list[dict]:
    """A measured cell's result rows, the latest of each question (an eval that resumed appends)."""
    from paravt.eval.runner import read_results

    rows = read_results(a.out / "measure" / name / cell / "results.jsonl", repair=False)  # a reader never truncates
    return [r for r in {r["id"]: r for r in rows}.values() if r.get("episode")]


def crops_table(a, names: list[str]) -> str:
    """Whether a cold start reads its crops (greedy at K = 4, where the overview rarely holds the event: the
    event-colour questions are answered from the crops' summaries or not at all), and at K = 64, τ = 0.7, how
    often it skips and how its skips answer against its calls, with the think prefix and without it (the
    `--k64-samples` seeds pooled, where measured)."""
    def mean(xs: list[float]) -> str:
        return f"{sum(xs) / len(xs):.2f}" if xs else "–"

    head = ("| model | acc K=4, greedy | event colour / other | calls, K=4 | parse problems, K=4 | "
            "skip K=64, prefix / none (rollouts) | acc call / skip, prefix | acc call / skip, none |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in names:
        g4 = cell_rows(a, name, "greedy_k4")
        if not g4:
            continue
        ev = [r["score"] or 0.0 for r in g4 if (r.get("extras") or {}).get("needs_event")]
        ot = [r["score"] or 0.0 for r in g4 if not (r.get("extras") or {}).get("needs_event")]
        cells = {x: [k64_cell(x, seed) for seed in range(a.k64_samples)] for x in ("", "_np")}
        k64 = {x: [r for c in cs for r in cell_rows(a, name, c)] for x, cs in cells.items()}  # the seeds pooled
        skip = {x: mean([float(not r["n_calls"]) for r in rs]) for x, rs in k64.items()}
        split = {x: " / ".join(mean([r["score"] or 0.0 for r in rs if bool(r["n_calls"]) == c]) for c in (True, False))
                 for x, rs in k64.items()}
        lines.append(f"| {name} | {100 * sum(r['score'] or 0.0 for r in g4) / len(g4):.1f} | "
                     f"{100 * sum(ev) / max(len(ev), 1):.1f} / {100 * sum(ot) / max(len(ot), 1):.1f} | "
                     f"{mean([float(r['n_calls']) for r in g4])} | {mean([float(bool(r['n_problems'])) for r in g4])} | "
                     f"{skip['']} / {skip['_np']} ({len(k64[''])} / {len(k64['_np'])}) | {split['']} | "
                     f"{split['_np']} |")
    return "\n".join(lines)


# each --table's markers in the page: its section is what lies between them
DOC_MARKERS = {
    "first": ("<!-- testbed table: scripts/paradox_testbed.py --write-doc -->", "<!-- end of testbed table -->"),
    "skip": ("<!-- skip testbed table: scripts/paradox_testbed.py --table skip --write-doc -->",
             "<!-- end of skip testbed table -->"),
    "crops": ("<!-- crops table: scripts/paradox_testbed.py --table crops --write-doc -->",
              "<!-- end of crops table -->"),
}


def write_doc(a, results: dict[str, dict]) -> None:
    """The measured tables between the markers of --write-doc's file (the prose around them stays); --table
    picks the testbed, each has its own markers."""
    start, end = DOC_MARKERS[a.table]
    if a.table == "crops":
        section = (f"The first {a.limit} questions of the test split, parallel dispatch, {a.max_new_tokens} new "
                   f"tokens a turn; K = 4 greedy with the think prefix; K = 64 at τ = {a.temperature}, the seeds "
                   f"measured of 0–{a.k64_samples - 1} pooled, with the prefix and without it (none, the vanilla "
                   f"baseline's rollouts).\n\n{crops_table(a, list(results))}")
    elif a.table == "skip":
        section = (f"The first {a.limit} questions of the test split; greedy and τ = {a.temperature} episodes, "
                   f"parallel dispatch, {a.max_new_tokens} new tokens a turn; {a.k64_samples} τ = {a.temperature} "
                   f"seed(s) at K = 64 for the call-vs-skip split.\n\n{table(results)}\n\nWithout the forced think "
                   f"prefix (the vanilla baseline's rollouts):\n\n{table_np(results)}\n\nAt K = 64, τ = "
                   f"{a.temperature}: the rollouts that call against those that skip (R: the episode's reward with "
                   f"anchoring off, as vanilla GRPO scores it, under paravt's reward and under "
                   f"`reward.release_compat`):\n\n{split_table(results)}")
    else:
        section = (f"The first questions of the test split (SynthVT `paradox` preset; their number is the "
                   f"table's `questions`, the least over a model's cells); greedy and τ = "
                   f"{a.temperature} (seed 0) episodes, parallel dispatch, {a.max_new_tokens} new tokens a turn.\n\n"
                   f"{table(results)}\n\nThe same without the forced think prefix (the vanilla baseline's "
                   f"rollouts):\n\n{table_np(results)}")
    body = f"{start}\n{section}\n{end}"
    path = Path(a.write_doc)
    text = path.read_text() if path.exists() else f"# The paradox testbed\n\n{start}\n{end}\n"
    if start not in text:
        text += f"\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    path.write_text(head + body + rest.split(end, 1)[1])
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=["all", "data", "base", "cold", "contrast", "skip", "measure", "ship"],
                   default="all")
    p.add_argument("--base", default=str(ASSETS / "paradox-base"),
                   help="the base the cold starts begin from when OUT/base is absent (default: the shipped one)")
    p.add_argument("--skip-prior", default="", metavar="K:p,...",
                   help="--stage skip: the oracle's tool prior by K (synth --tool-prior-at-k; default: the preset's)")
    p.add_argument("--skip-name", default="skip",
                   help="--stage skip: names its data (DATA/paradox_<name>_train) and its run (<name>cold_<steps>)")
    p.add_argument("--skip-start", default="",
                   help="--stage skip: the model its SFT starts from (default: the base; e.g. paradox-cold, so that "
                        "the skip rows go on top of a cold start that reads its crops)")
    p.add_argument("--skip-run", default="",
                   help="--stage skip: its run's name, checkpoints <run>_<steps> (default: <skip-name>cold)")
    p.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra SFT override for the cold starts (e.g. threads=1); repeatable")
    p.add_argument("--k64-samples", type=int, default=1,
                   help="τ = 0.7 seeds at K = 64 per model (the call-vs-skip split reads them all)")
    p.add_argument("--table", choices=["first", "skip", "crops"], default="first",
                   help="which testbed's table --write-doc writes (skip: the second testbed's, with the split; "
                        "crops: whether each cold start reads its crops, K = 4 per kind of question)")
    p.add_argument("--data", type=Path, default=Path("data"))
    p.add_argument("--out", type=Path, default=Path("runs/paradox_testbed"))
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-test", type=int, default=300)
    p.add_argument("--base-steps", type=int, default=1200, help="SFT steps on the tool-prior layout")
    p.add_argument("--cold-steps", type=lambda s: [int(x) for x in s.split(",")], default=[50, 100, 200, 400],
                   help="cold-start checkpoints to keep (cumulative steps)")
    p.add_argument("--cold-lr", type=float, default=3e-4)
    p.add_argument("--models", default=None, help="comma-separated models to measure (default: base and each cold_N)")
    p.add_argument("--np-models", type=lambda s: s.split(","), default=None,
                   help="measure only these without the think prefix too (default: every model measured)")
    p.add_argument("--sft", default=None, help="also measure this checkpoint as 'sft' (e.g. the shipped SFT start)")
    p.add_argument("--limit", type=int, default=100, help="test questions per cell")
    p.add_argument("--cells", type=lambda s: s.split(","), default=None,
                   help="measure only these cells (e.g. t07_k64,t07_k64_np,t07_k64_s1); default: all")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--ship-cold", default="cold_400", help="the cold start that --stage ship copies to the assets")
    p.add_argument("--write-doc", default=None, help="put the table into this markdown file (e.g. docs/paradox_log.md)")
    a = p.parse_args()
    a.paravt = [sys.executable, "-m", "paravt"]
    a.sft_set = [x for kv in a.sft_set for x in ("-o", kv)]
    stages = ["data", "base", "cold", "measure"] if a.stage == "all" else [a.stage]
    for s in stages:
        if s != "measure":
            {"data": stage_data, "base": stage_base, "cold": stage_cold, "contrast": stage_contrast,
             "skip": stage_skip, "ship": stage_ship}[s](a)
    if "measure" in stages:
        names = a.models.split(",") if a.models else ["base"] + [f"cold_{n}" for n in a.cold_steps]
        if a.sft:
            names.append("sft")
        results = {}
        for name in names:
            cached = a.out / "measure" / name / "summary.json"
            results[name] = json.loads(cached.read_text()) if cached.exists() else {}
            k64 = results[name].get("t07_k64", {}).get("rollouts")
            if not expected_cells(a, name) <= set(results[name]) or not k64 or "attempt" not in k64[0]:
                # cells added since: the others resume at once
                results[name] = measure(a, name)
        print(table(results))
        print(table_np(results))
        print(split_table(results))
        print(crops_table(a, names))
        if a.write_doc:
            write_doc(a, results)


if __name__ == "__main__":
    main()
