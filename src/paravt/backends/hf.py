"""In-process transformers backend for Qwen3-VL checkpoints, with request batching.

Requests that arrive while the model is busy (the sub-agents of one turn, the episodes of an
eval batch, the rollouts of a GRPO group) are collected and run as one left-padded batch on a
worker thread, so the event loop never blocks.

Decoding is our own loop rather than `generate()`: we need raw-model logprobs of every chosen
token for PPO, exact prompt ids for token-exact trajectories, per-row sampling settings and
seeds, and per-row stopping. The prefill (vision encoder, DeepStack, 3-D M-RoPE positions from
the model's own `get_rope_index`) is one ordinary `model(...)` call. Decode steps then run
`TextDecodeStep`, a lean re-statement of the Qwen3-VL text decoder for one new token per row
over the model's own weights and a preallocated KV cache. Why hand-written: profiling the tiny
model on CPU showed each decode step through `model.forward` costing ~60 small torch ops per
layer plus wrapper work (output capturing, causal-mask construction, rotary recomputation,
DynamicCache concatenation that copies the whole cache every step); with a few hundred
thousand weights per layer that overhead, not arithmetic, was the per-token time. Generated
tokens are text, so a decode step needs no vision, no DeepStack and (all three M-RoPE axes
being equal for text) only 1-D rotary tables. `fast_decode=False` steps through
`model.forward` instead; tests check both give the same logits.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from paravt.backends.base import BackendError, Completion, GenerateRequest, ImagePart, Message, TextPart

# ----------------------------------------------------------------------------------------------
# prompt rendering (shared with the trainer so training inputs equal rollout inputs)


@dataclass
class Rendered:
    ids: list[int]
    images: list[np.ndarray] = field(default_factory=list)
    visual_tokens: int = 0
    prefix_ids: list[int] = field(default_factory=list)


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


class Renderer:
    """Turns messages into token ids, segment by segment, so assistant messages that carry
    token_ids are inserted verbatim (no re-tokenization drift between turns).

    The layout is Qwen's chat format: `<|im_start|>role\\n ... <|im_end|>\\n` per message, each
    image as `<|vision_start|>` + one `<|image_pad|>` per merged patch + `<|vision_end|>`, in the
    order the parts come (the episode puts each frame's timestamp text before it)."""

    def __init__(self, processor):
        self.processor = processor
        self.tok = processor.tokenizer
        t = self.tok
        ids = {name: t.convert_tokens_to_ids(name) for name in
               ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")}
        missing = [name for name, i in ids.items() if i is None or i == t.unk_token_id]
        if missing:
            raise ValueError(f"tokenizer lacks the Qwen chat/vision tokens {missing}: not a Qwen3-VL checkpoint")
        self.im_start = ids["<|im_start|>"]
        self.im_end = ids["<|im_end|>"]
        self.vision_start = ids["<|vision_start|>"]
        self.vision_end = ids["<|vision_end|>"]
        self.image_pad = ids["<|image_pad|>"]
        self.newline = self.encode("\n")
        self._cache: dict[str, list[int]] = {}
        # generation ends at these ids (benchmarks may empty it to force fixed-length outputs)
        self.stop_ids = {self.im_end} | ({t.eos_token_id} if t.eos_token_id is not None else set())
        # never sampled: a generated vision placeholder has no frame behind it, so the completion
        # could not be fed back (next turn, or a training forward pass) without a shape error
        vision = [t.convert_tokens_to_ids(n) for n in
                  ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>")]
        self.banned_ids = sorted({i for i in vision if i is not None and i != t.unk_token_id})
        ip = processor.image_processor
        self.patch = int(getattr(ip, "patch_size", 16))
        self.merge = int(getattr(ip, "merge_size", 2))
        size = getattr(ip, "size", None) or {}
        get = size.get if isinstance(size, dict) else (lambda k, d=None: getattr(size, k, d))
        self.min_pixels = int(get("shortest_edge", None) or getattr(ip, "min_pixels", None) or 56 * 56)
        self.max_pixels = int(get("longest_edge", None) or getattr(ip, "max_pixels", None) or 28 * 28 * 1280)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if text else []

    def _header(self, role: str) -> list[int]:
        key = "h:" + role
        if key not in self._cache:
            self._cache[key] = [self.im_start] + self.encode(role + "\n")
        return self._cache[key]

    def image_size(self, image: np.ndarray) -> tuple[int, int]:
        """The (height, width) the image processor will resize this frame to (Qwen's smart resize:
        multiples of patch*merge within the processor's pixel budget)."""
        _check_image(image)
        h, w = image.shape[:2]
        return _smart_resize(h, w, self.patch * self.merge, self.min_pixels, self.max_pixels)

    def image_tokens(self, image: np.ndarray) -> int:
        """Visual tokens of one frame (merged patches), exactly as the processor will produce them."""
        h, w = self.image_size(image)
        return (h // self.patch) * (w // self.patch) // (self.merge * self.merge)

    def render(self, messages: list[Message], prefix: str = "", add_generation_prompt: bool = True) -> Rendered:
        ids: list[int] = []
        images: list[np.ndarray] = []
        visual = 0
        for m in messages:
            if m.role not in ("system", "user", "assistant"):
                raise ValueError(f"unknown message role {m.role!r}")
            ids += self._header(m.role)
            if m.role == "assistant" and m.token_ids is not None:
                body = list(m.token_ids)
                ids += body
                if not body or body[-1] != self.im_end:
                    ids.append(self.im_end)
                ids += self.newline
                continue
            for part in m.parts():
                if isinstance(part, TextPart):
                    ids += self.encode(part.text)
                elif isinstance(part, ImagePart):
                    n = self.image_tokens(part.image)
                    ids += [self.vision_start] + [self.image_pad] * n + [self.vision_end]
                    images.append(part.image)
                    visual += n
                else:
                    raise ValueError(f"unknown message part {type(part).__name__}")
            ids += [self.im_end] + self.newline
        prefix_ids: list[int] = []
        if add_generation_prompt:
            ids += self._header("assistant")
            prefix_ids = self.encode(prefix)
            ids += prefix_ids
        return Rendered(ids=ids, images=images, visual_tokens=visual, prefix_ids=prefix_ids)

    def pixel_inputs(self, images: list[np.ndarray]) -> dict:
        if not images:
            return {}
        out = self.processor.image_processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _check_image(image) -> None:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        desc = f"{type(image).__name__} {getattr(image, 'shape', '')} {getattr(image, 'dtype', '')}".strip()
        raise ValueError(f"an image part must be an HxWx3 uint8 array, got {desc}")
    if min(image.shape[:2]) < 1:
        raise ValueError(f"an image part is empty: shape {image.shape}")


def model_inputs(model, renderer: Renderer, rows: list[list[int]], images: list[list[np.ndarray]], device=None) -> dict:
    """Left-padded batch inputs (ids, mask, mm token types, pixels, 3-D positions) for `rows`.

    `images[i]` are the frames of row i in the order their placeholders appear."""
    device = device or model.device
    pad = renderer.tok.pad_token_id if renderer.tok.pad_token_id is not None else 0
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        attention[i, width - len(r):] = 1
    mm_types = (input_ids == renderer.image_pad).int() * attention
    flat_images = [im for per in images for im in per]
    pix = renderer.pixel_inputs(flat_images)
    inputs = {"input_ids": input_ids.to(device), "attention_mask": attention.to(device)}
    if pix:
        inputs["pixel_values"] = pix["pixel_values"].to(device=device, dtype=model.dtype)
        inputs["image_grid_thw"] = pix["image_grid_thw"].to(device)
    position_ids, _ = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=mm_types.to(device),
        image_grid_thw=inputs.get("image_grid_thw"),
        attention_mask=inputs["attention_mask"],
    )
    inputs["position_ids"] = position_ids
    inputs["mm_token_type_ids"] = mm_types.to(device)
    return inputs


def sequence_logprobs(model, renderer: Renderer, prompt_ids: list[int], completion_ids: list[int],
                      images: list[np.ndarray]) -> torch.Tensor:
    """log pi(completion token | everything before it) under the model's current weights, from one
    full forward pass (with grad when grad is enabled): the temperature-1 log-softmax of the raw
    logits, the same quantity `Completion.logprobs` reports at rollout time.

    The trainer calls this on exactly the ids a rollout fed and produced
    (`Completion.prompt_ids`, `Completion.token_ids`, and the request's frames in order)."""
    if not completion_ids:
        return torch.zeros(0)
    inputs = model_inputs(model, renderer, [list(prompt_ids) + list(completion_ids)], [images])
    out = model(**inputs, use_cache=False, logits_to_keep=len(completion_ids) + 1)
    logits = out.logits[0, :-1].float()
    target = torch.tensor(completion_ids, device=logits.device)
    return torch.log_softmax(logits, dim=-1).gather(-1, target[:, None])[:, 0]


# ----------------------------------------------------------------------------------------------
# decoding


class _KV:
    """Per-layer K/V buffers (B, kv_heads, capacity, head_dim) filled up to `length`; grows in chunks
    so a step writes one column instead of concatenating the whole cache."""

    CHUNK = 256

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], reserve: int):
        self.length = keys[0].shape[-2]
        cap = self.length + max(1, min(reserve, self.CHUNK))
        self.k = [self._alloc(k, cap) for k in keys]
        self.v = [self._alloc(v, cap) for v in values]

    @staticmethod
    def _alloc(t: torch.Tensor, cap: int) -> torch.Tensor:
        buf = t.new_empty((*t.shape[:-2], cap, t.shape[-1]))
        buf[..., : t.shape[-2], :] = t
        return buf

    def ensure(self, extra: int) -> None:
        cap = self.k[0].shape[-2]
        if self.length + extra <= cap:
            return
        new_cap = cap + max(self.CHUNK, extra)
        self.k = [self._alloc(k[..., : self.length, :], new_cap) for k in self.k]
        self.v = [self._alloc(v[..., : self.length, :], new_cap) for v in self.v]

    def select(self, rows: torch.Tensor) -> None:
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]


