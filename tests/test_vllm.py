"""paravt against a real vLLM server (opt-in: `pytest -m vllm`; never in CI).

Needs the virtualenv that `../shared/tools/vllm-cpu-env .venv-vllm` builds in the repository root
(or PARAVT_VLLM_PYTHON pointing at its python); skipped without it. Each server takes one to two
minutes to start on a CPU. The shipped tiny checkpoint is served in float32 and compared, greedy,
with the same checkpoint in-process: the whole parallel episode (text, calls, sub-agent summaries,
answer) must be the same, whether or not vLLM's tool-call and reasoning parsers rewrite the turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from paravt.ask import DEFAULT_MODEL
from paravt.procs import free_port

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("PARAVT_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
if not VLLM_PYTHON.exists():
    pytest.skip(f"no vLLM virtualenv at {VLLM_PYTHON} (build it with ../shared/tools/vllm-cpu-env .venv-vllm)",
                allow_module_level=True)

QUESTION = "What colour was the diamond? Answer with one word."


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` on loopback, stopped on exit."""

    def __init__(self, model: Path, *extra: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                    "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "8192",
                    "--gpu-memory-utilization", "0.15", *extra]
        self.log = log

    def __enter__(self) -> "VLLMServer":
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); log: {self.log}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"vLLM did not start in 600 s; log: {self.log}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    out = tmp_path_factory.mktemp("mini")
    subprocess.run([sys.executable, "-m", "paravt", "synth", "--preset", "mini", "--out", str(out), "--n", "6",
                    "--split", "test", "--seed", "0"], check=True, capture_output=True)
    return out


