"""Guarded server processes (paravt.procs): a server dies with the process that started it however
that one dies (SIGKILL included), a stopped (SIGSTOP) server is stopped whole with its children, and
what a run killed together with its guard left behind is found from the pid file and stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paravt.procs import free_port, group_members as members, port_is_free, start_guarded, stop_group, stop_leftovers

# A stand-in server: listens on its port (argv[1]); with "fork", a child of it listens on nothing and
# sleeps (as vLLM's engine processes do beside its API server). It forks before it listens, so a busy
# port means the child exists (the tests count the group's members once the port is taken).
SERVER = textwrap.dedent("""
    import os, socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    if len(sys.argv) > 2 and os.fork() == 0:
        s.close()
    else:
        s.listen(8)
    print("ready", flush=True)
    time.sleep(600)
""")


def wait_until(cond, timeout_s: float) -> float:
    """Seconds until cond() held; fails past timeout_s."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - t0


def start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as f:
        proc = start_guarded([sys.executable, "-c", SERVER, str(port), *extra], log=f, pid_file=tmp_path / "s.pid",
                             port=port, grace_s=2)
    wait_until(lambda: not port_is_free(port), 20)
    return proc, port, log


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc")
def test_a_server_dies_with_its_parent_even_by_sigkill(tmp_path):
    """A 'trainer' process starts a guarded server, then is SIGKILLed: within a few seconds nothing of
    the server's group runs and its port is free."""
    trainer = textwrap.dedent(f"""
        import sys, time
        from paravt.procs import start_guarded
        p = start_guarded([sys.executable, "-c", {SERVER!r}, sys.argv[1], "fork"], log=sys.stderr, port=int(sys.argv[1]))
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    port = free_port()
    t = subprocess.Popen([sys.executable, "-c", trainer, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(t.stdout.readline())
        wait_until(lambda: not port_is_free(port) and len(members(pgid)) == 3, 20)  # guard, server, its child
        t.kill()
        t.wait()
        took = wait_until(lambda: not members(pgid), 5)
        assert port_is_free(port) and took < 5
    finally:
        t.kill()


def test_stop_group_stops_a_stopped_server_and_its_children(tmp_path):
    proc, port, _ = start(tmp_path, "fork")
    server = [p for p in members(proc.pid) if p != proc.pid]
    assert len(server) == 2
    for pid in server:
        os.kill(pid, signal.SIGSTOP)  # hung: it accepts connections and never answers
    t0 = time.monotonic()
    stop_group(proc, grace_s=2)
    assert not members(proc.pid) and port_is_free(port)
    assert time.monotonic() - t0 < 10


def test_the_guard_exits_with_the_servers_code(tmp_path):
    with open(tmp_path / "log", "w") as f:
        proc = start_guarded([sys.executable, "-c", "import sys; sys.exit(3)"], log=f)
    assert proc.wait(20) == 3


def test_leftovers_of_a_run_killed_with_its_guard_are_stopped(tmp_path):
    """The guard and the server SIGKILLed together (kill -9 of the guard's group would take all; here
    the server's child survives, as an engine process can): a rerun's stop_leftovers finds the group
    from the pid file, stops it and says so; the pid file is gone."""
    proc, port, _ = start(tmp_path, "fork")
    rec = json.loads((tmp_path / "s.pid").read_text())
    assert rec["pgid"] == proc.pid and rec["port"] == port
    server = sorted(p for p in members(proc.pid) if p != proc.pid)[0]
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(server, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: len(members(proc.pid)) == 1, 5)  # the child is left, in the group
    lines = stop_leftovers(tmp_path, grace_s=2)
    assert len(lines) == 1 and f"port {port}" in lines[0] and "earlier run" in lines[0]
    assert not members(proc.pid) and not (tmp_path / "s.pid").exists()
    assert stop_leftovers(tmp_path) == []


def test_a_copy_of_a_live_runs_folder_never_stops_the_runs_server(tmp_path):
    """A live run's folder copied (cp -r, a backup, a new run started from a copy): the copy's pid file
    names the original's live server, token and all; stop_leftovers in the copy leaves it running, says
    so, and drops the copied file, while the original folder (renamed, even) still stops it."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    proc, port, _ = start(run, "fork")
    shutil.copytree(run, tmp_path / "copy")
    lines = stop_leftovers(tmp_path / "copy", grace_s=2)
    assert len(lines) == 1 and "left running" in lines[0] and f"port {port}" in lines[0]
    assert proc.poll() is None and not port_is_free(port) and not (tmp_path / "copy" / "s.pid").exists()
    old = json.loads((run / "s.pid").read_text())
    (tmp_path / "copy" / "s.pid").write_text(json.dumps({k: v for k, v in old.items() if k != "folder"}))
    assert "left running" in stop_leftovers(tmp_path / "copy", grace_s=2)[0]  # a record that names no folder
    assert proc.poll() is None
    run.rename(tmp_path / "moved")  # a rename keeps the folder: its own rerun still stops what it left
    server = sorted(p for p in members(proc.pid) if p != proc.pid)[0]
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(server, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: len(members(proc.pid)) == 1, 5)  # the server's child is left, in the group
    lines = stop_leftovers(tmp_path / "moved", grace_s=2)
    assert len(lines) == 1 and "earlier run" in lines[0] and not members(proc.pid)


def test_a_pid_file_of_a_finished_run_or_a_reused_group_id_stops_nothing(tmp_path):
    """A live group that took the id of a finished run's group, or that a crafted pid file names (run
    folders travel): it carries no guard's token, so it is never signalled, whatever the file says."""
    (tmp_path / "old.pid").write_text("12345\n")  # the earlier plain format
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        rec = {"pid": other.pid, "pgid": other.pid, "cmd": ["sleep", "60"], "start": 0}
        for i, extra in enumerate([{"port": 1}, {"port": None}, {"port": None, "token": "0" * 32},
                                   {"port": None, "token": ""}, {"port": 60, "token": None}]):
            (tmp_path / f"crafted{i}.pid").write_text(json.dumps({**rec, **extra}))
        (tmp_path / "group1.pid").write_text(json.dumps({"pid": 1, "pgid": 1, "port": None, "token": "0" * 32}))
        assert stop_leftovers(tmp_path, grace_s=0.5) == []
        assert other.poll() is None
        assert not list(tmp_path.glob("*.pid"))
    finally:
        other.kill()
        other.wait()


def test_a_stop_signal_waits_for_a_held_block_then_stops_the_run():
    """SIGTERM raises Stop at once, except inside signals_held() (a checkpoint's write): there it
    waits for the block to end. After stop_on_signals' block, the handlers held before it are back."""
    script = textwrap.dedent("""
        import os, signal, time
        from paravt.procs import Stop, signals_held, stop_on_signals
        with stop_on_signals():
            try:
                with signals_held():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)
                    print("the held block finished", flush=True)
            except Stop as e:
                print("stopped after it:", e.args[0], flush=True)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                print("not stopped")
            except Stop as e:
                print("stopped at once:", e.args[0], flush=True)
        try:  # after the block: Ctrl-C is Python's own again
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            print("KeyboardInterrupt after the block", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines() == ["the held block finished", "stopped after it: SIGTERM", "stopped at once: SIGINT",
                                     "KeyboardInterrupt after the block"], r.stdout + r.stderr
