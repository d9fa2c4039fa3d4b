"""In-process transformers backend for Qwen3-VL checkpoints, with request batching.

Requests that arrive while the model is busy (the sub-agents of one turn, the episodes of an
eval batch, the rollouts of a GRPO group) are collected and run as one left-padded batch.

Decoding is our own loop over `model.forward` with a KV cache rather than `generate()`:
we need raw-model logprobs of every sampled token for PPO, exact prompt ids for token-exact
trajectories, and per-request stopping; and on small models generate()'s per-step overhead
(logits processors, stopping criteria, multimodal position recomputation) dominates. The
3-D (M-RoPE) positions are computed once at prefill with the model's own `get_rope_index`;
decode steps continue each row's text position.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from paravt.backends.base import Completion, GenerateRequest, ImagePart, Message, TextPart

# ----------------------------------------------------------------------------------------------
# prompt rendering (shared with the trainer so training inputs equal rollout inputs)


@dataclass
class Rendered:
    ids: list[int]
    images: list[np.ndarray] = field(default_factory=list)
    visual_tokens: int = 0
    prefix_ids: list[int] = field(default_factory=list)


class Renderer:
    """Turns messages into token ids, segment by segment, so assistant messages that carry
    token_ids are inserted verbatim (no re-tokenization drift between turns)."""

    def __init__(self, processor):
        self.processor = processor
        self.tok = processor.tokenizer
        t = self.tok
        self.im_start = t.convert_tokens_to_ids("<|im_start|>")
        self.im_end = t.convert_tokens_to_ids("<|im_end|>")
        self.vision_start = t.convert_tokens_to_ids("<|vision_start|>")
        self.vision_end = t.convert_tokens_to_ids("<|vision_end|>")
        self.image_pad = t.convert_tokens_to_ids("<|image_pad|>")
        self.newline = self.encode("\n")
        self._cache: dict[str, list[int]] = {}
        # generation ends at these ids (benchmarks may empty it to force fixed-length outputs)
        self.stop_ids = {self.im_end} | ({t.eos_token_id} if t.eos_token_id is not None else set())

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if text else []

    def _header(self, role: str) -> list[int]:
        key = "h:" + role
        if key not in self._cache:
            self._cache[key] = [self.im_start] + self.encode(role + "\n")
        return self._cache[key]

    def image_tokens(self, image: np.ndarray) -> int:
        h, w = image.shape[:2]
        ip = self.processor.image_processor
        patch, merge = getattr(ip, "patch_size", 16), getattr(ip, "merge_size", 2)
        return (h // patch) * (w // patch) // (merge * merge)

    def render(self, messages: list[Message], prefix: str = "", add_generation_prompt: bool = True) -> Rendered:
        ids: list[int] = []
        images: list[np.ndarray] = []
        visual = 0
        for m in messages:
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


def model_inputs(model, renderer: Renderer, rows: list[list[int]], images: list[list[np.ndarray]], device=None) -> dict:
    """Left-padded batch inputs (ids, mask, mm token types, pixels, 3-D positions) for `rows`."""
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
    """log pi(completion token | prefix) under the model's current weights (with grad when enabled).

    The trainer calls this on exactly the ids a rollout fed and produced."""
    inputs = model_inputs(model, renderer, [list(prompt_ids) + list(completion_ids)], [images])
    out = model(**inputs, use_cache=False)
    logits = out.logits[0, len(prompt_ids) - 1 : len(prompt_ids) + len(completion_ids) - 1].float()
    target = torch.tensor(completion_ids, device=logits.device)
    return torch.log_softmax(logits, dim=-1).gather(-1, target[:, None])[:, 0]


# ----------------------------------------------------------------------------------------------
# decoding


@torch.no_grad()
def decode_batch(model, renderer: Renderer, rendered: list[Rendered], reqs: list[GenerateRequest]) -> list[Completion]:
    """Prefill the batch once, then sample token by token with a KV cache."""
    from transformers import DynamicCache

    device = model.device
    inputs = model_inputs(model, renderer, [r.ids for r in rendered], [r.images for r in rendered])
    position_ids = inputs.pop("position_ids")
    attention = inputs["attention_mask"]
    cache = DynamicCache(config=model.config.get_text_config())
    out = model(**inputs, position_ids=position_ids, past_key_values=cache, use_cache=True)
    next_pos = position_ids.max(dim=-1).values.max(dim=0).values + 1  # (B,) next text position per row
    logits = out.logits[:, -1, :].float()
    B = len(reqs)
    max_new = max(r.max_new_tokens for r in reqs)
    eos = renderer.stop_ids
    generators = []
    for r in reqs:
        g = torch.Generator(device="cpu")
        g.manual_seed(r.seed if r.seed is not None else int(time.time_ns() % (2**31)))
        generators.append(g)
    tokens: list[list[int]] = [[] for _ in range(B)]
    logps: list[list[float]] = [[] for _ in range(B)]
    done = [False] * B
    reasons = ["length"] * B
    stop_texts = [r.stop for r in reqs]
    for step in range(max_new):
        logprobs_raw = torch.log_softmax(logits, dim=-1)
        chosen = torch.empty(B, dtype=torch.long)
        for i, r in enumerate(reqs):
            if done[i]:
                chosen[i] = renderer.tok.pad_token_id or 0
                continue
            if r.temperature <= 0:
                chosen[i] = int(torch.argmax(logits[i]))
            else:
                probs = torch.softmax(logits[i] / r.temperature, dim=-1).cpu()
                if r.top_p < 1.0:
                    sp, si = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sp, 0) - sp < r.top_p
                    probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
                    probs /= probs.sum()
                chosen[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
        for i in range(B):
            if done[i]:
                continue
            t = int(chosen[i])
            tokens[i].append(t)
            logps[i].append(float(logprobs_raw[i, t]))
            if t in eos:
                done[i], reasons[i] = True, "stop"
            elif len(tokens[i]) >= reqs[i].max_new_tokens:
                done[i], reasons[i] = True, "length"
            elif stop_texts[i]:
                tail = renderer.tok.decode(tokens[i][-16:], skip_special_tokens=False)
                if any(s in tail for s in stop_texts[i]):
                    done[i], reasons[i] = True, "stop"
        if all(done):
            break
        attention = torch.cat([attention, torch.ones((B, 1), dtype=attention.dtype, device=device)], dim=1)
        pos = (next_pos + step).view(1, B, 1).expand(3, B, 1).to(device)
        out = model(input_ids=chosen.view(B, 1).to(device), attention_mask=attention, position_ids=pos,
                    past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :].float()

    results = []
    for i, (r, rd) in enumerate(zip(reqs, rendered)):
        ids = tokens[i]
        text_ids = ids[:-1] if ids and ids[-1] in eos else ids
        text = renderer.tok.decode(text_ids, skip_special_tokens=False)
        for special in ("<|im_end|>", "<|endoftext|>", "<|im_start|>"):
            text = text.replace(special, "")
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


# ----------------------------------------------------------------------------------------------
# the backend


class HFBackend:
    """Backend over an in-process Qwen3-VL. Concurrent `generate` calls are merged into batches
    of up to `max_batch` requests; the model runs on one worker thread, off the event loop."""

    name = "hf"

    def __init__(self, model, processor, *, max_batch: int = 16, batch_wait_ms: float = 5.0):
        self.model = model
        self.processor = processor
        self.renderer = Renderer(processor)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._lock = threading.Lock()  # one forward at a time on the model
        self.batches_run = 0  # observable: how many model batches served the requests so far
        self.batch_sizes: list[int] = []

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._worker is None or self._worker.done() or self._queue_loop is not loop:
            self._queue = asyncio.Queue()
            self._queue_loop = loop
            self._worker = loop.create_task(self._serve())
        futures = []
        for r in requests:
            fut = loop.create_future()
            await self._queue.put((r, fut))
            futures.append(fut)
        return list(await asyncio.gather(*futures))

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            await asyncio.sleep(self.batch_wait_s)  # let concurrent callers join this batch
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            # greedy and sampled requests decode the same way per row; one batch serves both
            reqs = [r for r, _ in batch]
            try:
                results = await loop.run_in_executor(None, self._run, reqs)
                for (_, fut), res in zip(batch, results):
                    if not fut.done():
                        fut.set_result(res)
            except Exception as e:  # a failed batch fails its requests, not the worker
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)

    def _run(self, reqs: list[GenerateRequest]) -> list[Completion]:
        with self._lock:
            rendered = [self.renderer.render(r.messages, prefix=r.prefix) for r in reqs]
            self.batches_run += 1
            self.batch_sizes.append(len(reqs))
            return decode_batch(self.model, self.renderer, rendered, reqs)

    def generate_sync(self, requests: list[GenerateRequest]) -> list[Completion]:
        """One batch, now, without an event loop (scripts, trainer)."""
        return self._run(requests)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None
