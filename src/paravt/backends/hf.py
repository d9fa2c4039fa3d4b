"""In-process transformers backend for Qwen3-VL checkpoints, with continuous batching.

One worker thread owns the model and runs a loop of decode steps over the rows in flight. A
request that arrives meanwhile (the sub-agents of one turn, the episodes of an eval batch, the
rollouts of a GRPO group, a client of `paravt serve`) is prefilled at the next step, together
with whatever else arrived, and its KV cache is merged into the running batch: a short request
is not held behind a long one, and its latency does not grow with the other's length. A row
leaves the batch as soon as it stops, and at once when its caller gives up (a cancelled task,
a disconnected client): nothing keeps computing for nobody. The event loop never blocks.

Decoding is our own loop rather than `generate()`: we need the sampling distribution's logprob of
every chosen token for PPO (log π_τ, `policy_log_softmax`), exact prompt ids for token-exact trajectories, per-row sampling settings and
seeds, per-row stopping, and rows joining and leaving between steps. Every forward pass is the
model's own `model(...)` with transformers' DynamicCache: the prefill (vision encoder, DeepStack,
3-D M-RoPE positions from the model's `get_rope_index`) and each decode step (explicit per-row
positions, a 2-D attention mask that hides left padding). An earlier hand-written decode step
(the Qwen3-VL text decoder restated over the model's weights) was 14 % faster for the 1.4 M
parameter tiny model on CPU (444 vs 389 new tokens/s, batch 1); not worth a second copy of the
model's math that would silently diverge when transformers changes Qwen3-VL.

A request whose prompt plus `max_new_tokens` exceeds the model's context (`max_model_len`,
default the text config's max_position_embeddings) fails with RequestRejected before any model
work; text is counted in bounded chunks, so a 60 MB prompt is refused without tokenizing it whole.

The chat renderer (messages -> ids) is `paravt.chat`, the forward inputs and log π_τ
`paravt.policy`, shared with the trainers; they are re-exported here for existing imports. The
prefill, which computes a prompt or a leading text that several rows share once, is
`paravt.backends.prefill`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable

import torch

from paravt.backends.base import BackendError, Completion, GenerateRequest, RequestRejected
from paravt.backends.incremental_text import IncrementalText
from paravt.backends.prefill import map_cache, prefill
from paravt.chat import Rendered, Renderer
from paravt.backends.static_decode import SlotBatch, StaticDecoder, cache_kwarg, choose_on_device, decode_mode
from paravt.policy import is_greedy, model_inputs, policy_log_softmax, sequence_logprobs

__all__ = ["HFBackend", "IncrementalText", "Rendered", "Renderer", "default_decode_threads", "model_inputs",
           "policy_log_softmax", "sequence_logprobs"]

# ----------------------------------------------------------------------------------------------
# decoding: rows in flight, one step at a time


@dataclass
class _Job:
    """One request on its way through the worker."""

    request: GenerateRequest
    future: concurrent.futures.Future
    rendered: Rendered | None = None
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reason: str = "length"
    # called on the worker thread with each token that does not end the row (streaming)
    on_token: Callable[[int], None] | None = None

    def gone(self) -> bool:
        """The caller stopped waiting (cancelled task, timeout, disconnected client)."""
        return self.future.done()


@dataclass
class _Batch:
    """The rows being decoded: their jobs, one KV cache (left-padded to a common length), the 2-D
    attention mask that hides the padding, each row's next position, the logits of its next token."""

    jobs: list[_Job]
    cache: object  # transformers.DynamicCache
    attention: torch.Tensor  # (B, L) long
    positions: torch.Tensor  # (B,) long
    logits: torch.Tensor  # (B, vocab) float32

    def select(self, keep: list[int]) -> "_Batch | None":
        return _select(self, keep)

    def decode(self, model) -> "_Batch":
        return _decode(model, self)

    def release(self) -> None:
        """Nothing to give back: the cache goes with the batch."""


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _prefill(model, renderer: Renderer, jobs: list[_Job], resume: bool = False) -> _Batch:
    """One forward pass over the new rows' prompts (`paravt.backends.prefill`: shared prompts and
    shared leading text computed once). With `resume`, each row's prompt is followed by the tokens it
    has generated so far (a row rebuilt after a failed decode step), so the logits are those of its
    next token."""
    rows = [j.rendered.ids + (j.tokens if resume else []) for j in jobs]
    out = prefill(model, renderer, rows, [j.rendered.images for j in jobs])
    return _Batch(jobs, out.cache, out.attention, out.positions, out.logits)


