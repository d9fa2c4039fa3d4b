"""The static-cache decode path (`paravt.backends.static_decode`, the GPU's) gives the tokens of the
eager DynamicCache path: greedy and seeded sampling token for token, logprobs within 1e-5, on the
tiny model in fp32 on CPU, while rows join and leave between steps, a later prompt longer than the
running rows moves them right, and generation runs past a cache bucket (compaction, then growth)."""

import asyncio
import threading

import numpy as np
import pytest

from paravt import protocol as P
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend
from paravt.backends.static_decode import MIN_LENGTH, bucket
from paravt.models.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def request(i: int, frames: int, new: int) -> GenerateRequest:
    rng = np.random.default_rng(i)
    parts = []
    for f in range(frames):
        parts += [TextPart(P.timestamp_text(f * 2.0)), ImagePart(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))]
    parts.append(TextPart("What happens? " * (1 + i % 3)))
    return GenerateRequest([Message("system", P.system_prompt("parallel")), Message("user", parts)],
                           max_new_tokens=new, temperature=0.0 if i % 2 == 0 else 0.7, seed=i, prefix=P.THINK_PREFIX)


def test_buckets():
    assert bucket(1, 10_000) == MIN_LENGTH and bucket(MIN_LENGTH + 1, 10_000) == 2 * MIN_LENGTH
    assert bucket(3000, 2048) == 3000 and bucket(700, 600) == 700  # never below what is needed


# short and long prompts and generations; the 6-frame prompt joins after shorter ones started
JOINING = [(0, 1, 20), (1, 2, 70), (2, 1, 8), (3, 6, 30), (4, 1, 60), (5, 3, 12)]


@pytest.fixture(scope="module")
def eager_alone(tiny):
    """The eager path's completion of each JOINING request alone, at full length (no stop token: the
    long rows really run past the bucket): what both batch sizes below must give."""
    eager = HFBackend(*tiny, decode="eager")
    eager.renderer.stop_ids = set()
    return [eager.generate_sync([request(*r)])[0] for r in JOINING]


@pytest.mark.parametrize("max_batch", [3, 8])
def test_static_decode_gives_the_eager_tokens_while_rows_join_and_leave(tiny, eager_alone, max_batch, monkeypatch):
    import paravt.backends.static_decode as sd

    monkeypatch.setattr(sd, "MIN_LENGTH", 32)  # small buckets: the rows below cross several (grow, compact)
    model, processor = tiny
    reqs = [request(*r) for r in JOINING]
    alone = eager_alone
    static = HFBackend(model, processor, decode="static", max_batch=max_batch, batch_wait_ms=20)
    static.renderer.stop_ids = set()

    async def staggered():
        tasks = []
        for i, r in enumerate(reqs):
            tasks.append(asyncio.ensure_future(static.generate([r])))
            await asyncio.sleep(0.05 * (i % 3))
        return [t[0] for t in await asyncio.gather(*tasks)]

    got = asyncio.run(staggered())
    for a, b in zip(alone, got):
        assert b.token_ids == a.token_ids
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    assert len(static.batch_sizes) > 1  # rows joined a running batch
    dec = static._static
    first = sd.bucket(max(len(a.prompt_ids) for a in alone[:max_batch]) + 1, dec.cap)
    assert dec.length > first  # grown past the bucket it started in
    assert sorted(dec.free) == list(range(max_batch))  # every slot given back


def test_decode_modes_are_checked(tiny):
    model, processor = tiny
    assert HFBackend(model, processor).decode == "eager"  # auto on CPU
    with pytest.raises(ValueError, match="decode must be one of"):
        HFBackend(model, processor, decode="fast")


def test_a_step_that_cannot_be_captured_runs_eagerly_with_the_same_tokens(tiny):
    """static-graphs where CUDA graphs cannot be recorded (here: no GPU) warns once, says why in
    `failed`, and decodes on, eagerly, to the tokens and logprobs of the eager path."""
    model, processor = tiny
    eager = HFBackend(model, processor, decode="eager", max_batch=4)
    graphs = HFBackend(model, processor, decode="static-graphs", max_batch=4)
    reqs = [request(i, 2, 12) for i in range(3)]
    want = eager.generate_sync(reqs)
    with pytest.warns(RuntimeWarning, match="capturing the step failed"):
        got = graphs.generate_sync(reqs)
    assert graphs._static.failed
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)


def test_graphs_are_dropped_when_the_weights_move_and_kept_when_loaded_in_place(tiny):
    """FSDP2 gathers the weights into new memory before each rollout phase: a graph captured over
    the old addresses would read freed memory, silently. The decoder drops its graphs where any
    weight moved, and keeps them where weights were loaded in place (their addresses unchanged)."""
    import torch

    model, processor = build_tiny(seed=0)
    b = HFBackend(model, processor, decode="static", max_batch=2)
    dec = b._static
    dec.capture = "graphs"  # the bookkeeping of the GPU path; a CPU step is never captured
    dec._run_step = lambda batch, *step: dec._forward(*step)  # (no capture on CPU)
    b.generate_sync([request(0, 1, 3)])
    dec._graphs[(dec.length, 1)] = "captured"
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p * 1.0)  # in place: same addresses
    b.generate_sync([request(0, 1, 3)])
    assert dec._graphs == {(dec.length, 1): "captured"}
    moved = next(model.model.language_model.layers[0].parameters())
    moved.data = moved.data.clone()  # new memory, as an unshard gives
    b.generate_sync([request(0, 1, 3)])
    assert dec._graphs == {}


