"""The hf backend's decode step for the GPU: a static KV cache in slots, the model's own text decoder
and lm_head, shapes fixed per cache-length bucket so that each bucket's step is one CUDA graph.

Why: at Qwen3-VL-8B's shape an eager decode step issues ~2,300 kernel launches (the GPU busy ~5 % of
the step) and a DynamicCache grows by concatenation; gpt-fast showed that a static cache and a
captured step reach most of the memory bandwidth in plain PyTorch. The prefill stays the model's own
forward (vision tower, DeepStack, M-RoPE); only decode steps run here, through
`model.model.language_model` and `model.lm_head` (no restated model math).

Layout: the cache holds `slots` rows of `length` columns (a step runs over the first 1, 2, 4, 8,
16, 24, ... slots that hold every row in use), and every row writes its next token at the
same column `w` (transformers' StaticCache write pointer, shared by the batch). A row's tokens end at
w - 1 and begin where its prompt began; earlier columns are masked. Rotary embeddings are applied
before a key is cached, so where a key sits does not matter, only the mask: a joining row's prefill
K/V (from the model's DynamicCache) is copied into its slot to end at w, moving every row right
first when its prompt is longer than w; when w reaches the end, the columns no row uses are cut
(rows move left), else the cache grows to the next bucket (a new graph). The attention mask is built
here as a 4-D boolean mask (sdpa), which transformers uses as given.

What a step reads (`attend`): "live", the default, attends over the first `span(w + 1)` columns
only (w + 1 rounded up to an eighth of the power of two below it: at most 1/8 more than used, 8
shapes an octave), a view of the cache, with a graph per (bucket, span, batch); and when the rows
left all begin late (the long row that set the columns left), they are moved to column 0 first.
"bucket", the first round's, attends over the whole bucket: at batch 32 and a 16 k bucket a step
read up to twice the KV it needs, every step. Why a slice rather than FlexAttention's block mask or
`torch.nn.attention.varlen`: the slice keeps the model's own sdpa call, so the CPU tests check the
GPU's arithmetic (masked columns weigh exactly 0 either way: the same tokens); a view is a fixed
address for a CUDA graph, and a new span is one more capture (a second at 8B) once per 1/8 octave;
FlexAttention's decode kernel needs inductor (a minute a bucket at 8B, docs/gpu.md) and varlen
wants each row's KV contiguous (a paged cache, a gather per step). What the slice does not buy: in
a batch of a long row and short ones each short row still reads the long row's span (its masked
columns). One episode's sub-agents are alike in length and its main agent waits for them; where
episodes run together (a rollout phase), a main row beside sub-agents makes them read its span.

Rows join and leave between steps as in the eager path (hf.py keeps the batch bookkeeping). On CPU
the eager DynamicCache path stays the default (`HFBackend(decode="auto")`): a static cache only adds
work there (masked columns, copies), and there is no launch overhead to save.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch

MIN_LENGTH = 256  # the smallest cache-length bucket; buckets double from here
SPAN_STEPS = 8  # attended spans per octave ("live" attention): at most 1/8 of a span unused
SPAN_MIN = 64  # the finest span step (kernel blocks and sdpa's mask padding stay aligned)
ATTEND = ("live", "bucket")


def bucket(n: int, cap: int) -> int:
    """The cache length for `n` columns: the next power of two from MIN_LENGTH, at most `cap`."""
    length = MIN_LENGTH
    while length < n:
        length *= 2
    return min(length, max(cap, n))


def span(n: int, length: int) -> int:
    """The columns a "live" step attends over when `n` are in use: n rounded up to a multiple of an
    eighth of the power of two below it (SPAN_MIN at least), at most the bucket's `length`."""
    low = 1
    while low * 2 <= n:
        low *= 2
    step = max(low // SPAN_STEPS, SPAN_MIN)
    return min(-(-n // step) * step, length)


@functools.lru_cache(maxsize=None)
def cache_kwarg(cls: type) -> str:
    """The name a model class's forward takes its KV cache by: `cache` in newer transformers (5.24 here), which
    deprecates `past_key_values` and drops it in 5.40; `past_key_values` in older ones (5.17, the GPU image's,
    knows no other name)."""
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


@dataclass
class StaticDecoder:
    """The static cache of one HFBackend and its compiled step per length bucket."""

    model: object
    slots: int
    cap: int  # the model's context: no bucket is longer
    capture: str = "none"  # "none" (eager steps), "graphs" (torch.cuda.CUDAGraph), "compile" (torch.compile)
    attend: str = "live"  # "live": the columns in use (a view per span); "bucket": the whole bucket (round 1)
    cache: object = None  # transformers.StaticCache
    length: int = 0
    mask: torch.Tensor | None = None  # (slots, length) bool: which columns each slot attends to
    w: int = 0  # the column every row writes its next token to
    free: list[int] = field(default_factory=list)
    _steps: dict = field(default_factory=dict)  # (length, batch) -> step function (compiled on CUDA)
    _warm: set = field(default_factory=set)
    _graphs: dict = field(default_factory=dict)  # (length, batch) -> replay function (capture="graphs")
    _pool: object = None  # the graphs' shared memory pool: they never run at the same time
    failed: str | None = None  # why capturing was given up (the steps then run eagerly)
    _weights: tuple = ()  # the parameters' addresses the graphs were captured over
    _views: dict = field(default_factory=dict)  # (batch, span) -> StaticCache over the first slots and columns
    start: dict = field(default_factory=dict)  # slot -> the first column of its row (host side: no sync a step)
    kv_columns: int = 0  # KV columns attended over, summed over the steps and the rows of each (what was read)

    def __post_init__(self) -> None:
        if self.attend not in ATTEND:
            raise ValueError(f"attend must be one of {ATTEND}, got {self.attend!r}")
        self.free = list(range(self.slots))
        text = self.model.model.language_model
        self._cache_kw = cache_kwarg(type(text))

    # ---- the cache

    def _allocate(self, length: int) -> None:
        """A new cache of `length` columns, the current one's contents copied in (left-aligned)."""
        from transformers import StaticCache

        cfg = self.model.config.get_text_config()
        cache = StaticCache(config=cfg, max_cache_len=length)
        dev = self.model.device
        dtype = next(self.model.model.language_model.parameters()).dtype
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cache.early_initialization(self.slots, heads, head_dim, dtype, dev)
        mask = torch.zeros((self.slots, length), dtype=torch.bool, device=dev)
        if self.cache is not None:
            n = min(self.length, length)
            for new, old in zip(cache.layers, self.cache.layers):
                new.keys[:, :, :n].copy_(old.keys[:, :, :n])
                new.values[:, :, :n].copy_(old.values[:, :, :n])
            mask[:, :n] = self.mask[:, :n]
        self.cache, self.length, self.mask = cache, length, mask
        self._views = {}  # views of the old cache: made again on demand
        self._graphs = {}  # captured over the old cache's addresses

    def _shift(self, d: int) -> None:
        """Move every row's columns by `d` (right when > 0, left when < 0); `w` moves with them."""
        if d == 0:
            return
        for layer in self.cache.layers:
            for t in (layer.keys, layer.values):
                if d > 0:
                    t[:, :, d:].copy_(t[:, :, :-d].clone())
                    t[:, :, :d].zero_()
                else:
                    t[:, :, :d].copy_(t[:, :, -d:].clone())
        if d > 0:
            self.mask[:, d:] = self.mask[:, :-d].clone()
            self.mask[:, :d] = False
        else:
            self.mask[:, :d] = self.mask[:, -d:].clone()
            self.mask[:, d:] = False
        self.w += d
        self.start = {slot: col + d for slot, col in self.start.items()}

    def _room(self, need_w: int) -> None:
        """Make `w` at least `need_w` and leave column `w` writable: shift, compact, or grow."""
        if self.cache is None or len(self.free) == self.slots:  # nothing to keep: place `w` where needed
            if self.cache is None or need_w >= self.length:
                self._allocate(bucket(need_w + 1, self.cap))
            self.w = need_w
            return
        if self.w < need_w:
            if need_w >= self.length:
                self._allocate(bucket(need_w + 1, self.cap))
            self._shift(need_w - self.w)
        if self.w >= self.length:
            active = sorted(set(range(self.slots)) - set(self.free))
            used = self.mask[active, : self.w].any(dim=0).nonzero()
            first = int(used[0]) if used.numel() else self.w
            self._shift(-first)
        if self.w >= self.length:
            if self.length >= self.cap:
                raise RuntimeError(f"the static cache is full at the model's context of {self.cap} tokens")
            self._allocate(bucket(self.w + 1, self.cap))

    # ---- rows

    def admit(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]], attention: torch.Tensor) -> list[int]:
        """Copy a prefill's rows into free slots (their K/V per layer, (n, H, Lp, D), left-padded as
        `attention` (n, Lp) says); returns each row's slot."""
        self._check_weights()
        n, width = attention.shape
        if n > len(self.free):
            raise RuntimeError(f"{n} rows joining, {len(self.free)} slots free")
        self._room(width)
        slots = [self.free.pop(0) for _ in range(n)]
        idx = torch.tensor(slots, device=self.mask.device)
        lo = self.w - width
        for layer, (k, v) in zip(self.cache.layers, keys_values):
            layer.keys[idx, :, :lo] = 0
            layer.values[idx, :, :lo] = 0
            layer.keys[idx, :, lo:self.w] = k.to(layer.keys.dtype)
            layer.values[idx, :, lo:self.w] = v.to(layer.values.dtype)
        self.mask[idx] = False
        self.mask[idx, lo:self.w] = attention.to(self.mask.device).bool()
        firsts = attention.bool().int().argmax(dim=1).tolist()  # left padding: each row's first real column
        self.start.update({slot: lo + first for slot, first in zip(slots, firsts)})
        return slots

    def _check_weights(self) -> None:
        """A captured graph reads each weight at the address it had at capture. Weights loaded in
        place (`reload_weights`, an optimizer step) keep their addresses; weights gathered anew
        (FSDP2 unshards into fresh memory before each rollout phase) do not, and a graph over the
        old addresses would read freed memory without an error. So where any weight moved, the
        graphs (and inductor's compiled steps) are dropped and captured again."""
        if self.capture == "none":
            return
        where = tuple(p.data_ptr() for p in self.model.parameters())
        if where != self._weights:
            self._weights = where
            self._graphs, self._steps, self._warm = {}, {}, set()

    def release(self, slots: list[int]) -> None:
        for s in slots:
            self.mask[s] = False
            self.start.pop(s, None)
            self.free.append(s)
        self.free.sort()

    # ---- the step

    def step(self, slots: list[int], tokens: list[int], positions: torch.Tensor) -> torch.Tensor:
        """Feed each slot its token (at its M-RoPE text position) and return the rows' next-token
        logits (len(slots), vocab) float32. The step runs over the first `b` slots only, b the power
        of two up to 8, then the multiple of 8, that holds the highest slot in use (slots are handed
        out lowest first), so a batch of one reads one slot's cache, not max_batch's; the other slots
        among the b compute on a token that only sees itself. It attends over the first `n` columns:
        the bucket's length, or with `attend="live"` the span in use (`span`)."""
        self._room(self.w)
        if self.attend == "live":
            self._compact(slots)
        b = 1
        while b <= max(slots) and b < 8:
            b *= 2
        if b <= max(slots):  # past 8, a multiple of 8: 40 sub-agents step over 40 slots, not 64
            b = -(-(max(slots) + 1) // 8) * 8
        b = min(b, self.slots)
        n = span(self.w + 1, self.length) if self.attend == "live" else self.length
        dev = self.mask.device
        idx = torch.tensor(slots, device=dev)
        ids = torch.zeros((b, 1), dtype=torch.long, device=dev)
        ids[idx, 0] = torch.tensor(tokens, device=dev)
        pos = torch.zeros((b,), dtype=torch.long, device=dev)
        pos[idx] = positions.to(dev)
        self.mask[:, self.w] = True  # each slot sees the token it writes now
        cache = self._view(b, n)
        for layer in cache.layers:
            layer.cumulative_length.fill_(self.w)
        mask = self.mask[:b, :n][:, None, None, :]
        logits = self._run_step((self.length, n, b), ids, pos.view(1, b, 1).expand(3, b, 1), mask, cache)
        self.kv_columns += b * n
        self.w += 1
        return logits.index_select(0, idx).float()

    def _compact(self, slots: list[int]) -> None:
        """Move the rows to column 0 when the earliest of them begins at least as far in as the
        span they use (the long row that set the columns has left): one copy of the cache, then
        every later step reads at most half the columns it would have."""
        first = min((self.start.get(s, self.w) for s in slots), default=self.w)
        if first >= SPAN_MIN and first >= self.w - first:
            self._shift(-first)

    def _view(self, b: int, n: int):
        """A StaticCache over the first `b` slots and `n` columns of the cache (views: its writes are
        the cache's)."""
        if b == self.slots and n == self.length:
            return self.cache
        if (b, n) not in self._views:
            from transformers import StaticCache

            cfg = self.model.config.get_text_config()
            view = StaticCache(config=cfg, max_cache_len=1)
            first = self.cache.layers[0]
            view.early_initialization(1, first.keys.shape[1], first.keys.shape[-1], first.keys.dtype,
                                      first.keys.device)  # tiny tensors, replaced by views below
            for mine, big in zip(view.layers, self.cache.layers):
                mine.keys, mine.values = big.keys[:b, :, :n], big.values[:b, :, :n]
                mine.max_cache_len = n
                if not torch.compiler.is_compiling():
                    torch._dynamo.mark_static_address(mine.keys)
                    torch._dynamo.mark_static_address(mine.values)
            self._views[(b, n)] = view
        return self._views[(b, n)]

    def _run_step(self, key: tuple, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """The step of the current (length, span, batch) bucket: eager the first time (it initialises
        what a graph reads), then captured: one CUDA graph a bucket, recorded from the eager step (`graphs`:
        no compiler, a capture costs one step) or compiled by inductor (`compile`: reduce-overhead,
        fused kernels, minutes of compiling a bucket at 8B). A capture that fails is reported once
        (`failed`) and the steps go on eagerly: slower, the same tokens."""
        if key not in self._warm or self.capture == "none" or self.failed:
            self._warm.add(key)
            return self._forward(ids, pos, mask, cache)
        try:
            if self.capture == "compile":
                if key not in self._steps:
                    # one graph per bucket: more buckets than dynamo's default of 8 recompilations a function
                    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                    self._steps[key] = torch.compile(self._forward, mode="reduce-overhead", dynamic=False)
                return self._steps[key](ids, pos, mask, cache)
            if key in self._graphs:
                return self._graphs[key](ids, pos)
            return self._capture(key, ids, pos, mask, cache)
        except Exception as e:  # noqa: BLE001 - any failure to capture leaves the eager step, which works
            self.failed = f"{type(e).__name__}: {e}"[:500]
            self._graphs, self._steps = {}, {}
            import warnings

            warnings.warn(f"static decode: capturing the step failed, steps run eagerly from now on ({self.failed})",
                          RuntimeWarning, stacklevel=2)
            return self._forward(ids, pos, mask, cache)

    def _capture(self, key: tuple, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Record this bucket's step as a CUDA graph (`torch.cuda.CUDAGraph`), keep its replay, run it.
        The graph reads the token ids and positions from buffers of its own, the mask and the cache
        from their fixed addresses (a new cache length is a new bucket: `_allocate` drops the
        graphs), and writes the logits into its own output, which the caller copies at once."""
        static_ids, static_pos = ids.clone(), pos.contiguous().clone()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):  # capture on a side stream, as torch.cuda.graph does
            # thread_local: CUDA work of other threads (a server's, a trainer's) does not spoil the capture
            with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                out = self._forward(static_ids, static_pos, mask, cache)
        torch.cuda.current_stream().wait_stream(side)

        def replay(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # the mask and cache: at their addresses
            static_ids.copy_(ids)
            static_pos.copy_(pos)
            graph.replay()
            return out

        self._graphs[key] = replay
        return replay(ids, pos)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        text = self.model.model.language_model
        out = text(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{self._cache_kw: cache})
        return self.model.lm_head(out.last_hidden_state[:, -1, :])


def choose_on_device(logits: torch.Tensor, requests: list, generators: list, banned: torch.Tensor
                     ) -> tuple[list[int], list[float], list[bool]]:
    """Every row's next token, its log π_τ, and whether its distribution was finite, with one host
    synchronisation for the whole batch (the eager path's `_choose` syncs per row). The same
    arithmetic as `paravt.policy.policy_log_softmax` and hf's `_choose_row`: greedy rows take the
    argmax and report τ = 1 values; sampled rows draw from softmax(logits / τ) top-p truncated (the
    top token always kept) with their own seeded generator, so a seeded request gives the same tokens
    alone or in any batch. A row with NaN or inf logits draws a placeholder (a GPU's multinomial
    must never see NaN: it would assert and take the process with it) and is reported not finite."""
    from paravt.policy import GREEDY_BELOW

    x = logits.float()
    if banned.numel():
        x = x.index_fill(-1, banned, float("-inf"))
    dev = x.device
    temps = torch.tensor([float(r.temperature) for r in requests], device=dev)
    greedy = temps < GREEDY_BELOW
    scale = torch.where(greedy, torch.ones_like(temps), temps)
    lsm = torch.log_softmax(x / scale[:, None], dim=-1)
    finite = torch.isfinite(lsm.max(dim=-1).values)
    chosen = torch.argmax(x, dim=-1)
    placeholder = torch.zeros(x.shape[-1], device=dev)
    placeholder[0] = 1.0
    for j, r in enumerate(requests):
        if r.temperature < GREEDY_BELOW:
            continue
        probs = torch.where(finite[j], lsm[j].exp(), placeholder)
        if r.top_p < 1.0:
            sp, si = torch.sort(probs, descending=True)
            keep = torch.cumsum(sp, 0) - sp < r.top_p
            keep[0] = True
            probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
        chosen[j] = torch.multinomial(probs, 1, generator=generators[j])[0]
    lp = lsm.gather(1, chosen[:, None])[:, 0]
    ok = finite & torch.isfinite(lp)
    rows = torch.stack([chosen.double(), lp.double(), ok.double()], dim=1).tolist()  # the one sync
    return [int(c) for c, _, _ in rows], [float(v) for _, v, _ in rows], [bool(o) for _, _, o in rows]


@dataclass
class SlotBatch:
    """The rows `hf.HFBackend` decodes on the static path (a `StaticDecoder`): their jobs, the
    cache slot of each, each row's next position and the logits of its next token."""

    jobs: list  # hf._Job
    decoder: StaticDecoder
    slots: list[int]
    positions: torch.Tensor  # (B,) long
    logits: torch.Tensor  # (B, vocab) float32

    @classmethod
    def join(cls, batch: "SlotBatch | None", fresh, decoder: StaticDecoder) -> "SlotBatch":
        """`batch` with the prefilled rows of `fresh` copied into free slots."""
        slots = decoder.admit([(layer.keys, layer.values) for layer in fresh.cache.layers], fresh.attention)
        if batch is None:
            return cls(fresh.jobs, decoder, slots, fresh.positions, fresh.logits)
        return cls(batch.jobs + fresh.jobs, decoder, batch.slots + slots, torch.cat([batch.positions, fresh.positions]),
                   torch.cat([batch.logits, fresh.logits]))

    def release(self) -> None:
        self.decoder.release(self.slots)

    def select(self, keep: list[int]) -> "SlotBatch | None":
        gone = [s for i, s in enumerate(self.slots) if i not in set(keep)]
        self.decoder.release(gone)
        if not keep:
            return None
        idx = torch.tensor(keep, device=self.positions.device)
        return SlotBatch([self.jobs[i] for i in keep], self.decoder, [self.slots[i] for i in keep],
                          self.positions.index_select(0, idx), self.logits.index_select(0, idx))

    def decode(self, model) -> "SlotBatch":
        self.logits = self.decoder.step(self.slots, [job.tokens[-1] for job in self.jobs], self.positions)
        self.positions = self.positions + 1
        return self


# "-bucket": the static path attending over its whole cache bucket (the first GPU round's), kept to
# compare with the default, which attends over the columns in use (static_decode's `attend`)
DECODE_MODES = ("auto", "eager", "static", "static-graphs", "static-compiled", "static-bucket", "static-graphs-bucket",
                "static-compiled-bucket")


def decode_mode(decode: str, model) -> str:
    """The decode path to use (see HFBackend): auto is static-graphs on a GPU with sdpa attention
    (the static path builds sdpa's boolean mask), eager elsewhere."""
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
    attn = getattr(model.config.get_text_config(), "_attn_implementation", None)
    if decode == "auto":
        return "static-graphs" if model.device.type == "cuda" and attn == "sdpa" else "eager"
    if decode != "eager" and attn != "sdpa":
        raise ValueError(f"decode={decode} needs sdpa attention; the model uses {attn}")
    return decode
