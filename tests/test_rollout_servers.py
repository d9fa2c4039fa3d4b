"""PARA-GRPO rollouts on `paravt serve` subprocesses with disk weight sync (train.rollout): the
weights really arrive, a dead server's requests go to the other, server ids give the in-process
sequences, and a run with servers trains two steps and resumes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from paravt.ask import DEFAULT_MODEL
from paravt.backends.base import GenerateRequest
from paravt.procs import wait_port_free
from paravt.train.rollout import RolloutConfig, RolloutServers, write_sync_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def split(mini_split):
    return mini_split


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = RolloutConfig(engine="servers", launch="paravt", devices=["cpu", "cpu"], start_timeout_s=300)
    s = RolloutServers.start(cfg, str(DEFAULT_MODEL), tmp_path_factory.mktemp("logs"))
    yield s
    s.close()


def request():
    from tests.test_hf_backend import msgs

    return GenerateRequest(msgs(seed=3), max_new_tokens=8)


def served(servers, url: str):
    """A greedy completion with ids and logprobs from one server (with the key the launched servers want)."""
    from paravt.backends.openai import OpenAIBackend

    return asyncio.run(OpenAIBackend(url, logprobs=True, api_key=servers.api_key).generate([request()]))[0]


def test_after_a_sync_both_servers_hold_the_trainers_weights(servers, tmp_path):
    from paravt.backends.hf import Renderer, sequence_logprobs
    from paravt.models import load_model
    from paravt.train.engine import init_engine

    before = [served(servers, u) for u in servers.urls]
    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    with torch.no_grad():  # a "training step": every weight moved
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    engine = init_engine("single", "cpu")
    weights = write_sync_weights(engine, model, processor, tmp_path, "7")
    seconds = servers.sync(weights, "7")
    assert seconds < 60 and servers.version == {u: "7" for u in servers.urls}
    renderer = Renderer(processor)
    images = [p.image for m in request().messages for p in m.images()]
    for url, old in zip(servers.urls, before):
        new = served(servers, url)
        with torch.no_grad():
            mine = sequence_logprobs(model, renderer, new.prompt_ids, new.token_ids, images)
        np.testing.assert_allclose(new.logprobs, mine.numpy(), atol=1e-4)  # the trainer's weights, exactly
        assert new.token_ids != old.token_ids or not np.allclose(new.logprobs, old.logprobs, atol=1e-3)
        assert servers._http[url].get(url + "/weight_info").json() == {"weight_version": "7"}


def test_server_ids_give_the_in_process_sequences(servers, split, tmp_path):
    """The same greedy episode in-process and over a server: the same training sequences, built from
    the server's prompt_token_ids and token_ids."""
    from paravt.agent import EpisodeConfig, run_episode
    from paravt.backends.hf import HFBackend
    from paravt.backends.openai import OpenAIBackend
    from paravt.models import load_model
    from paravt.train.sequences import episode_sequences
    from paravt.data import load_rl_rows
    from paravt.train.engine import init_engine

    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    servers.sync(write_sync_weights(init_engine("single", "cpu"), model, processor, tmp_path, "0"), "0")
    hf = HFBackend(model, processor)
    cfg = EpisodeConfig(frames=4, max_new_tokens=200, sub_max_new_tokens=60)
    # a question whose evidence the 4 overview frames miss: the shipped model crops in parallel
    s = next(s for s in load_rl_rows(split / "rl.parquet") if s.extra.get("needs_event")
             and not s.extra["overview_visible"]["4"])
    local = asyncio.run(run_episode(hf, s.video, s.question, cfg, question_type=s.question_type))
    remote = asyncio.run(run_episode(OpenAIBackend(servers.urls[0], logprobs=True, api_key=servers.api_key), s.video,
                                     s.question, cfg, question_type=s.question_type))
    assert [t.generation.text for t in remote.turns] == [t.generation.text for t in local.turns]
    a, drift_a = episode_sequences(local, 0.5, hf.renderer, anchoring="token")
    b, drift_b = episode_sequences(remote, 0.5, hf.renderer, anchoring="token")
    assert drift_a == drift_b and len(a) == len(b) and any(s.kind == "sub" for s in a)
    for x, y in zip(a, b):
        assert (x.kind, x.ids, x.mask, x.advantages) == (y.kind, y.ids, y.mask, y.advantages)
        np.testing.assert_allclose(x.old_logprobs, y.old_logprobs, atol=1e-4)


