import asyncio

import numpy as np
import pytest
import torch

from paravt import protocol as P
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend, sequence_logprobs
from paravt.models import ModelLoadError, load_model
from paravt.models.tiny import build_tiny, save_pretrained


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def frame(seed, h=64, w=64):
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def msgs(seed=0, n_frames=2):
    parts = []
    for i in range(n_frames):
        parts += [TextPart(P.timestamp_text(i * 2.0)), ImagePart(frame(seed + i), timestamp=i * 2.0)]
    parts.append(TextPart("\nWhat happens?"))
    return [Message("system", P.system_prompt("parallel")), Message("user", parts)]


def test_tokenizer_has_tags_and_qwen_specials_as_single_tokens(tiny):
    _, processor = tiny
    tok = processor.tokenizer
    for t in list(P.ALL_TAGS) + ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>"]:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t


def test_save_load_round_trip_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, processor = tiny
    save_pretrained(model, processor, tmp_path / "m")
    m2, p2 = load_model(str(tmp_path / "m"))
    assert p2.tokenizer.encode("<think>hi</think>", add_special_tokens=False) == \
        processor.tokenizer.encode("<think>hi</think>", add_special_tokens=False)
    for (n1, a), (n2, b) in zip(model.state_dict().items(), m2.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b)
    r1 = HFBackend(model, processor).generate_sync([GenerateRequest(msgs(), max_new_tokens=8)])[0]
    r2 = HFBackend(m2, p2).generate_sync([GenerateRequest(msgs(), max_new_tokens=8)])[0]
    assert r1.token_ids == r2.token_ids


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path / "empty"))


def test_concurrent_requests_are_batched_and_match_one_by_one(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=20)
    reqs = [GenerateRequest(msgs(seed=s, n_frames=1 + s % 3), max_new_tokens=6) for s in range(5)]
    alone = [HFBackend(model, processor).generate_sync([r])[0] for r in reqs]

    async def together():
        return await asyncio.gather(*[backend.generate([r]) for r in reqs])

    got = [r[0] for r in asyncio.run(together())]
    assert backend.batch_sizes == [5]
    for a, b in zip(alone, got):
        assert a.token_ids == b.token_ids
        assert a.prompt_ids == b.prompt_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_token_exact_continuation(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    first = msgs()
    c1 = backend.generate_sync([GenerateRequest(first, max_new_tokens=5, prefix=P.THINK_PREFIX)])[0]
    assert c1.assistant_ids[: len(c1.assistant_ids) - len(c1.token_ids)] == \
        processor.tokenizer.encode(P.THINK_PREFIX, add_special_tokens=False)
    second = first + [Message("assistant", P.THINK_PREFIX + c1.text, token_ids=c1.assistant_ids),
                      Message("user", P.format_tool_response("A red circle at 3 s."))]
    c2 = backend.generate_sync([GenerateRequest(second, max_new_tokens=5, prefix=P.THINK_PREFIX)])[0]
    head = c1.prompt_ids + c1.token_ids
    assert c2.prompt_ids[: len(head)] == head


def test_logprobs_match_recomputed_forward(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    m = msgs()
    c = backend.generate_sync([GenerateRequest(m, max_new_tokens=6, temperature=1.0, seed=3)])[0]
    images = [p.image for mm in m for p in mm.images()]
    with torch.no_grad():
        lp = sequence_logprobs(model, backend.renderer, c.prompt_ids, c.token_ids, images)
    np.testing.assert_allclose(lp.numpy(), np.array(c.logprobs), atol=1e-4)


def test_images_change_visual_tokens(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    a = backend.generate_sync([GenerateRequest(msgs(n_frames=1), max_new_tokens=1)])[0]
    b = backend.generate_sync([GenerateRequest(msgs(n_frames=3), max_new_tokens=1)])[0]
    assert (a.visual_tokens, b.visual_tokens) == (4, 12)


def test_sampling_is_seeded(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    r = lambda s: backend.generate_sync([GenerateRequest(msgs(), max_new_tokens=8, temperature=1.0, seed=s)])[0].token_ids  # noqa: E731
    assert r(1) == r(1)
    assert r(1) != r(2)