def _dynamic_cache_tensors(cache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return list(cache.key_cache), list(cache.value_cache)  # older transformers


def fast_decode_supported(model) -> bool:
    """TextDecodeStep restates the dense Qwen3-VL text decoder (SiLU MLP, full attention, default
    M-RoPE); other variants step through model.forward."""
    try:
        cfg = model.model.language_model.config
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    except AttributeError:
        return False
    layer_types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    return (type(model).__name__ == "Qwen3VLForConditionalGeneration" and cfg.hidden_act == "silu"
            and layer_types == {"full_attention"} and rope.get("rope_type", "default") == "default")


class TextDecodeStep:
    """One decode step of the Qwen3-VL text decoder for one new (text) token per row, over the
    model's own weights and a `_KV` cache.

    Same math as `Qwen3VLTextModel.forward` for a text token: RMSNorm -> q/k/v projections ->
    per-head q/k RMSNorm -> rotary (text tokens have equal T/H/W positions, so M-RoPE reduces to
    1-D rotary with the model's inv_freq) -> attention over the cache -> o_proj, residual, SwiGLU
    MLP, residual; final norm and lm_head. For small models (where per-op overhead is the cost)
    the q/k/v and gate/up weights are concatenated into one matrix each; the copies are rebuilt
    whenever a parameter changed in place (optimizer steps bump `Tensor._version`), so a trainer
    updating the weights between rollouts is always seen."""

    FUSE_MAX_PARAMS = 50_000_000  # above this, copying weights costs memory and buys nothing

    def __init__(self, model):
        lm = model.model.language_model
        cfg = lm.config
        self.model = model
        self.lm = lm
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.gqa = self.n_heads != self.n_kv
        self.fuse = sum(p.numel() for p in lm.parameters()) <= self.FUSE_MAX_PARAMS
        self._fused: list[tuple] | None = None
        self._fused_key: tuple | None = None

    def prepare(self) -> None:
        """Refresh the fused weight copies if any parameter changed; call once per batch (walking
        the parameters every step would cost more than the step)."""
        if not self.fuse:
            return
        key = tuple((id(p), p._version) for p in self.lm.layers.parameters())
        if self._fused is None or key != self._fused_key:
            fused = []
            for layer in self.lm.layers:
                a, m = layer.self_attn, layer.mlp
                bias = None
                if a.q_proj.bias is not None:
                    bias = torch.cat((a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)).detach()
                fused.append((
                    torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)).detach(),
                    bias,
                    torch.cat((a.q_norm.weight.expand(self.n_heads, -1), a.k_norm.weight.expand(self.n_kv, -1))).detach(),
                    torch.cat((m.gate_proj.weight, m.up_proj.weight)).detach(),
                ))
            self._fused, self._fused_key = fused, key

    def rotary(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for positions (B,), shaped (B, 1, head_dim):
        x*cos + roll(x, head_dim/2)*sin equals HF's x*cos + rotate_half(x)*sin."""
        rot = self.lm.rotary_emb
        freqs = positions[:, None].float() * rot.inv_freq.to(positions.device, torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * rot.attention_scaling).to(dtype)
        sin = (emb.sin() * rot.attention_scaling).to(dtype)
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[:, None, :], sin[:, None, :]

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x) in x's dtype, computed in float32 as HF's Qwen3VLTextRMSNorm does."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), None, self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _norm(self, x: torch.Tensor, mod) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), mod.weight, mod.variance_epsilon)
        return mod.weight * self._rms(x)

    def __call__(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: _KV,
                 mask: torch.Tensor | None) -> torch.Tensor:
        """ids (B,) -> logits (B, vocab). cos/sin from `rotary`; mask (B, 1, 1, length+1) bool or None."""
        B = ids.shape[0]
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        half = hd // 2
        t = kv.length
        fused = self._fused if self.fuse else None
        if self.fuse and fused is None:
            raise RuntimeError("TextDecodeStep.prepare() must run before the first step")
        h = F.embedding(ids, self.lm.embed_tokens.weight)[:, None, :]  # (B, 1, H)
        for i, layer in enumerate(self.lm.layers):
            a, m = layer.self_attn, layer.mlp
            x = self._norm(h, layer.input_layernorm)
            if fused is not None:
                w_qkv, b_qkv, w_qkn, w_gu = fused[i]
                qkv = F.linear(x, w_qkv, b_qkv).view(B, nh + 2 * nkv, hd)
            else:
                qkv = torch.cat((F.linear(x, a.q_proj.weight, a.q_proj.bias), F.linear(x, a.k_proj.weight, a.k_proj.bias),
                                 F.linear(x, a.v_proj.weight, a.v_proj.bias)), dim=-1).view(B, nh + 2 * nkv, hd)
                w_qkn = torch.cat((a.q_norm.weight.expand(nh, -1), a.k_norm.weight.expand(nkv, -1)))
            qk = w_qkn * self._rms(qkv[:, : nh + nkv])
            qk = qk * cos + qk.roll(half, dims=-1) * sin
            kv.k[i][:, :, t] = qk[:, nh:]
            kv.v[i][:, :, t] = qkv[:, nh + nkv:]
            o = F.scaled_dot_product_attention(
                qk[:, :nh, None], kv.k[i][:, :, : t + 1], kv.v[i][:, :, : t + 1], attn_mask=mask,
                scale=a.scaling, enable_gqa=self.gqa,
            )
            h = h + F.linear(o.reshape(B, 1, nh * hd), a.o_proj.weight, a.o_proj.bias)
            x = self._norm(h, layer.post_attention_layernorm)
            if fused is not None:
                gate, up = F.linear(x, w_gu).chunk(2, dim=-1)
            else:
                gate, up = F.linear(x, m.gate_proj.weight), F.linear(x, m.up_proj.weight)
            h = h + F.linear(F.silu(gate) * up, m.down_proj.weight)
        kv.length = t + 1
        h = self._norm(h, self.lm.norm)
        return self.model.lm_head(h)[:, 0]


