"""Server processes that cannot outlive the process that started them, and that can be stopped
whole, however they hang.

A server paravt starts (a rollout server of the trainer: `paravt serve` or vLLM) runs under a
*guard*: a small process of this module (stdlib only) that starts the server in its own process
group and watches two things:
- its parent (the trainer): when the parent is gone, however it went (SIGKILL, the OOM killer, a
  preempted node), the guard stops the whole group — the server and any children of it (vLLM's
  engine processes) — with SIGTERM, then SIGKILL after a grace period. A parent-death signal
  (PR_SET_PDEATHSIG) would not do: it fires when the *thread* that forked the child exits, and the
  trainer starts servers again from worker threads; nor does it reach a server's own children.
- the server: when it exits, the guard exits with its code, so the parent's `Popen.poll()` sees
  the server's death.

The guard leads a session of its own, so a terminal's Ctrl-C (sent to the trainer's foreground
group) or a `kill -- -PGID` of the trainer's group does not reach it directly, and `stop_group`
can stop the guard, the server and its children together — a stopped (SIGSTOP) server included,
whose SIGTERM would otherwise wait until it is continued.

Each started server is described by a pid file (JSON: the guard's pid, which is the group's id,
the port, the command, the guard's start time, a random token, and the identity of the folder the
file was written in) so that a rerun can find and stop what a run killed together with its guards
left behind (`stop_leftovers`). The token is also in the environment of the guard, the server and
every child of theirs (TOKEN_ENV): a group is stopped only if one of its live processes carries the
file's token, so a pid file from elsewhere (run folders travel) can name no group but a server this
run's folder itself started; and only from the folder it was written in (its device and inode, which
a rename keeps and a copy does not), so starting a copy of a live run's folder leaves the original
run's servers alone.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

GRACE_S = 10.0  # SIGTERM, then this long, then SIGKILL
WATCH_S = 0.25  # how often the guard looks at its parent and the server
TOKEN_ENV = "PARAVT_GUARD_TOKEN"  # in the environment of a guarded server and its children (module docstring)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `port` now (as uvicorn and vLLM bind: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def wait_port_free(port: int, timeout_s: float = 30.0, host: str = "127.0.0.1") -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(port, host):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def start_guarded(cmd: list[str], *, log, env: dict | None = None, pid_file: str | Path | None = None,
                  port: int | None = None, grace_s: float = GRACE_S) -> subprocess.Popen:
    """Start `cmd` under a guard (module docstring); returns the guard's Popen, whose exit code is
    the server's. Output goes to `log` (an open file)."""
    guard = [sys.executable, "-m", "paravt.procs", "--parent", str(os.getpid()), "--grace", f"{grace_s:g}", "--",
             *cmd]
    token = secrets.token_hex(16)
    env = {**(os.environ if env is None else env), TOKEN_ENV: token}
    proc = subprocess.Popen(guard, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    if pid_file is not None:
        record = {"pid": proc.pid, "pgid": proc.pid, "port": port, "cmd": cmd, "start": _start_ticks(proc.pid),
                  "token": token, "folder": _folder_id(Path(pid_file).parent)}
        Path(pid_file).write_text(json.dumps(record) + "\n")
    return proc


def _folder_id(folder: Path) -> str:
    """The folder itself, not its name: a rename keeps it, a copy is another."""
    st = os.stat(folder)
    return f"{st.st_dev}:{st.st_ino}"


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> int | None:
    """Stop a guarded server's whole group (the guard leads it): SIGTERM and SIGCONT (a stopped
    process handles SIGTERM only once continued), up to `grace_s` for it to exit, then SIGKILL.
    Returns the guard's exit code (None if it could not be reaped)."""
    _signal_group(proc.pid, signal.SIGTERM)
    _signal_group(proc.pid, signal.SIGCONT)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        return None


def stop_leftovers(folder: str | Path, grace_s: float = GRACE_S) -> list[str]:
    """Stop the servers whose pid files in `folder` name a group that still runs (an earlier run's,
    killed with its guards) and were written in this very folder; remove the pid files. A pid file
    written elsewhere (a copy of another run's folder, live or not) names that run's server: it is
    never signalled, and said so. Returns what was stopped or left running, one line each."""
    if not Path(folder).is_dir():
        return []
    stopped = []
    here = _folder_id(Path(folder))
    for f in sorted(Path(folder).glob("*.pid")):
        try:
            rec = json.loads(f.read_text())
            pgid, port, token = int(rec["pgid"]), rec.get("port"), rec["token"]
            if pgid <= 1 or not isinstance(token, str) or len(token) < 16:
                raise ValueError(f"not a guard's record: {rec}")
        except (OSError, ValueError, KeyError, TypeError):
            f.unlink(missing_ok=True)  # an older format, a torn file or a crafted one: nothing to trust
            continue
        members = group_members(pgid, token=token)
        if rec.get("folder") != here:
            if members:
                stopped.append(f"left running a server {f.name} names (process group {pgid}, port {port}): that file "
                               "was written in another folder (this one a copy of a run's?), so the server is that "
                               f"run's to stop (or `kill -- -{pgid}` if it is a leftover of yours)")
            f.unlink(missing_ok=True)
            continue
        if members:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                _signal_group(pgid, sig)
            deadline = time.monotonic() + grace_s
            while group_members(pgid, token=token) and time.monotonic() < deadline:
                time.sleep(0.1)
            if group_members(pgid, token=token):
                _signal_group(pgid, signal.SIGKILL)
            stopped.append(f"stopped a server an earlier run left running (process group {pgid}, port {port}, "
                           f"{len(members)} process(es); from {f.name})")
        f.unlink(missing_ok=True)
    return stopped


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell it from a later one with its pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def group_members(pgid: int, *, token: str | None = None) -> list[int]:
    """The live processes of group `pgid` (zombies aside) — with `token`, only if one of them carries
    it in its environment (TOKEN_ENV: a group id, once free, can be taken by an unrelated group, and a
    pid file can be written by anyone). Without /proc: the group's existence alone, and never a
    group asked for by token (nothing could be checked)."""
    proc = Path("/proc")
    if not proc.is_dir():
        if token is not None:
            return []
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except OSError:
            return []
    members, named = [], token is None
    mark = f"{TOKEN_ENV}={token}".encode()
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            members.append(int(d.name))
            if not named:
                named = mark in (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
    return members if named else []


# ---- a run that is asked to stop


class Stop(BaseException):
    """SIGTERM or SIGINT asked the run to stop (raised in the main thread, as Ctrl-C raises
    KeyboardInterrupt): `finally` blocks stop its servers; its last checkpoint stays."""


_held = {"depth": 0, "pending": None}


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside this block SIGTERM and SIGINT raise Stop in the main thread, except inside
    `signals_held()`: there the signal waits until that block ends (an exception raised in the middle
    of a checkpoint's write leaves a half-written checkpoint, and torch's writer then fails with its
    own error). The handlers held before come back after it: a run started from Python (a notebook,
    a test's CliRunner) must not leave Ctrl-C raising Stop in whatever runs next. Off the main
    thread, where signals cannot be handled, the block changes nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in before:
        signal.signal(sig, _on_stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _on_stop(signum, _frame) -> None:
    name = signal.Signals(signum).name
    if _held["depth"]:
        _held["pending"] = name
        return
    raise Stop(name)


@contextmanager
def signals_held():
    """A block that a stop signal does not interrupt (see stop_on_signals); the stop comes after it."""
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
    if not _held["depth"] and _held["pending"]:
        name, _held["pending"] = _held["pending"], None
        raise Stop(name)


# ---- the guard process


def _die_with_parent() -> None:
    """In the server, before exec (Linux): SIGKILL when the guard dies, even by SIGKILL. The guard
    has one thread, so the thread caveat of PR_SET_PDEATHSIG does not apply here."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _guard(parent: int, cmd: list[str], grace_s: float) -> int:
    """Run `cmd` in this process's group until it exits (its code is returned) or `parent` goes
    (the group is stopped). SIGTERM, SIGINT and SIGHUP to the guard stop the server too."""
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while True:
        rc = child.poll()
        if rc is not None:
            return rc if rc >= 0 else 128 - rc
        if stop["why"] is None and os.getppid() != parent:
            stop["why"] = f"its parent {parent} is gone"
        if stop["why"] is not None:
            break
        time.sleep(WATCH_S)
    print(f"paravt guard: stopping the server ({stop['why']})", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM below is for the server
    _signal_group(os.getpgrp(), signal.SIGTERM)
    _signal_group(os.getpgrp(), signal.SIGCONT)
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(os.getpgrp(), signal.SIGKILL)  # the server's children too; the guard goes with them
    return 143


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        sep = args.index("--")
        opts = dict(zip(args[:sep:2], args[1:sep:2]))
        parent, grace_s, cmd = int(opts["--parent"]), float(opts.get("--grace", GRACE_S)), args[sep + 1:]
    except (ValueError, KeyError):
        print("usage: python -m paravt.procs --parent PID [--grace S] -- COMMAND...", file=sys.stderr)
        return 2
    if not cmd:
        print("paravt guard: no command", file=sys.stderr)
        return 2
    return _guard(parent, cmd, grace_s)


if __name__ == "__main__":
    sys.exit(main())
