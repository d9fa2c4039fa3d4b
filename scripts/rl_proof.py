"""Does PARA-GRPO make the model better? Runs and reports it, resumably: PARA-GRPO and the release's
vanilla GRPO from one start (the shipped SFT start, tiny-paravt-sft, by default) on SynthVT, then held-out accuracy of the
start and of each run's checkpoint at K = 4, 16, 64 (parallel dispatch), with 95 % intervals. Writes
docs/rl.md (the table, the run settings, the command) and docs/rl_curves.png (reward, κ, fτ,
entropy, KL per step).

    python scripts/rl_proof.py --steps 300 --limit 200                 # everything, resumable
    python scripts/rl_proof.py --stage report                          # the page from what exists so far
    python scripts/rl_proof.py --stage commands                        # print the commands, run nothing

The PARA-GRPO run is the shipped `tiny-paravt`'s (its model card gives the same command, and
tests/test_rl_proof_script.py checks they agree): grpo_tiny.yaml with `-o seed=2`, 300 steps.

Every stage is a `paravt train grpo` / `paravt eval run` command (printed before it runs), so any
cell can be rerun by hand; both resume, so rerunning continues where it stopped. A run still under
way is evaluated at its newest checkpoint and the table says at which step.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paradox_synthvt import VARIANTS, read_jsonl, run, smooth  # noqa: E402  (the same run/ablation definitions)

RUNS = {"vanilla": "vanilla GRPO", "para_token": "PARA-GRPO"}


def run_overrides(a, name: str) -> list[str]:
    """A run's overrides of the config: its variant's (with its own seed: PARA-GRPO's is 2), then --set,
    whose seed, when given, replaces the variant's (a key given twice is an error at load)."""
    seed_set = any(o.startswith("seed=") for o in a.set)
    return [o for o in VARIANTS[name] if not (seed_set and o.startswith("seed="))] + a.set


def wilson(correct: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a proportion (in %): it stays inside [0, 100] at small n."""
    if n == 0:
        return 0.0, 0.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * (centre - half), 100 * (centre + half)


def checkpoint_step(run_dir: Path) -> int | None:
    state = run_dir / "checkpoint" / "checkpoint_complete"
    return int(state.read_text().split()[0]) if state.exists() else None


def train_jobs(a) -> list:
    jobs = []
    for name in RUNS:
        out = a.out / "rl" / name
        cmd = [*a.paravt, "train", "grpo", "--config", a.config, "-o", f"model={a.start}",
               "-o", f"data={a.train}/rl.parquet", "-o", f"out={out}", "-o", f"steps={a.steps}", "-o", "threads=1"]
        for o in run_overrides(a, name):
            cmd += ["-o", o]
        jobs.append((cmd, out / "train.log"))
    return jobs


def eval_dir(a, name: str, k: int, step: int | None) -> Path:
    return a.out / "eval" / (f"{name}__k{k}" if step is None else f"{name}__step{step}__k{k}")


def eval_jobs(a) -> list:
    models = [("sft", str(a.start), None)]
    for name in RUNS:
        step = checkpoint_step(a.out / "rl" / name)
        if step is not None:
            models.append((name, str(a.out / "rl" / name / "checkpoint"), step))
    jobs = []
    for k in a.ks:
        for name, path, step in models:
            out = eval_dir(a, name, k, step)
            cmd = [*a.paravt, "eval", "run", "--bench", "synthvt", "--data", str(a.test), "--model", path,
                   "--mode", "parallel", "--frames", str(k), "--out", str(out), "--limit", str(a.limit),
                   "--concurrency", str(a.concurrency), "--max-new-tokens", str(a.max_new_tokens)]
            jobs.append((cmd, out / "eval.log"))
    return jobs


def cell(a, name: str, k: int, step: int | None) -> str:
    rows = read_jsonl(eval_dir(a, name, k, step) / "results.jsonl")
    if not rows:
        return "-"
    right = sum(float(r.get("score", 0.0)) for r in rows)
    lo, hi = wilson(right, len(rows))
    return f"{100 * right / len(rows):.1f} [{lo:.0f}, {hi:.0f}] (n={len(rows)})"


def paired_gain(a, name: str, k: int, step: int | None) -> str:
    """The run's accuracy minus the start's on the same questions, in points, with a 95 % paired
    bootstrap interval (`paravt.eval.metrics.paired_gain`): the two score the same questions, so pairing
    removes most of the question-to-question variance that the separate Wilson intervals carry."""
    from paravt.eval.metrics import paired_gain as gain, row_score

    start = {r["id"]: row_score(r) for r in read_jsonl(eval_dir(a, "sft", k, None) / "results.jsonl")}
    run = {r["id"]: row_score(r) for r in read_jsonl(eval_dir(a, name, k, step) / "results.jsonl")}
    mean, lo, hi, n = gain(start, run)
    return "-" if n == 0 else f"{100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def shown(path) -> str:
    """A path as the page shows it: relative to the working folder when inside it (no machine paths)."""
    p = Path(str(path)).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name


def report(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("reward", "mean reward R"), ("kappa", "κ (crop calls per rollout)"), ("f_tau", "fτ (format reward)"),
            ("entropy", "entropy of π_τ (nats/token)"), ("kl", "KL to the reference (nats/token)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.0 * len(keys), 3.6))
    rows = [f"| SFT start | 0 | - | - | - | {' | '.join(cell(a, 'sft', k, None) for k in a.ks)} |"]
    gains = []
    for name, label in RUNS.items():
        log = [r for r in read_jsonl(a.out / "rl" / name / "log.jsonl") if "entropy" in r]
        step = checkpoint_step(a.out / "rl" / name)
        if not log:
            rows.append(f"| {label} | 0 | - | - | - | {' | '.join('-' for _ in a.ks)} |")
            continue
        steps = [r["step"] for r in log]
        for ax, (key, title) in zip(axes, keys):
            ax.plot(steps, smooth([r.get(key, 0.0) for r in log], a.smooth), label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("RL step")
        fifth = max(1, len(log) // 10)
        mean = lambda xs, key: sum(r.get(key, 0.0) for r in xs) / len(xs)  # noqa: E731
        accs = " | ".join(cell(a, name, k, step) for k in a.ks)
        rows.append(f"| {label} | {log[-1]['step']} (eval at {step}) | {mean(log[:fifth], 'entropy'):.3f} | "
                    f"{mean(log[-fifth:], 'entropy'):.3f} | {mean(log[-fifth:], 'kl'):.4f} | {accs} |")
        gains.append(f"| {label} | {' | '.join(paired_gain(a, name, k, step) for k in a.ks)} |")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"PARA-GRPO vs vanilla GRPO on {a.title} from {Path(str(a.start)).name} "
                 f"(moving average over {a.smooth} steps)")
    fig.tight_layout()
    a.docs.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.docs / "rl_curves.png", dpi=100)
    plt.close(fig)
    head = "| run | steps | entropy first | entropy last | KL last | " + " | ".join(f"acc K={k}" for k in a.ks) + " |"
    table = [head, "|" + "---|" * (5 + len(a.ks)), *rows]
    gain_table = ["| run | " + " | ".join(f"gain K={k}" for k in a.ks) + " |", "|" + "---|" * (1 + len(a.ks)), *gains]
    page = (a.docs / "rl.md").read_text() if (a.docs / "rl.md").exists() else ""
    begin, end = "<!-- rl_proof:begin -->", "<!-- rl_proof:end -->"
    overrides = "; ".join(f"{label} `{' '.join('-o ' + o for o in run_overrides(a, name))}`"
                          for name, label in RUNS.items())
    block = [begin, "", f"Written by `scripts/rl_proof.py` from its runs under `{shown(a.out)}`; start "
             f"`{shown(a.start)}`, config `{a.config}`, {a.steps} steps, overrides: {overrides}; test: the first "
             f"{a.limit} questions of `{shown(a.test)}`, parallel dispatch, greedy. Accuracy in % with its 95 % "
             "Wilson interval. Entropy first/last and KL last: means over the first and the last tenth of the "
             "logged steps.", "", *table, "",
             "Gain over the SFT start on the same questions, in points, with a 95 % paired bootstrap interval:", "",
             *gain_table, "", "![curves](rl_curves.png)", "", end]
    if begin in page and end in page:
        page = page[:page.index(begin)] + "\n".join(block) + page[page.index(end) + len(end):]
    else:
        page = page + ("\n" if page else "") + "\n".join(block) + "\n"
    (a.docs / "rl.md").write_text(page)
    print("\n".join(table + [""] + gain_table))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", default=str(Path(__file__).resolve().parents[1] / "src/paravt/assets/tiny-paravt-sft"),
                   help="the SFT start (default: the shipped one, paravt.SFT_MODEL)")
    p.add_argument("--train", type=Path, default=Path("data/mini_train"))
    p.add_argument("--test", type=Path, default=Path("data/mini_test"))
    p.add_argument("--out", type=Path, default=Path("runs/rl_proof"))
    p.add_argument("--docs", type=Path, default=Path("docs"))
    p.add_argument("--config", default="src/paravt/configs/grpo_tiny.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--set", action="append", default=[], help="extra override for both runs (KEY=VALUE)")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    p.add_argument("--limit", type=int, default=200, help="test questions per cell")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--jobs", type=int, default=2, help="commands at once (one torch thread each)")
    p.add_argument("--smooth", type=int, default=10)
    p.add_argument("--stage", choices=["all", "train", "eval", "report", "commands"], default="all",
                   help="commands: print every train and eval command (the eval ones for the checkpoints that exist)")
    p.add_argument("--title", default=None)
    a = p.parse_args()
    a.title = a.title or ("SynthVT-hard" if "hard" in str(a.test) else "SynthVT-mini")
    script = Path(sys.executable).parent / "paravt"
    a.paravt = [str(script)] if script.exists() else [sys.executable, "-m", "paravt"]
    if a.stage == "commands":
        for cmd, _ in train_jobs(a) + eval_jobs(a):  # as a reader types them: `paravt`, no machine paths
            args = [c.replace(str(a.start), shown(a.start)) for c in cmd[len(a.paravt):]]
            print(shlex.join(["paravt", *args]))
        return
    failed = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        if a.stage in ("all", "train"):
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), train_jobs(a)))
        if a.stage in ("all", "eval"):
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), eval_jobs(a)))
    report(a)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
