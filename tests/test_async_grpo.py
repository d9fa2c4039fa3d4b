"""Asynchronous PARA-GRPO (rollout.max_staleness > 0, train.producer): the decoupled PPO loss on
hand numbers, a weight sync that cuts generations in flight and loses none nor mixes versions
(every call's tokens are scored again under the weights of the version it is tagged with), and a
run on a launched `paravt serve` whose server is killed, then stopped (hung), mid-run and started
again each time, whose trained tokens all lie within the staleness bound, and whose killed trainer
leaves no server behind."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from paravt.ask import DEFAULT_MODEL
from paravt.procs import group_members
from paravt.train.grpo import ppo_loss


def test_decoupled_ppo_loss_by_hand():
    """w · max(−A·r, −A·clip(r)), r = π_θ/π_prox, w = π_prox/π_behave; w above the cap: no gradient,
    still in the token-mean's denominator."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.5]], requires_grad=True)
    prox = torch.tensor([[-1.2, -2.0, -0.5, -1.0]])
    behave = torch.tensor([[-1.0, -2.5, -3.0, -1.0]])  # w = e^-0.2, e^0.5, e^2.5 (> cap 5), 1
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = ppo_loss(logp, behave, adv, mask, n_tokens=3, clip_eps=0.2, prox_logp=prox, behave_cap=5.0)
    r0, r1 = np.exp(0.2), 1.0  # token 0: r clipped at 1.2 for A > 0 (min of the gains)
    want = (np.exp(-0.2) * -1.0 * min(r0, 1.2) + np.exp(0.5) * 1.0 * r1) / 3
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert stats["behave_masked"].item() == 1 and stats["behave_weight"].item() == pytest.approx(np.exp(-0.2) + np.exp(0.5))
    loss.backward()
    g = logp.grad[0].tolist()
    assert g[0] == 0.0  # clipped
    assert g[1] == pytest.approx(np.exp(0.5) * 1.0 * r1 / 3)  # −A·w·r/3 with A = −1
    assert g[2] == 0.0 and g[3] == 0.0  # over the cap; untrained
    # a token the policy cannot produce (log π = −inf, e.g. a never-sampled id a server sampled):
    # masked and counted, and the gradient stays finite
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    inf = float("-inf")
    bad, st = ppo_loss(lp.clone(), torch.tensor([[-1.0, -2.0]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), 2,
                       prox_logp=torch.tensor([[-1.0, inf]]), behave_cap=5.0)
    bad.backward()
    assert torch.isfinite(bad) and torch.isfinite(lp.grad).all() and st["behave_masked"].item() == 1
    # without π_prox it is the on-policy loss, the ratio against the behaviour logprobs
    on, _ = ppo_loss(logp.detach(), behave, adv, mask, 3, 0.2)
    assert on.item() == pytest.approx(ppo_loss(logp.detach(), behave, adv, mask, 3, 0.2, prox_logp=behave)[0].item())


class _Call:
    def __init__(self, version: int):
        self.generation = self
        self.weight_version, self.served_by = str(version), "fake"


class _Episode:
    def __init__(self, version: int):
        self.turns = [_Call(version)]

    def model_calls(self):
        return [t.generation for t in self.turns]


class _Servers:
    """What the producer needs of RolloutServers, without processes."""

    def __init__(self):
        from paravt.train.rollout import RolloutConfig

        self.urls, self.version, self.api_key, self.launched, self.restarts = ["http://a"], {"http://a": "0"}, None, {}, 0
        self.cfg = RolloutConfig()

    def backend(self, gate, down=None):
        class B:
            resent = 0

            async def aclose(self):
                pass

        return B()

    def dead(self, url):
        return False

    def async_client(self):
        import httpx

        return httpx.AsyncClient()


def test_the_producer_keeps_the_recipes_capacity_and_drops_groups_past_the_bound():
    """accepted + running <= (s + v + 1)·P, whole groups, taken in the order they were submitted (a
    long group is not overtaken by short ones); a group more than s versions behind the trainer is
    dropped all the same and its room refilled."""
    import asyncio

    from paravt.train.producer import RolloutProducer

    release: dict[int, tuple] = {}
    started: list[int] = []

    async def run_group(backend, readers, jobs):
        g = jobs[0]
        started.append(g)
        ev = asyncio.Event()
        release[g] = (ev, None)
        await ev.wait()
        return [_Episode(release[g][1])]

    p = RolloutProducer(_Servers(), max_staleness=2, per_step=2, version=0, plan_group=lambda i: [i],
                        run_group=run_group)

    def on_loop(fn):
        async def call():
            await asyncio.sleep(0.05)  # let submitted groups start
            return fn()
        return p._call(call())

    def finish(groups, version):
        def go():
            for g in groups:
                ev, _ = release[g]
                release[g] = (ev, version)
                ev.set()
        on_loop(go)
        on_loop(lambda: None)

    try:
        assert on_loop(lambda: (p.running, sorted(started))) == (6, [0, 1, 2, 3, 4, 5])  # (2 + 0 + 1)·2
        finish([1, 0, 2], 0)
        groups, failed = p.take(0)
        assert [g.index for g in groups] == [0, 1] and not failed  # submission order, not finishing order
        assert on_loop(lambda: (p.running, p.accepted, len(started))) == (3, 3, 6)  # full: nothing new
        p.reopen(["http://a"], 1)  # version 1: room for two more groups
        assert on_loop(lambda: sorted(started)[-2:]) == [6, 7]
        finish([3, 4, 5, 6, 7], 1)
        p.reopen(["http://a"], 3)
        groups, _ = p.take(3)  # group 2 (v0) is 3 versions behind: dropped; 3 and 4 (v1) are within 2
        assert [g.index for g in groups] == [3, 4] and p.stale_groups == 1
        assert on_loop(lambda: p.accepted + p.running) == (2 + 3 + 1) * 2  # the dropped group's room refilled
    finally:
        # on the producer's loop, which starts groups (and adds to `release`) as room opens: iterating it
        # from this thread raced with a group starting under load ("dictionary changed size")
        p.loop.call_soon_threadsafe(lambda: [ev.set() for ev, _ in list(release.values())])
        p.close()


def _perturbed(model, seed: int):
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.03)
    return model


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory):
    """A launched `paravt serve --max-batch 1` (one request at a time: the next groups are still
    generating when a sync comes), shared by both pauses: each test syncs it to its own weights first."""
    from paravt.train.rollout import RolloutConfig, RolloutServers

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rc = RolloutConfig(engine="servers", launch="paravt", devices=["cpu"], start_timeout_s=300,
                       server_args=["--max-batch", "1"])
    servers = RolloutServers.start(rc, str(DEFAULT_MODEL), tmp_path_factory.mktemp("logs"))
    yield servers
    servers.close()