def test_device_sampling_matches_the_per_row_sampler_and_isolates_nan_rows():
    """`choose_on_device` (one host sync a step) draws what hf's per-row `_choose_row` draws with the
    same seeded generators, greedy and sampled (top-p included); a NaN row is reported alone."""
    import torch

    from paravt.backends import hf
    from paravt.backends.static_decode import choose_on_device

    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits[3] = float("nan")
    reqs = [GenerateRequest([], temperature=t, top_p=p, seed=i)
            for i, (t, p) in enumerate([(0.0, 1.0), (0.7, 1.0), (1.0, 0.5), (0.7, 1.0), (1e-300, 0.9)])]
    banned = torch.tensor([7, 9])
    gens = [torch.Generator().manual_seed(r.seed) for r in reqs]
    tokens, lps, ok = choose_on_device(logits, reqs, gens, banned)
    assert ok == [True, True, True, False, True]
    masked = logits.index_fill(-1, banned, float("-inf"))
    for j, r in enumerate(reqs):
        if j == 3:
            continue
        job = hf._Job(r, None, generator=torch.Generator().manual_seed(r.seed))
        t, lp = hf._choose_row(masked[j], int(masked[j].argmax()), job)
        assert (tokens[j], round(lps[j], 6)) == (t, round(lp, 6)) and t not in (7, 9)


def test_spans():
    from paravt.backends.static_decode import span

    assert span(1, 4096) == 64 and span(65, 4096) == 128 and span(300, 4096) == 320  # 512 / 8 = 64 a step
    assert span(8050, 16384) == 8192 and span(8193, 16384) == 9216 and span(9000, 8192) == 8192
    assert all(n <= span(n, 1 << 20) <= n * 1.125 + 64 for n in range(1, 20000, 37))


def test_live_attention_reads_only_the_columns_in_use_with_the_same_tokens(tiny, monkeypatch):
    """A long bucket (4,096 columns) decoding short rows: attending over the columns in use (the
    default) gives the tokens and logprobs of attending over the whole bucket (the first GPU round's
    path), and reads an eighth of the KV columns. A long row leaving moves the short rows to column 0."""
    import paravt.backends.static_decode as sd

    monkeypatch.setattr(sd, "MIN_LENGTH", 4096)
    model, processor = tiny
    reqs = [request(0, 1, 24), request(1, 1, 16), request(2, 2, 20)]
    got = {}
    for decode in ("static-bucket", "static"):
        b = HFBackend(model, processor, decode=decode, max_batch=4)
        b.renderer.stop_ids = set()
        got[decode] = (b.generate_sync(reqs), b._static)
    (want, full), (live, dec) = got["static-bucket"], got["static"]
    # the worker's clock: one prefill for the three rows, then every later token from a decode step
    assert b.timing["prefill_s"] > 0 and b.timing["decode_s"] > 0 and b.batch_sizes == [3]
    assert b.timing["decode_tokens"] == sum(len(o.token_ids) - 1 for o in live)
    assert full.length == dec.length == 4096 and full.attend == "bucket" and dec.attend == "live"
    for w, g in zip(want, live):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    assert dec.kv_columns * 8 <= full.kv_columns, (dec.kv_columns, full.kv_columns)
    # a long row and a short one that outlives it: once it leaves, the short row moves to column 0;
    # a row joining later gets its eager tokens too
    b = HFBackend(model, processor, decode="static", max_batch=4, batch_wait_ms=20)
    b.renderer.stop_ids = set()
    moved, rows_after, sent = [], [], threading.Event()
    compact = sd.StaticDecoder._compact

    def watched(self, slots):
        w = self.w
        compact(self, slots)
        if self.w < w:
            moved.append(w - self.w)
            sent.wait(30)  # the worker holds here until the third row is queued: it joins next
        elif moved:
            rows_after.append(len(slots))

    monkeypatch.setattr(sd.StaticDecoder, "_compact", watched)

    async def joined_later():
        first = asyncio.ensure_future(b.generate([request(3, 64, 2), request(4, 1, 40)]))
        while not moved:
            await asyncio.sleep(0.002)
        late = asyncio.ensure_future(b.generate([request(5, 2, 10)]))
        await asyncio.sleep(0.05)  # queued
        sent.set()
        return await first, (await late)[0]

    (long, short), late = asyncio.run(joined_later())
    eager = HFBackend(model, processor, decode="eager")
    eager.renderer.stop_ids = set()
    assert short.token_ids == eager.generate_sync([request(4, 1, 40)])[0].token_ids
    assert late.token_ids == eager.generate_sync([request(5, 2, 10)])[0].token_ids
    assert moved[0] > len(long.prompt_ids) - len(short.prompt_ids) - 8  # the long row's columns cut
    assert 2 in rows_after  # the third row decoded beside the moved one


def test_past_eight_rows_a_step_runs_over_a_multiple_of_eight_slots(tiny, monkeypatch):
    """Seventeen rows step over 24 slots, not the next power of two (32): the eager path's tokens."""
    import paravt.backends.static_decode as sd

    model, processor = tiny
    reqs = [request(i, 1, 4) for i in range(17)]
    eager = HFBackend(model, processor, decode="eager", max_batch=17)
    eager.renderer.stop_ids = set()
    want = eager.generate_sync(reqs)
    static = HFBackend(model, processor, decode="static", max_batch=32)
    static.renderer.stop_ids = set()
    seen = []
    step = sd.StaticDecoder._run_step
    monkeypatch.setattr(sd.StaticDecoder, "_run_step", lambda self, key, *a: seen.append(key[2]) or step(self, key, *a))
    got = static.generate_sync(reqs)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert static.batch_sizes == [17] and set(seen) == {24}
