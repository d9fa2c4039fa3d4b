"""PARA-GRPO steps per hour, synchronous vs asynchronous rollouts (`rollout.max_staleness` s):
the same tiny-model run (src/paravt/configs/grpo_tiny.yaml, from the shipped model) for N steps at
each s, rollouts on one launched rollout server (`paravt serve`, or vLLM with --vllm-python), the
trainer in its own process; both sides on one thread each.

    .venv/bin/python benchmarks/bench_rl_step.py --steps 20                       # paravt serve, s = 0, 1, 2
    .venv/bin/python benchmarks/bench_rl_step.py --steps 20 --vllm-python .venv-vllm/bin/python
    .venv/bin/python benchmarks/bench_rl_step.py --steps 100 --staleness 0 2 --plot docs/async_curves.png

Steps per hour count the steps after the first (which waits for the first rollouts in every mode).
Busy fractions are the per-step means: rollout = a request in flight on a server (synchronous: the
rollout phase), update = the trainer not waiting for rollouts. Runs resume: rerunning reports what
exists and continues unfinished runs. `--plot` draws reward and κ per step of every run (the
equal-quality check: the curves of s = 0 and s = 2 should agree within run-to-run noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run(a, s: int) -> list[dict]:
    out = a.out / f"{a.server}_s{s}"
    opts = {"model": a.model, "data": f"{a.data}/rl.parquet", "out": out, "steps": a.steps, "save_every": a.steps,
            "keep_checkpoints": 0, "keep_best": "''", "threads": 1, "rollout.engine": "servers",
            "rollout.launch": "vllm" if a.vllm_python else "paravt", "rollout.devices": "[cpu]",
            "rollout.max_staleness": s, "seed": a.seed}
    if a.vllm_python:
        opts["rollout.vllm_python"] = a.vllm_python
        opts["rollout.server_args"] = json.dumps(["--dtype", "float32", "--max-model-len", "8192",
                                                  "--gpu-memory-utilization", "0.15"])
    cmd = [sys.executable, "-m", "paravt", "train", "grpo", "--config", str(a.config)]
    for k, v in opts.items():
        cmd += ["-o", f"{k}={v}"]
    log = out / "log.jsonl"
    done = len(log.read_text().splitlines()) if log.exists() else 0
    if done < a.steps:
        out.mkdir(parents=True, exist_ok=True)
        print(" ".join(cmd), flush=True)
        with open(out / "train.log", "a") as f:
            subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT,
                           env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    return [json.loads(line) for line in log.read_text().splitlines()]


def summary(log: list[dict]) -> dict:
    rest = log[1:] or log
    mean = lambda k: sum(r.get(k, 0.0) for r in rest) / len(rest)  # noqa: E731
    return {"steps": len(log), "steps_per_hour": 3600 * len(rest) / sum(r["step_time_s"] for r in rest),
            "step_s": mean("step_time_s"), "rollout_busy": mean("rollout_busy"), "update_busy": mean("update_busy"),
            "update_s": mean("update_s"), "staleness_mean": mean("staleness_mean"),
            "staleness_max": max((r.get("staleness_max", 0) for r in log), default=0),
            "masked": sum(r.get("behave_masked_tokens", 0) for r in log),
            "trained": sum(r.get("trained_tokens", 0) for r in log),
            "reward": sum(r["reward"] for r in log) / len(log), "kappa": sum(r["kappa"] for r in log) / len(log)}


def plot(logs: dict[str, list[dict]], path: Path, window: int = 10) -> None:
    """Reward and κ per step of each run (`logs`: label -> log.jsonl rows), raw and smoothed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (label, log) in enumerate(logs.items()):
        steps = [r["step"] for r in log]
        for ax, key in zip(axes, ("reward", "kappa")):
            vals = [r[key] for r in log]
            sm = [sum(vals[max(0, i - window + 1):i + 1]) / len(vals[max(0, i - window + 1):i + 1]) for i in range(len(vals))]
            ax.plot(steps, vals, alpha=0.2, color=f"C{i}")
            ax.plot(steps, sm, color=f"C{i}", label=label)
    for ax, title in zip(axes, ("reward per step", "κ (tool calls per rollout)")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    from paravt.ask import DEFAULT_MODEL

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data", type=Path, default=Path("data/mini_train"))
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "src/paravt/configs/grpo_tiny.yaml")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_rl_step"))
    ap.add_argument("--vllm-python", default=None, help="a vLLM environment's python: roll out on vLLM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--compare", type=Path, nargs="*", default=[],
                    help="more run directories (e.g. another seed's) to draw beside these")
    a = ap.parse_args()
    a.server = "vllm" if a.vllm_python else "paravt"
    logs = {s: run(a, s) for s in a.staleness}
    rows = {s: summary(log) for s, log in logs.items()}
    base = rows.get(0)
    t = Table(title=f"PARA-GRPO steps/hour, rollouts on one {a.server} server, {a.steps} steps")
    for c in ("max_staleness", "steps/h", "speed-up", "s/step", "rollout busy", "update busy", "staleness mean/max",
              "masked tokens", "reward", "κ"):
        t.add_column(c)
    for s, r in rows.items():
        t.add_row(str(s), f"{r['steps_per_hour']:.0f}", f"{r['steps_per_hour'] / base['steps_per_hour']:.2f}x" if base else "",
                  f"{r['step_s']:.1f}", f"{r['rollout_busy']:.0%}", f"{r['update_busy']:.0%}",
                  f"{r['staleness_mean']:.2f} / {r['staleness_max']}", f"{r['masked']} of {r['trained']}",
                  f"{r['reward']:.3f}", f"{r['kappa']:.2f}")
    Console(width=150).print(t)
    (a.out / f"{a.server}_summary.json").write_text(json.dumps(rows, indent=1))
    if a.plot:
        runs = {f"max_staleness {s}, seed {a.seed}": log for s, log in logs.items()}
        for d in a.compare:
            cfg = json.loads((d / "config.json").read_text())
            runs[f"max_staleness {cfg['rollout']['max_staleness']}, seed {cfg['seed']}"] = \
                [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()]
        plot(runs, a.plot)
        print(f"wrote {a.plot}")


if __name__ == "__main__":
    main()
