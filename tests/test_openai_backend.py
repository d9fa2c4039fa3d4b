"""The openai backend against local servers on loopback (create_app over a fake Backend, uvicorn in a thread)."""

import asyncio
import json
import socket
import threading
import time

import numpy as np
import pytest

from servetools import Server, free_port

from paravt.backends.base import Backend, BackendError, Completion, GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.openai import OpenAIBackend, image_data_url
from paravt.serve import create_app, decode_image


class FakeBackend:
    """Answers with a description of what it received, so an HTTP round trip can be checked exactly."""

    name = "fake"

    def __init__(self, delay_s: float = 0.0):
        self.seen: list[GenerateRequest] = []
        self.fail_next = 0  # this many calls raise BackendError (the server answers 500)
        self.delay_s = delay_s
        self.active = 0
        self.max_active = 0

    async def generate(self, reqs: list[GenerateRequest]) -> list[Completion]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            out = []
            for r in reqs:
                self.seen.append(r)
                if self.fail_next:
                    self.fail_next -= 1
                    raise BackendError("transient failure")
                layout = "".join("I" if isinstance(p, ImagePart) else "T" for m in r.messages for p in m.parts())
                out.append(Completion(text=f"{layout} prefix={r.prefix!r}", finish_reason="length", prompt_tokens=10,
                                      visual_tokens=4, completion_tokens=3, token_ids=[7, 8, 9],
                                      logprobs=[-0.5, -1.0, -2.0]))
            return out
        finally:
            self.active -= 1

    async def aclose(self) -> None:
        pass


@pytest.fixture
def fake():
    b = FakeBackend()
    with Server(create_app(b, "fake-model", api_key="k")) as s:
        yield b, s


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (32, 48, 3), dtype=np.uint8) for _ in range(n)]


def msgs(n: int = 2) -> list[Message]:
    parts: list = []
    for i, f in enumerate(frames(n)):
        parts += [TextPart(f"<{i}.0 seconds>"), ImagePart(f, timestamp=float(i))]
    return [Message("system", "sys"), Message("user", parts + [TextPart("What?")])]


def test_fake_is_a_backend():
    assert isinstance(FakeBackend(), Backend)
    assert isinstance(OpenAIBackend("http://127.0.0.1:1"), Backend)


def test_images_round_trip_exactly_in_order_with_prefix_and_usage(fake):
    b, s = fake
    be = OpenAIBackend(s.url, api_key="k")  # model=None: the id comes from /v1/models
    out = asyncio.run(be.generate([GenerateRequest(msgs(3), prefix="<think>\n", max_new_tokens=5, seed=3,
                                                   stop=["</answer>"], temperature=0.7, top_p=0.9)]))[0]
    # text/image order kept, prefix continued, not prepended to the text
    assert out.text == "TTITITIT prefix='<think>\\n'"
    assert (out.prompt_tokens, out.visual_tokens, out.completion_tokens, out.finish_reason) == (10, 4, 3, "length")
    assert out.logprobs == [-0.5, -1.0, -2.0] and out.token_ids == [7, 8, 9]  # asked for by default
    got = b.seen[-1]
    assert [m.role for m in got.messages] == ["system", "user"]
    for sent, back in zip(frames(3), got.messages[1].images()):
        assert np.array_equal(sent, back.image)
    assert (got.max_new_tokens, got.seed, got.stop, got.temperature, got.top_p) == (5, 3, ["</answer>"], 0.7, 0.9)
    # the next turn resends the same frames: encoded once, sent again unchanged
    asyncio.run(be.generate([GenerateRequest(msgs(3))]))
    assert be.image_cache.hits == 3
    for sent, back in zip(frames(3), b.seen[-1].messages[1].images()):
        assert np.array_equal(sent, back.image)


def test_jpeg_frames_decode_close_and_png_exact():
    f = frames(1)[0]
    assert np.array_equal(decode_image(image_data_url(f)), f)
    smooth = np.tile(np.linspace(0, 255, 48, dtype=np.uint8)[None, :, None], (32, 1, 3))
    back = decode_image(image_data_url(smooth, "jpeg"))
    assert back.shape == smooth.shape and np.abs(back.astype(int) - smooth).mean() < 4
    with pytest.raises(BackendError, match="HxWx3 uint8"):
        image_data_url(np.zeros((4, 4), np.uint8))


