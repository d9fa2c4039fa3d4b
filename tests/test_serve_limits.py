"""paravt serve against requests that must not take it down: over-long prompts (the backend's
RequestRejected), too many or too large images, clients that hang up mid-generation, deeply
nested JSON and lone surrogates. All servers bind 127.0.0.1; all load is a handful of requests."""

import asyncio
import base64
import json
import socket
import struct
import threading
import time
import zlib

import httpx
import numpy as np
import pytest
from servetools import Server
from test_openai_backend import FakeBackend

from paravt.backends.base import RequestRejected
from paravt.backends.openai import image_data_url
from paravt.serve import MAX_IMAGES, MAX_TOTAL_PIXELS, create_app

CHAT = "/v1/chat/completions"


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def img_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def png_header_only(w: int, h: int) -> str:
    """A PNG data URL whose header claims w x h pixels but whose pixel data is a few bytes: it can
    only be refused by size if the size is read from the header, before any decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


# ------------------------------------------------------------------------------------------
# 5. a request the model can never serve (longer than its context) is the client's fault


class RejectingBackend(FakeBackend):
    async def generate(self, reqs):
        raise RequestRejected("the prompt is 70000 tokens (text 3000, images 67000); the model's context is "
                              "32768 tokens (--max-model-len)")


@pytest.fixture(scope="module")
def tiny_backend(tiny_dir):
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    return HFBackend(*load_model(str(tiny_dir), device="cpu"))


def test_a_prompt_over_the_context_is_reported_with_the_whole_prompts_numbers(tiny_backend):
    """The limit and the count are the whole prompt's: 2000 messages once said "the prompt needs more
    than 8 tokens of text" (the room left for the last message), max_tokens near the context "-3 tokens"."""
    import re

    ctx = tiny_backend.max_model_len
    with Server(create_app(tiny_backend, "tiny")) as s:
        many = [{"role": "user", "content": "hello there " * 8}] * 2000
        r = httpx.post(s.url + CHAT, json={"messages": many, "max_tokens": 8}, timeout=60)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert f"over the limit of {ctx - 8} tokens for the prompt" in msg, msg
        assert int(re.search(r"the prompt is at least (\d+) tokens", msg).group(1)) > ctx - 8, msg
        assert f"context is {ctx} tokens, of which max_new_tokens=8" in msg
        r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": ctx - 1})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "over the limit of 1 token for the prompt" in msg and not re.search(r"-\d", msg), msg
    assert tiny_backend.batches_run == 0  # refused before any model work


def test_request_rejected_by_the_backend_is_400_with_its_message():
    with Server(create_app(RejectingBackend(), "m")) as s:
        r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "x" * 1000}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert "70000 tokens" in err["message"] and "32768" in err["message"]


class RecordingHF(FakeBackend):
    """Stands in for HFBackend in `serve()`: records its constructor's keywords."""

    made: list[dict] = []

    def __init__(self, model, processor, **kw):
        super().__init__()
        RecordingHF.made.append(kw)


LOADED: list[str] = []


@pytest.fixture
def serve_wiring(monkeypatch):
    """`paravt serve` with the model loader, the hf backend and uvicorn.run replaced: the app it builds
    is kept, the paths it loads are in LOADED."""
    import uvicorn

    import paravt.backends.hf
    import paravt.models
    import paravt.models.tiny

    apps = []
    RecordingHF.made = []
    LOADED.clear()
    monkeypatch.delenv("PARAVT_MODEL", raising=False)
    monkeypatch.setattr(paravt.backends.hf, "HFBackend", RecordingHF)
    monkeypatch.setattr(paravt.models, "load_model", lambda path, *a, **k: LOADED.append(path) or (object(), object()))
    monkeypatch.setattr(paravt.models.tiny, "build_tiny", lambda *a, **k: (object(), object()))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    return apps