def _merge(a: _Batch | None, b: _Batch) -> _Batch:
    """The rows of both batches in one: the shorter cache is left-padded (masked) to the longer."""
    if a is None:
        return b
    la, lb = a.attention.shape[1], b.attention.shape[1]
    width = max(la, lb)
    for x, y in zip(a.cache.layers, b.cache.layers):
        x.keys = torch.cat([_left_pad(x.keys, width - la, 2), _left_pad(y.keys, width - lb, 2)])
        x.values = torch.cat([_left_pad(x.values, width - la, 2), _left_pad(y.values, width - lb, 2)])
    return _Batch(a.jobs + b.jobs, a.cache,
                  torch.cat([_left_pad(a.attention, width - la, 1), _left_pad(b.attention, width - lb, 1)]),
                  torch.cat([a.positions, b.positions]), torch.cat([a.logits, b.logits]))


def _select(batch: _Batch, keep: list[int]) -> _Batch | None:
    """The batch with only rows `keep`; columns that are padding in every remaining row are cut."""
    if not keep:
        return None
    if len(keep) == len(batch.jobs):
        return batch
    idx = torch.tensor(keep, device=batch.attention.device)
    attention = batch.attention.index_select(0, idx)
    start = int((attention.sum(0) > 0).nonzero()[0])  # first column some row attends to
    map_cache(batch.cache, lambda t: t.index_select(0, idx)[:, :, start:])
    return _Batch([batch.jobs[i] for i in keep], batch.cache, attention[:, start:],
                  batch.positions.index_select(0, idx), batch.logits.index_select(0, idx))


def _choose(batch: "_Batch | SlotBatch", banned: torch.Tensor) -> tuple[list[int], list[float], dict[int, Exception]]:
    """One token per row: greedy at a temperature below GREEDY_BELOW, else sampled from π_τ
    (softmax(logits / T) without the vision placeholders, top-p truncated, always keeping the top
    token) with the row's own seeded generator (so a seeded request gives the same tokens alone or
    in any batch). Each logprob is log π_τ of the chosen token (`policy_log_softmax`), the behaviour
    policy PPO's ratio needs. Vision placeholders are never chosen: a generated one has no frame
    behind it and would break the next forward pass. A row whose choice fails (non-finite logits)
    is returned in the errors, by index: it fails alone."""
    if isinstance(batch, SlotBatch):  # the GPU path: every row on the device, one sync
        chosen, lps, finite = choose_on_device(batch.logits, [j.request for j in batch.jobs],
                                               [j.generator for j in batch.jobs], banned)
        return chosen, lps, {j: BackendError(f"the model's next-token distribution is not finite (log π {lps[j]})")
                             for j, ok in enumerate(finite) if not ok}
    logits = batch.logits
    if banned.numel():
        logits = logits.index_fill(-1, banned, float("-inf"))
    chosen = torch.argmax(logits, dim=-1).tolist()
    lps = [0.0] * len(batch.jobs)
    errors: dict[int, Exception] = {}
    for j, job in enumerate(batch.jobs):
        try:
            chosen[j], lps[j] = _choose_row(logits[j], chosen[j], job)
        except Exception as e:  # noqa: BLE001 - one row's sampling fails that row, not its batch
            errors[j] = e
    return chosen, lps, errors