def test_logprobs_off_when_not_wanted(fake):
    _, s = fake
    be = OpenAIBackend(s.url, api_key="k", logprobs=False)
    out = asyncio.run(be.generate([GenerateRequest(msgs(1))]))[0]
    assert out.logprobs is None


def test_4xx_is_a_clear_error_without_retries(fake):
    b, s = fake
    be = OpenAIBackend(s.url, api_key="wrong", max_retries=3, backoff_s=0.01)
    with pytest.raises(BackendError, match=r"HTTP 401.*API key"):
        asyncio.run(be.generate([GenerateRequest(msgs(1))]))
    assert sum(be.requests_sent.values()) == 1
    be = OpenAIBackend(s.url, model="other-model", api_key="k", max_retries=3, backoff_s=0.01)
    with pytest.raises(BackendError, match=r"HTTP 404.*'other-model' is not served"):
        asyncio.run(be.generate([GenerateRequest(msgs(1))]))
    assert not b.seen


def test_5xx_is_retried_with_backoff(fake):
    b, s = fake
    b.fail_next = 2
    be = OpenAIBackend(s.url, api_key="k", max_retries=3, backoff_s=0.05)
    t = time.time()
    out = asyncio.run(be.generate([GenerateRequest(msgs(1))]))[0]
    assert out.text.startswith("TTIT")
    assert len(b.seen) == 3 and sum(be.requests_sent.values()) == 3
    assert time.time() - t >= 0.05 * 0.5 + 0.1 * 0.5  # two backoff sleeps happened
    b.fail_next = 10
    with pytest.raises(BackendError, match=r"unreachable after 2 tries.*HTTP 500.*transient failure"):
        asyncio.run(OpenAIBackend(s.url, api_key="k", max_retries=1, backoff_s=0.01).generate([GenerateRequest(msgs(1))]))


def test_dead_server_fails_fast_and_clearly():
    url = f"http://127.0.0.1:{free_port()}"
    be = OpenAIBackend(url, model="m", max_retries=2, backoff_s=0.01, timeout_s=2)
    t = time.time()
    with pytest.raises(BackendError, match=f"server at {url} unreachable after 3 tries"):
        asyncio.run(be.generate([GenerateRequest(msgs(1))]))
    assert time.time() - t < 5


def test_slow_server_times_out_then_fails():
    b = FakeBackend(delay_s=20.0)
    with Server(create_app(b, "m")) as s:
        be = OpenAIBackend(s.url, model="m", max_retries=1, backoff_s=0.01, timeout_s=0.2)
        t = time.time()
        with pytest.raises(BackendError, match=r"no answer from http://127.0.0.1:\d+ within 0.2 s.*--timeout"):
            asyncio.run(be.generate([GenerateRequest(msgs(1))]))
        assert time.time() - t < 10.0  # the server would take 20 s; slack for a loaded machine


def test_concurrency_limit_and_reuse_across_event_loops():
    b = FakeBackend(delay_s=0.1)
    with Server(create_app(b, "m")) as s:
        be = OpenAIBackend(s.url, concurrency=2)
        for _ in range(2):  # a fresh loop per call, as run_episode_sync and the trainer do
            outs = asyncio.run(be.generate([GenerateRequest(msgs(1)) for _ in range(6)]))
            assert len(outs) == 6
        assert b.max_active == 2


def test_endpoints_share_the_load_and_a_dead_one_is_skipped():
    backs = [FakeBackend(delay_s=0.05), FakeBackend(delay_s=0.05)]
    with Server(create_app(backs[0], "m")) as s1, Server(create_app(backs[1], "m")) as s2:
        be = OpenAIBackend(s1.url, endpoints=[s1.url, s2.url], concurrency=2)
        asyncio.run(be.generate([GenerateRequest(msgs(1)) for _ in range(8)]))
        before = [len(x.seen) for x in backs]
        assert sum(before) == 8 and min(before) >= 3
        # one-at-a-time requests alternate (round-robin on ties), not all on the first endpoint
        async def one_by_one():
            for _ in range(4):
                await be.generate([GenerateRequest(msgs(1))])
        asyncio.run(one_by_one())
        assert [len(x.seen) - n for x, n in zip(backs, before)] == [2, 2]
        dead = f"http://127.0.0.1:{free_port()}"
        be = OpenAIBackend(dead, model="m", endpoints=[dead, s1.url], max_retries=2, backoff_s=0.01)
        outs = asyncio.run(be.generate([GenerateRequest(msgs(1)) for _ in range(4)]))
        assert all(o.text.startswith("TTIT") for o in outs)


