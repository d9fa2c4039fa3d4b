import asyncio

import numpy as np
import pytest
import torch

from paravt import protocol as P
from paravt.backends.base import BackendError, GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend, sequence_logprobs
from paravt.models.tiny import build_tiny


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


def test_concurrent_requests_are_batched_and_match_one_by_one(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100)  # room for a loaded CI machine
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


def test_weight_updates_are_seen_by_the_next_generation(tiny):
    """A trainer updates weights in place between rollouts; generation must use the new ones."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    req = GenerateRequest(msgs(), max_new_tokens=5)
    before = backend.generate_sync([req])[0]
    w = model.model.language_model.layers[0].mlp.up_proj.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(3.0)
        after = backend.generate_sync([req])[0]
        lp = sequence_logprobs(model, backend.renderer, after.prompt_ids, after.token_ids, [p.image for p in req.messages[1].images()])
        np.testing.assert_allclose(lp.detach().numpy(), after.logprobs, atol=1e-4)
        assert not np.allclose(before.logprobs, after.logprobs, atol=1e-4) or before.token_ids != after.token_ids
    finally:
        with torch.no_grad():
            w.copy_(saved)


def test_rows_of_different_lengths_and_stops(tiny):
    """Rows finish at different steps (max_new_tokens, stop strings); dropping finished rows from
    the batch leaves every row's result as it is alone."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    probe = backend.generate_sync([GenerateRequest(msgs(seed=9), max_new_tokens=6)])[0]
    stop_text = processor.tokenizer.decode(probe.token_ids[2:4])
    assert stop_text  # a non-empty piece of what the model generates there
    reqs = [GenerateRequest(msgs(seed=s), max_new_tokens=n) for s, n in ((1, 1), (2, 2), (3, 12), (4, 3))]
    reqs.append(GenerateRequest(msgs(seed=9), max_new_tokens=6, stop=[stop_text]))
    alone = [backend.generate_sync([r])[0] for r in reqs]
    together = backend.generate_sync(reqs)
    for a, b, r in zip(alone, together, reqs):
        assert a.token_ids == b.token_ids and len(b.token_ids) <= r.max_new_tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert together[-1].finish_reason == "stop" and len(together[-1].token_ids) <= 4
    assert stop_text not in together[-1].text
    assert [c.finish_reason for c in together[:2]] == ["length", "length"]


def test_seeded_sampling_does_not_depend_on_the_batch(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor)
    req = GenerateRequest(msgs(seed=5), max_new_tokens=8, temperature=0.7, top_p=0.9, seed=11)
    alone = backend.generate_sync([req])[0]
    others = [GenerateRequest(msgs(seed=s), max_new_tokens=8, temperature=1.0, seed=s) for s in range(3)]
    together = backend.generate_sync(others + [req])[-1]
    assert alone.token_ids == together.token_ids