def ask(video: Path, model: str, trace: Path, frames: int = 4) -> tuple[dict, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "paravt", "ask", str(video), QUESTION, "--question-type", "oe",
                        "--model", model, "--frames", str(frames), "--json", str(trace)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(trace.read_text()), time.perf_counter() - t


def summary(ep: dict) -> dict:
    """What must agree between two runs of the same greedy episode."""
    return {"texts": [t["generation"]["text"] for t in ep["turns"]],
            "calls": [[(c["start"], c["end"], c["status"], c["response"]) for c in t["calls"]] for t in ep["turns"]],
            "answer": ep["answer"]}


@pytest.mark.parametrize("parsers", [(), ("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                          "--reasoning-parser", "qwen3")], ids=["plain", "with-parsers"])
def test_the_parallel_episode_over_vllm_equals_in_process(split, tmp_path, parsers):
    video = split / "videos" / "test_00000.mp4"
    local, local_s = ask(video, str(DEFAULT_MODEL), tmp_path / "local.json")
    with VLLMServer(DEFAULT_MODEL, *parsers, log=tmp_path / "vllm.log") as server:
        ask(video, server.url, tmp_path / "warm.json")  # first request compiles/warms the server
        remote, remote_s = ask(video, server.url, tmp_path / "remote.json")
        assert remote["n_executed_calls"] >= 2  # K=4: the model crops in parallel
        assert not any(p["kind"] == "unclosed_think" for t in remote["turns"] for p in t["parsed"]["problems"])
        assert summary(remote) == summary(local)
        # the server's exact ids came back with the text
        g = remote["turns"][0]["generation"]
        assert g["token_ids"] and g["prompt_ids"] and len(g["logprobs"]) == len(g["token_ids"])

        out = tmp_path / "eval"
        r = subprocess.run([sys.executable, "-m", "paravt", "eval", "--bench", "synthvt", "--data", str(split),
                            "--model", server.url, "--frames", "4", "--limit", "4", "--out", str(out)],
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and not any(row.get("error") for row in rows)
    print(f"\nepisode wall time, K=4, {video.name}: in-process {local_s:.1f} s (CLI, model load included), "
          f"vLLM {remote_s:.1f} s (CLI); episode loop alone: in-process {local['wall_time']:.2f} s, "
          f"vLLM {remote['wall_time']:.2f} s")


def test_para_grpo_with_vllm_rollouts_and_disk_weight_sync(split, tmp_path):
    """Two PARA-GRPO steps of the tiny model with rollouts on a real vLLM that paravt starts (dev-mode
    RL API) and disk weight sync; after each sync vLLM's logprobs are the trainer's."""
    import asyncio

    import numpy as np
    import torch

    from paravt.backends.base import GenerateRequest
    from paravt.backends.hf import Renderer, sequence_logprobs
    from paravt.backends.openai import OpenAIBackend
    from paravt.models import load_model
    from paravt.train.grpo import GRPOConfig, train_grpo
    from paravt.train.rollout import RolloutServers

    out = tmp_path / "run"
    server_args = ["--dtype", "float32", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15"]
    cfg = GRPOConfig.load(overrides=[
        f"model={DEFAULT_MODEL}", f"data={split / 'rl.parquet'}", f"out={out}", "steps=2", "prompts_per_step=2",
        "rollouts_per_prompt=4", "episode.max_new_tokens=64", "device=cpu", "lr=1e-4", "save_every=2",
        "rollout.engine=servers", "rollout.launch=vllm", "rollout.devices=[cpu]", f"rollout.vllm_python={VLLM_PYTHON}",
        f"rollout.server_args={json.dumps(server_args)}"])
    kept = {}
    real_close = RolloutServers.close

    def keep_open(self):  # check the server after training, then stop it
        kept["servers"] = self

    RolloutServers.close = keep_open
    try:
        t = time.perf_counter()
        last = train_grpo(cfg)
        seconds = time.perf_counter() - t
        servers = kept["servers"]
        assert last["step"] == 2 and last["logprob_drift"] < 1e-4 and last["episodes"] == 8
        model, processor = load_model(str(out / "checkpoint"), device="cpu")  # the policy after step 2
        from tests.test_hf_backend import msgs

        req = GenerateRequest(msgs(seed=3), max_new_tokens=8)
        got = asyncio.run(OpenAIBackend(servers.urls[0], api_key=servers.api_key).generate([req]))[0]
        images = [p.image for m in req.messages for p in m.images()]
        with torch.no_grad():
            mine = sequence_logprobs(model, Renderer(processor), got.prompt_ids, got.token_ids, images)
            start = load_model(str(DEFAULT_MODEL), device="cpu")[0]
            before = sequence_logprobs(start, Renderer(processor), got.prompt_ids, got.token_ids, images)
        # two engines' fp32 kernels: a token's log-probability may differ by a few 1e-4 (the mean by
        # < 1e-4: the run's logprob_drift); the weights before the two steps are farther off
        served = np.asarray(got.logprobs)
        off, off_start = np.abs(served - mine.numpy()).max(), np.abs(served - before.numpy()).max()
        assert off < 1e-3 and off < off_start, (off, off_start)
        assert servers._http[servers.urls[0]].get(servers.urls[0] + "/weight_info").json()["weight_version"] == "2"
    finally:
        RolloutServers.close = real_close
        if "servers" in kept:
            kept["servers"].close()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    shares = ["%.1f%%" % (100 * r["sync_share"]) for r in log]
    drifts = ["%.1e" % r["logprob_drift"] for r in log]
    print(f"\nPARA-GRPO on vLLM: 2 steps in {seconds:.0f} s (server start included); per step: rollout "
          f"{[round(r['rollout_s'], 2) for r in log]} s, {[round(r['rollout_tokens_per_s']) for r in log]} tok/s, "
          f"sync {[round(r['sync_s'], 2) for r in log]} s ({shares} of the step), logprob drift {drifts}")


def test_asynchronous_para_grpo_on_vllm(split, tmp_path):
    """Three asynchronous PARA-GRPO steps (max_staleness 2) with 32 rollouts per step on a launched vLLM
    (CPU, without chunked prefill): the syncs cut generations in flight (vLLM answers them with
    finish_reason "abort"), which run again on the new weights; every trained call is within the
    bound, and the loss is the decoupled one (its ratio is 1 before the update)."""
    from paravt.train.grpo import GRPOConfig, train_grpo

    out = tmp_path / "run"
    server_args = ["--dtype", "float32", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15"]
    cfg = GRPOConfig.load(overrides=[
        f"model={DEFAULT_MODEL}", f"data={split / 'rl.parquet'}", f"out={out}", "steps=3", "prompts_per_step=4",
        "rollouts_per_prompt=8", "episode.max_new_tokens=64", "device=cpu", "lr=1e-4", "save_every=3", "threads=1",
        "rollout.engine=servers", "rollout.launch=vllm", "rollout.devices=[cpu]", f"rollout.vllm_python={VLLM_PYTHON}",
        "rollout.max_staleness=2", f"rollout.server_args={json.dumps(server_args)}"])
    t = time.perf_counter()
    last = train_grpo(cfg)
    seconds = time.perf_counter() - t
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and last["episodes"] == 32
    for r in log:
        assert r["staleness_max"] <= 2 and abs(r["ratio_mean"] - 1) < 1e-3 and r["logprob_drift"] < 1e-3
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["step"] - 3 <= min(r["versions"]) and max(r["versions"]) <= r["step"] - 1 for r in records)
    print(f"\nasynchronous PARA-GRPO on vLLM: 3 steps in {seconds:.0f} s (server start included); staleness "
          f"{[r['staleness_mean'] for r in log]}, calls sent again {log[-1]['resent_calls']}, busy rollout "
          f"{[round(r['rollout_busy'], 2) for r in log]} update {[round(r['update_busy'], 2) for r in log]}")


@pytest.mark.parametrize("pause", ["drain", "abort"])
def test_a_sync_mid_generation_on_vllm(split, tmp_path, pause):
    """tests/test_async_grpo.py's sync mid-generation on a launched vLLM: with abort, vLLM's cut
    generations (finish_reason "abort") are sent again; with drain, pause?mode=wait; either way every
    call's tokens have the logprobs of the weights of the version it carries."""
    from tests.test_async_grpo import check_sync_mid_generation

    # one sequence at a time, as paravt serve's --max-batch 1 there: a batched vLLM finishes a turn's
    # calls in the same step (the shipped model answers in its first turn, and every call runs to the
    # same token cap), so when the first call's answer is read none is left generating to drain or cut
    server_args = ["--dtype", "float32", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15",
                   "--max-num-seqs", "1"]
    check_sync_mid_generation(split, tmp_path, pause, atol=1e-3, launch="vllm", vllm_python=str(VLLM_PYTHON),
                              server_args=server_args)


@pytest.mark.timeout(1800)  # four vLLM starts on CPU, a minute or more each
def test_a_killed_a_hung_vllm_and_a_killed_trainer(split, tmp_path):
    """tests/test_async_grpo.py's server faults on a launched vLLM: killed (its process group), then
    stopped (SIGSTOP of its API server: its engine process runs on), each started again; a killed
    trainer leaves nothing of its vLLM."""
    from tests.test_async_grpo import check_server_faults

    server_args = ["--dtype", "float32", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15"]
    took = check_server_faults(split / "rl.parquet", tmp_path, {
        "rollout.launch": "vllm", "rollout.vllm_python": str(VLLM_PYTHON), "rollout.timeout_s": 30,
        "rollout.server_args": json.dumps(server_args)}, start_s=900)
    print(f"\nvLLM: step 4 came {took['step_4_after_stop_s']:.0f} s after its server was stopped; a killed "
          f"trainer's vLLM was gone {took['server_gone_after_kill_s']:.1f} s after the kill")


# ---- OpenAI tool calling: paravt serve against vLLM's hermes parser --------------------------------------

LONGVT_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # how LongVT's eval starts vLLM


@pytest.fixture(scope="module")
def vllm_tools(tmp_path_factory):
    """The shipped model on vLLM started as LongVT starts it (native tool calls, the hermes parser)."""
    log = tmp_path_factory.mktemp("vllm_tools") / "vllm.log"
    with VLLMServer(DEFAULT_MODEL, *LONGVT_ARGS, "--no-enable-chunked-prefill", log=log) as server:
        yield server


@pytest.fixture(scope="module")
def served_tiny():
    """The same checkpoint behind paravt serve (in-process, a thread)."""
    from servetools import Server

    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.serve import create_app

    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    with Server(create_app(HFBackend(model, processor), DEFAULT_MODEL.name)) as s:
        yield s, processor


def _tool_requests(split) -> dict[str, dict]:
    """What lmms-eval's loop and paravt's native mode send: an episode's first turn with the tool
    declared, the same with tool_choice none and with parallel_tool_calls false, and a history of
    tool_calls (content text, null and "", arguments that are not JSON) and tool messages (text, text
    parts, an image), with and without a system message."""
    from paravt import protocol as P
    from paravt.agent import build_main_messages
    from paravt.backends.openai import to_native_messages
    from paravt.video import VideoReader

    with VideoReader(split / "videos" / "test_00000.mp4") as r:
        msgs = build_main_messages(r.overview(4), r.duration, QUESTION, "oe", "parallel")
    native, tools = to_native_messages(msgs, prefix=P.THINK_PREFIX)
    cont = {"continue_final_message": True, "add_generation_prompt": False}
    first = {"messages": native, "tools": tools, "tool_choice": "auto", **cont}

    def call(i, args):
        return {"id": f"c{i}", "type": "function", "function": {"name": "crop_video", "arguments": args}}

    history = native[:2] + [
        {"role": "assistant", "content": "<think>\nlook\n</think>", "tool_calls": [
            call(0, '{"start_time": 0, "end_time":15}'), call(1, "not json")]},
        {"role": "tool", "tool_call_id": "c0", "content": "At 3.0 s a white square."},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "Frames<0.5 seconds>"},
                                                           native[1]["content"][1], {"type": "text", "text": "end"}]},
        {"role": "assistant", "content": None, "tool_calls": [call(2, '{"start_time": 3, "end_time": 4}')]},
        {"role": "tool", "tool_call_id": "c2", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "")]},
        {"role": "tool", "tool_call_id": "c3", "content": []},
        {"role": "user", "content": "Answer now."}]
    return {"first": first, "tool_choice none": {**first, "tool_choice": "none"},
            "one call": {**first, "parallel_tool_calls": False},
            "history": {"messages": history, "tools": tools},
            "history, empty system": {"messages": [{"role": "system", "content": ""}] + history[1:], "tools": tools}}


def test_tool_calling_on_paravt_serve_equals_vllms_hermes_parser(split, vllm_tools, served_tiny):
    """The same requests, greedy, to vLLM (hermes parser) and to paravt serve, same checkpoint: the same
    prompt tokens (tools, tool_calls and tool messages rendered alike), the same generated tokens, the
    same content, tool_calls (name, arguments) and finish_reason; streamed, the same calls again."""
    import openai

    server, _ = served_tiny
    urls = {"vllm": vllm_tools.url, "paravt": server.url}
    for name, body in _tool_requests(split).items():
        body = {**body, "model": str(DEFAULT_MODEL), "max_tokens": 200, "temperature": 0, "return_token_ids": True,
                "skip_special_tokens": False}
        got = {}
        for who, url in urls.items():
            r = httpx.post(url + "/v1/chat/completions", json={**body, "model": DEFAULT_MODEL.name} if who == "paravt"
                           else body, timeout=300)
            assert r.status_code == 200, (who, name, r.text[:500])
            data = r.json()
            c = data["choices"][0]
            got[who] = {"prompt": data["prompt_token_ids"], "tokens": c["token_ids"], "finish": c["finish_reason"],
                        "content": c["message"].get("content"), "calls": [
                            (t["type"], t["function"]["name"], t["function"]["arguments"])
                            for t in c["message"].get("tool_calls") or []]}
        a, b = got["vllm"], got["paravt"]
        if name == "one call":  # vLLM's grammar ends the reply after the call's </tool_call>, paravt at it
            a.pop("tokens"), b.pop("tokens")
        assert a == b, name
        if name == "first":
            assert a["finish"] == "tool_calls" and len(a["calls"]) >= 2
            first = a
    for who, url in urls.items():  # streamed through the official client
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        body = _tool_requests(split)["first"]
        chunks = client.chat.completions.create(
            model=str(DEFAULT_MODEL) if who == "vllm" else DEFAULT_MODEL.name, messages=body["messages"],
            tools=body["tools"], temperature=0, max_tokens=200, stream=True,
            extra_body={"continue_final_message": True, "add_generation_prompt": False})
        calls: dict[int, list] = {}
        finish = None
        for ch in chunks:
            if ch.choices:
                finish = ch.choices[0].finish_reason or finish
                for t in ch.choices[0].delta.tool_calls or []:
                    entry = calls.setdefault(t.index, ["", ""])
                    entry[0] += t.function.name or ""
                    entry[1] += t.function.arguments or ""
        got[who] = ([("function", n, args) for _, (n, args) in sorted(calls.items())], finish)
    assert got["vllm"] == got["paravt"] == (first["calls"], "tool_calls")


@pytest.mark.parametrize("mode", ["text", "native"])
def test_paravts_episode_on_vllm_started_as_longvt_starts_it(split, vllm_tools, tmp_path, mode):
    """`paravt ask --tool-calls text|native` against vLLM with LongVT's flags: the whole episode is the
    in-process one (texts, calls, summaries, answer)."""
    video = split / "videos" / "test_00000.mp4"
    local, _ = ask(video, str(DEFAULT_MODEL), tmp_path / "local.json")
    r = subprocess.run([sys.executable, "-m", "paravt", "ask", str(video), QUESTION, "--question-type", "oe",
                        "--model", vllm_tools.url, "--frames", "4", "--json", str(tmp_path / "remote.json"),
                        "--tool-calls", mode], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    remote = json.loads((tmp_path / "remote.json").read_text())
    assert remote["n_executed_calls"] >= 2 and remote["config"]["tool_calls"] == mode
    assert summary(remote) == summary(local)