_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _decode_step(model) -> TextDecodeStep:
    """One TextDecodeStep per model, so fused weight copies are reused across batches."""
    step = _STEPS.get(model)
    if step is None:
        step = _STEPS[model] = TextDecodeStep(model)
    return step


@torch.no_grad()
def decode_batch(model, renderer: Renderer, rendered: list[Rendered], reqs: list[GenerateRequest],
                 fast: bool | None = None, decode_threads: int | None = None) -> list[Completion]:
    """Prefill the batch once, then choose token by token with a KV cache.

    Per row: greedy when temperature <= 0, else sampling from softmax(logits / temperature)
    (top-p truncated when top_p < 1) with the row's own seeded generator, so a seeded request
    gives the same tokens alone or in any batch. Reported logprobs are always
    log_softmax(raw logits)[chosen] (temperature 1, no top-p): log pi(token | context) under the
    model, what the policy-gradient ratio needs, independent of the sampling settings.
    Finished rows are dropped from the batch once at most half of the rows are still running.
    `decode_threads`: torch intra-op threads for the token-by-token phase (the prefill keeps the
    caller's setting); see `default_decode_threads`."""
    from transformers import DynamicCache

    if fast is None:
        fast = fast_decode_supported(model)
    inputs = model_inputs(model, renderer, [r.ids for r in rendered], [r.images for r in rendered])
    position_ids = inputs.pop("position_ids")
    attention = inputs["attention_mask"]
    cache = DynamicCache(config=model.config.get_text_config())
    out = model(**inputs, position_ids=position_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1, :].float()
    del out
    next_pos = position_ids.max(dim=-1).values.max(dim=0).values + 1  # (B,) next text position per row
    max_new = max(r.max_new_tokens for r in reqs)

    step_fn, kv = None, None
    if fast:  # hand the prefill's cache to the lean decode step
        step_fn = _decode_step(model)
        step_fn.prepare()
        kv = _KV(*_dynamic_cache_tensors(cache), reserve=max_new)
        cache = None

    prev_threads = torch.get_num_threads()
    if decode_threads:
        torch.set_num_threads(decode_threads)  # per-thread under OpenMP: the caller's other threads keep theirs
    try:
        return _decode_loop(model, renderer, rendered, reqs, logits, next_pos, max_new, step_fn, kv, cache, attention)
    finally:
        if decode_threads:
            torch.set_num_threads(prev_threads)