@pytest.mark.slow
@pytest.mark.parametrize("pause", ["drain", "abort"])
def test_a_sync_mid_generation_loses_nothing_and_mixes_no_versions(mini_split, tmp_path, pause, one_at_a_time):
    """The producer runs ahead (s = 1) while the trainer syncs new weights twice: the generations in
    flight end on the old weights first (drain) or are cut and sent again (abort), every group comes
    back, and each call's tokens have exactly the logprobs of the weights of the version it carries."""
    check_sync_mid_generation(mini_split, tmp_path, pause, servers=one_at_a_time)


def check_sync_mid_generation(data, tmp_path, pause: str, atol: float = 2e-4, min_done: int = 2, servers=None,
                              **servers_cfg) -> None:
    """The test above on `servers`, or on servers launched here with `servers_cfg` (RolloutConfig
    fields): also run on vLLM by tests/test_vllm.py (whose kernels differ from torch's by a few 1e-4 a
    token: `atol`; each version's weights differ from the last by far more)."""
    from paravt.agent import EpisodeConfig
    from paravt.backends.hf import Renderer, sequence_logprobs
    from paravt.models import load_model
    from paravt.train.engine import init_engine
    from paravt.train.grpo import GRPOConfig, _load_samples, _plan_group, play_jobs
    from paravt.train.producer import RolloutProducer
    from paravt.train.rollout import RolloutConfig, RolloutServers, ServerGate, write_sync_weights

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    own = servers is None
    launch = RolloutConfig(engine="servers", devices=["cpu"], start_timeout_s=300, **servers_cfg) if own else servers.cfg
    rc = dataclasses.replace(launch, max_staleness=1, sync_pause=pause)
    cfg = GRPOConfig(data=str(data / "rl.parquet"), prompts_per_step=2, rollouts_per_prompt=2, rollout=rc,
                     episode=EpisodeConfig(mode="parallel", max_turns=2, max_new_tokens=40, sub_max_new_tokens=24,
                                           think_prefix=True))
    samples = _load_samples(cfg)
    engine = init_engine("single", "cpu")
    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    weights = {}
    if own:
        servers = RolloutServers.start(rc, str(DEFAULT_MODEL), tmp_path / "logs")
    servers.banned_ids = Renderer(processor).banned_ids  # as the trainer sets them
    producer = None
    # The first sync must come while the first groups generate, some of their calls done on version 0
    # and others still generating. That moment can last only as long as the first calls' staggered
    # ends (the shipped model answers in its first turn: no call follows them), which a thread polling
    # the counters missed under load ("calls in flight: not within 60 s"). So the sync is asked for
    # on the producer's loop, in the call's own leave(), the moment the state arises: it cannot be
    # missed, and the gate closes before the calls still in flight can end.
    moment = threading.Event()
    left = [0]
    leave = ServerGate.leave

    def leave_then_sync(gate, url):
        leave(gate, url)
        left[0] += 1
        if not moment.is_set() and left[0] >= min_done and sum(gate._calls.values()) >= min(min_done, 2):
            moment.set()
            producer.request_sync(weights[1], 1)  # on the loop: schedules the sync, never blocks

    try:
        weights[0] = write_sync_weights(engine, model, processor, tmp_path, "0", keep=5)
        servers.sync(weights[0], "0")
        weights[1] = write_sync_weights(engine, _perturbed(model, 0), processor, tmp_path, "1", keep=5)
        ServerGate.leave = leave_then_sync
        producer = RolloutProducer(servers, 1, cfg.prompts_per_step, 0, pause=pause,
                                   plan_group=lambda g: _plan_group(cfg, samples, *divmod(g, 2), number=g),
                                   run_group=lambda b, r, jobs: play_jobs(b, r, jobs, cfg.episode, 1.0))
        taken = []
        for v in (0, 1, 2):
            if v == 0:
                assert moment.wait(rc.start_timeout_s), "no call ended while another was generating"
                producer.wait_sync()
            elif v == 1:  # the second may meet the groups the first made room for, or find them done already
                weights[2] = write_sync_weights(engine, _perturbed(model, 1), processor, tmp_path, "2", keep=5)
                producer.sync(weights[2], 2)
            groups, failed = producer.take(v)
            assert not failed and [g.index for g in groups] == [2 * v, 2 * v + 1]
            assert all(v - g.oldest <= 1 for g in groups)
            taken += groups
        resent, drained = producer.resent(), producer.gate.drained_calls
    finally:
        ServerGate.leave = leave
        if producer is not None:
            producer.close()
        if own:
            servers.close()
    # generations were in flight at the syncs: abort cut them (sent again), drain let them end first
    assert (resent > 0, drained > 0) == ((True, False) if pause == "abort" else (False, True)), (resent, drained)
    versions = sorted({v for g in taken for v in g.versions})
    assert versions[0] == 0 and versions[-1] >= 1
    models = {v: load_model(str(weights[v]), device="cpu")[0] for v in versions}
    renderer = Renderer(processor)
    checked = 0
    for g in taken:
        for ep in g.results:
            for c in ep.model_calls():
                images = [p.image for m in c.messages for p in m.images()]
                with torch.no_grad():
                    mine = sequence_logprobs(models[int(c.weight_version)], renderer, c.prompt_ids, c.token_ids, images)
                np.testing.assert_allclose(c.logprobs, mine.numpy(), atol=atol)
                checked += 1
    assert checked >= 12


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_async_grpo_survives_a_killed_and_a_hung_server_and_a_killed_trainer(mini_split, tmp_path):
    """`paravt train grpo` with max_staleness 2 on one launched `paravt serve`: see check_server_faults."""
    check_server_faults(mini_split / "rl.parquet", tmp_path, {"rollout.launch": "paravt", "rollout.timeout_s": 10})


