"""paravt serve over real HTTP on loopback: the official openai client, bad payloads, keys, limits,
the tiny model served in-process, and the shipped one as a `paravt serve` process (streamed and plain
answers through the official client, a whole episode through it, then its death)."""

import asyncio
import base64
import json
import socket
import time

import httpx
import numpy as np
import pytest
from servetools import Server, paravt_server
from test_openai_backend import FakeBackend

from paravt.backends.base import BackendError, GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.openai import OpenAIBackend, image_data_url
from paravt.serve import create_app

KEY = {"Authorization": "Bearer k"}


@pytest.fixture
def fake():
    b = FakeBackend()
    with Server(create_app(b, "fake-model", api_key="k")) as s:
        yield b, s


def image(seed: int = 0, h: int = 64, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def img_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_official_openai_client_with_image_prefix_and_logprobs(fake):
    import openai

    b, s = fake
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["fake-model"]
    img = image()
    r = client.chat.completions.create(
        model="fake-model", max_tokens=4, temperature=0, seed=1, logprobs=True,
        messages=[{"role": "system", "content": "sys"},
                  {"role": "user", "content": [{"type": "text", "text": "<0.0 seconds>"},
                                               img_part(image_data_url(img)), {"type": "text", "text": "What?"}]},
                  {"role": "assistant", "content": "<think>\n"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert r.choices[0].message.content == "TTIT prefix='<think>\\n'"
    assert r.choices[0].finish_reason == "length"
    assert [t.logprob for t in r.choices[0].logprobs.content] == [-0.5, -1.0, -2.0]
    assert r.usage.prompt_tokens == 10 and r.usage.completion_tokens == 3 and r.usage.total_tokens == 13
    got = b.seen[-1]
    assert np.array_equal(got.messages[1].images()[0].image, img)
    assert (got.max_new_tokens, got.temperature, got.seed, got.prefix) == (4, 0.0, 1, "<think>\n")
    # a string content and max_completion_tokens work too; without continue_final_message an
    # assistant message is history, not a prefix
    r = client.chat.completions.create(model="fake-model", max_completion_tokens=7,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "T prefix=''" and b.seen[-1].max_new_tokens == 7


def test_api_key_is_enforced_health_is_open(fake):
    _, s = fake
    assert httpx.get(s.url + "/health").json()["status"] == "ok"
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k"}):
        r = httpx.get(s.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(s.url + "/v1/chat/completions", headers=headers, json={"messages": user()})
        assert r.status_code == 401
    assert httpx.get(s.url + "/v1/models", headers=KEY).status_code == 200


BAD = [
    ({"messages": []}, "non-empty"),
    ({}, "non-empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "function", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, "string or a list"),
    ({"messages": user({"type": "video", "video": "x"})}, "text part or an image_url"),
    ({"messages": user(img_part("file:///etc/passwd"))}, "never fetches"),
    ({"messages": user(img_part("/etc/passwd"))}, "never fetches"),
    ({"messages": user(img_part("data:text/plain;base64,aGk="))}, "data URL of an image"),
    ({"messages": user(img_part("data:image/png;base64,@@@"))}, "not valid base64"),
    ({"messages": user(img_part("data:image/png;base64," + base64.b64encode(b"not a png").decode()))}, "could not be decoded"),
    ({"messages": [{"role": "assistant", "content": [img_part(image_data_url(image(h=4, w=4)))]}]}, "user and tool messages only"),
    ({"messages": user(), "stream": "yes"}, "stream must be true or false"),
    ({"messages": user(), "stream_options": {"include_usage": True}}, "stream_options is only allowed with stream=true"),
    ({"messages": user(), "stream": True, "stream_options": {"include_usage": 1}}, "include_usage must be true or false"),
    ({"messages": user(), "stream": True, "stream_options": []}, "stream_options must be an object"),
    ({"messages": user(), "stream": True, "logprobs": True}, "logprobs are not streamed"),
    ({"messages": user(), "stream": True, "return_token_ids": True}, "return_token_ids is not streamed"),
    ({"messages": user(), "n": 3}, "n=1"),
    ({"messages": user(), "n": "two"}, "n must be an integer"),
    ({"messages": user(), "temperature": -1}, "temperature must be between"),
    ({"messages": user(), "temperature": "hot"}, "temperature must be a number"),
    ({"messages": user(), "top_p": 0}, "top_p must be greater than 0"),
    ({"messages": user(), "max_tokens": 0}, "max_tokens must be between"),
    ({"messages": user(), "max_completion_tokens": 2.5}, "max_completion_tokens must be an integer"),
    ({"messages": user(), "stop": [1, 2]}, "stop must be"),
    ({"messages": user(), "top_logprobs": 3}, "top_logprobs"),
    ({"messages": user(), "tools": [{"type": "function"}]}, 'tools[0] must be {"type": "function"'),
    ({"messages": user(), "continue_final_message": True}, "last message to be the assistant"),
    ({"messages": user(), "add_generation_prompt": False}, "only supported with continue_final_message"),
    ({"messages": user(), "model": 3}, "model must be a string"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[n for _, n in BAD])
def test_bad_payloads_are_400_with_a_clear_message(fake, body, needle):
    b, s = fake
    r = httpx.post(s.url + "/v1/chat/completions", json=body, headers=KEY)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error" and err["code"] == 400
    assert not b.seen


def test_other_errors_are_openai_shaped(fake):
    _, s = fake
    h = {**KEY, "content-type": "application/json"}
    for content, needle in ((b"{nope", "not valid JSON"), (b"[1, 2]", "JSON object")):
        r = httpx.post(s.url + "/v1/chat/completions", content=content, headers=h)
        assert r.status_code == 400 and needle in r.json()["error"]["message"]
    r = httpx.post(s.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": user()}, headers=KEY)
    assert r.status_code == 404 and "'fake-model'" in r.json()["error"]["message"]
    r = httpx.get(s.url + "/v1/nothing", headers=KEY)
    assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
    r = httpx.get(s.url + "/v1/chat/completions", headers=KEY)
    assert r.status_code == 405 and "error" in r.json()


def test_the_server_never_fetches_an_image_url(fake):
    _, s = fake
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(1)
        trap.setblocking(False)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}/frame.png"
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": user(img_part(url))}, headers=KEY)
        assert r.status_code == 400 and "never fetches" in r.json()["error"]["message"]
        with pytest.raises(BlockingIOError):
            trap.accept()  # nobody connected


def test_oversized_bodies_and_images_are_refused():
    b = FakeBackend()
    with Server(create_app(b, "m", max_body_bytes=2000, max_image_pixels=32 * 32)) as s:
        url = s.url + "/v1/chat/completions"
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413 and "over the limit" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: refused while streaming in
            for _ in range(10):
                yield b" " * 500

        r = httpx.post(url, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = httpx.post(url, json={"messages": user(img_part(image_data_url(np.zeros((40, 40, 3), np.uint8))))})
        assert r.status_code == 400 and "40x40 pixels is over the limit" in r.json()["error"]["message"]
        assert not b.seen


class CrashingBackend(FakeBackend):
    async def generate(self, reqs):
        if reqs[0].messages[-1].text() == "boom":
            raise RuntimeError("kaboom")
        raise BackendError("model out of memory")


def test_backend_failures_are_500_json():
    with Server(create_app(CrashingBackend(), "m")) as s:
        for text, needle in (("boom", "RuntimeError: kaboom"), ("x", "model out of memory")):
            r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]})
            assert r.status_code == 500 and needle in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "server_error"


def test_parallel_episode_over_http_keeps_subagents_concurrent(tmp_path):
    """A scripted model behind paravt serve: three crops of one turn travel as three concurrent HTTP
    requests, arrive together (one batch), carry the right frames, and come back in call order."""
    import re

    from videotools import decode_stripe, make_test_video

    from paravt.agent import EpisodeConfig, run_episode_sync
    from paravt.backends.scripted import ScriptedBackend

    fps = 4
    video = make_test_video(tmp_path / "v.mp4", seconds=60, fps=fps, gop=20)

    def sub(req):
        s, e = map(float, re.search(r"between ([\d.]+) and ([\d.]+) seconds", req.messages[-1].text()).groups())
        times = [decode_stripe(p.image) / fps for m in req.messages for p in m.images()]
        inside = all(s - 0.5 <= t <= e + 0.5 for t in times)
        return f"Window {s:g}-{e:g}: {len(times)} frames, inside={inside}."

    def call(s, e):
        return '<tool_call>{"name": "crop_video", "arguments": {"start_time": %s, "end_time": %s}}</tool_call>\n' % (s, e)

    main = ["I will look closer.</think>\n" + call(40, 50) + call(0, 10) + call(20, 30),
            "Settled.</think><answer>B</answer>"]
    b = ScriptedBackend(main, sub=sub, latency_s=0.3, batch_window_s=0.2)
    with Server(create_app(b, "scripted")) as s:
        be = OpenAIBackend(s.url)
        ep = run_episode_sync(be, video, "Which shape was red?\nA. square\nB. circle", EpisodeConfig(frames=8))
    assert ep.answer == "B" and ep.error is None
    turn = ep.turns[0]
    assert [c.status for c in turn.calls] == ["ok"] * 3
    assert 3 in b.batches  # the three sub-agent requests were served together
    gens = [c.generation for c in turn.calls]
    assert max(g.started for g in gens) < min(g.finished for g in gens)
    resp = turn.tool_response
    assert resp.index("Window 40-50: 10 frames, inside=True") < resp.index("Window 0-10: 10 frames, inside=True") \
        < resp.index("Window 20-30: 10 frames, inside=True")
    # the forced think prefix was continued by the server, not answered as a new turn
    assert all(r.prefix == "<think>\n" for r in b.requests if r.messages[0].role == "system")
    assert ep.main_visual_tokens == 8 * 4  # the scripted backend counts 4 tokens per image


# ------------------------------------------------------------------------------------------
# the tiny model, for real


def test_tiny_model_served_in_process_with_batching(tiny_dir):
    import openai

    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    model, processor = load_model(str(tiny_dir), device="cpu")
    # 50 ms of waiting for company: four HTTP requests on a loaded machine arrive further apart than the default 5
    backend = HFBackend(model, processor, max_batch=8, batch_wait_ms=50)
    with Server(create_app(backend, "tiny")) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(
            model="tiny", max_tokens=6, temperature=0,
            messages=[{"role": "user", "content": [{"type": "text", "text": "<0.0 seconds>"},
                                                   img_part(image_data_url(image())),
                                                   {"type": "text", "text": "What is shown?"}]}])
        c = r.choices[0]
        assert isinstance(c.message.content, str) and c.finish_reason in ("stop", "length")
        assert 1 <= r.usage.completion_tokens <= 6
        assert r.usage.prompt_tokens_details.image_tokens == 4  # 64x64, 16-px patches, 2x2 merge
        assert r.usage.prompt_tokens > 4
        # concurrent HTTP requests end up in one model batch (identical greedy rows, identical answers)
        be = OpenAIBackend(s.url, concurrency=4, logprobs=True)
        msg = [Message("user", [TextPart("<0.0 seconds>"), ImagePart(image()), TextPart("What is shown?")])]
        n_batches = backend.batches_run
        outs = asyncio.run(be.generate([GenerateRequest(msg, max_new_tokens=6) for _ in range(4)]))
        assert len({o.text for o in outs}) == 1
        assert backend.batches_run - n_batches < 4 and max(backend.batch_sizes) > 1
        assert all(o.token_ids and len(o.logprobs) == len(o.token_ids) == o.completion_tokens for o in outs)
        assert all(lp <= 0 for o in outs for lp in o.logprobs)


@pytest.mark.slow
def test_paravt_serve_process_streams_and_runs_a_whole_episode(tmp_path):
    """`paravt serve` with no --model (the shipped trained tiny model) and an API key, as its own
    process (one process for both claims: each start costs seconds of imports):
    - `stream: true` through the official openai client: for greedy, seeded and stop-string requests,
      the streamed chunks join to the plain response's message, with the same finish_reason and usage,
      over several chunks (one per decode step);
    - an episode through the openai backend; then the server dies: a clear BackendError, quickly."""
    import os

    import openai
    from videotools import make_test_video

    from paravt.agent import EpisodeConfig, run_episode_sync

    env = {k: v for k, v in os.environ.items() if k not in ("PARAVT_MODEL", "PARAVT_API_KEY")}
    env["OMP_NUM_THREADS"] = "1"
    video = make_test_video(tmp_path / "v.mp4", seconds=30, fps=2)
    with paravt_server("serve", "--api-key", "secret", env=env) as (url, proc):
        client = openai.OpenAI(base_url=url + "/v1", api_key="secret", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny-paravt"]
        streams_join_to_plain(client, "tiny-paravt")

        be = OpenAIBackend(url, api_key="secret", timeout_s=60)
        cfg = EpisodeConfig(frames=4, max_new_tokens=12, sub_max_new_tokens=8, max_turns=2)
        ep = run_episode_sync(be, video, "What is shown?", cfg)
        assert ep.turns and ep.turns[0].generation.completion_tokens > 0
        assert ep.main_visual_tokens > 0 and ep.error is None
        json.dumps(ep.to_dict())
        proc.terminate()
        proc.wait(20)
        # the server is gone: a clear BackendError, quickly, not a hang
        be2 = OpenAIBackend(url, api_key="secret", max_retries=1, backoff_s=0.01, timeout_s=2)
        t = time.time()
        with pytest.raises(BackendError, match="unreachable after 2 tries"):
            run_episode_sync(be2, video, "What is shown?", cfg)
        assert time.time() - t < 10


def streams_join_to_plain(client, model: str) -> None:
    """For greedy, seeded and stop-string requests of one image and a question, the official client's
    streamed chunks (`stream_options.include_usage`) join to the plain response's message, with its
    finish_reason and usage, over more than one chunk."""
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[16:48, 16:48] = (255, 0, 0)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "<0.0 seconds>"}, {"type": "image_url", "image_url": {"url": image_data_url(frame)}},
        {"type": "text", "text": "What colour was the square?"}]}]
    greedy = dict(model=model, messages=messages, max_tokens=24, temperature=0)
    plain = client.chat.completions.create(**greedy)
    text = plain.choices[0].message.content
    assert len(text) > 8
    stop = text[len(text) // 2: len(text) // 2 + 3]
    for kw in (greedy, dict(greedy, temperature=1.0, seed=7), dict(greedy, stop=[stop])):
        want = plain if kw is greedy else client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks)
        assert len({c.id for c in chunks}) == 1
        assert chunks[0].choices[0].delta.role == "assistant"
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == want.choices[0].message.content, kw
        assert len(pieces) > 1  # decoded step by step, not one block at the end
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [want.choices[0].finish_reason]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == want.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens == want.usage.prompt_tokens
    assert stop not in "".join(pieces)