def default_decode_threads(model) -> int | None:
    """1 for small models on CPU, else None (leave torch's setting). A decode step of a few-million-
    parameter model is hundreds of tiny ops; splitting each over 2+ OpenMP threads only adds
    synchronisation, and on a shared machine spinning threads wait on each other (measured ~5x
    slower with 2 threads than with 1 on the 2-core dev box under load)."""
    if model.device.type != "cpu":
        return None
    return 1 if sum(p.numel() for p in model.parameters()) <= TextDecodeStep.FUSE_MAX_PARAMS else None


def _decode_loop(model, renderer, rendered, reqs, logits, next_pos, max_new, step_fn, kv, cache, attention):
    fast = step_fn is not None
    device = model.device
    B = len(reqs)
    padded = bool((attention == 0).any())
    valid = attention.bool()
    generators = []
    for r in reqs:
        g = torch.Generator(device="cpu")
        g.manual_seed(r.seed if r.seed is not None else int(time.time_ns() % (2**31)))
        generators.append(g)
    tokens: list[list[int]] = [[] for _ in range(B)]
    logps: list[list[float]] = [[] for _ in range(B)]
    reasons = ["length"] * B
    eos = renderer.stop_ids
    rows = list(range(B))  # request index of each live batch row
    finished: set[int] = set()
    pad_id = renderer.tok.pad_token_id or 0
    banned = torch.tensor(renderer.banned_ids, dtype=torch.long, device=logits.device)
    for step in range(max_new):
        # --- choose one token per live row. Logprobs are the raw model's (what training recomputes);
        # sampling excludes the banned vision tokens (their mass is ~0 in any trained model)
        lsm = torch.log_softmax(logits, dim=-1)
        logits = logits.index_fill(-1, banned, float("-inf"))
        chosen = torch.argmax(logits, dim=-1).cpu()
        for j, ri in enumerate(rows):
            r = reqs[ri]
            if ri in finished or r.temperature <= 0:
                continue
            probs = torch.softmax(logits[j] / r.temperature, dim=-1).cpu()
            if r.top_p < 1.0:
                sp, si = torch.sort(probs, descending=True)
                keep = torch.cumsum(sp, 0) - sp < r.top_p
                probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
            chosen[j] = torch.multinomial(probs, 1, generator=generators[ri])[0]
        chosen_dev = chosen.to(logits.device)
        lp = lsm.gather(-1, chosen_dev[:, None])[:, 0].tolist()
        for j, (ri, t) in enumerate(zip(rows, chosen.tolist())):
            if ri in finished:
                chosen[j] = pad_id
                continue
            tokens[ri].append(t)
            logps[ri].append(lp[j])
            if t in eos:
                finished.add(ri)
                reasons[ri] = "stop"
            elif len(tokens[ri]) >= reqs[ri].max_new_tokens:
                finished.add(ri)
            elif reqs[ri].stop:
                tail = renderer.tok.decode(tokens[ri][-16:], skip_special_tokens=False)
                if any(s and s in tail for s in reqs[ri].stop):
                    finished.add(ri)
                    reasons[ri] = "stop"
        if len(finished) == B:
            break
        live = [j for j, ri in enumerate(rows) if ri not in finished]
        if fast and len(live) <= len(rows) // 2:  # compact: stop computing finished rows
            sel = torch.tensor(live, device=device)
            kv.select(sel)
            next_pos = next_pos.index_select(0, sel)
            chosen = chosen[live]
            rows = [rows[j] for j in live]
            if padded:
                valid = valid.index_select(0, sel)
                padded = bool((~valid).any())
        # --- feed the chosen tokens
        n = len(rows)
        ids = chosen.to(device)
        pos = next_pos + step
        if fast:
            kv.ensure(1)
            if padded:
                valid = torch.cat([valid, torch.ones((n, 1), dtype=torch.bool, device=device)], dim=1)
            cos, sin = step_fn.rotary(pos, model.dtype)
            logits = step_fn(ids, cos, sin, kv, valid[:, None, None, :] if padded else None).float()
        else:
            attention = torch.cat([attention, torch.ones((n, 1), dtype=attention.dtype, device=device)], dim=1)
            out = model(input_ids=ids.view(n, 1), attention_mask=attention,
                        position_ids=pos.view(1, n, 1).expand(3, n, 1), past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :].float()

    results = []
    for i, (r, rd) in enumerate(zip(reqs, rendered)):
        ids = tokens[i]
        text_ids = ids[:-1] if ids and ids[-1] in eos else ids
        text = strip_chat_tokens(renderer.tok.decode(text_ids, skip_special_tokens=False))
        cuts = [text.find(s) for s in r.stop if s and s in text]
        if cuts:  # OpenAI semantics: the text ends before the stop string (token_ids keep what was generated)
            text = text[: min(cuts)]
        results.append(Completion(
            text=text,
            finish_reason=reasons[i],
            prompt_tokens=len(rd.ids),
            visual_tokens=rd.visual_tokens,
            completion_tokens=len(ids),
            prompt_ids=list(rd.ids),
            token_ids=list(ids),
            logprobs=logps[i],
            assistant_ids=list(rd.prefix_ids) + list(ids),
        ))
    return results