def check_server_faults(data, tmp_path, opts: dict, start_s: float = 300) -> dict:
    """The server process is killed (SIGKILL) after step 1, and the one started again is stopped
    (SIGSTOP: it accepts connections and never answers) after step 2; the trainer starts the dead one
    again, finds the stopped one hung (a call past its deadline, then no answer to its health check),
    stops its whole process group and starts it again on the newest weights. After step 4 the trainer
    itself is killed (SIGKILL): within a few seconds nothing of its server runs. Every trained call
    lies within [v − 2, v] of the version v it updated, and the loss used the recomputed π_prox (two
    minibatches: it equals the fresh forward before the first). The rerun (the CLI's entry point, in
    this process: what is killed is the first trainer) resumes at step 4 with no episode from the first
    run. Returns the times measured."""
    out = tmp_path / "run"
    log = out / "log.jsonl"
    said = tmp_path / "trainer.txt"  # what the trainer prints (its stdout and stderr)

    def overrides(steps: int) -> list[str]:
        args = dict(model=DEFAULT_MODEL, data=data, out=out, steps=steps, prompts_per_step=2, rollouts_per_prompt=2,
                    **{"episode.max_new_tokens": 40, "rollout.engine": "servers", "rollout.devices": "[cpu]",
                       "rollout.max_staleness": 2, **opts},
                    device="cpu", threads=1, lr=3e-4, save_every=1, minibatches=2)  # π_prox recomputed
        return [f"{k}={v}" for k, v in args.items()]

    def train(steps: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "paravt", "train", "grpo"] + [x for o in overrides(steps) for x in ("-o", o)]
        with open(said, "w") as f:  # a file, not a pipe: read while it runs
            started.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                            env={**{k: v for k, v in os.environ.items() if k != "PARAVT_API_KEY"},
                                                 "OMP_NUM_THREADS": "1"}))
        return started[-1]

    def train_here(steps: int) -> str:
        """A run in this process (a fresh one's imports cost the suite ~5 CPU-s); returns what it printed."""
        from contextlib import redirect_stderr, redirect_stdout

        from paravt.train import run_training

        with pytest.MonkeyPatch.context() as mp, open(said, "w") as f, redirect_stdout(f), redirect_stderr(f):
            mp.delenv("PARAVT_API_KEY", raising=False)  # the launched server gets a random key
            mp.setenv("OMP_NUM_THREADS", "1")  # for the server it launches, as the first trainer's
            run_training("grpo", None, overrides(steps))
        return said.read_text()

    def steps_logged(n: int, proc) -> None:
        wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= n, start_s, f"step {n}", proc)

    def output(proc) -> str:
        proc.wait(timeout=600)
        return said.read_text()

    started = []  # a failed check kills its trainers: their guards then stop the servers
    try:
        proc = train(10)  # killed after step 4
        steps_logged(1, proc)
        killed, first = server_of(out, start_s, proc=proc)
        port = json.loads((out / "servers" / "server_0.pid").read_text())["port"]
        assert len(launch_key(first)) >= 32  # a random key, unless the user gave one
        if opts.get("rollout.launch") == "paravt":  # its RL API answers to the key alone (vLLM's has no key)
            assert httpx.post(f"http://127.0.0.1:{port}/pause", params={"mode": "abort"}, timeout=5).status_code == 401
        os.killpg(killed, signal.SIGKILL)
        steps_logged(2, proc)
        guard, stopped = server_of(out, start_s, proc=proc)
        assert guard != killed
        # started again and synced: stopped any earlier, it fails its start (the trainer starts it again too,
        # but by another path than the one this test is for: a call past its deadline, then the health check)
        wait_for(lambda: ": back, on the weights of version" in said.read_text(), start_s, "the server back", proc)
        os.kill(stopped, signal.SIGSTOP)
        t_stop = time.time()
        steps_logged(4, proc)
        took = {"step_4_after_stop_s": time.time() - t_stop}
        assert process_state(stopped) is None and not group_alive(guard)  # stopped whole, not left beside the new one
        guard, server = server_of(out, start_s, ready=False, proc=proc)  # it answered the calls of step 4
        proc.kill()  # the trainer, as the OOM killer would
        text = output(proc)
        took["server_gone_after_kill_s"] = wait_for(lambda: not group_alive(guard), 10, "the killed trainer's server")
        assert process_state(server) is None
        assert "exited with code" in text and "its health check got no answer either" in text, text[-3000:]
        assert "stopped it and started it again on the weights of version" in text, text[-3000:]
        assert text.count(": back, on the weights of version") >= 2, text[-3000:]  # after the kill, after the stop
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["step"] for r in rows][:4] == [1, 2, 3, 4] and rows[3]["server_restarts"] >= 2  # more: a start tried again
        for r in rows:
            assert 0 <= r["staleness_max"] <= 2 and r["staleness_mean"] <= r["staleness_max"]
            assert "behave_masked_tokens" in r and r["episodes"] == 4
            assert r["logprob_drift"] < 1e-4 and r["updates"] == 2  # π_prox is the fresh forward before the update
            assert 0 <= r["rollout_busy"] <= 1 and 0 < r["update_busy"] <= 1  # 0: waiting for the restarted server
        assert any(r["staleness_max"] > 0 for r in rows), "the producer never ran ahead of the trainer"
        records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
        for rec in records:  # trained at version step − 1
            v = rec["step"] - 1
            assert rec["versions"] and v - 2 <= min(rec["versions"]) and max(rec["versions"]) <= v

        last = len(rows)
        text = train_here(last + 1)  # resumes at the last checkpoint: in-flight rollouts lost, the producer refills
        resumed = int(re.search(r"resuming from [\s\S]*? at\s+step\s+(\d+)", text).group(1))  # a kill may beat a save
        assert last - 1 <= resumed <= last
        assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == list(range(1, last + 2))
        records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
        assert all(min(r["versions"]) >= resumed for r in records if r["step"] > resumed)  # nothing from the first run
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
    return took


def wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen | None = None, poll_s: float = 0.1) -> float:
    """Seconds until cond() held (fails past timeout_s, or when `proc` exited meanwhile)."""
    t0 = time.time()
    while not cond():
        assert proc is None or proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)
    return time.time() - t0


def server_of(out, timeout_s: float = 300, ready: bool = True, proc: subprocess.Popen | None = None
              ) -> tuple[int, int]:
    """(its guard's pid, which is the group's id; the server's pid) of OUT's launched server 0, once the
    trainer has set its weight version (one started again a moment ago may still be loading, or be
    loading the weights the trainer sends it)."""
    def read():
        rec = json.loads((out / "servers" / "server_0.pid").read_text())
        return rec, Path(f"/proc/{rec['pgid']}/task/{rec['pgid']}/children").read_text().split()

    def answers() -> bool:
        try:
            rec, children = read()
            if not ready or not children:
                return bool(children)
            info = http.get(f"http://127.0.0.1:{rec['port']}/weight_info",
                            headers={"Authorization": f"Bearer {launch_key(int(children[0]))}"})
            # the trainer's versions are step numbers; vLLM starts at "default", paravt serve at None
            return info.status_code == 200 and str(info.json().get("weight_version")).isdigit()
        except (OSError, ValueError, httpx.HTTPError):
            return False

    # one client for the polls: httpx.get builds a client (an SSL context) per call, ~40 ms of CPU,
    # which at 10 polls a second while a server loads was a third of a core; no connection is kept
    # (the server polled may be killed, stopped or replaced on its port between polls)
    with httpx.Client(timeout=2, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        wait_for(answers, timeout_s, "the launched server answering", proc)
    rec, children = read()
    return rec["pgid"], int(children[0])


def launch_key(pid: int) -> str:
    """The random key a trainer handed its launched server (in the server's environment): the RL API
    answers to it alone."""
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return env.get("PARAVT_API_KEY") or env["VLLM_API_KEY"]


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


@pytest.mark.slow
def test_async_grpo_on_two_trainer_processes(mini_split, tmp_path):
    """`torchrun --nproc_per_node 2` with max_staleness 1: each process's producer rolls out its share
    of the prompts on the one server rank 0 launched; the syncs close every process's gates before
    the pause, so the bound holds for both shares."""
    from tests.test_train_distributed import _run

    out = tmp_path / "run"
    opts = dict(model=DEFAULT_MODEL, data=mini_split / "rl.parquet", out=out, steps=2, prompts_per_step=2,
                rollouts_per_prompt=2, **{"episode.max_new_tokens": 32, "rollout.engine": "servers",
                                          "rollout.launch": "paravt", "rollout.devices": "[cpu]",
                                          "rollout.max_staleness": 1},
                engine="fsdp", device="cpu", threads=1, lr=3e-4, save_every=2)
    _run(["-m", "paravt", "train", "grpo"] + [x for k, v in opts.items() for x in ("-o", f"{k}={v}")], 2, tmp_path)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    for r in log:
        # the servers' logprobs on calls of the weights being updated equal the sharded forward's
        assert r["episodes"] == 4 and r["staleness_max"] <= 1 and r["logprob_drift"] < 1e-4
    assert log[0]["logprob_drift_tokens"] > 0
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["group"] % 2 for r in records}) == [0, 1]  # both processes' shares were trained
    assert all(r["step"] - 2 <= min(r["versions"]) and max(r["versions"]) <= r["step"] - 1 for r in records)


