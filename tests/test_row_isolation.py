"""One request's failure is its own: poison requests (sampling values the math cannot take, frames
too small for a patch, a seed of thousands of digits, a row whose prefill or decode step breaks)
beside normal ones, in the hf backend's continuous batch and through `paravt serve` over HTTP. None
of the normal requests may fail, and each normal answer equals the one it gets alone."""

import asyncio
import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from servetools import Server

from paravt import protocol as P
from paravt.backends import hf, prefill
from paravt.backends.base import BackendError, GenerateRequest, ImagePart, Message, RequestRejected, TextPart
from paravt.backends.hf import HFBackend
from paravt.models.tiny import build_tiny
from paravt.serve import create_app


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def frame(seed: int, h: int = 64, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def ask(img: np.ndarray | None = None, text: str = "What happens?") -> list[Message]:
    parts = [TextPart(P.timestamp_text(0.0))] + ([ImagePart(img)] if img is not None else []) + [TextPart(text)]
    return [Message("user", parts)]


def normal(i: int) -> GenerateRequest:
    """Greedy and seeded sampled rows: both must come out as they do alone."""
    return GenerateRequest(ask(frame(i)), max_new_tokens=8, temperature=0.0 if i % 2 else 0.7, seed=i)


POISON = {
    "temperature 1e-300": GenerateRequest(ask(frame(9)), max_new_tokens=8, temperature=1e-300),
    "top_p 1e-300": GenerateRequest(ask(frame(9)), max_new_tokens=8, temperature=1.0, top_p=1e-300, seed=3),
    "1x1 frame": GenerateRequest(ask(frame(9, 1, 1)), max_new_tokens=8),
    "3x1 frame": GenerateRequest(ask(frame(9, 3, 1)), max_new_tokens=8),
    "seed of 4,000 digits": GenerateRequest(ask(frame(9)), max_new_tokens=8, temperature=0.7, seed=10**3999),
    "aspect ratio 1:400": GenerateRequest(ask(frame(9, 1, 400)), max_new_tokens=8),
}


def run_together(backend: HFBackend, reqs: list[GenerateRequest]) -> list:
    async def go():
        return await asyncio.gather(*[backend.generate([r]) for r in reqs], return_exceptions=True)

    return [r if isinstance(r, BaseException) else r[0] for r in asyncio.run(go())]


@pytest.fixture(scope="module")
def alone(tiny):
    model, processor = tiny
    return [HFBackend(model, processor).generate_sync([normal(i)])[0] for i in range(4)]


def assert_normal(got: list, alone: list) -> None:
    for i, (g, a) in enumerate(zip(got, alone)):
        assert not isinstance(g, BaseException), f"normal request {i} failed beside a poison one: {g!r}"
        assert g.token_ids == a.token_ids
        np.testing.assert_allclose(g.logprobs, a.logprobs, atol=1e-4)


@pytest.mark.parametrize("decode", ["eager", "static"])
@pytest.mark.parametrize("name", list(POISON))
def test_a_poison_request_never_fails_its_batch(tiny, alone, name, decode):
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100, decode=decode)  # the five requests join one prefill
    got = run_together(backend, [normal(0), normal(1), POISON[name], normal(2), normal(3)])
    assert_normal(got[:2] + got[3:], alone)
    bad = got[2]
    if name in ("seed of 4,000 digits", "aspect ratio 1:400"):  # refused alone, saying why
        assert isinstance(bad, RequestRejected), bad
        assert ("seed" if "seed" in name else "aspect ratio") in str(bad)
    else:  # read as what it means
        assert not isinstance(bad, BaseException), bad
        assert bad.completion_tokens >= 1 and all(np.isfinite(bad.logprobs))
    assert backend.batch_sizes[0] >= 2  # the poison shared a prefill with normal rows


