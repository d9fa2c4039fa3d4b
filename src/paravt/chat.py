"""The Qwen3-VL chat renderer: messages -> token ids, for the backends and the trainers alike, so
that training inputs equal rollout inputs token for token.

The layout is Qwen's chat format (`<|im_start|>role\\n ... <|im_end|>\\n` per message, each image
as vision placeholders); an assistant message that carries `token_ids` is inserted verbatim.
tests/test_chat_template.py checks the result against the checkpoint's own chat template.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paravt.messages import ImagePart, Message, RequestRejected, TextPart


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
        # Qwen checkpoints end a turn with <|im_end|> and also stop at <|endoftext|> (their
        # generation_config lists both)
        endoftext = t.convert_tokens_to_ids("<|endoftext|>")
        self.stop_ids = {self.im_end} | {i for i in (t.eos_token_id, endoftext) if i is not None and i != t.unk_token_id}
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

    CHUNK_CHARS = 65536

    def encode_within(self, text: str, budget: int, used: int = 0) -> list[int]:
        """`encode(text)`, or RequestRejected once the prompt is known to need more than `budget`
        tokens, `used` of which came before this text (the error speaks of the whole prompt: the
        room left for this one text is no number a client can act on). A long text is first
        counted in chunks (stopping at the budget), so a huge prompt costs one chunk's memory to
        refuse, not a tokenization of the whole."""
        if len(text) > self.CHUNK_CHARS:
            n = 0
            slack = len(text) // self.CHUNK_CHARS + 1  # a chunk boundary shifts counts by ~1
            for i in range(0, len(text), self.CHUNK_CHARS):
                n += len(self.encode(text[i: i + self.CHUNK_CHARS]))
                if used + n - slack > budget:
                    raise _too_long(used + n - slack, budget)
        ids = self.encode(text)
        if used + len(ids) > budget:
            raise _too_long(used + len(ids), budget)
        return ids

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

    def render(self, messages: list[Message], prefix: str = "", add_generation_prompt: bool = True,
               max_tokens: int | None = None) -> Rendered:
        """Token ids of `messages` (+ the generation header and forced `prefix`), images in order.
        With `max_tokens`, RequestRejected as soon as the prompt is known to be longer."""
        budget = max_tokens if max_tokens is not None else 1 << 62
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
                    ids += self.encode_within(part.text, budget, used=len(ids))
                elif isinstance(part, ImagePart):
                    n = self.image_tokens(part.image)
                    ids += [self.vision_start] + [self.image_pad] * n + [self.vision_end]
                    images.append(part.image)
                    visual += n
                else:
                    raise ValueError(f"unknown message part {type(part).__name__}")
                if len(ids) > budget:
                    raise _too_long(len(ids), budget)
            ids += [self.im_end] + self.newline
        prefix_ids: list[int] = []
        if add_generation_prompt:
            ids += self._header("assistant")
            prefix_ids = self.encode(prefix)
            ids += prefix_ids
        if len(ids) > budget:
            raise _too_long(len(ids), budget, exact=True)
        return Rendered(ids=ids, images=images, visual_tokens=visual, prefix_ids=prefix_ids)

    def pixel_inputs(self, images: list[np.ndarray]) -> dict:
        if not images:
            return {}
        # HxWx3 stated, not guessed: the processor takes a 1x1 or 3xN frame for channels-first
        # otherwise, and its patch count then disagrees with `image_tokens`
        out = self.processor.image_processor(images=images, return_tensors="pt", input_data_format="channels_last")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _too_long(count: int, budget: int, exact: bool = False) -> RequestRejected:
    """The error of a prompt over its budget: how long it is (or at least, when counting stopped
    early) against the whole prompt's limit."""
    def tokens(n: int) -> str:
        return f"{n} token" if n == 1 else f"{n} tokens"

    size = tokens(count) if exact else f"at least {tokens(count)}"
    return RequestRejected(f"the prompt is {size}, over the limit of {tokens(max(budget, 0))} for the prompt")


def same_image(a: np.ndarray, b: np.ndarray) -> bool:
    """Two frames are the same picture: by content (the same array, a shared overview, at once).
    Placeholder ids do not tell frames apart; whatever reuses work done for one frame asks this."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b)))


def _check_image(image) -> None:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        desc = f"{type(image).__name__} {getattr(image, 'shape', '')} {getattr(image, 'dtype', '')}".strip()
        raise ValueError(f"an image part must be an HxWx3 uint8 array, got {desc}")
    if min(image.shape[:2]) < 1:
        raise ValueError(f"an image part is empty: shape {image.shape}")
