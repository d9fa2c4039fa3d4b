"""paravt serve and the openai backend, over real HTTP on loopback."""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from paravt.agent import EpisodeConfig, run_episode_sync
from paravt.backends.base import BackendError, Completion, GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.openai import OpenAIBackend
from paravt.serve import create_app
from videotools import make_test_video


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeBackend:
    """Echoes what it received, so the HTTP round trip can be checked exactly."""

    name = "fake"

    def __init__(self):
        self.seen: list[GenerateRequest] = []
        self.fail_next = 0

    async def generate(self, reqs):
        out = []
        for r in reqs:
            self.seen.append(r)
            if self.fail_next:
                self.fail_next -= 1
                raise BackendError("transient")
            imgs = [p for m in r.messages for p in m.images()]
            out.append(Completion(text=f"images={len(imgs)} prefix={r.prefix!r}", prompt_tokens=10, completion_tokens=3))
        return out

    async def aclose(self):
        pass


class Server:
    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.02)
        raise RuntimeError("server did not start")

    def __exit__(self, *a):
        self.server.should_exit = True
        self.thread.join(5)


@pytest.fixture
def fake():
    b = FakeBackend()
    with Server(create_app(b, "fake-model", api_key="k")) as s:
        yield b, s


def msgs(n=2):
    img = np.random.default_rng(0).integers(0, 255, (32, 64, 3), dtype=np.uint8)
    parts = [TextPart("<1.0 seconds>"), ImagePart(img)] * n + [TextPart("What?")]
    return [Message("system", "sys"), Message("user", parts)]


def test_images_and_prefix_round_trip(fake):
    b, s = fake
    be = OpenAIBackend(s.url, api_key="k")
    out = asyncio.run(be.generate([GenerateRequest(msgs(3), prefix="<think>\n", max_new_tokens=5)]))[0]
    assert out.text == "images=3 prefix='<think>\\n'"
    got = b.seen[-1].messages[1].images()[0].image
    sent = msgs()[1].images()[0].image
    assert np.array_equal(got, sent)
    assert out.prompt_tokens == 10 and out.completion_tokens == 3


def test_official_openai_client(fake):
    import openai

    _, s = fake
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="k")
    assert client.models.list().data[0].id == "fake-model"
    r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.choices[0].message.content.startswith("images=0")


def test_api_key_and_bad_payloads(fake):
    _, s = fake
    h = {"Authorization": "Bearer k"}
    assert httpx.get(s.url + "/v1/models").status_code == 401
    cases = [
        ({"messages": []}, "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]}, "data URL"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]}, "decoded"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 3}, "n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ]
    for body, needle in cases:
        r = httpx.post(s.url + "/v1/chat/completions", json=body, headers=h)
        assert r.status_code == 400, body
        assert needle in r.json()["error"]["message"]
    r = httpx.post(s.url + "/v1/chat/completions", content=b"{nope", headers={**h, "content-type": "application/json"})
    assert r.status_code == 400


def test_oversized_body_rejected():
    with Server(create_app(FakeBackend(), "m", max_body_bytes=1000)) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413


def test_4xx_is_a_clear_error_without_retries(fake):
    b, s = fake
    be = OpenAIBackend(s.url, api_key="wrong", max_retries=3, backoff_s=0.01)
    with pytest.raises(BackendError, match="401"):
        asyncio.run(be.generate([GenerateRequest(msgs(1))]))


def test_5xx_is_retried(fake):
    b, s = fake
    b.fail_next = 2
    be = OpenAIBackend(s.url, api_key="k", max_retries=3, backoff_s=0.01)
    out = asyncio.run(be.generate([GenerateRequest(msgs(1))]))[0]
    assert out.text.startswith("images=1")


def test_dead_server_fails_fast_and_clearly():
    be = OpenAIBackend(f"http://127.0.0.1:{free_port()}", model="m", max_retries=2, backoff_s=0.01, timeout_s=2)
    t = time.time()
    with pytest.raises(BackendError, match="unreachable after 3 tries"):
        asyncio.run(be.generate([GenerateRequest(msgs(1))]))
    assert time.time() - t < 10


def test_several_endpoints_share_the_load():
    backs = [FakeBackend(), FakeBackend()]
    with Server(create_app(backs[0], "m")) as s1, Server(create_app(backs[1], "m")) as s2:
        be = OpenAIBackend(s1.url, endpoints=[s1.url, s2.url], concurrency=2)
        asyncio.run(be.generate([GenerateRequest(msgs(1)) for _ in range(8)]))
    assert len(backs[0].seen) > 0 and len(backs[1].seen) > 0


@pytest.mark.slow
def test_episode_through_paravt_serve_on_tiny_model(tmp_path):
    """`paravt serve` as a real process on the tiny model, a whole episode through the openai backend."""
    from paravt.models.tiny import build_tiny, save_pretrained

    model, processor = build_tiny(seed=0)
    save_pretrained(model, processor, tmp_path / "tiny")
    video = make_test_video(tmp_path / "v.mp4", seconds=30, fps=2)
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "paravt", "serve", "--model", str(tmp_path / "tiny"), "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode())
        be = OpenAIBackend(url)
        ep = run_episode_sync(be, video, "What is shown?", EpisodeConfig(frames=4, max_new_tokens=12, max_turns=2))
        assert ep.turns and ep.turns[0].generation.completion_tokens > 0
        assert ep.main_visual_tokens == 4 * 6
        # server killed mid-episode: a clear BackendError, not a hang
        proc.terminate()
        proc.wait(10)
        be2 = OpenAIBackend(url, max_retries=1, backoff_s=0.01, timeout_s=2)
        with pytest.raises(BackendError):
            run_episode_sync(be2, video, "What is shown?", EpisodeConfig(frames=4, max_new_tokens=4))
    finally:
        if proc.poll() is None:
            proc.kill()