def _choose_row(logits: torch.Tensor, greedy: int, job: _Job) -> tuple[int, float]:
    """One row's token (`greedy` is its argmax) and log π_τ of it; BackendError when its
    distribution is not finite (NaN or inf logits)."""
    r = job.request
    lsm = policy_log_softmax(logits, r.temperature)
    token = greedy
    if not is_greedy(r.temperature):
        probs = lsm.exp().cpu()
        if r.top_p < 1.0:
            sp, si = torch.sort(probs, descending=True)
            keep = torch.cumsum(sp, 0) - sp < r.top_p
            keep[0] = True  # a top_p below the top token's mass keeps that token
            probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
        try:
            token = int(torch.multinomial(probs, 1, generator=job.generator)[0])
        except RuntimeError as e:  # "probability tensor contains either inf, nan or element < 0"
            raise BackendError(f"the model's next-token distribution is not finite ({e})") from None
    lp = float(lsm[token])
    if not math.isfinite(lp):
        raise BackendError(f"the model's next-token distribution is not finite (log π of token {token} is {lp})")
    return token, lp


def _finished(job: _Job, token: int, renderer: Renderer, max_model_len: int) -> bool:
    r = job.request
    if token in renderer.stop_ids:
        job.reason = "stop"
        return True
    if len(job.tokens) >= r.max_new_tokens or len(job.rendered.ids) + len(job.tokens) >= max_model_len:
        return True
    if r.stop:
        tail = renderer.tok.decode(job.tokens[-16:], skip_special_tokens=False)
        if any(s and s in tail for s in r.stop):
            job.reason = "stop"
            return True
    return False


def _advance(renderer: Renderer, batch: "_Batch | SlotBatch", banned: torch.Tensor, max_model_len: int
             ) -> tuple["_Batch | SlotBatch | None", list[_Job], list[tuple[_Job, Exception]]]:
    """Choose each row's next token and let finished rows go. Returns the rows that go on (their
    tokens chosen, not yet fed), the jobs that finished, and the jobs that failed, each alone."""
    tokens, lps, errors = _choose(batch, banned)
    keep, done, failed = [], [], []
    for j, (job, t, lp) in enumerate(zip(batch.jobs, tokens, lps)):
        if j in errors:
            failed.append((job, errors[j]))
            continue
        try:
            job.tokens.append(t)
            job.logprobs.append(lp)
            if _finished(job, t, renderer, max_model_len):
                done.append(job)
            elif not job.gone():
                if job.on_token is not None:
                    job.on_token(t)
                keep.append(j)
        except Exception as e:  # noqa: BLE001 - a row's own bookkeeping (stop strings, streaming) fails it alone
            failed.append((job, e))
    return batch.select(keep), done, failed


def _decode(model, batch: _Batch) -> _Batch:
    """Run every row one token further: feed each row's last chosen token."""
    n = len(batch.jobs)
    device = batch.attention.device
    batch.attention = torch.cat([batch.attention, batch.attention.new_ones((n, 1))], dim=1)
    ids = torch.tensor([job.tokens[-1] for job in batch.jobs], device=device).view(n, 1)
    # a text token's three M-RoPE positions (time, height, width) are equal
    pos = batch.positions.view(1, n, 1).expand(3, n, 1)
    out = model(input_ids=ids, attention_mask=batch.attention, position_ids=pos, use_cache=True,
                **{cache_kwarg(type(model)): batch.cache})
    batch.logits = out.logits[:, -1, :].float()
    batch.positions = batch.positions + 1
    return batch


def _completion(job: _Job, renderer: Renderer) -> Completion:
    """The result of a finished job. `text` is everything the model wrote but the token that ended
    its turn, special tokens included (a rollout that runs on into a fake `<|im_start|>user` turn
    must be seen as such by the degenerate-output reward), and cut before a stop string."""
    ids, rd, r = job.tokens, job.rendered, job.request
    text_ids = ids[:-1] if ids and ids[-1] in renderer.stop_ids else ids
    text = renderer.tok.decode(text_ids, skip_special_tokens=False)
    cuts = [text.find(s) for s in r.stop if s and s in text]
    if cuts:  # OpenAI semantics: the text ends before the stop string (token_ids keep what was generated)
        text = text[: min(cuts)]
    return Completion(text=text, finish_reason=job.reason, prompt_tokens=len(rd.ids), visual_tokens=rd.visual_tokens,
                      completion_tokens=len(ids), prompt_ids=list(rd.ids), token_ids=list(ids),
                      logprobs=list(job.logprobs), assistant_ids=list(rd.prefix_ids) + list(ids))