@pytest.mark.parametrize("failures", [2, 3])
def test_a_failed_server_start_is_tried_again_and_never_ends_a_run_without_a_reason(failures, monkeypatch):
    """On a loaded machine a restarted server's start or weight sync can miss its deadline (httpx's
    ReadTimeout has an empty message): the start is tried again, and when every try fails the run's
    error names the exception, its meaning and the end of the server's log."""
    import asyncio
    from types import SimpleNamespace

    import httpx

    import paravt.train.producer as producer

    monkeypatch.setattr(producer, "RELAUNCH_BACKOFF_S", 0.0)
    whys = []

    class Servers:
        cfg = SimpleNamespace(timeout_s=10.0)
        weights, current = "w", "3"

        def relaunch(self, url, why):
            whys.append(why)
            if len(whys) <= failures:
                raise httpx.ReadTimeout("")

        def log_tail(self, url):
            return "; the end of server_0.log:\nINFO loading weights"

    async def sync_one(url, weights, version):
        return None

    me = SimpleNamespace(servers=Servers(), backend=SimpleNamespace(forget_model=lambda url: None),
                         restarting={"u": None}, error=None, changed=asyncio.Event(), _sync_one=sync_one)
    asyncio.run(producer.RolloutProducer._relaunch(me, "u", "exited with code -9", True))
    assert whys[0] == "exited with code -9" and "start 1 of 3 failed (ReadTimeout: no answer within 10 s)" in whys[1]
    assert me.restarting == {}
    if failures < producer.RELAUNCH_TRIES:
        assert me.error is None and len(whys) == failures + 1
    else:
        text = str(me.error)
        assert "did not come back after 3 starts: ReadTimeout: no answer within 10 s" in text
        assert text.endswith("INFO loading weights") and me.changed.is_set()