def test_non_json_success_body_is_a_backend_error():
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()
    app.post("/v1/chat/completions")(lambda: PlainTextResponse("<html>proxy page</html>"))
    with Server(app) as s:
        with pytest.raises(BackendError, match="not JSON"):
            asyncio.run(OpenAIBackend(s.url, model="m").generate([GenerateRequest(msgs(1))]))


def test_bad_urls_and_settings_rejected():
    with pytest.raises(BackendError, match="http"):
        OpenAIBackend("localhost:8000")
    with pytest.raises(ValueError):
        OpenAIBackend("http://127.0.0.1:1", concurrency=0)


# ---- what real servers send and expect -----------------------------------------------------------

FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "vllm"


class Recorder:
    """A minimal OpenAI-compatible app that records request bodies and answers with a canned body."""

    def __init__(self, answer: dict):
        from fastapi import FastAPI, Request

        self.bodies: list[dict] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat(request: Request):
            self.bodies.append(await request.json())
            return answer


def test_requests_ask_for_special_tokens_token_ids_and_logprobs():
    """vLLM drops special tokens from the text by default: a tokenizer that marks </think> or
    <tool_call> special loses the episode's structure. So the body asks to keep them, and for the
    exact generated ids (vLLM: return_token_ids) that training needs."""
    answer = json.loads((FIXTURES / "chat_parsers_hermes_qwen3_tools.json").read_text())["k64"]
    rec = Recorder(answer)
    with Server(rec.app) as s:
        out = asyncio.run(OpenAIBackend(s.url, model="m").generate([GenerateRequest(msgs(1), prefix="<think>\n")]))[0]
        body = rec.bodies[-1]
        assert body["skip_special_tokens"] is False and body["return_token_ids"] is True and body["logprobs"] is True
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        assert out.token_ids == answer["choices"][0]["token_ids"] and out.token_ids[-1] == 2  # <|im_end|> kept
        assert out.prompt_ids == answer["prompt_token_ids"]
        asyncio.run(OpenAIBackend(s.url, model="m", server_extensions=False).generate([GenerateRequest(msgs(1))]))
        assert not {"skip_special_tokens", "return_token_ids"} & set(rec.bodies[-1])
        with pytest.raises(BackendError, match="continues the final message"):
            asyncio.run(OpenAIBackend(s.url, model="m", server_extensions=False).generate(
                [GenerateRequest(msgs(1), prefix="<think>\n")]))


@pytest.mark.parametrize("k, calls, answer", [("k4", 4, None), ("k64", 0, "magenta")])
def test_turns_split_by_vllm_parsers_are_put_back_together(k, calls, answer):
    """Real vLLM 0.32 bodies (the shipped model served with --enable-auto-tool-choice
    --tool-call-parser hermes --reasoning-parser qwen3): the think went to `reasoning`, the calls to
    `tool_calls`, and the answer tags out of `content`. The rebuilt turn reads as the model wrote it."""
    from paravt import protocol as P
    from paravt.backends.openai import _completion

    data = json.loads((FIXTURES / "chat_parsers_hermes_qwen3_tools.json").read_text())[k]
    c = data["choices"][0]
    assert c["message"].get("reasoning") and (c["message"].get("tool_calls") or "<answer>" not in c["message"]["content"])
    written = bytes(b for t in c["logprobs"]["content"][:-1] for b in t["bytes"]).decode()
    out = _completion(data, "<think>\n", "u")
    assert out.text == written and out.finish_reason == "stop"
    turn = P.parse(out.text, prefix="<think>\n")
    assert len(turn.calls) == calls and turn.answer == answer and turn.think_closed and not turn.problems
    # without token bytes (logprobs off) the fields are joined again: same calls, same answer
    data = json.loads(json.dumps(data))
    data["choices"][0]["logprobs"] = None
    rebuilt = P.parse(_completion(data, "<think>\n", "u").text, prefix="<think>\n")
    assert [x.arguments for x in rebuilt.calls] == [x.arguments for x in turn.calls] and rebuilt.think_closed
    if answer is None:
        assert rebuilt.answer is None