def default_decode_threads(model) -> int | None:
    """1 for small models on CPU, else None (leave torch's setting). A decode step of a few-million-
    parameter model is hundreds of tiny ops; splitting each over 2+ OpenMP threads only adds
    synchronisation, and on a shared machine spinning threads wait on each other (measured ~5x
    slower with 2 threads than with 1 on the 2-core dev box under load)."""
    if model.device.type != "cpu":
        return None
    return 1 if sum(p.numel() for p in model.parameters()) <= 50_000_000 else None


def _resolve(job: _Job, value) -> None:
    """Hand a result (or an exception) to a caller that may have stopped waiting meanwhile."""
    try:
        if isinstance(value, BaseException):
            job.future.set_exception(value)
        else:
            job.future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled meanwhile: nobody wants it


# ----------------------------------------------------------------------------------------------
# the backend


class HFBackend:
    """Backend over an in-process Qwen3-VL, with continuous batching (module doc).

    max_batch: most rows decoded at once (more requests wait). batch_wait_ms: when the worker is
    idle, how long it waits after a first request for others to join the same prefill.
    decode_threads: torch threads for the decode steps; None = `default_decode_threads` (1 for
    small models on CPU); prefills keep torch's setting. max_model_len: prompt + max_new_tokens
    limit (default: the model's max_position_embeddings). decode: "eager" (a DynamicCache, each step
    the whole model's forward), "static" (`static_decode`: a static cache in slots through the text
    decoder), "static-graphs" (the same, each step a CUDA graph recorded from the eager step),
    "static-compiled" (each step a CUDA graph of inductor's fused kernels, compiled per bucket), or
    "auto": static-graphs on a GPU, eager on a CPU. The static paths attend over the cache columns in
    use; with "-bucket" appended (say "static-graphs-bucket") over the whole bucket, as before."""

    name = "hf"

    def __init__(self, model, processor, *, max_batch: int = 16, batch_wait_ms: float = 5.0,
                 device: str | None = None, decode_threads: int | None = None, max_model_len: int | None = None,
                 decode: str = "auto"):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if device is not None:
            model.to(device)
        self.model = model
        self.processor = processor
        self.renderer = Renderer(processor)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self.decode_threads = default_decode_threads(model) if decode_threads is None else decode_threads
        text_cfg = model.config.get_text_config()
        limit = getattr(text_cfg, "max_position_embeddings", None) or 1 << 30
        self.max_model_len = int(max_model_len or limit)
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        self.decode = decode_mode(decode, model)
        self._static: StaticDecoder | None = None
        if self.decode != "eager":
            path = self.decode.removesuffix("-bucket")
            capture = {"static": "none", "static-graphs": "graphs", "static-compiled": "compile"}[path]
            self._static = StaticDecoder(model, slots=max_batch, cap=self.max_model_len, capture=capture,
                                         attend="bucket" if path != self.decode else "live")
        self._banned: torch.Tensor | None = None
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # observable, for tests and benchmarks
        self.batches_run = 0  # prefills run (one per group of requests admitted together)
        self.batch_sizes: list[int] = []  # rows per prefill
        self.peak_rows = 0  # most rows decoded together
        # seconds between the worker's token choices (each a host sync), split by what ran in between:
        # a prefill (with any step beside it) or decode steps alone, and the tokens those steps gave
        self.timing = {"prefill_s": 0.0, "decode_s": 0.0, "decode_tokens": 0, "decode_steps": 0}

    # ---- submitting

    def _submit(self, requests: list[GenerateRequest], on_token: Callable[[int], None] | None = None
                ) -> list[concurrent.futures.Future]:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._worker, name="paravt-hf", daemon=True)
                self._thread.start()
        futures = []
        for r in requests:
            f: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put(_Job(r, f, on_token=on_token))
            futures.append(f)
        return futures

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        """Complete every request; cancelling the awaiting task drops its rows from the batch."""
        futures = [asyncio.wrap_future(f) for f in self._submit(requests)]
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[str | Completion]:
        """One request's text as it is decoded (a piece per decode step, for `paravt serve`'s
        stream=true), then its Completion. The pieces are the completion's text as the steps made it
        (a piece that ends inside a UTF-8 character waits for the rest); `Completion.text` is the
        authority (it drops the token that ended the turn and cuts at a stop string), so a consumer
        sends what it has not sent of it at the end. Closing the iterator drops the row, as a
        cancelled `generate` does."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | None] = asyncio.Queue()

        def on_token(t: int) -> None:  # worker thread: hand the token to the event loop
            try:
                loop.call_soon_threadsafe(tokens.put_nowait, t)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        future = asyncio.wrap_future(self._submit([request], on_token=on_token)[0])
        # queued after every token: the worker reports a token before it resolves the row
        future.add_done_callback(lambda _: tokens.put_nowait(None))
        text = IncrementalText(self.renderer.tok)
        try:
            while (t := await tokens.get()) is not None:
                piece = text.push(t)
                if piece:
                    yield piece
            yield await future
        finally:
            future.cancel()

    def generate_sync(self, requests: list[GenerateRequest]) -> list[Completion]:
        """The same without an event loop (scripts, trainer): blocks until all are done."""
        return [f.result() for f in self._submit(requests)]

    def reload_weights(self, path: str) -> None:
        """Load new weights in place from a directory of safetensors files (a trainer's consolidated
        checkpoint): the weight-sync path of `paravt serve --rl-api`. Call it with no request in
        flight (the server pauses first). A tied weight may be absent (it is its source)."""
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no .safetensors files")
        state: dict = {}
        for f in files:
            state.update(load_file(f))
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state) - tied)
        unknown = sorted(set(state) - set(own))
        if missing or unknown:
            raise ValueError(f"{path} does not match the served model: missing {missing[:3]}, unknown {unknown[:3]}")
        bad = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
        if bad:
            raise ValueError(f"{path}: shapes differ from the served model's for {bad[:3]}")
        with torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v.to(own[k].dtype))

    async def aclose(self) -> None:
        """Stop the worker once the rows in flight are done (a later call starts a new one)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        self._thread = None

    # ---- the worker thread

    def _admit(self, job: _Job) -> bool:
        """Render a new job and seed its generator; a job that cannot run fails alone (False)."""
        r = job.request
        try:
            if r.max_new_tokens < 1:
                raise RequestRejected(f"max_new_tokens must be >= 1, got {r.max_new_tokens}")
            if r.max_new_tokens >= self.max_model_len:
                raise RequestRejected(f"max_new_tokens {r.max_new_tokens} leaves no room for a prompt in the "
                                      f"model's context of {self.max_model_len} tokens")
            if r.seed is not None and not (isinstance(r.seed, int) and -(2**63) <= r.seed < 2**64):
                raise RequestRejected(f"seed must be an integer in [-2^63, 2^64), got {str(r.seed)[:40]}")
            job.rendered = self.renderer.render(r.messages, prefix=r.prefix,
                                                max_tokens=self.max_model_len - r.max_new_tokens)
            # sampled where the logits are: the static path draws on the device (choose_on_device)
            job.generator = torch.Generator(device=self.model.device if self._static is not None else "cpu")
            seed = r.seed if r.seed is not None else time.time_ns() % (2**31)
            job.generator.manual_seed(seed % (2**64))  # a negative seed as its two's complement
        except RequestRejected as e:
            _resolve(job, RequestRejected(f"bad request: {e} (the model's context is {self.max_model_len} tokens, "
                                          f"of which max_new_tokens={r.max_new_tokens} are for the answer)"))
            return False
        except Exception as e:  # noqa: BLE001 - a request that cannot be rendered fails alone
            _resolve(job, RequestRejected(f"bad request: {e}"))
            return False
        return True

    def _prefill_rows(self, jobs: list[_Job], resume: bool = False) -> _Batch | None:
        """The rows' prefill; if it fails, each row is prefilled alone, so a row the model cannot take
        (a frame its vision tower refuses, say) fails by itself and the others go on."""
        try:
            with torch.no_grad():
                return _prefill(self.model, self.renderer, jobs, resume)
        except Exception as e:  # noqa: BLE001
            if len(jobs) == 1:
                _resolve(jobs[0], _failure(e))
                return None
        batch = None
        for job in jobs:
            one = self._prefill_rows([job], resume)
            if one is not None:
                batch = _merge(batch, one)
        return batch

    def _worker(self) -> None:
        if self._banned is None:
            self._banned = torch.tensor(self.renderer.banned_ids, dtype=torch.long, device=self.model.device)
        base_threads = torch.get_num_threads()
        batch: _Batch | None = None
        waiting: list[_Job] = []
        stopping = False
        mark = None  # when the last token choice ended (None: idle since)
        while True:
            # 1. collect what arrived: block when idle, then give concurrent callers a moment to join
            if batch is None and not waiting:
                mark = None
                if stopping:
                    return
                item = self._queue.get()
                if item is None:
                    return
                waiting.append(item)
                time.sleep(self.batch_wait_s)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    waiting.append(item)
            waiting = [j for j in waiting if not j.gone()]
            # 2. admit up to max_batch rows: one prefill, merged into the running batch
            room = self.max_batch - (len(batch.jobs) if batch else 0)
            new, waiting = waiting[:max(room, 0)], waiting[max(room, 0):]
            new = [j for j in new if self._admit(j)]
            try:
                if new:
                    mark = mark or time.perf_counter()
                    torch.set_num_threads(base_threads)
                    with torch.profiler.record_function("paravt::prefill"):  # a range for profiles (benchmarks)
                        fresh = self._prefill_rows(new)
                    if fresh is not None:
                        batch = self._join(batch, fresh)
                    self.batches_run += 1
                    self.batch_sizes.append(len(new))
                if batch is None:
                    continue
                self.peak_rows = max(self.peak_rows, len(batch.jobs))
                # 3. one decode step for every row: each row's token, then one forward pass
                if self.decode_threads:
                    torch.set_num_threads(self.decode_threads)
                rows = len(batch.jobs)
                with torch.no_grad(), torch.profiler.record_function("paravt::sampling"):
                    batch, done, failed = _advance(self.renderer, batch, self._banned, self.max_model_len)
                mark = self._clock(mark, bool(new), rows)
                for job in done:
                    _resolve(job, _completion(job, self.renderer))
                for job, e in failed:
                    _resolve(job, _failure(e))
                if batch is not None:
                    with torch.profiler.record_function("paravt::decode step"):
                        batch = self._decode_or_rebuild(batch)
            except Exception as e:  # noqa: BLE001 - the worker outlives any failure; the rows in hand fail
                for job in (batch.jobs if batch else []) + new:
                    _resolve(job, _failure(e))
                batch = None
            finally:
                torch.set_num_threads(base_threads)

    def _clock(self, mark: float | None, prefilled: bool, rows: int) -> float:
        """Account the time since the last token choice (`timing`): to the prefill where one ran, else
        to decode steps, which gave `rows` tokens. A token choice syncs with the device, so each
        interval holds the device work launched in it."""
        now = time.perf_counter()
        if mark is not None:
            if prefilled:
                self.timing["prefill_s"] += now - mark
            else:
                self.timing["decode_s"] += now - mark
                self.timing["decode_tokens"] += rows
                self.timing["decode_steps"] += 1
        return now

    def _join(self, batch, fresh: _Batch):
        """The running batch with newly prefilled rows: merged caches (eager) or copied into slots."""
        if self._static is None:
            return _merge(batch, fresh)
        return SlotBatch.join(batch, fresh, self._static)

    def _decode_or_rebuild(self, batch):
        """One decode step; if the batched forward fails, the rows are rebuilt one by one from their
        prompt and the tokens they have so far (a recompute, as vLLM's preemption does), so a row
        that breaks the step fails alone and the others go on from where they were."""
        try:
            with torch.no_grad():
                return batch.decode(self.model)
        except Exception:  # noqa: BLE001 - each row gets its own verdict below
            batch.release()
            rebuilt = self._prefill_rows(batch.jobs, resume=True)
            return None if rebuilt is None else self._join(None, rebuilt)


def _failure(e: BaseException) -> BackendError:
    """The error a failed row's caller gets: a BackendError as raised, anything else named."""
    return e if isinstance(e, BackendError) else BackendError(f"hf generation failed: {type(e).__name__}: {e}")