def test_a_dead_server_is_routed_around_then_started_again_and_a_given_one_dropped(servers, tmp_path):
    """One launched server dies: requests go to the other, and the next sync starts it again on the new
    weights. A server given by URL that fails the sync is dropped; with none left the sync says so."""
    from paravt.models import load_model
    from paravt.procs import free_port
    from paravt.train.engine import init_engine

    restarts = servers.restarts
    os.killpg(servers.procs[1].pid, signal.SIGKILL)  # the server's process group: its guard, it, its children
    servers.procs[1].wait()
    assert wait_port_free(servers.launched[servers.urls[1]]["port"])
    backend = servers.backend()
    backend.backoff_s = 0.01
    outs = asyncio.run(backend.generate([request() for _ in range(4)]))
    assert all(o.token_ids for o in outs) and {o.served_by for o in outs} == {servers.urls[0]}
    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    weights = write_sync_weights(init_engine("single", "cpu"), model, processor, tmp_path, "1")
    servers.sync(weights, "1")
    assert len(servers.urls) == 2 and servers.restarts == restarts + 1
    assert servers.version == {u: "1" for u in servers.urls}
    pid_file = servers.launched[servers.urls[1]]["log"].with_suffix(".pid")
    assert json.loads(pid_file.read_text())["pid"] == servers.procs[1].pid
    assert served(servers, servers.urls[1]).token_ids  # the started-again server answers

    live, gone = servers.urls[0], f"http://127.0.0.1:{free_port()}"  # given by URL: one answering, one not
    # servers given by URL are reached with the key configured for them (the fixture's launched ones want theirs)
    given = RolloutServers(RolloutConfig(engine="servers", servers=[live, gone], start_timeout_s=5,
                                         api_key=servers.api_key), [live, gone])
    given.sync(weights, "2")  # the dead one is dropped; the live one's sync is not disturbed by it
    assert given.urls == [live] and given.version[live] == "2"
    assert servers._http[live].get(live + "/weight_info").json() == {"weight_version": "2"}
    with pytest.raises(Exception, match="no rollout server is left"):
        RolloutServers(RolloutConfig(engine="servers", servers=[gone]), [gone]).sync(weights, "3")


def test_grpo_with_two_rollout_servers_trains_and_resumes(servers, split, tmp_path, monkeypatch):
    """`paravt train grpo` on two servers given by URL (the module's pair, holding other weights by
    now): each step syncs them to the trainer's weights, and a rerun (the command, in a process of its
    own) resumes at step 1 and syncs them to the checkpoint first. (A trainer that launches its
    servers, and starts them again on resume, is the async tests' setting: test_async_grpo.py.)"""
    out = tmp_path / "run"
    urls = "[" + ",".join(servers.urls) + "]"

    def train(steps: int, process: bool) -> list[dict]:
        opts = dict(model=DEFAULT_MODEL, data=split / "rl.parquet", out=out, steps=steps, prompts_per_step=2,
                    rollouts_per_prompt=4, **{"episode.max_new_tokens": 48, "rollout.engine": "servers",
                                              "rollout.servers": urls},
                    device="cpu", threads=1, lr=1e-4, save_every=1)
        overrides = [f"{k}={v}" for k, v in opts.items()]
        if process:
            args = [sys.executable, "-m", "paravt", "train", "grpo"] + [x for o in overrides for x in ("-o", o)]
            env = dict(os.environ, OMP_NUM_THREADS="1", PARAVT_API_KEY=servers.api_key)
            r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        else:  # the CLI's entry point in this process: a fresh one's imports cost the suite ~5 CPU-s
            from paravt.train import run_training

            monkeypatch.setenv("PARAVT_API_KEY", servers.api_key)
            run_training("grpo", None, overrides)
        return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]

    log = train(1, process=False)
    log = train(2, process=True)  # resumes at step 1: the servers are synced to the checkpoint
    assert [r["step"] for r in log] == [1, 2]
    last = log[-1]
    # step 2 rolled out on the synced weights: the trainer recomputes the servers' logprobs
    assert last["logprob_drift"] < 1e-4 and last["episodes"] == 8 and last["sync_s"] > 0
    assert sorted(p.name for p in (out / "sync").iterdir()) == ["1", "2"]
    assert all(servers._http[u].get(u + "/weight_info").json() == {"weight_version": "2"} for u in servers.urls)
    # max_staleness 0 (the default) is the synchronous step: no producer, no version gate, no π_prox
    assert "staleness_max" not in last and "behave_masked_tokens" not in last and last["rollout_busy"] > 0
    assert all(json.loads(line)["versions"] == [] for line in (out / "rollouts.jsonl").read_text().splitlines())


def test_a_launched_vllm_reports_the_sampling_distributions_logprobs():
    """vLLM's default logprobs are the τ = 1 values; the trainer's ratio needs log π_τ. On a CPU it also
    runs without chunked prefill (its CPU engine dies under many concurrent seeded requests)."""
    from paravt.train.rollout import launch_command

    gpu = launch_command("vllm", "m", 8000, device="0")
    cpu = launch_command("vllm", "m", 8000, device="cpu")
    assert gpu[gpu.index("--logprobs-mode") + 1] == "processed_logprobs" and "--no-enable-chunked-prefill" not in gpu
    assert "--no-enable-chunked-prefill" in cpu and "processed_logprobs" in cpu
