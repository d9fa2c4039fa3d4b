"""Servers that hang (SIGSTOP: they accept connections and never answer), as they fail at scale:
`paravt eval` routes around a stopped endpoint, and synchronous rollouts stop a hung launched server
whole and start it again (the asynchronous trainer's hung server and killed trainer:
tests/test_async_grpo.py). Both tests stop the same launched `paravt serve` process (the module's:
one start of a model-loading server, not one a test), each finding the one running when it starts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from paravt.ask import DEFAULT_MODEL
from servetools import Server
from tests.test_async_grpo import process_state, server_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """A `paravt serve --rl-api` process on the shipped model, launched the way the trainer launches
    its rollout servers (under a guard, in a process group of its own, with a short call deadline:
    a hung server is found within seconds); (the servers, the folder whose servers/server_0.pid
    names the running one: the test that stops it and starts it again leaves a new one)."""
    from paravt.train.rollout import RolloutConfig, RolloutServers

    d = tmp_path_factory.mktemp("launched")
    cfg = RolloutConfig(engine="servers", launch="paravt", devices=["cpu"], timeout_s=3, start_timeout_s=120)
    servers = RolloutServers.start(cfg, str(DEFAULT_MODEL), d / "servers")
    yield servers, d
    servers.close()


def test_eval_routes_around_a_stopped_endpoint(mini_split, tmp_path, launched):
    """Two endpoints serving the shipped model: a `paravt serve` process stopped with SIGSTOP (the
    module's launched one), and paravt serve's app in this process (the one that answers: its process
    is not what is tested). The check before the run finds the stopped one does not answer and takes
    it out of the rotation (the run's output and summary name it), every sample is answered by the
    other, and the score line says what it is over. (A server that stops during the run:
    tests/test_openai_backend.py.)"""
    from typer.testing import CliRunner

    from paravt.backends.hf import HFBackend
    from paravt.cli import app
    from paravt.models import load_model
    from paravt.serve import create_app
    from paravt.webguard import h11_protocol

    out = tmp_path / "run"
    servers, folder = launched
    a = servers.urls[0]
    _, pid_a = server_of(folder, ready=False)  # the paravt serve process (its guard's child)
    assert process_state(pid_a) not in (None, "T")  # running: not stopped by an earlier test
    served = create_app(HFBackend(*load_model(str(DEFAULT_MODEL), device="cpu")), Path(DEFAULT_MODEL).resolve().name,
                        loopback_only=True)  # as `paravt serve` builds it
    with Server(served, http=h11_protocol()) as server_b:
        b = server_b.url
        os.kill(pid_a, signal.SIGSTOP)
        try:
            t0 = time.time()
            r = CliRunner().invoke(app, ["eval", "--bench", "synthvt", "--data", str(mini_split), "--endpoints", f"{a},{b}",
                                         "--timeout", "30", "--concurrency", "2", "--limit", "4", "--frames", "4",
                                         "--max-turns", "2", "--out", str(out)], terminal_width=200)
            took = time.time() - t0
        finally:
            os.kill(pid_a, signal.SIGCONT)
    assert r.exit_code == 0, r.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 4 and summary["errors"] == 0
    assert [(e["endpoint"], e["event"]) for e in summary["endpoint_events"]] == [(a, "out")]
    assert f"{a} was taken out of the rotation" in r.output and "(before the run: no answer within" in r.output
    assert "over 4 samples, no errors" in r.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {c["served_by"] for row in rows for c in _calls(row["episode"])} == {b}
    assert took < 120  # one deadline for the calls in flight on the stopped server, not one per sample


def _calls(episode: dict) -> list[dict]:
    return [t["generation"] for t in episode["turns"]] + [c["generation"] for t in episode["turns"]
                                                          for c in t["calls"] if c.get("generation")]


def test_synchronous_rollouts_start_a_hung_server_again_and_send_the_call_again(tmp_path, launched):
    """Synchronous rollouts (no producer): a call to a launched server that hangs is sent again once the
    server was stopped and started again on the current weights, at the current version."""
    from paravt.backends.base import GenerateRequest
    from paravt.models import load_model
    from paravt.train.engine import init_engine
    from paravt.train.rollout import write_sync_weights
    from tests.test_hf_backend import msgs

    servers, folder = launched
    restarts = servers.restarts
    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    servers.sync(write_sync_weights(init_engine("single", "cpu"), model, processor, tmp_path, "3"), "3")
    guard, server = server_of(folder)
    os.kill(server, signal.SIGSTOP)
    out = asyncio.run(servers.backend().generate([GenerateRequest(msgs(seed=3), max_new_tokens=8)]))[0]
    assert out.token_ids and servers.restarts == restarts + 1 and servers.version == {servers.urls[0]: "3"}
    assert process_state(server) is None and servers.procs[0].pid != guard
