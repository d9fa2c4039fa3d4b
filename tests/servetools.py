"""Servers for tests that talk to them as a user's client would, on a free loopback port: a `paravt`
server command (serve, app) as its own process, or an app under uvicorn in a thread (`Server`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from paravt.procs import free_port  # noqa: F401  (re-exported: the tests import it from here)


@contextlib.contextmanager
def paravt_server(*args: str, env: dict[str, str] | None = None, ready: str = "/health", cwd: Path | None = None,
                  log: Path | None = None, timeout_s: float = 90.0,
                  any_answer: bool = False) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m paravt ARGS --port P` until GET `ready` answers 200 (`any_answer`: answers at all,
    for an endpoint a GET is not meant for); yields (base URL, process).
    Afterwards the process is asked to stop (SIGTERM: a server cleans up, e.g. the app's uploads)
    and killed if it has not within 20 s. Its output goes to `log` when given."""
    port = free_port()
    env = {**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"}
    out = open(log, "w") if log else subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-m", "paravt", *args, "--port", str(port)], env=env, cwd=cwd,
                            stdout=out, stderr=subprocess.STDOUT)

    def output() -> str:
        return Path(log).read_text() if log else proc.stdout.read().decode()

    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + timeout_s
        # one client for the polls: httpx.get builds one (an SSL context) per call, ~40 ms of CPU a poll
        with httpx.Client(timeout=1, limits=httpx.Limits(max_keepalive_connections=0)) as http:
            while True:
                assert proc.poll() is None, output()
                assert time.time() < deadline, f"paravt {args[0]} did not come up: {output() if log else ''}"
                try:
                    if http.get(url + ready).status_code == 200 or any_answer:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if log:
            out.close()


class Server:
    """uvicorn on 127.0.0.1:free port in a daemon thread; stopped on exit."""

    def __init__(self, app, **config):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", **config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