def test_serve_without_a_model_serves_the_shipped_trained_one(serve_wiring, monkeypatch, tmp_path):
    """As `ask`, `eval` and `demo`: the shipped checkpoint (it once served an untrained model, "its
    output is noise"), or $PARAVT_MODEL."""
    from pathlib import Path

    import paravt
    from paravt.serve import serve

    shipped = Path(paravt.__file__).parent / "assets" / "tiny-paravt"
    assert (shipped / "model.safetensors").exists()
    serve(None)
    assert [Path(p).resolve() for p in LOADED] == [shipped.resolve()]
    with Server(serve_wiring[-1]) as s:
        assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == ["tiny-paravt"]
    mine = tmp_path / "my-ckpt"
    mine.mkdir()
    monkeypatch.setenv("PARAVT_MODEL", str(mine))
    serve(None)
    assert LOADED[-1] == str(mine)
    monkeypatch.setenv("PARAVT_MODEL", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="PARAVT_MODEL is a URL"):
        serve(None)


def test_cli_serve_passes_max_model_len_and_image_limits(serve_wiring):
    from typer.testing import CliRunner

    from paravt.cli import app

    r = CliRunner().invoke(app, ["serve", "--max-model-len", "4096", "--max-images", "2",
                                 "--max-total-pixels", str(3 * 16 * 16), "--max-batch", "3"])
    assert r.exit_code == 0, r.output
    assert RecordingHF.made == [{"max_batch": 3, "max_model_len": 4096}]
    url = image_data_url(np.zeros((16, 16, 3), np.uint8))
    with Server(serve_wiring[0]) as s:
        r = httpx.post(s.url + CHAT, json={"messages": user(*[img_part(url)] * 3)})
        assert r.status_code == 400 and "3 images" in r.json()["error"]["message"]
        r = httpx.post(s.url + CHAT, json={"messages": user(img_part(url), img_part(png_header_only(16, 40)))})
        assert r.status_code == 413
        r = httpx.post(s.url + CHAT, json={"messages": user(img_part(url), img_part(url))})
        assert r.status_code == 200, r.text
    r = CliRunner().invoke(app, ["serve", "--help"])
    assert "--max-model-len" in r.output and "--max-images" in r.output and "--max-total-pixels" in r.output


@pytest.mark.parametrize("flags,needle", [(["--max-images", "0"], "max_images must be >= 1"),
                                          (["--max-total-pixels", "0"], "max_total_pixels must be >= 1"),
                                          (["--max-inflight-pixels", "0"], "max_inflight_pixels must be >= 1"),
                                          (["--max-model-len", "0"], "max_model_len must be >= 1")])
def test_cli_serve_refuses_bad_limits_before_loading(serve_wiring, monkeypatch, flags, needle):
    from typer.testing import CliRunner

    import paravt.models
    import paravt.models.tiny
    from paravt.cli import app

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the limits were checked")

    monkeypatch.setattr(paravt.models.tiny, "build_tiny", boom)
    monkeypatch.setattr(paravt.models, "load_model", boom)
    r = CliRunner().invoke(app, ["serve", *flags])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [f"error: {needle}, got 0"], r.output
    assert not RecordingHF.made and not serve_wiring


def test_serve_without_max_model_len_leaves_the_backend_default(serve_wiring):
    from paravt.serve import serve

    serve(None)
    assert RecordingHF.made == [{"max_batch": 16, "max_model_len": None}]


# ------------------------------------------------------------------------------------------
# 6. images per request and decoded pixels per request are capped, from the headers


def test_default_caps_fit_an_episode():
    assert MAX_IMAGES == 256 and MAX_TOTAL_PIXELS == 256 * 1024 * 1024
    assert 64 * 448 * 448 + 5 * 16 * 448 * 448 < MAX_TOTAL_PIXELS  # overview + a turn of crops


def test_too_many_images_is_400_before_any_decoding():
    b = FakeBackend()
    with Server(create_app(b, "m")) as s:
        # header-only PNGs: decoding any of them would fail, so a count error proves none was decoded
        body = {"messages": user(*[img_part(png_header_only(8, 8))] * (MAX_IMAGES + 1))}
        r = httpx.post(s.url + CHAT, json=body)
        assert r.status_code == 400, r.text
        assert f"{MAX_IMAGES + 1} images" in r.json()["error"]["message"]
        assert f"limit of {MAX_IMAGES}" in r.json()["error"]["message"]
    assert not b.seen


