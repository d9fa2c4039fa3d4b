"""Servers that hang (SIGSTOP: they accept connections and never answer) or outlive their trainer
(kill -9), as they fail at scale: `paravt eval` routes around a stopped endpoint, `paravt train grpo`
stops a hung rollout server whole and starts it again, and a killed trainer leaves no server behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt.ask import DEFAULT_MODEL
from servetools import paravt_server

pytestmark = pytest.mark.slow


def test_eval_routes_around_a_stopped_endpoint(mini_split, tmp_path):
    """Two `paravt serve` endpoints, one stopped with SIGSTOP: every sample is answered by the other,
    the stopped one is taken out of the rotation and named in the run's output and summary, and the
    score line says what it is over."""
    out = tmp_path / "run"
    with paravt_server("serve", log=tmp_path / "a.log") as (a, proc_a), \
            paravt_server("serve", log=tmp_path / "b.log") as (b, _):
        os.kill(proc_a.pid, signal.SIGSTOP)
        try:
            t0 = time.time()
            r = subprocess.run([sys.executable, "-m", "paravt", "eval", "--bench", "synthvt", "--data", str(mini_split),
                                "--endpoints", f"{a},{b}", "--timeout", "30", "--concurrency", "2", "--limit", "4", "--frames", "4",
                                "--max-turns", "2", "--out", str(out)], capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, COLUMNS="200"))
            took = time.time() - t0
        finally:
            os.kill(proc_a.pid, signal.SIGCONT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 4 and summary["errors"] == 0
    assert [(e["endpoint"], e["event"]) for e in summary["endpoint_events"]] == [(a, "out")]
    assert f"{a} was taken out of the rotation" in r.stdout and "nor to its health check" in r.stdout
    assert "over 4 samples, no errors" in r.stdout
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {c["served_by"] for row in rows for c in _calls(row["episode"])} == {b}
    assert took < 120  # one deadline for the calls in flight on the stopped server, not one per sample


def _calls(episode: dict) -> list[dict]:
    return [t["generation"] for t in episode["turns"]] + [c["generation"] for t in episode["turns"]
                                                          for c in t["calls"] if c.get("generation")]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(_state(p) not in ("Z", None) for p in _members(pgid))


def _members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _server_of(out: Path) -> tuple[int, int]:
    """(the guard's pid = the group's id, the server's pid) of OUT's launched server 0."""
    guard = json.loads((out / "servers" / "server_0.pid").read_text())["pgid"]
    children = Path(f"/proc/{guard}/task/{guard}/children").read_text().split()
    return guard, int(children[0])


def _wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> float:
    t0 = time.time()
    while not cond():
        assert proc is None or proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return time.time() - t0


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_grpo_restarts_a_hung_server_and_a_killed_trainer_leaves_no_server(mini_split, tmp_path):
    """Asynchronous `paravt train grpo` on one launched `paravt serve`: the server is stopped (SIGSTOP)
    after step 1 (the producer may have run ahead: four steps, so later ones need it); the trainer finds it hung (a call past its 5 s deadline, then no answer to its
    health check), stops it whole, starts it again on the newest weights and finishes. Then a rerun
    is killed with SIGKILL: within a few seconds nothing of its server runs."""
    out = tmp_path / "run"
    log = out / "log.jsonl"

    def train(steps: int) -> subprocess.Popen:
        opts = dict(model=DEFAULT_MODEL, data=mini_split / "rl.parquet", out=out, steps=steps, prompts_per_step=2,
                    rollouts_per_prompt=2, **{"episode.max_new_tokens": 40, "rollout.engine": "servers",
                                              "rollout.launch": "paravt", "rollout.devices": "[cpu]",
                                              "rollout.max_staleness": 2, "rollout.timeout_s": 5},
                    device="cpu", threads=1, lr=3e-4, save_every=1)
        args = [sys.executable, "-m", "paravt", "train", "grpo"] + [x for k, v in opts.items() for x in ("-o", f"{k}={v}")]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))

    def steps_logged() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    proc = train(4)
    _wait_for(lambda: steps_logged() >= 1, 300, "step 1", proc)
    guard, server = _server_of(out)
    os.kill(server, signal.SIGSTOP)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["server_restarts"] >= 1
    assert "its health check got no answer either: stopped it and started it again on the weights of version" in text, text[-3000:]
    assert _state(server) is None  # the stopped server was stopped whole, not left beside the new one

    proc = train(6)  # resumes at step 4; killed once it has made a step
    _wait_for(lambda: (out / "servers" / "server_0.pid").exists() and _server_of(out)[0] != guard
              and steps_logged() >= 5, 300, "the rerun's step 5", proc)
    guard, server = _server_of(out)
    proc.kill()
    proc.wait()
    took = _wait_for(lambda: not _group_alive(guard), 10, "the killed trainer's server stopping")
    assert _state(server) is None and took < 10
