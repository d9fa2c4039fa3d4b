"""`stream: true` on paravt serve: OpenAI's server-sent events, checked with the official openai
client against in-process servers over fakes (what is sent while the model still decodes, stop
strings held back, errors, a client that leaves, a weight-update abort) and over the tiny model;
against a real `paravt serve` process in tests/test_serve.py (its process test, which streams and
answers plainly on one process). All servers bind 127.0.0.1."""

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest
from servetools import Server
from test_openai_backend import FakeBackend

from paravt.backends.base import BackendError, Completion, RequestRejected
from paravt.backends.openai import image_data_url
from paravt.serve import create_app

CHAT = "/v1/chat/completions"


def ask(text: str = "What is shown?", **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def events(response: httpx.Response) -> list:
    """The JSON payloads of an SSE response, "[DONE]" as is."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def content(chunks: list) -> list[str]:
    return [c["choices"][0]["delta"]["content"] for c in chunks
            if isinstance(c, dict) and c.get("choices") and c["choices"][0]["delta"].get("content")]


class StreamingFake:
    """Streams scripted pieces, then a Completion. `hold` (a threading.Event) makes it wait after the
    first piece until the client says it has received that piece; `fail` raises after the first piece;
    `sleep_s` sleeps after it (recording a cancellation)."""

    name = "stream-fake"

    def __init__(self, pieces: list[str], final: str, hold: threading.Event | None = None,
                 fail: Exception | None = None, sleep_s: float = 0.0, reject: bool = False):
        self.pieces, self.final, self.hold, self.fail, self.sleep_s = pieces, final, hold, fail, sleep_s
        self.reject = reject
        self.held_ok: bool | None = None
        self.cancelled_at: float | None = None
        self.seen = []

    def completion(self) -> Completion:
        return Completion(text=self.final, finish_reason="stop", prompt_tokens=5, completion_tokens=len(self.pieces))

    async def generate(self, reqs):
        self.seen += reqs
        return [self.completion()]

    async def generate_stream(self, req):
        self.seen.append(req)
        if self.reject:
            raise RequestRejected("the prompt is at least 99 tokens, over the limit of 10 tokens for the prompt")
        for i, piece in enumerate(self.pieces):
            yield piece
            if i == 0 and self.hold is not None:
                self.held_ok = await asyncio.to_thread(self.hold.wait, 10)
            if i == 0 and self.fail is not None:
                raise self.fail
            if i == 0 and self.sleep_s:
                try:
                    await asyncio.sleep(self.sleep_s)
                except asyncio.CancelledError:
                    self.cancelled_at = time.perf_counter()
                    raise
        yield self.completion()

    async def aclose(self) -> None:
        pass


def test_hf_backend_streams_pieces_that_join_to_its_completion(tiny_dir):
    from paravt.backends.base import GenerateRequest, Message
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    backend = HFBackend(*load_model(str(tiny_dir), device="cpu"))
    req = GenerateRequest([Message("user", "What is shown?")], max_new_tokens=12, temperature=1.0, seed=3)

    async def collect():
        return [item async for item in backend.generate_stream(req)]

    items = asyncio.run(collect())
    *pieces, final = items
    assert isinstance(final, Completion) and all(isinstance(p, str) for p in pieces)
    assert final.text.startswith("".join(pieces)) and len(pieces) >= final.completion_tokens - 2
    assert final.text == backend.generate_sync([req])[0].text


def test_incremental_text_waits_for_whole_characters(tiny_dir):
    from paravt.backends.hf import IncrementalText
    from paravt.models import load_model

    _, processor = load_model(str(tiny_dir), device="cpu")
    tok = processor.tokenizer
    text = "héllo wörld 😀 ümlaut <tool_call>\n{\"a\": 1}</tool_call> 東京"
    ids = tok.encode(text, add_special_tokens=False)
    inc = IncrementalText(tok)
    pieces = [inc.push(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=False)
    assert not any("\ufffd" in p for p in pieces)


# ------------------------------------------------------------------------------------------
# in-process servers over fakes


def test_chunks_are_sent_while_the_model_still_decodes():
    """The client gets the first piece while the backend waits for it to say so: nothing is buffered."""
    hold = threading.Event()
    b = StreamingFake(["Hel", "lo", " world"], "Hello world", hold=hold)
    with Server(create_app(b, "m")) as s, httpx.stream("POST", s.url + CHAT, json=ask(stream=True), timeout=20) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got.append(json.loads(line[6:]))
                if content(got) == ["Hel"]:
                    hold.set()
    assert b.held_ok is True
    assert "".join(content(got)) == "Hello world"
    assert got[-1]["choices"][0]["finish_reason"] == "stop" and got[-1]["choices"][0]["delta"] == {}


def test_the_openai_client_reads_the_stream_and_usage():
    import openai

    b = StreamingFake(["a", "b", "c"], "abc")
    with Server(create_app(b, "m")) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=ask()["messages"], stream=True,
                                                     stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "abc"
        assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.total_tokens == 8
        chunks = list(client.chat.completions.create(model="m", messages=ask()["messages"], stream=True))
        assert all(c.usage is None and c.choices for c in chunks)  # no usage chunk unless asked


@pytest.mark.parametrize("pieces,final,stop", [
    (["Hello </", "ans", "wer> more"], "Hello ", ["</answer>"]),
    (["a <", "b> c"], "a <b> c", ["</answer>"]),  # a false alarm is sent once it is known to be one
    (["x<", "/", "answer>"], "x", ["</answer>", "STOP"]),
    (["done", "."], "done.", []),
])
def test_a_stop_string_is_never_streamed(pieces, final, stop):
    b = StreamingFake(pieces, final)
    with Server(create_app(b, "m")) as s, httpx.stream("POST", s.url + CHAT, json=ask(stream=True, stop=stop)) as r:
        got = events(r)
    assert "".join(content(got)) == final and got[-1] == "[DONE]"


def test_stream_text_never_sends_past_a_stop_string():
    from paravt.serve import StreamText

    t = StreamText(["</answer>"])
    assert [t.push(p) for p in ["The answer is <", "/ans", "wer>", " tail"]] == ["The ans", "wer ", "is ", ""]
    assert t.finish("The answer is ") == ""
    t = StreamText(["ab"])
    assert [t.push(p) for p in ["xa", "c", "a"]] == ["x", "a", "c"] and t.finish("xaca") == "a"
    t = StreamText([])
    assert [t.push(p) for p in ["a", "b"]] == ["a", "b"] and t.finish("ab") == ""


def test_a_backend_that_cannot_stream_sends_its_text_at_the_end():
    b = FakeBackend()
    with Server(create_app(b, "m")) as s:
        plain = httpx.post(s.url + CHAT, json=ask()).json()
        with httpx.stream("POST", s.url + CHAT, json=ask(stream=True)) as r:
            got = events(r)
    assert content(got) == [plain["choices"][0]["message"]["content"]]
    assert got[-2]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"] and got[-1] == "[DONE]"


def test_an_error_before_the_first_token_is_plain_json():
    for b in (StreamingFake([], "", reject=True), FakeBackend()):
        if isinstance(b, FakeBackend):
            b.fail_next = 1
        with Server(create_app(b, "m")) as s:
            r = httpx.post(s.url + CHAT, json=ask(stream=True))
        want = 400 if isinstance(b, StreamingFake) else 500
        assert r.status_code == want and r.headers["content-type"] == "application/json", r.text
        assert ("over the limit" if want == 400 else "transient failure") in r.json()["error"]["message"]


def test_an_error_after_the_first_token_is_an_error_event():
    import openai

    b = StreamingFake(["partial", "never"], "", fail=BackendError("the model ran out of memory"))
    with Server(create_app(b, "m")) as s:
        with httpx.stream("POST", s.url + CHAT, json=ask(stream=True)) as r:
            got = events(r)
        assert content(got) == ["partial"] and got[-1] == "[DONE]"
        assert got[-2]["error"]["code"] == 500 and "ran out of memory" in got[-2]["error"]["message"]
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="ran out of memory"):
            list(client.chat.completions.create(model="m", messages=ask()["messages"], stream=True))


def test_a_client_that_leaves_mid_stream_cancels_the_generation():
    b = StreamingFake(["first", "second"], "firstsecond", sleep_s=30)
    url = image_data_url(np.zeros((8, 8, 3), np.uint8))
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "stream": True}
    with Server(create_app(b, "m", max_inflight_pixels=64, pixel_wait_s=0.5)) as s:
        with httpx.stream("POST", s.url + CHAT, json=body, timeout=10) as r:
            for line in r.iter_lines():
                if "first" in line:
                    break
        left = time.perf_counter()
        while b.cancelled_at is None and time.perf_counter() - left < 5:
            time.sleep(0.02)
        assert b.cancelled_at is not None and b.cancelled_at - left < 2
        b.sleep_s = 0
        time.sleep(0.1)
        # its pixels came back: a request with the same image fits the budget again
        with httpx.stream("POST", s.url + CHAT, json=body, timeout=10) as r:
            assert r.status_code == 200 and "".join(content(events(r))) == "firstsecond"


def test_a_weight_update_abort_ends_a_stream_with_an_error_event():
    b = StreamingFake(["first", "second"], "firstsecond", sleep_s=30)
    with Server(create_app(b, "m", rl_api=True)) as s:
        with httpx.stream("POST", s.url + CHAT, json=ask(stream=True), timeout=10) as r:
            got = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
                    if content(got) == ["first"]:
                        assert httpx.post(s.url + "/pause?mode=abort", timeout=5).json() == {"status": "paused"}
        assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == 503 and b.cancelled_at is not None
        assert httpx.get(s.url + "/is_paused").json() == {"is_paused": True}
        httpx.post(s.url + "/resume")
        b.sleep_s = 0
        with httpx.stream("POST", s.url + CHAT, json=ask(stream=True), timeout=10) as r:
            assert "".join(content(events(r))) == "firstsecond"