def test_tiny_temperature_and_top_p_mean_greedy(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    greedy = backend.generate_sync([GenerateRequest(ask(frame(9)), max_new_tokens=8, temperature=0.0)])[0]
    tiny_t = backend.generate_sync([POISON["temperature 1e-300"]])[0]
    top1 = backend.generate_sync([POISON["top_p 1e-300"]])[0]
    assert tiny_t.token_ids == greedy.token_ids == top1.token_ids


def test_a_row_whose_prefill_breaks_fails_alone(tiny, alone, monkeypatch):
    real = prefill.model_inputs

    def breaks_on_17(model, renderer, rows, images, device=None):
        if any(im.shape[:2] == (17, 17) for per in images for im in per):
            raise RuntimeError("vision tower refuses 17x17")
        return real(model, renderer, rows, images, device)

    monkeypatch.setattr(prefill, "model_inputs", breaks_on_17)
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100)
    bad = GenerateRequest(ask(frame(9, 17, 17)), max_new_tokens=8)
    got = run_together(backend, [normal(0), normal(1), bad, normal(2), normal(3)])
    assert_normal(got[:2] + got[3:], alone)
    assert isinstance(got[2], BackendError) and "refuses 17x17" in str(got[2])


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_a_failed_decode_step_rebuilds_its_rows(tiny, alone, monkeypatch, decode):
    """A decode step that fails once: every row is rebuilt from its prompt and tokens so far and
    goes on to the same tokens; a row that breaks even alone fails by itself."""
    from paravt.backends.static_decode import StaticDecoder

    calls = {"n": 0}
    real = hf._decode if decode == "eager" else StaticDecoder.step

    def fails_third(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA error: an illegal memory access")
        return real(*args)

    if decode == "eager":
        monkeypatch.setattr(hf, "_decode", fails_third)
    else:
        monkeypatch.setattr(StaticDecoder, "step", fails_third)
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100, decode=decode)
    got = run_together(backend, [normal(i) for i in range(4)])
    assert calls["n"] > 3
    assert_normal(got, alone)


def test_nan_logits_fail_their_row_with_a_clear_error(tiny, alone, monkeypatch):
    real = hf._choose_row

    def nan_for_seed_9(logits, greedy, job):
        if job.request.seed == 9:
            logits = logits.clone().fill_(float("nan"))
        return real(logits, greedy, job)

    monkeypatch.setattr(hf, "_choose_row", nan_for_seed_9)
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100)
    bad = GenerateRequest(ask(frame(9)), max_new_tokens=8, temperature=0.7, seed=9)
    got = run_together(backend, [normal(0), normal(1), bad, normal(2), normal(3)])
    assert_normal(got[:2] + got[3:], alone)
    assert isinstance(got[2], BackendError) and "not finite" in str(got[2])


def png_url(h: int, w: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(frame(5, h, w)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def body(image_url: str | None = None, **sampling) -> dict:
    content = [{"type": "text", "text": "<0.0 seconds>"}]
    if image_url:
        content.append({"type": "image_url", "image_url": {"url": image_url}})
    content.append({"type": "text", "text": "What is shown?"})
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 6, **sampling}


HTTP_POISON = {
    "temperature 1e-300": (body(png_url(64, 64), temperature=1e-300), 200),
    "top_p 1e-300": (body(png_url(64, 64), top_p=1e-300), 200),
    "1x1 png": (body(png_url(1, 1), temperature=0), 200),
    "3x1 png": (body(png_url(3, 1), temperature=0), 200),
    "seed of 4,000 digits": ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1'
                             + "0" * 3999 + "}", 400),
    "seed of 5,000 digits": ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1'
                             + "0" * 4999 + "}", 400),
}


def test_http_poison_beside_normal_requests(tiny):
    """Over HTTP: each poison is sent while normal requests are in flight; every normal one is 200,
    each poison is 200 (read as what it means) or 400 with a message, never a 500."""
    model, processor = tiny
    backend = HFBackend(model, processor, max_batch=16, batch_wait_ms=50)
    with Server(create_app(backend, "tiny")) as s:
        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as c:
                def send(b):
                    if isinstance(b, str):
                        return c.post("/v1/chat/completions", content=b, headers={"content-type": "application/json"})
                    return c.post("/v1/chat/completions", json=b)

                normals = [send(body(png_url(64, 64), temperature=0.7, seed=i)) for i in range(2 * len(HTTP_POISON))]
                poisons = [send(b) for b, _ in HTTP_POISON.values()]
                return await asyncio.gather(*normals, *poisons)

        out = asyncio.run(go())
    normals, poisons = out[: 2 * len(HTTP_POISON)], out[2 * len(HTTP_POISON):]
    assert [r.status_code for r in normals] == [200] * len(normals), [r.text[:200] for r in normals]
    for (name, (_, status)), r in zip(HTTP_POISON.items(), poisons):
        assert r.status_code == status, (name, r.text[:300])
        if status == 400:  # the seed named, or (past Python's 4,300-digit int limit) the JSON refused
            message = r.json()["error"]["message"]
            assert "seed" in message or "4300 digits" in message, (name, message)
