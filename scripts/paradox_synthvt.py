"""The earlier paradox experiment on SynthVT-mini and -hard (docs/paradox_mini.md, docs/tiny_model.md),
kept to reproduce those runs; the Table 2 campaign on the paradox testbed is scripts/paradox.py.

From one SFT checkpoint, five RL runs with the same budget (the paper's Table 2, arXiv 2605.20342, in miniature):
vanilla GRPO, PARA-GRPO with token anchoring, PARA-GRPO with sequence anchoring, anchoring
only, gating only. Then every final model (and the SFT start) is evaluated on held-out
SynthVT-mini test videos at K overview frames x dispatch modes. Writes per-step fτ/κ plots,
an accuracy grid plot and a markdown table under --docs.

    python scripts/paradox_synthvt.py --sft runs/sft_tiny/checkpoint --train data/mini_train --test data/mini_test
    python scripts/paradox_synthvt.py --config src/paravt/configs/grpo_tiny_hard.yaml --sft runs/sft_tiny_hard/checkpoint \
        --train data/hard_train --test data/hard_test --out runs/paradox_hard --steps 200 --variants vanilla para_token

Every stage is a `paravt train grpo` / `paravt eval run` command (printed before it runs),
so any cell can be rerun by hand; both resume, so rerunning this script continues where it
stopped. Jobs run `--jobs` at a time, one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the paradox modules beside this file
from paradox_campaign import run  # noqa: E402
from paradox_page import smooth  # noqa: E402
from paradox_read import read_jsonl  # noqa: E402
from paravt.synth.oracle import stated_answer  # noqa: E402

# overrides of src/paravt/configs/grpo_tiny.yaml (PARA-GRPO with token anchoring). The vanilla baseline is
# the release's: no nFrames gating, no anchoring, and its format prompt without the think prefix and the
# answer suffix. Each run has a seed of its own (--set seed=N overrides them all).
VARIANTS = {
    "vanilla": ["gating=false", "anchoring=off", "episode.think_prefix=false", "reward.answer_suffix=false", "seed=1"],
    "para_token": ["seed=2"],
    "para_sequence": ["anchoring=sequence", "seed=3"],
    "anchoring_only": ["gating=false", "seed=4"],
    "gating_only": ["anchoring=off", "seed=5"],
}
LABELS = {"sft": "SFT start", "vanilla": "vanilla GRPO", "para_token": "PARA-GRPO (token anchor)",
          "para_sequence": "PARA-GRPO (sequence anchor)", "anchoring_only": "anchoring only",
          "gating_only": "gating only"}


def train_jobs(a) -> list[tuple[list[str], Path]]:
    jobs = []
    for name, overrides in VARIANTS.items():
        if a.variants and name not in a.variants:
            continue
        out = a.out / "rl" / name
        cmd = [*a.paravt, "train", "grpo", "--config", a.config, "-o", f"model={a.sft}",
               "-o", f"data={a.train}/rl.parquet", "-o", f"out={out}", "-o", f"steps={a.steps}", "-o", "threads=1"]
        mine = [o for o in overrides if not (o.startswith("seed=") and any(x.startswith("seed=") for x in a.set))]
        for o in mine + a.set:
            cmd += ["-o", o]
        jobs.append((cmd, out / "train.log"))
    return jobs


def models(a) -> dict[str, str]:
    out = {"sft": str(a.sft)}
    for name in VARIANTS:
        if (not a.variants or name in a.variants) and (a.out / "rl" / name / "checkpoint" / "config.json").exists():
            out[name] = str(a.out / "rl" / name / "checkpoint")
    return out


def eval_dir(a, model: str, mode: str, k: int) -> Path:
    return a.out / "eval" / f"{model}__{mode}__k{k}"


def eval_jobs(a, only: set[str] | None = None) -> list[tuple[list[str], Path, dict[str, str]]]:
    jobs = []  # mode-major, in --modes order: when time runs short, whole modes are done first
    for mode in a.modes:
        for k in a.ks:
            for name, path in models(a).items():
                if only is not None and name not in only:
                    continue
                out = eval_dir(a, name, mode, k)
                cmd = [*a.paravt, "eval", "run", "--bench", "synthvt", "--data", str(a.test), "--model", path,
                       "--mode", mode, "--frames", str(k), "--out", str(out), "--limit", str(a.limit),
                       "--concurrency", str(a.concurrency), "--max-new-tokens", str(a.max_new_tokens)]
                # a CPU eval is fp32 like the SFT figures; on a GPU load_model picks bf16
                jobs.append((cmd, out / "eval.log", {"CUDA_VISIBLE_DEVICES": ""} if a.eval_device == "cpu" else {}))
    return jobs


def plot(a) -> None:
    """The two figures and the report page (--doc-name under --docs), from whatever runs and cells exist."""
    a.docs.mkdir(parents=True, exist_ok=True)
    rl_rows, windows = plot_curves(a)
    grid = plot_grid(a)
    lines = [*run_lines(a, rl_rows), *window_lines(windows), *accuracy_lines(a, grid), *colour_lines(a, grid)]
    (a.docs / a.doc_name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot_curves(a) -> tuple[list[tuple], list[tuple[str, list[dict]]]]:
    """paradox_rl.png, per-step curves of each run; returns each run's first-vs-last-fifth row and its log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # entropy and the KL to the reference tell a policy collapse apart from a policy choosing fewer calls
    keys = [("f_tau", "fτ (mean format reward)"), ("kappa", "κ (crop calls per rollout)"),
            ("accuracy", "rollout accuracy"), ("entropy", "policy entropy (nats/token)"),
            ("kl", "KL to the reference (k3, log)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8))
    rl_rows, windows = [], []
    for name in VARIANTS:
        log = [r for r in read_jsonl(a.out / "rl" / name / "log.jsonl") if "f_tau" in r]
        if not log:
            continue
        steps = [r["step"] for r in log]
        for ax, (key, title) in zip(axes, keys):
            ax.plot(steps, smooth([r.get(key, 0.0) for r in log], a.smooth), label=LABELS[name])
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("RL step")
            if key == "kl":
                ax.set_yscale("log")
        windows.append((name, log))
        first, last = log[: max(1, len(log) // 5)], log[-max(1, len(log) // 5):]
        mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
        k64 = kappa_at_k(read_jsonl(a.out / "rl" / name / "rollouts.jsonl"), 64, len(log))
        rl_rows.append((name, len(log), mean(first, "f_tau"), mean(last, "f_tau"), mean(first, "kappa"),
                        mean(last, "kappa"), mean(first, "accuracy"), mean(last, "accuracy"), *k64))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"PARA-GRPO ablations on {a.title} (moving average over {a.smooth} steps)")
    fig.tight_layout()
    fig.savefig(a.docs / "paradox_rl.png", dpi=110)
    plt.close(fig)
    return rl_rows, windows


def plot_grid(a) -> dict[str, dict[tuple[str, int], dict]]:
    """paradox_accuracy.png, test accuracy by K and dispatch mode; returns each model's cells' summaries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid: dict[str, dict[tuple[str, int], dict]] = {}
    for name in ["sft", *VARIANTS]:
        for mode in a.modes:
            for k in a.ks:
                p = eval_dir(a, name, mode, k) / "summary.json"
                if p.exists():
                    grid.setdefault(name, {})[(mode, k)] = json.loads(p.read_text())
    if grid:
        fig, axes = plt.subplots(1, len(grid), figsize=(3.2 * len(grid), 3.4), squeeze=False)
        for ax, (name, cells) in zip(axes[0], grid.items()):
            m = [[_acc(cells.get((mode, k))) for mode in a.modes] for k in a.ks]
            ax.imshow([[v if v is not None else float("nan") for v in row] for row in m], vmin=0, vmax=100, cmap="viridis")
            for i, row in enumerate(m):
                for j, v in enumerate(row):
                    ax.text(j, i, "-" if v is None else f"{v:.0f}", ha="center", va="center", color="w", fontsize=9)
            ax.set_xticks(range(len(a.modes)), a.modes, rotation=30, fontsize=8)
            ax.set_yticks(range(len(a.ks)), [f"K={k}" for k in a.ks], fontsize=8)
            ax.set_title(LABELS[name], fontsize=9)
        fig.suptitle(f"{a.title} test accuracy (%) by overview frames K and dispatch mode")
        fig.tight_layout()
        fig.savefig(a.docs / "paradox_accuracy.png", dpi=110)
        plt.close(fig)
    return grid


def run_lines(a, rl_rows: list[tuple]) -> list[str]:
    """The page's head and its table of the RL runs, first against last fifth of the steps."""
    lines = [f"# The paradox on {a.title}", "", "Written by `scripts/paradox_synthvt.py`; numbers from its runs. "
             f"Every RL run starts from `{a.sft}` (config `{a.config}`); `--set`: {' '.join(a.set) or 'none'}. "
             "Discussion: [tiny_model.md](tiny_model.md).", "",
             f"## RL runs ({a.steps} steps each; first vs last fifth of the steps)", "",
             "fτ: mean format reward of the rollouts (τ = 0.7); κ: crop calls per rollout; κ at K=64: the same, on",
             "the rollouts whose overview had 64 frames (every rollout of the fixed-K runs, a fifth of the gated ones).", "",
             "| run | steps | fτ first | fτ last | κ first | κ last | κ K=64 first | κ K=64 last | acc first | acc last |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {LABELS[n]} | {s} | {f0:.3f} | {f1:.3f} | {k0:.2f} | {k1:.2f} | {_f(q0)} | {_f(q1)} | {a0:.3f} | {a1:.3f} |"
              for n, s, f0, f1, k0, k1, a0, a1, q0, q1 in rl_rows]
    return lines


def window_lines(windows: list[tuple[str, list[dict]]]) -> list[str]:
    """Each run's means over tenths of the longest run's steps."""
    if not windows:
        return []
    longest = max(len(log) for _, log in windows)
    width = max(1, longest // 10)
    spans = [(lo, lo + width - 1) for lo in range(1, longest + 1, width)]
    lines = ["", f"## Per {width}-step window", "",
             "Means over each window of steps: κ, fτ, rollout accuracy, policy entropy (nats per token) and",
             "KL to the reference; a rising entropy and KL mark a policy that diverges rather than one that",
             "chooses fewer calls.", "",
             "| run | metric | " + " | ".join(f"{lo}-{hi}" for lo, hi in spans) + " |",
             "|---|---|" + "---|" * len(spans)]
    for name, log in windows:
        for key, label, fmt in [("kappa", "κ", "{:.2f}"), ("f_tau", "fτ", "{:.2f}"), ("accuracy", "acc", "{:.2f}"),
                                ("entropy", "entropy", "{:.2f}"), ("kl", "KL", "{:.3f}")]:
            cells = []
            for lo, hi in spans:
                xs = [r.get(key, 0.0) for r in log if lo <= r["step"] <= hi]
                cells.append(fmt.format(sum(xs) / len(xs)) if xs else "-")
            lines.append(f"| {LABELS[name]} | {label} | " + " | ".join(cells) + " |")
    return lines


def accuracy_lines(a, grid: dict) -> list[str]:
    """Test accuracy of every cell (crops per episode beside it), then by question kind where there are several."""
    lines = ["", f"## Test accuracy (%), {a.limit} questions per cell (crops per episode in brackets)", "",
             "| model | " + " | ".join(f"{mode} K={k}" for mode in a.modes for k in a.ks) + " |",
             "|---|" + "---|" * (len(a.modes) * len(a.ks))]
    for name, cells in grid.items():
        vals = []
        for mode in a.modes:
            for k in a.ks:
                c = cells.get((mode, k))
                vals.append("-" if c is None else f"{_acc(c):.1f} ({c.get('mean_tool_calls', 0):.1f})")
        lines.append(f"| {LABELS[name]} | " + " | ".join(vals) + " |")
    tasks = question_kinds(grid)
    if len(tasks) > 1:
        lines += ["", "## Accuracy (%) by question kind, parallel dispatch", "",
                  "| model | " + " | ".join(f"{t} K={k}" for t in tasks for k in a.ks) + " |",
                  "|---|" + "---|" * (len(tasks) * len(a.ks))]
        for name, cells in grid.items():
            vals = []
            for t in tasks:
                for k in a.ks:
                    g = ((cells.get(("parallel", k)) or {}).get("by_task") or {}).get(t)
                    vals.append("-" if g is None else f"{g['score']:.0f} ({g['n']})")
            lines.append(f"| {LABELS[name]} | " + " | ".join(vals) + " |")
    return lines


def question_kinds(grid: dict) -> list[str]:
    return sorted({t for cells in grid.values() for c in cells.values() for t in (c.get("by_task") or {})})


def colour_lines(a, grid: dict) -> list[str]:
    """The colour questions: how often the answer is right, and how often the colour the reasoning names is."""
    header = ["| model | " + " | ".join(f"{mode} K={k}" for mode in a.modes for k in a.ks) + " |",
              "|---|" + "---|" * (len(a.modes) * len(a.ks))]
    said, answered = [], []
    for name in grid:
        s_vals, a_vals = [], []
        for mode in a.modes:
            for k in a.ks:
                rows = read_jsonl(eval_dir(a, name, mode, k) / "results.jsonl")
                colour = [r for r in rows if _is_colour(r) and r.get("episode")]
                right = sum(stated_answer(" ".join(t["generation"]["text"] for t in r["episode"]["turns"])) == r["answer"]
                            for r in colour)
                s_vals.append(f"{100 * right / len(colour):.0f}" if colour else "-")
                a_vals.append(f"{100 * sum(r['score'] for r in colour) / len(colour):.0f}" if colour else "-")
        said.append(f"| {LABELS[name]} | " + " | ".join(s_vals) + " |")
        answered.append(f"| {LABELS[name]} | " + " | ".join(a_vals) + " |")
    others = ("the by-kind table above has the others" if len(question_kinds(grid)) > 1
              else "the other questions of each cell are background-colour controls (chance 1 in 6)")
    return ["", "## Colour questions: answer accuracy (%; chance 12.5 %)", "",
            f"Colour questions only; {others}.", "", *header, *answered,
            "", "## Colour named in the reasoning (%, of the cell's colour questions)", "",
            "The final think of a colour question usually ends \"So the answer is: <colour>.\"; this is how often",
            "that colour is the right one, whatever the <answer> tag says (perception and one copy; chance 12.5 %).", "",
            *header, *said]


def kappa_at_k(rollouts: list[dict], k: int, steps: int) -> tuple[float | None, float | None]:
    """Mean crop calls of the rollouts with K = k, over the first and the last fifth of the steps."""
    fifth = max(1, steps // 5)
    first = [r["n_parsed_calls"] for r in rollouts if r.get("k") == k and r["step"] <= fifth]
    last = [r["n_parsed_calls"] for r in rollouts if r.get("k") == k and r["step"] > steps - fifth]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return mean(first), mean(last)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _is_colour(row: dict) -> bool:
    """A SynthVT colour question (older results name no task: every open-ended question was one)."""
    task = (row.get("extras") or {}).get("task")
    return task in ("colour", "colour_oe") if task else row.get("question_type") == "oe"


def _acc(summary: dict | None) -> float | None:
    if summary is None:
        return None
    return float(summary.get("accuracy", 0.0))  # summary.json holds percentages


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", type=Path, default=Path("runs/sft_tiny/checkpoint"))
    p.add_argument("--train", type=Path, default=Path("data/mini_train"))
    p.add_argument("--test", type=Path, default=Path("data/mini_test"))
    p.add_argument("--out", type=Path, default=Path("runs/paradox"))
    p.add_argument("--docs", type=Path, default=Path("docs"))
    p.add_argument("--doc-name", default="paradox_synthvt.md", help="the report's file under --docs")
    p.add_argument("--config", default="src/paravt/configs/grpo_tiny.yaml")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--set", action="append", default=[], help="extra override for every RL run (KEY=VALUE)")
    p.add_argument("--variants", nargs="*", default=[], help=f"subset of {', '.join(VARIANTS)}")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    p.add_argument("--modes", type=lambda s: s.split(","), default=["parallel", "sequential", "none"])
    p.add_argument("--limit", type=int, default=40, help="test questions per eval cell")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--jobs", type=int, default=2, help="commands at once (one torch thread each)")
    p.add_argument("--smooth", type=int, default=5)
    p.add_argument("--eval-device", choices=["cpu", "auto"], default="cpu",
                   help="cpu: evaluate in fp32 on the CPU even where RL ran on a GPU (figures comparable across machines)")
    p.add_argument("--stage", choices=["all", "train", "eval", "plot"], default="all")
    p.add_argument("--title", default=None, help="the testbed's name in the report (default: from --test)")
    a = p.parse_args()
    a.title = a.title or ("SynthVT-hard" if "hard" in str(a.test) else "SynthVT-mini")
    script = Path(sys.executable).parent / "paravt"  # absent where the package is on PYTHONPATH only
    a.paravt = [str(script)] if script.exists() else [sys.executable, "-m", "paravt"]
    failed = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        first = train_jobs(a) if a.stage in ("all", "train") else []
        if a.stage == "all":  # the SFT start's grid needs no RL run: it fills the cores the RL runs leave idle
            first += eval_jobs(a, {"sft"})
        failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), first))
        if a.stage in ("all", "eval"):
            rest = eval_jobs(a, None if a.stage == "eval" else set(VARIANTS))
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), rest))
    plot(a)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
