"""How long paravt takes to get over the failures of servers and trainers at scale, measured:

- a rollout server that hangs (SIGSTOP: it accepts connections and never answers) during an
  asynchronous PARA-GRPO run: from the stop to the trainer's restart message, and to the next step;
  whether the run finishes every step;
- a trainer killed with SIGKILL (the OOM killer, a preempted node): from the kill until no process of
  its server runs;
- a trainer stopped with SIGTERM: its exit code, the same time, and the checkpoint it kept;
- `paravt eval` over two endpoints, one stopped mid-run: samples failed, the endpoint taken out of the
  rotation, the run's wall time beside the same run with both endpoints answering.

    python benchmarks/bench_faults.py                                   # paravt serve, 20 steps, stop at 5
    python benchmarks/bench_faults.py --vllm-python .venv-vllm/bin/python --timeout 60

The tiny shipped model on a SynthVT-mini split made here. Prints a markdown table; --out keeps the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from paravt import DEFAULT_MODEL
from paravt.procs import free_port, group_members

PY = sys.executable


class Watched:
    """A paravt command whose output lines are kept with the time each arrived."""

    def __init__(self, args: list[str], log: Path):
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen([PY, "-m", "paravt", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
        self.log = open(log, "a")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))
            self.log.write(line)
            self.log.flush()

    def first(self, text: str, after: float = 0.0) -> float | None:
        return next((t for t, line in self.lines if t >= after and text in line), None)


def wait(cond, timeout_s: float, what: str) -> float:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout_s:
            raise SystemExit(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)
    return time.time() - t0


def steps(out: Path) -> int:
    log = out / "log.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def server(out: Path) -> tuple[int, int, int]:
    """(group id, server pid, port) of OUT's launched server 0 once the trainer has set its version."""
    def read():
        rec = json.loads((out / "servers" / "server_0.pid").read_text())
        kids = Path(f"/proc/{rec['pgid']}/task/{rec['pgid']}/children").read_text().split()
        info = httpx.get(f"http://127.0.0.1:{rec['port']}/weight_info", timeout=2).json()
        return rec, kids, info

    def ready() -> bool:
        try:
            _, kids, info = read()
            return bool(kids) and info.get("weight_version") is not None
        except (OSError, ValueError, httpx.HTTPError):
            return False

    wait(ready, 900, "the launched server")
    rec, kids, _ = read()
    return rec["pgid"], int(kids[0]), rec["port"]


def train_args(a, data: Path, out: Path, n: int) -> list[str]:
    opts = {"model": DEFAULT_MODEL, "data": data / "rl.parquet", "out": out, "steps": n, "prompts_per_step": 2,
            "rollouts_per_prompt": 4, "episode.max_new_tokens": 64, "rollout.engine": "servers",
            "rollout.devices": "[cpu]", "rollout.max_staleness": 2, "rollout.timeout_s": a.timeout, "device": "cpu",
            "threads": 1, "save_every": 1, "rollout.launch": "vllm" if a.vllm_python else "paravt"}
    if a.vllm_python:
        opts["rollout.vllm_python"] = a.vllm_python
        opts["rollout.server_args"] = json.dumps(["--dtype", "float32", "--max-model-len", "8192",
                                                  "--gpu-memory-utilization", "0.15"])
    return ["train", "grpo", "--config", "src/paravt/configs/grpo_tiny.yaml"] + \
        [x for k, v in opts.items() for x in ("-o", f"{k}={v}")]


def hung_server(a, data: Path, out: Path) -> dict:
    run = Watched(train_args(a, data, out, a.steps), out.parent / "train.log")
    wait(lambda: steps(out) >= a.stop_at, 1800, f"step {a.stop_at}")
    _, pid, _ = server(out)
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    run.proc.wait(3600)
    t_restart = run.first("stopped it and started it again", t_stop)
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    # the first step whose rollouts needed the restarted server: the first logged after the restart
    t_next = None
    if t_restart is not None:
        t_next = next((t for t, line in run.lines if t > t_restart and line.startswith("step ")), None)
    ahead = sum(1 for t, line in run.lines if t_stop < t < (t_restart or t_stop) and line.startswith("step "))
    return {"finished": f"{len(rows)} of {a.steps} steps (rc {run.proc.returncode})",
            "restarts": rows[-1].get("server_restarts") if rows else None,
            "stop → restart message": _s(t_restart, t_stop), "stop → next step after it": _s(t_next, t_stop),
            "steps made meanwhile (rollouts run ahead)": ahead}