_CHAT_SPECIALS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>")


def strip_chat_tokens(text: str) -> str:
    """Completion text: chat-format special tokens removed, our tags (<think>, <tool_call>...) kept."""
    for special in _CHAT_SPECIALS:
        text = text.replace(special, "")
    return text


# ----------------------------------------------------------------------------------------------
# the backend


class HFBackend:
    """Backend over an in-process Qwen3-VL. Concurrent `generate` calls are merged into batches
    of up to `max_batch` requests (collected for `batch_wait_ms` after the first arrives); the model
    runs on one worker thread, off the event loop. A request that cannot be rendered (bad image,
    unknown role) fails alone with BackendError; a failing model call fails its batch.

    `fast_decode`: None picks the lean decode step when the model supports it (see module doc).
    `decode_threads`: torch threads for the token-by-token phase; None = `default_decode_threads`
    (1 for small models on CPU). The prefill (vision encoder over all frames) keeps torch's setting."""

    name = "hf"

    def __init__(self, model, processor, *, max_batch: int = 16, batch_wait_ms: float = 5.0,
                 device: str | None = None, fast_decode: bool | None = None, decode_threads: int | None = None):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if device is not None:
            model.to(device)
        self.model = model
        self.processor = processor
        self.renderer = Renderer(processor)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self.fast_decode = fast_decode_supported(model) if fast_decode is None else fast_decode
        self.decode_threads = default_decode_threads(model) if decode_threads is None else decode_threads
        self._queue: asyncio.Queue | None = None
        self._queue_loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # one batch at a time on the model
        self.batches_run = 0  # observable: how many model batches served the requests so far
        self.batch_sizes: list[int] = []

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._queue_loop is not loop:
            self._queue = asyncio.Queue()
            self._queue_loop = loop
            self._worker = loop.create_task(self._serve())
        futures = []
        for r in requests:
            fut = loop.create_future()
            self._queue.put_nowait((r, fut))
            futures.append(fut)
        return list(await asyncio.gather(*futures))

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.batch_wait_s)  # let concurrent callers join this batch
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            batch = [(r, f) for r, f in batch if not f.done()]  # callers that gave up (timeouts)
            if not batch:
                continue
            # greedy and sampled rows decode side by side: each row has its own settings and generator
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paravt-hf")
            try:
                results = await loop.run_in_executor(self._pool, self._run, [r for r, _ in batch])
            except Exception as e:  # a failed batch fails its requests, not the worker
                err = e if isinstance(e, BackendError) else BackendError(f"hf generation failed: {e}")
                results = [err] * len(batch)
            for (_, fut), res in zip(batch, results):
                if fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)

    def _run(self, reqs: list[GenerateRequest]) -> list[Completion | BackendError]:
        """Render each request (a bad one fails alone), then decode the good ones as one batch."""
        rendered: list[Rendered | BackendError] = []
        for r in reqs:
            try:
                if r.max_new_tokens < 1:
                    raise ValueError(f"max_new_tokens must be >= 1, got {r.max_new_tokens}")
                rendered.append(self.renderer.render(r.messages, prefix=r.prefix))
            except Exception as e:
                rendered.append(BackendError(f"bad request: {e}"))
        good = [i for i, rd in enumerate(rendered) if not isinstance(rd, BackendError)]
        out: list[Completion | BackendError] = list(rendered)  # type: ignore[arg-type]
        if good:
            with self._lock:
                self.batches_run += 1
                self.batch_sizes.append(len(good))
                done = decode_batch(self.model, self.renderer, [rendered[i] for i in good], [reqs[i] for i in good],
                                    fast=self.fast_decode, decode_threads=self.decode_threads)
            for i, c in zip(good, done):
                out[i] = c
        return out

    def generate_sync(self, requests: list[GenerateRequest]) -> list[Completion]:
        """One batch, now, without an event loop (scripts, trainer). Raises BackendError for a
        request that cannot be rendered."""
        out = self._run(requests)
        for o in out:
            if isinstance(o, BackendError):
                raise o
        return out  # type: ignore[return-value]

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