def test_any_frame_size_gets_the_processor_token_count(tiny):
    """Frames that are not multiples of 32 (or exceed the pixel budget) are resized by the image
    processor; the placeholder count must follow it or the model refuses the input."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    for h, w in ((50, 70), (300, 500), (20, 20)):
        img = frame(0, h, w)
        out = processor.image_processor(images=[img], return_tensors="pt")
        want = int(out["image_grid_thw"].prod()) // 4
        assert backend.renderer.image_tokens(img) == want
        req = GenerateRequest([Message("user", [TextPart("<0.0 seconds>"), ImagePart(img), TextPart("Hi")])], max_new_tokens=1)
        assert backend.generate_sync([req])[0].visual_tokens == want


def test_a_bad_request_fails_alone(tiny):
    model, processor = tiny
    backend = HFBackend(model, processor, batch_wait_ms=100)  # room for a loaded CI machine
    bad = GenerateRequest([Message("user", [ImagePart(np.zeros((8, 8), dtype=np.float32))])], max_new_tokens=3)
    good = [GenerateRequest(msgs(seed=s), max_new_tokens=3) for s in range(2)]

    async def run():
        return await asyncio.gather(*[backend.generate([r]) for r in [good[0], bad, good[1]]], return_exceptions=True)

    res = asyncio.run(run())
    assert isinstance(res[1], BackendError) and "HxWx3 uint8" in str(res[1])
    assert all(len(r[0].token_ids) == 3 for r in (res[0], res[2]))
    assert backend.batch_sizes == [2]
    with pytest.raises(BackendError, match="max_new_tokens"):
        backend.generate_sync([GenerateRequest(msgs(), max_new_tokens=0)])


def test_summaries_keep_our_tags_and_drop_chat_tokens():
    from paravt.agent import summary_of

    s = f"{P.THINK_OPEN}x{P.THINK_CLOSE}<|im_start|>user<|vision_start|>A red star.<|im_end|>"
    assert summary_of(s) == "userA red star."


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_vision_placeholders_are_never_generated(tiny, temperature):
    """A model that prefers <|image_pad|> (here pushed there by a hook on lm_head) still never emits
    it: a generated placeholder has no frame behind it and would break the next forward pass."""
    model, processor = tiny
    from paravt.backends.hf import Renderer

    renderer = Renderer(processor)
    pad = renderer.image_pad
    assert {pad, renderer.vision_start, renderer.vision_end} <= set(renderer.banned_ids)

    def favour_pad(module, args, out):
        out = out.clone()
        out[..., pad] += 1e4
        return out

    handle = model.lm_head.register_forward_hook(favour_pad)
    try:
        c = HFBackend(model, processor).generate_sync(
            [GenerateRequest(msgs(), max_new_tokens=6, temperature=temperature, seed=0)])[0]
    finally:
        handle.remove()
    assert len(c.token_ids) == 6
    assert not set(c.token_ids) & set(renderer.banned_ids)
    # the logprobs are the sampler's, placeholders removed (the trainer recomputes the same), not the raw
    # model's, where the favoured placeholder takes all the mass
    assert all(-100 < lp <= 0 for lp in c.logprobs)


# ---- continuous batching, cancellation, context limit ----------------------------------------------


def favour(model, token_id: int, bonus: float = 1e4):
    """A hook that makes `token_id` the model's next token (returns its handle)."""

    def hook(module, args, out):
        out = out.clone()
        out[..., token_id] += bonus
        return out

    return model.lm_head.register_forward_hook(hook)


def never_stop(backend):
    """Generation runs to max_new_tokens: no stop token ends it (benchmark-style forced lengths)."""
    backend.renderer.stop_ids = set()
    return backend


def test_a_short_request_is_not_held_behind_a_long_one(tiny):
    """Requests join the rows in flight at the next decode step: one arriving while a 300-token
    generation runs finishes while that one is still running, and its result is the same as alone."""
    model, processor = tiny
    backend = never_stop(HFBackend(model, processor))
    short = GenerateRequest(msgs(seed=4), max_new_tokens=4)
    alone = never_stop(HFBackend(model, processor)).generate_sync([short])[0]

    async def run():
        long_task = asyncio.ensure_future(backend.generate([GenerateRequest(msgs(seed=3), max_new_tokens=300)]))
        await asyncio.sleep(0.3)  # the long one is decoding
        got = (await backend.generate([short]))[0]
        return got, long_task.done(), await long_task

    got, long_done, long_out = asyncio.run(run())
    assert not long_done and len(long_out[0].token_ids) == 300
    assert got.token_ids == alone.token_ids and backend.batch_sizes == [1, 1] and backend.peak_rows == 2
    np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=1e-4)


def test_a_cancelled_request_stops_being_computed(tiny):
    """A caller that gives up (a cancelled task, a disconnected client) frees its row at once."""
    model, processor = tiny
    backend = never_stop(HFBackend(model, processor))
    steps = []
    handle = model.register_forward_hook(lambda m, a, out: steps.append(1))

    async def run():
        task = asyncio.ensure_future(backend.generate([GenerateRequest(msgs(), max_new_tokens=5000)]))
        for _ in range(12_000):  # cancelled once it decodes (under load the prefill alone can take seconds)
            if len(steps) >= 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        n = len(steps)
        await asyncio.sleep(0.5)
        return n, len(steps)

    try:
        at_cancel, later = asyncio.run(run())
    finally:
        handle.remove()
    assert 1 < at_cancel < 5000 and later - at_cancel <= 1  # at most the step in flight