def test_too_many_pixels_is_413_from_the_headers_alone():
    """17 images of 4096x4096 (285 M pixels, 850 MB decoded) in a body of a few kB."""
    b = FakeBackend()
    with Server(create_app(b, "m")) as s:
        body = json.dumps({"messages": user(*[img_part(png_header_only(4096, 4096))] * 17)})
        assert len(body) < 10_000
        t = time.perf_counter()
        r = httpx.post(s.url + CHAT, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert time.perf_counter() - t < 2
        err = r.json()["error"]
        assert "pixels" in err["message"] and str(MAX_TOTAL_PIXELS) in err["message"]
        assert err["type"] == "invalid_request_error"
    assert not b.seen


def test_image_caps_are_configurable_and_exact_at_the_limit():
    b = FakeBackend()
    url = image_data_url(np.full((10, 20, 3), 7, np.uint8))
    with Server(create_app(b, "m", max_images=3, max_total_pixels=3 * 200)) as s:
        r = httpx.post(s.url + CHAT, json={"messages": user(*[img_part(url)] * 3)})
        assert r.status_code == 200, r.text
        assert [im.image.shape for im in b.seen[-1].messages[0].images()] == [(10, 20, 3)] * 3
        r = httpx.post(s.url + CHAT, json={"messages": user(*[img_part(url)] * 4)})
        assert r.status_code == 400
        # images spread over several messages count together
        two = user(img_part(url), img_part(url))
        r = httpx.post(s.url + CHAT, json={"messages": two + [{"role": "assistant", "content": "ok"}] + two})
        assert r.status_code == 400 and "4 images" in r.json()["error"]["message"]
    with Server(create_app(b, "m", max_images=3, max_total_pixels=3 * 200 - 1)) as s:
        r = httpx.post(s.url + CHAT, json={"messages": user(*[img_part(url)] * 3)})
        assert r.status_code == 413
    with pytest.raises(ValueError, match="max_images"):
        create_app(b, "m", max_images=0)


# ------------------------------------------------------------------------------------------
# round 2, 3. decoded pixels: shrunk to the model's size while decoding, bounded server-wide


class SizedBackend(FakeBackend):
    """A fake that knows its model's image size the way HFBackend does (through its renderer)."""

    def __init__(self, renderer, delay_s: float = 0.0):
        super().__init__(delay_s)
        self.renderer = renderer


def halves(w: int, h: int) -> np.ndarray:
    """Red left half, blue right half: survives any resize, so the content can be checked."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2, 0] = 255
    img[:, w // 2:, 2] = 255
    return img


def test_a_large_image_is_decoded_to_the_models_size(tiny_backend):
    """A 4096x2048 image reaches the model at the size its processor resizes it to, not at full size
    (it used to be held at 4096x2048, 25 MB, until the prefill); a JPEG is never decoded whole (the
    decoder's DCT scaling); a small image is passed exactly as sent."""
    from paravt.serve import ImageLimits, model_image_fit, read_messages

    renderer = tiny_backend.renderer
    big = halves(4096, 2048)
    th, tw = renderer.image_size(big)
    assert tw * th <= renderer.max_pixels < 4096 * 2048 // 16
    small = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    b = SizedBackend(renderer)
    with Server(create_app(b, "m")) as s:
        for fmt in ("jpeg", "png"):
            body = {"messages": user(img_part(image_data_url(big, fmt)), img_part(image_data_url(small)))}
            r = httpx.post(s.url + CHAT, json=body, timeout=30)
            assert r.status_code == 200, r.text
            got, kept = (p.image for p in b.seen[-1].messages[0].images())
            assert got.shape == (th, tw, 3), fmt
            assert got[:, : tw // 3, 0].min() > 200 and got[:, : tw // 3, 2].max() < 60  # red stays left
            assert got[:, -tw // 3:, 2].min() > 200 and got[:, -tw // 3:, 0].max() < 60  # blue stays right
            assert np.array_equal(kept, small)
    raw = user(img_part(image_data_url(big, "jpeg")), img_part(image_data_url(big, "png")))
    _, (jpeg, png) = read_messages(raw, ImageLimits(), model_image_fit(tiny_backend))
    assert jpeg.decode_pixels <= 4096 * 2048 // 16  # the decoder works at 1/4 scale or less
    assert png.decode_pixels == 4096 * 2048 and png.held_pixels == jpeg.held_pixels == tw * th


def test_the_pixel_budget_is_first_come_first_served():
    from paravt.serve import PixelBudget

    async def main():
        budget = PixelBudget(10, wait_s=5)
        assert await budget.acquire(8) == 8
        big = asyncio.ensure_future(budget.acquire(5))
        await asyncio.sleep(0.01)
        small = asyncio.ensure_future(budget.acquire(1))  # would fit, but waits behind the earlier request
        await asyncio.sleep(0.01)
        assert not big.done() and not small.done()
        budget.release(8)
        assert await big == 5 and await small == 1 and budget.used == 6
        budget.release(6)
        assert await budget.acquire(50) == 10  # larger than the whole budget: runs alone
        assert await PixelBudget(10, wait_s=0.05).acquire(1) == 1
        short = PixelBudget(10, wait_s=0.05)
        await short.acquire(10)
        assert await short.acquire(1) is None and short.used == 10 and not short._waiters

    asyncio.run(main())


def test_pixels_in_flight_are_bounded_server_wide():
    """A request whose images do not fit next to those in flight waits for them, and past the wait is
    answered 503 with Retry-After; text-only requests are never held; pixels come back after a request."""
    url = image_data_url(np.full((64, 64, 3), 9, np.uint8))
    with_image = {"messages": user(img_part(url), {"type": "text", "text": "hi"})}
    b = FakeBackend(delay_s=1.0)
    with Server(create_app(b, "m", max_inflight_pixels=64 * 64, pixel_wait_s=0.2)) as s:
        first: list = []
        t = threading.Thread(target=lambda: first.append(httpx.post(s.url + CHAT, json=with_image, timeout=10)))
        t.start()
        deadline = time.time() + 5
        while not b.active and time.time() < deadline:
            time.sleep(0.01)
        assert b.active == 1
        r = httpx.post(s.url + CHAT, json=with_image, timeout=10)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) > 0
        err = r.json()["error"]
        assert err["type"] == "service_unavailable" and "pixels" in err["message"] and str(64 * 64) in err["message"]
        r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "no image"}]}, timeout=10)
        assert r.status_code == 200
        t.join(10)
        assert first[0].status_code == 200
        assert httpx.post(s.url + CHAT, json=with_image, timeout=10).status_code == 200  # the pixels came back
    b = FakeBackend(delay_s=0.5)
    with Server(create_app(b, "m", max_inflight_pixels=64 * 64, pixel_wait_s=10)) as s:
        out: list = []
        ts = [threading.Thread(target=lambda: out.append(httpx.post(s.url + CHAT, json=with_image, timeout=10)))
              for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        assert [r.status_code for r in out] == [200, 200]
        assert b.max_active == 1  # the second waited for the first's pixels


# ------------------------------------------------------------------------------------------
# 7. a client that hangs up cancels its generation


class SlowBackend(FakeBackend):
    """generate sleeps long on "slow" and records whether (and when) it was cancelled."""

    def __init__(self):
        super().__init__()
        self.started = threading.Event()
        self.cancelled_at: float | None = None

    async def generate(self, reqs):
        if reqs[0].messages[-1].text() == "slow":
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled_at = time.perf_counter()
                raise
        return await super().generate(reqs)


def raw_post(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_client_disconnect_cancels_the_generation():
    b = SlowBackend()
    with Server(create_app(b, "m")) as s:
        sock = raw_post(s.port, json.dumps({"messages": [{"role": "user", "content": "slow"}]}).encode())
        assert b.started.wait(5), "the generation did not start"
        sock.close()
        closed = time.perf_counter()
        while b.cancelled_at is None and time.perf_counter() - closed < 3:
            time.sleep(0.02)
        assert b.cancelled_at is not None, "the generation kept running after the client left"
        assert b.cancelled_at - closed < 1.0
        # the server goes on: the next request is answered
        r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "quick"}]}, timeout=5)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "T prefix=''"