def _raw_server(handler) -> tuple[str, threading.Event]:
    """A TCP server on loopback whose connections `handler(conn, stop)` serves (one thread each)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handler, args=(conn, stop), daemon=True).start()
        srv.close()

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", stop


def _silent(conn, stop):  # accepts, reads, never answers
    conn.settimeout(0.2)
    while not stop.is_set():
        try:
            if not conn.recv(65536):
                break
        except OSError:
            pass
    conn.close()


def _trickle(conn, stop):  # answers one byte at a time, forever: a per-read timeout never fires
    conn.settimeout(5)
    try:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        while not stop.is_set():
            conn.sendall(b" ")
            time.sleep(0.05)
    except OSError:
        pass
    conn.close()


@pytest.mark.parametrize("handler", [_silent, _trickle])
def test_every_call_has_an_overall_deadline(handler):
    """A server that accepts and never answers, or trickles a byte at a time, fails the call within
    timeout_s (retries and the model lookup included), with an error that says so."""
    url, stop = _raw_server(handler)
    try:
        for model in ("m", None):  # None: the model lookup (GET /v1/models) is bounded too
            be = OpenAIBackend(url, model=model, timeout_s=0.6, max_retries=4, backoff_s=0.01)
            t = time.time()
            with pytest.raises(BackendError, match=r"no answer from .* within 0.6 s"):
                asyncio.run(be.generate([GenerateRequest(msgs(1))]))
            assert time.time() - t < 10.0  # the server never finishes; slack for a loaded machine
    finally:
        stop.set()


def _hung_while(hang: threading.Event):
    """A server that, while `hang` is set, accepts and never answers (a stopped or deadlocked process);
    otherwise answers every request 200 with a model list (its health check passes)."""
    def handler(conn, stop):
        conn.settimeout(0.2)
        try:
            while not stop.is_set():
                try:
                    if not conn.recv(65536):
                        return
                except OSError:
                    continue
                if hang.is_set():
                    continue
                body = b'{"data": [{"id": "m"}]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                return
        finally:
            conn.close()
    return handler


def test_a_hung_endpoint_is_routed_around_then_taken_back(monkeypatch):
    """One of two endpoints hangs: the calls in flight on it go on to the other when their deadline
    passes, no new call goes to it while it is out of the rotation, and it comes back once it answers
    its health check. Every call succeeds."""
    import paravt.backends.openai as O

    monkeypatch.setattr(O, "PROBE_S", 0.3)
    hang = threading.Event()
    hang.set()
    hung, stop = _raw_server(_hung_while(hang))
    b = FakeBackend(delay_s=0.05)
    try:
        with Server(create_app(b, "m")) as s:
            be = OpenAIBackend(hung, endpoints=[hung, s.url], model="m", timeout_s=1.0, concurrency=2, backoff_s=0.01)
            t = time.time()
            outs = asyncio.run(be.generate([GenerateRequest(msgs(1)) for _ in range(12)]))
            assert all(o.served_by == s.url for o in outs) and len(b.seen) == 12
            assert be.requests_sent[hung + "/v1"] <= 2  # one deadline per call in flight on it, not one per call
            assert time.time() - t < 8  # 12 calls one after the other on the hung one would take 12 s
            assert [(e["endpoint"], e["event"]) for e in be.endpoint_events] == [(hung, "out")]
            assert "no answer within 1 s" in be.endpoint_events[0]["why"]

            async def later():  # a new event loop: the endpoint is still out and is checked from here
                outs = await be.generate([GenerateRequest(msgs(1)) for _ in range(4)])
                hang.clear()
                await asyncio.sleep(1.5)
                return outs

            sent = be.requests_sent[hung + "/v1"]
            assert all(o.served_by == s.url for o in asyncio.run(later()))
            assert be.requests_sent[hung + "/v1"] == sent  # nothing sent to it while it was out
            assert [e["event"] for e in be.endpoint_events] == ["out", "back"] and not be.out_of_rotation
    finally:
        stop.set()


def test_a_call_fails_only_when_no_endpoint_answers():
    urls, stops = zip(*[_raw_server(_silent) for _ in range(2)])
    try:
        be = OpenAIBackend(urls[0], endpoints=list(urls), model="m", timeout_s=0.5, backoff_s=0.01)
        t = time.time()
        with pytest.raises(BackendError, match=rf"no answer from {urls[0]} and {urls[1]} within 0.5 s"):
            asyncio.run(be.generate([GenerateRequest(msgs(1))]))
        assert time.time() - t < 5
    finally:
        for stop in stops:
            stop.set()