def test_prompts_longer_than_the_context_are_refused_before_any_work(tiny):
    from paravt.backends.base import RequestRejected

    model, processor = tiny
    n = len(HFBackend(model, processor).renderer.render(msgs(n_frames=1)).ids)
    backend = HFBackend(model, processor, max_model_len=n + 10)
    with pytest.raises(RequestRejected, match=f"context is {n + 10} tokens"):
        backend.generate_sync([GenerateRequest(msgs(n_frames=1), max_new_tokens=11)])
    ok = backend.generate_sync([GenerateRequest(msgs(n_frames=1), max_new_tokens=10)])[0]
    assert len(ok.prompt_ids) == n
    assert backend.batches_run == 1  # the refused one never reached the model
    # a huge text is refused after counting one bounded chunk, not by tokenizing all of it
    seen = []
    encode = backend.renderer.encode
    backend.renderer.encode = lambda t: seen.append(len(t)) or encode(t)
    huge = [Message("user", "word " * 2_000_000)]  # 10 MB
    with pytest.raises(RequestRejected):
        backend.generate_sync([GenerateRequest(huge, max_new_tokens=5)])
    assert max(seen) <= backend.renderer.CHUNK_CHARS and sum(seen) <= 2 * backend.renderer.CHUNK_CHARS


def test_completion_text_is_what_the_model_wrote(tiny):
    """Chat-format tokens a model writes stay in the text (the degenerate-output reward looks for a
    rollout that runs on into fake `<|im_start|>` turns); only the token that ended the turn goes."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    start = backend.renderer.im_start
    handle = favour(model, start)
    try:
        c = backend.generate_sync([GenerateRequest(msgs(), max_new_tokens=6)])[0]
    finally:
        handle.remove()
    assert c.token_ids == [start] * 6 and c.text == "<|im_start|>" * 6
    handle = favour(model, backend.renderer.im_end)
    try:
        c = backend.generate_sync([GenerateRequest(msgs(), max_new_tokens=6)])[0]
    finally:
        handle.remove()
    assert c.token_ids == [backend.renderer.im_end] and c.text == "" and c.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_reported_logprobs_are_the_sampling_distributions(tiny, temperature):
    """Rollouts sampled at τ report log softmax(logits / τ) of each chosen token, checked against a
    separate plain forward pass; the τ = 1 values (what the backend reported before) differ. A ratio
    or KL built on τ = 1 values is that of a policy that did not sample."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    m = msgs()
    c = backend.generate_sync([GenerateRequest(m, max_new_tokens=8, temperature=temperature, seed=5)])[0]
    images = [p.image for mm in m for p in mm.images()]
    from paravt.backends.hf import model_inputs

    with torch.no_grad():
        inputs = model_inputs(model, backend.renderer, [c.prompt_ids + c.token_ids], [images])
        logits = model(**inputs, use_cache=False).logits[0, len(c.prompt_ids) - 1:-1].double()
    logits[:, backend.renderer.banned_ids] = float("-inf")  # never sampled
    target = torch.tensor(c.token_ids)[:, None]
    at_tau = torch.log_softmax(logits / temperature, -1).gather(-1, target)[:, 0].numpy()
    at_one = torch.log_softmax(logits, -1).gather(-1, target)[:, 0].numpy()
    np.testing.assert_allclose(c.logprobs, at_tau, atol=1e-4)
    assert np.abs(np.array(c.logprobs) - at_one).max() > 1e-2


def test_the_cache_goes_by_the_name_this_transformers_takes(tiny):
    """transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name warns, and goes in
    5.40); 5.17, the GPU image's, knows only the old one. Generation passes whichever the model takes."""
    import inspect
    import warnings

    model, processor = tiny
    takes_cache = "cache" in inspect.signature(type(model).forward).parameters
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        HFBackend(model, processor).generate_sync([GenerateRequest(msgs(), max_new_tokens=3)])
    renamed = [str(w.message) for w in seen if "past_key_values" in str(w.message)]
    assert not renamed, renamed
    assert takes_cache or "past_key_values" in inspect.signature(type(model).forward).parameters