def test_a_disconnect_returns_none_without_waiting_for_the_cancelled_generation():
    """The handler's own view: once the client is gone it answers None at once, even though the
    cancelled generation has not finished unwinding (it used to read the unfinished task's result,
    and the server logged an InvalidStateError for every client that timed out)."""
    from paravt.backends.base import GenerateRequest, Message
    from paravt.serve import generate_while_connected

    async def main():
        b = FakeBackend(delay_s=30.0)

        async def receive():
            return {"type": "http.disconnect"}

        req = GenerateRequest(messages=[Message("user", "hi")])
        return await asyncio.wait_for(generate_while_connected(b, req, receive), 5)

    assert asyncio.run(main()) is None


def test_a_client_that_stays_gets_its_answer():
    b = FakeBackend(delay_s=0.5)  # longer than the disconnect poll
    with Server(create_app(b, "m")) as s:
        r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=5)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "T prefix=''"


# ------------------------------------------------------------------------------------------
# 9. malformed JSON the parser chokes on is 400, and the connection stays usable


class Utf8Backend(FakeBackend):
    """Encodes the text as a tokenizer would (lone surrogates cannot be encoded)."""

    async def generate(self, reqs):
        for r in reqs:
            for m in r.messages:
                m.text().encode("utf-8")
        return await super().generate(reqs)


