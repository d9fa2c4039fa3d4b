"""A `paravt` server command (serve, app) as its own process on a free loopback port, for tests that
talk to it as a user's client would."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def paravt_server(*args: str, env: dict[str, str] | None = None, ready: str = "/health",
                  timeout_s: float = 90.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m paravt ARGS --port P` until GET `ready` answers 200; yields (base URL, process)
    and kills the process afterwards (if the test has not ended it)."""
    port = free_port()
    env = {**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "paravt", *args, "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + timeout_s
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, f"paravt {args[0]} did not come up"
            try:
                if httpx.get(url + ready, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