def killed_trainer(a, data: Path, out: Path, sig: int) -> dict:
    run = Watched(train_args(a, data, out, steps(out) + 50), out.parent / "train.log")
    start = steps(out)
    wait(lambda: steps(out) > start, 1800, "a step of the rerun")
    pgid, pid, _ = server(out)
    os.kill(run.proc.pid, sig)
    t = time.time()
    rc = run.proc.wait(120)
    ckpt = out / "checkpoint" / "checkpoint_complete"
    wait(lambda: not group_members(pgid), 60, "the trainer's server stopping")
    return {"exit code": rc, "signal → no process of its server": f"{time.time() - t:.1f} s",
            "checkpoint kept at step": ckpt.read_text().split()[0] if ckpt.exists() else None}


def eval_run(a, data: Path, out: Path, stop_after: int | None) -> dict:
    ports = [free_port(), free_port()]
    servers = [subprocess.Popen([PY, "-m", "paravt", "serve", "--port", str(p)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for u in urls:
            wait(lambda: _answers(u), 300, f"{u}")
        run = Watched(["eval", "--bench", "synthvt", "--data", str(data), "--endpoints", ",".join(urls), "--timeout",
                       str(a.timeout), "--concurrency", "4", "--frames", "4", "--limit", str(a.eval_n), "--out",
                       str(out)], out.parent / f"{out.name}.log")
        t0 = time.time()
        if stop_after is not None:
            wait(lambda: _rows(out) >= stop_after, 600, "the first samples")
            os.kill(servers[0].pid, signal.SIGSTOP)
        run.proc.wait(1800)
        summary = json.loads((out / "summary.json").read_text())
        return {"wall": f"{time.time() - t0:.1f} s", "samples": summary["n"], "failed": summary["errors"],
                "taken out": [e["endpoint"] == urls[0] and e["event"] for e in summary.get("endpoint_events", [])]}
    finally:
        for s in servers:
            os.kill(s.pid, signal.SIGCONT)
            s.terminate()
            s.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _rows(out: Path) -> int:
    f = out / "results.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def _s(t: float | None, t0: float) -> str:
    return "never" if t is None else f"{t - t0:.1f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--stop-at", type=int, default=5)
    p.add_argument("--timeout", type=float, default=20.0, help="rollout.timeout_s and eval --timeout")
    p.add_argument("--eval-n", type=int, default=16)
    p.add_argument("--vllm-python", default="")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    root = a.out or Path(tempfile.mkdtemp(prefix="bench_faults_"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    if not (data / "rl.parquet").exists():
        subprocess.run([PY, "-m", "paravt", "synth", "--preset", "mini", "--out", str(data), "--n", "16", "--split",
                        "train", "--seed", "0"], check=True, capture_output=True)
    out = root / "grpo"
    rows = {"hung rollout server": hung_server(a, data, out),
            "trainer killed (SIGKILL)": killed_trainer(a, data, out, signal.SIGKILL),
            "trainer stopped (SIGTERM)": killed_trainer(a, data, out, signal.SIGTERM)}
    if not a.vllm_python:
        rows["eval, both endpoints answering"] = eval_run(a, data, root / "eval_ok", None)
        rows["eval, one endpoint stopped mid-run"] = eval_run(a, data, root / "eval_stop", 4)
    server_kind = "vLLM" if a.vllm_python else "paravt serve"
    print(f"\n{server_kind}, timeout {a.timeout:g} s, runs in {root}\n")
    print("| case | measured |\n|---|---|")
    for case, measured in rows.items():
        print(f"| {case} | " + "; ".join(f"{k}: {v}" for k, v in measured.items()) + " |")


if __name__ == "__main__":
    main()