BAD_BODIES = [
    (b"[" * 100_000, "nested"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nested"),
    (b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}', "surrogate"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}', "surrogate"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\ud83d"]}', "surrogate"),
]


@pytest.mark.parametrize("bad,needle", BAD_BODIES, ids=[f"{n}{i}" for i, (_, n) in enumerate(BAD_BODIES)])
def test_bad_json_is_400_and_keeps_the_connection(bad, needle):
    b = Utf8Backend()
    ports = []

    def where(response: httpx.Response) -> None:  # the local port of the connection each answer came on
        ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    with Server(create_app(b, "m")) as s, httpx.Client(base_url=s.url, event_hooks={"response": [where]}) as c:
        h = {"content-type": "application/json"}
        r = c.post(CHAT, content=bad, headers=h)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"
        assert r.headers.get("connection", "").lower() != "close"
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "fine \U0001f600"}]})
        assert r.status_code == 200, r.text
    assert len(ports) == 2 and ports[0] == ports[1], "the server dropped the keep-alive connection"
    assert len(b.seen) == 1


class Crashing(FakeBackend):
    """Fails once with an error no handler expects (a bug), then works."""

    async def generate(self, reqs):
        if not getattr(self, "crashed", False):
            self.crashed = True
            raise RuntimeError("a bug in the backend")
        return await super().generate(reqs)


def test_an_unexpected_server_error_is_500_and_keeps_the_connection():
    ports = []

    def where(response: httpx.Response) -> None:
        ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    with Server(create_app(Crashing(), "m")) as s, httpx.Client(base_url=s.url, event_hooks={"response": [where]}) as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 500 and "a bug in the backend" in r.json()["error"]["message"]
        assert c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert len(ports) == 2 and ports[0] == ports[1], "the server dropped the keep-alive connection"


def test_a_valid_surrogate_pair_escape_is_fine():
    b = Utf8Backend()
    with Server(create_app(b, "m")) as s:
        r = httpx.post(s.url + CHAT, content=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
                       headers={"content-type": "application/json"})
    assert r.status_code == 200 and b.seen[0].messages[0].text() == "\U0001f600"


def test_cli_defaults_are_the_servers():
    import inspect

    from paravt.cli import serve as cli_serve
    from paravt.serve import MAX_INFLIGHT_PIXELS

    params = inspect.signature(cli_serve).parameters
    assert params["max_images"].default.default == MAX_IMAGES
    assert params["max_total_pixels"].default.default == MAX_TOTAL_PIXELS
    assert params["max_inflight_pixels"].default.default == MAX_INFLIGHT_PIXELS