def test_shared_prompts_and_shared_text_are_prefilled_once(tiny):
    """A GRPO group (one prompt, ids and frames, in four rows) beside a prompt with the same ids and
    other frames and a longer one: the model sees the three distinct prompts' common text (the system
    prompt) once, as one row, then their three remainders; every row samples on its own seed, and
    its tokens and logprobs, decode steps included, are those of its request sent alone."""
    model, processor = tiny
    backend = HFBackend(model, processor)
    fed = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        group = [GenerateRequest(msgs(seed=3), max_new_tokens=8, temperature=1.0, seed=s) for s in range(4)]
        others = [GenerateRequest(msgs(seed=4), max_new_tokens=8, temperature=1.0, seed=0),
                  GenerateRequest(msgs(seed=5, n_frames=3), max_new_tokens=8, temperature=1.0, seed=0)]
        ids = [backend.renderer.render(r.messages).ids for r in (group[0], *others)]
        assert ids[0] == ids[1] and len(ids[2]) > len(ids[0])
        got = backend.generate_sync(group + others)
        shared = ids[0].index(backend.renderer.vision_start)  # the text before the first frame
        assert backend.batch_sizes == [6]
        assert fed[:2] == [(1, shared), (3, len(ids[2]) - shared)], fed[:2]
        alone = [HFBackend(model, processor).generate_sync([r])[0] for r in group + others]
    finally:
        hook.remove()
    for a, b in zip(alone, got):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert len({tuple(c.token_ids) for c in got[:4]}) > 1  # four seeds, not four copies of one row


def test_five_crops_are_one_prefill_with_one_vision_tower_call(tiny):
    """A parallel turn's five sub-agents (each its own crop's frames) sent together: one prefill,
    whose vision tower runs once over all five crops' frames, and each row's tokens are those of
    its request sent alone (greedy)."""
    from paravt.agent.messages import build_subagent_messages
    from paravt.video.frames import Frame

    model, processor = tiny
    crops = [[Frame(frame(10 * c + i), 4.0 * c + i, 4.0 * c + i) for i in range(3)] for c in range(5)]
    reqs = [GenerateRequest(build_subagent_messages(f, f[0].timestamp, f[-1].timestamp + 1, "What happens?"),
                            max_new_tokens=6, temperature=0.0, role="sub") for f in crops]
    grids = []
    hook = model.model.visual.register_forward_hook(lambda m, a, kw, out: grids.append(len(kw["grid_thw"])),
                                                    with_kwargs=True)
    try:
        backend = HFBackend(model, processor)
        got = backend.generate_sync(reqs)
        assert backend.batch_sizes == [5] and grids == [15]  # one call, every crop's frames
        alone = [HFBackend(model, processor).generate_sync([r])[0] for r in reqs]
    finally:
        hook.remove()
    assert [c.token_ids for c in got] == [c.token_ids for c in alone]


def test_a_decode_step_writes_its_column_into_room_the_cache_holds():
    """kv_cache.RoomyLayer: transformers' DynamicLayer copies each row's whole K/V at every decode
    step (a concatenation). Here a step writes its column in place: twenty steps, one buffer; the
    views handed out before keep their values; keys replaced from outside (hf's map_cache: rows
    selected, batches merged) are taken up at the next step."""
    from paravt.backends.kv_cache import RoomyLayer

    g = torch.Generator().manual_seed(0)
    kv = lambda rows, cols: (torch.randn(rows, 2, cols, 4, generator=g), torch.randn(rows, 2, cols, 4, generator=g))  # noqa: E731
    layer = RoomyLayer()
    k0, v0 = kv(3, 5)
    keys, _ = layer.update(k0, v0)  # the prefill: kept as given
    assert torch.equal(keys, k0)
    steps = [kv(3, 1) for _ in range(21)]
    first, _ = layer.update(*steps[0])
    buffer = first.untyped_storage().data_ptr()
    for k, v in steps[1:]:
        keys, values = layer.update(k, v)
    assert keys.untyped_storage().data_ptr() == buffer  # no copy after the first step's
    assert torch.equal(keys, torch.cat([k0] + [k for k, _ in steps], dim=-2))
    assert torch.equal(values, torch.cat([v0] + [v for _, v in steps], dim=-2))
    assert torch.equal(first, torch.cat([k0, steps[0][0]], dim=-2))  # an earlier view is never written
    layer.keys, layer.values = layer.keys[1:], layer.values[1:]  # a row left the batch
    k, v = kv(2, 1)
    keys, values = layer.update(k, v)
    assert keys.shape == (2, 2, 27, 4) and keys.untyped_storage().data_ptr() != buffer
    assert torch.equal(keys[:, :, -1:], k) and torch.equal(values[:, :, :5], v0[1:])
