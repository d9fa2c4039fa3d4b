"""`paravt serve`: an OpenAI-compatible chat server over any Backend (the in-process hf one by default).

Each HTTP request awaits `backend.generate([request])` (a streamed one iterates
`backend.generate_stream(request)` where the backend has it); requests that arrive together are
therefore awaited together, and the hf backend merges them into one batched forward pass.

Safety, because a model server is a network service:
- binds 127.0.0.1 unless told otherwise; a bearer key is checked on /v1/* when given;
- never fetches a URL or opens a file: images must be base64 data URLs, decoded in memory;
- bodies over `max_body_bytes` are refused (413) while they stream in, not after;
- decoded pixels are bounded per request, because a small PNG can inflate to gigabytes. The
  limits are checked from the image headers before any pixel data is decoded:
    `max_images` (--max-images, default 256): images in one request, else 400;
    `max_total_pixels` (--max-total-pixels, default 256 x 1024^2 = 268 M pixels, ~800 MB as
    RGB): their decoded pixels together, else 413;
    `max_image_pixels` (default 4096^2): one image, else 400.
  An episode needs far less: 64 overview frames of up to 448x448 (13 M pixels) plus a turn of
  crops (5 calls x 16 frames x 448x448 = 16 M);
- images are decoded straight to the size the model will see: the model's processor resizes every
  image to its pixel budget (224x224 at most for the tiny model), so an image at least twice that
  size per side is shrunk while it is decoded (JPEG: the decoder's DCT scaling, `Image.draft`;
  then PIL's `reduce` and a resize to exactly the processor's size) instead of being held at full
  size until the model's prefill. Smaller images are passed as sent. A 4096x4096 JPEG then never
  exists at full size; a PNG does, one image at a time, only while it is decoded;
- decoded pixels are bounded server-wide too (`max_inflight_pixels`, --max-inflight-pixels, default
  512 M): a request reserves what its images will hold (plus the largest one's full decode) before
  decoding and keeps it until its answer is sent; a request that does not fit waits for others to
  finish (up to `pixel_wait_s`, 30 s) and is then answered 503 with Retry-After. A request larger
  than the whole budget runs alone. Once no request holds pixels the freed heap is handed back to
  the system (glibc's malloc_trim), so the server's memory returns to its idle size;
- a request the model can never serve (the backend's RequestRejected, e.g. a prompt longer than
  --max-model-len) is 400 with the backend's message; any other backend failure is 500;
- malformed JSON (including nesting too deep for the parser) and lone UTF-16 surrogates
  (`"\\ud800"`, valid JSON but not text) are 400, and the connection stays usable;
- a client that disconnects cancels its generation (the backend sees asyncio cancellation);
- every error is OpenAI-shaped JSON `{"error": {"message", "type", "code"}}`.

Weight sync for RL (`--rl-api`, off by default; behind --api-key when one is set): the endpoints
and semantics of vLLM's dev-mode RL API, so a trainer drives `paravt serve` and vLLM alike:
`POST /pause?mode=wait|abort|keep` (new requests wait; "wait" and "keep" let the requests in flight
finish first, "abort" cancels them), `POST /resume`, `GET /is_paused`, `POST /collective_rpc` with
`{"method": "reload_weights", "kwargs": {"weights_path": DIR}}` (safetensors written by the
trainer; only while paused), `POST /update_weight_version {"new_version": V}`, `GET /weight_info`.
With `return_token_ids: true` a response carries the generated ids (`choices[0].token_ids`) and the
prompt's (`prompt_token_ids`), as vLLM's does.

Streaming (`stream: true`) follows the OpenAI API: `text/event-stream` of `chat.completion.chunk`
objects (a first chunk with the role, one per decode step with the new text in `delta.content`,
a last one with `finish_reason`; with `stream_options.include_usage` a final chunk of usage with
no choices), then `data: [DONE]`. A backend that decodes step by step (hf: `generate_stream`)
streams as it decodes; any other sends its whole text in one chunk at the end. Text that might be
the start of a stop string is held back until it is known not to be, so the chunks join to exactly
the non-streamed message. An error before the first token is a plain JSON error (400/500/503);
one after it is an SSE `data: {"error": ...}` event. `logprobs` and `return_token_ids` are not
streamed (400: ask without stream for them).

Supported: string or list content with text and image_url parts; temperature, top_p,
max_tokens / max_completion_tokens, seed, stop, n=1, stream, logprobs (tokens are
reported as "token_id:N", as vLLM's --return-tokens-as-token-ids does, because the server
is tokenizer-agnostic and exact ids are what a trainer needs), and vLLM's
`continue_final_message` / `add_generation_prompt` for a forced assistant prefix.
`usage.prompt_tokens_details.image_tokens` carries the visual share of the prompt.
"""

# no `from __future__ import annotations`: FastAPI resolves the handlers' annotations (Request) at runtime
import asyncio
import base64
import binascii
import hmac
import io
import json
import logging
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import numpy as np

from paravt.backends.base import (Backend, BackendError, Completion, GenerateRequest, ImagePart, Message,
                                  RequestRejected, TextPart)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGES = 256
MAX_TOTAL_PIXELS = 256 * 1024 * 1024
MAX_NEW_TOKENS = 32768
MAX_INFLIGHT_PIXELS = 2 * MAX_TOTAL_PIXELS  # decoded pixels all requests together may hold (~1.5 GB as RGB)
PIXEL_WAIT_S = 30.0  # how long a request waits for others to free pixels before it is answered 503
RETRY_AFTER_S = 5
# (width, height) of an image -> the (width, height) the model's processor resizes it to
ImageFit = Callable[[int, int], tuple[int, int]]
log = logging.getLogger("paravt.serve")
_SURROGATE = re.compile("[\ud800-\udfff]")


class PayloadError(ValueError):
    """A request the server understands to be wrong; its message goes back to the client (400)."""

    status = 400


class PayloadTooLarge(PayloadError):
    """A request whose images would decode to more pixels than the server accepts (413)."""

    status = 413


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may decode to (see the module docstring)."""

    max_pixels: int = MAX_IMAGE_PIXELS  # one image
    max_images: int = MAX_IMAGES
    max_total_pixels: int = MAX_TOTAL_PIXELS  # all images of the request together

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_images", "max_total_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PendingImage:
    """An image whose header is read and whose pixels are not decoded yet: what it will cost is known
    before it is decoded, so the server can reserve that much of its pixel budget first."""

    image: Any  # a lazily opened PIL image (a JPEG's draft scale already set)
    where: str  # messages[i].content[j], for errors
    parts: list  # the message's parts; the decoded ImagePart goes to parts[index]
    index: int
    target: tuple[int, int] | None = None  # (width, height) to shrink to while decoding; None: as sent

    @property
    def decode_pixels(self) -> int:
        """Pixels the decoder materialises (a JPEG's draft scale included)."""
        w, h = self.image.size
        return w * h

    @property
    def held_pixels(self) -> int:
        """Pixels the request holds once this image is decoded."""
        return self.target[0] * self.target[1] if self.target else self.decode_pixels


@dataclass
class ChatRequest:
    """A parsed /v1/chat/completions body. `pending` lists images not decoded yet
    (`parse_chat_request(..., decode=False)`; `decode_pending` fills them in)."""

    request: GenerateRequest
    model: str | None
    logprobs: bool
    return_token_ids: bool = False
    stream: bool = False
    include_usage: bool = False
    pending: list[PendingImage] = field(default_factory=list)

    def pixels_needed(self) -> int:
        """What decoding the pending images needs at its peak: every image's decoded size, plus the
        largest full decode (images are decoded one at a time, each shrunk before the next)."""
        held = sum(p.held_pixels for p in self.pending)
        return held + max((p.decode_pixels - p.held_pixels for p in self.pending), default=0)

    def pixels_held(self) -> int:
        return sum(p.held_pixels for p in self.pending)


def open_image(url: str, max_pixels: int = MAX_IMAGE_PIXELS):
    """A base64 image data URL -> a lazily opened PIL image: only its header is read, so its size can
    be checked before any pixel is decoded. Anything but a data URL is refused: the server fetches nothing."""
    from PIL import Image

    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:60] if isinstance(url, str) else type(url).__name__
        raise PayloadError(f"image_url must be a base64 data URL (data:image/...;base64,...), got {shown!r}; "
                           "this server never fetches URLs or opens files")
    header, sep, b64 = url.partition(",")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise PayloadError("image_url must be a base64 data URL of an image (data:image/png;base64,...)")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PayloadError(f"image data URL is not valid base64: {e}") from None
    try:
        img = Image.open(io.BytesIO(raw))  # lazy: reads the header only
        w, h = img.size
    except Exception as e:  # PIL raises many kinds (UnidentifiedImageError, OSError, DecompressionBombError, ...)
        raise PayloadError(f"image could not be decoded: {type(e).__name__}: {e}") from None
    if w * h > max_pixels:
        raise PayloadError(f"image of {w}x{h} pixels is over the limit of {max_pixels} pixels")
    return img


def to_rgb(img, target: tuple[int, int] | None = None) -> np.ndarray:
    """Decode a lazily opened PIL image's pixels -> HxWx3 uint8 RGB; with `target` (width, height),
    shrunk to exactly that size while decoding (`plan_image` chose it and set a JPEG's draft)."""
    try:
        if target is not None:
            return np.asarray(_shrink(img, target))
        return np.asarray(img.convert("RGB"))
    except Exception as e:
        raise PayloadError(f"image could not be decoded: {type(e).__name__}: {e}") from None


def _shrink(img, target: tuple[int, int]):
    """Reduce by the largest integer factor that stays at or above `target` (a box filter: cheap, and it
    averages every source pixel), then resize to exactly `target` with the processors' bicubic."""
    from PIL import Image

    factor = min(img.width // target[0], img.height // target[1])
    if factor >= 2:
        if img.mode not in ("RGB", "RGBA", "L", "LA"):  # what `reduce` takes; palette and CMYK convert first
            img = img.convert("RGB")
        img = img.reduce(factor)
    img = img.convert("RGB")
    return img if img.size == target else img.resize(target, Image.Resampling.BICUBIC)


def model_image_fit(backend: Backend) -> ImageFit | None:
    """The size the backend's model will resize an image to, for backends that can say (hf: its
    renderer's smart resize, exactly what its processor does), else None (a proxy, a test fake):
    their images are decoded as sent."""
    size = getattr(getattr(backend, "renderer", None), "image_size", None)
    if size is None:
        return None

    def fit(width: int, height: int) -> tuple[int, int]:
        try:  # a broadcast view stands in for the image: its shape is all image_size reads, no pixel is allocated
            h, w = size(np.broadcast_to(np.zeros(3, np.uint8), (height, width, 3)))
        except Exception:  # noqa: BLE001 - e.g. an extreme aspect ratio: decoded as sent, the model refuses it
            return width, height
        return w, h

    return fit


def plan_image(img, fit: ImageFit | None) -> tuple[int, int] | None:
    """The (width, height) to decode a lazily opened image to, or None to decode it as sent. Only an
    image at least twice the model's size per side is shrunk here (the processor would resize it anyway;
    smaller ones keep the processor's own resize, so ordinary frames are fed exactly as before). A JPEG's
    decoder is told to scale by 1/2..1/8 in the DCT (`draft`), so it never decodes the full size."""
    if fit is None:
        return None
    w, h = img.size
    tw, th = fit(w, h)
    if tw < 1 or th < 1 or w < 2 * tw or h < 2 * th:
        return None
    if img.format == "JPEG":
        img.draft("RGB", (tw, th))  # picks the smallest scale that is still >= (tw, th)
    return tw, th


def decode_pending(pending: list[PendingImage]) -> None:
    """Decode the images in place, one at a time (each is shrunk before the next is decoded), and
    drop each compressed image once decoded."""
    for p in pending:
        try:
            p.parts[p.index] = ImagePart(to_rgb(p.image, p.target))
        except PayloadError as e:
            raise PayloadError(f"{p.where}: {e}") from None
        finally:
            p.image.close()


def decode_image(url: str, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """A base64 image data URL -> HxWx3 uint8 RGB (size checked from the header first)."""
    return to_rgb(open_image(url, max_pixels))


def _is_image_part(p: Any) -> bool:
    return isinstance(p, dict) and p.get("type") == "image_url"


def count_images(raw: Any) -> int:
    """Image parts in a messages list, counted before any of them is decoded."""
    if not isinstance(raw, list):
        return 0
    return sum(_is_image_part(p) for m in raw if isinstance(m, dict) and isinstance(m.get("content"), list)
               for p in m["content"])


def check_text(body: Any) -> None:
    """Refuse lone UTF-16 surrogates anywhere in the body. JSON's "\\ud800" escape parses into a str
    that cannot be encoded as UTF-8, so it would fail later, in the tokenizer, as a 500."""
    stack: list[tuple[str, Any]] = [("body", body)]
    while stack:  # iterative: the parsed body may be nested as deep as the JSON parser allowed
        where, v = stack.pop()
        if isinstance(v, str):
            m = None if v.isascii() else _SURROGATE.search(v)  # isascii is O(1): base64 images cost nothing
            if m:
                raise PayloadError(f"{where} holds a lone surrogate (\\u{ord(m.group()):04x} at character "
                                   f"{m.start()}), which is not text; send valid UTF-8 / paired \\u escapes")
        elif isinstance(v, dict):
            for k, x in v.items():
                if not k.isascii() and _SURROGATE.search(k):
                    raise PayloadError(f"a key of {where} holds a lone surrogate, which is not text")
                stack.append((k if where == "body" else f"{where}.{k}", x))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))


def parse_messages(raw: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None,
                   fit: ImageFit | None = None) -> list[Message]:
    """OpenAI chat messages -> our Messages (images decoded to arrays; with `fit`, shrunk to the model's
    size while decoding). The request's image count and total pixels are checked against `limits` from
    the headers before any image is decoded."""
    msgs, pending = read_messages(raw, limits or ImageLimits(max_pixels=max_pixels), fit)
    decode_pending(pending)
    return msgs


def read_messages(raw: Any, limits: ImageLimits, fit: ImageFit | None = None
                  ) -> tuple[list[Message], list[PendingImage]]:
    """OpenAI chat messages -> our Messages, with every image's header read and checked against
    `limits` but its pixels not decoded: each is a PendingImage (its ImagePart slot is None until
    `decode_pending`)."""
    if not isinstance(raw, list) or not raw:
        raise PayloadError("messages must be a non-empty list")
    n_images = count_images(raw)
    if n_images > limits.max_images:
        raise PayloadError(f"the request holds {n_images} images, over the limit of {limits.max_images} images "
                           "per request")
    msgs: list[Message] = []
    pending: list[PendingImage] = []
    total = 0
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "developer":  # the newer OpenAI name of the system role
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise PayloadError(f"messages[{i}].role must be system, user or assistant, got {role!r} "
                               "(tools are called through text tags, not the tool role)")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, str):
            msgs.append(Message(role, content))
            continue
        if not isinstance(content, list):
            raise PayloadError(f"messages[{i}].content must be a string or a list of parts")
        parts: list = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text" and isinstance(p.get("text"), str):
                parts.append(TextPart(p["text"]))
            elif kind == "image_url" and isinstance(p.get("image_url"), (dict, str)):
                url = p["image_url"].get("url") if isinstance(p["image_url"], dict) else p["image_url"]
                where = f"messages[{i}].content[{j}]"
                if role != "user":
                    raise PayloadError(f"messages[{i}]: images are accepted in user messages only")
                try:
                    img = open_image(url, limits.max_pixels)
                except PayloadError as e:
                    raise PayloadError(f"{where}: {e}") from None
                total += img.size[0] * img.size[1]
                pending.append(PendingImage(img, where, parts, len(parts), plan_image(img, fit)))
                parts.append(None)  # decoded later, once every image's size is known to fit
            else:
                raise PayloadError(f"messages[{i}].content[{j}] must be a text part or an image_url part "
                                   f"(got type {kind!r})")
        msgs.append(Message(role, parts))
    if total > limits.max_total_pixels:
        raise PayloadTooLarge(f"the request's {n_images} images decode to {total} pixels, over the limit of "
                              f"{limits.max_total_pixels} pixels per request")
    return msgs, pending


def _number(body: dict, key: str, default: float, lo: float, hi: float, kind: type = float) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise PayloadError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise PayloadError(f"{key} must be between {lo:g} and {hi:g}, got {v!r}")
    return kind(v)


def _stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage), checked."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise PayloadError(f"stream must be true or false, got {stream!r}")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise PayloadError("stream_options is only allowed with stream=true")
    if not isinstance(opts, dict):
        raise PayloadError('stream_options must be an object like {"include_usage": true}')
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise PayloadError(f"stream_options.include_usage must be true or false, got {usage!r}")
    return True, usage


def parse_chat_request(body: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None,
                       fit: ImageFit | None = None, decode: bool = True) -> ChatRequest:
    """Validate a /v1/chat/completions body and turn it into a GenerateRequest; PayloadError says what is
    wrong (its `status` is 400, or 413 for images over the pixel budget). With decode=False the images
    are left in `pending` (headers read and checked, pixels not decoded) for `decode_pending`."""
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    check_text(body)
    stream, include_usage = _stream_flags(body)
    if stream and body.get("logprobs"):
        raise PayloadError("logprobs are not streamed; send stream=false to get them")
    if stream and body.get("return_token_ids"):
        raise PayloadError("return_token_ids is not streamed; send stream=false to get them")
    if _number(body, "n", 1, 1, 128, int) != 1:
        raise PayloadError("only n=1 is supported")
    if body.get("tools") or body.get("functions"):
        raise PayloadError("native tool calling is not supported; crop_video calls are written as text tags")
    if _number(body, "top_logprobs", 0, 0, 20, int):
        raise PayloadError("top_logprobs is not supported (logprobs=true gives the sampled tokens' logprobs)")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise PayloadError("model must be a string")
    messages, pending = read_messages(body.get("messages"), limits or ImageLimits(max_pixels=max_pixels), fit)
    cont = bool(body.get("continue_final_message", False))
    add_gen = body.get("add_generation_prompt")
    prefix = ""
    if cont:
        if add_gen:
            raise PayloadError("continue_final_message and add_generation_prompt cannot both be true")
        if messages[-1].role != "assistant":
            raise PayloadError("continue_final_message needs the last message to be the assistant's")
        prefix = messages.pop().text()
        if not messages:
            raise PayloadError("continue_final_message needs a message before the assistant's")
    elif add_gen is False:
        raise PayloadError("add_generation_prompt=false is only supported with continue_final_message=true")
    max_tokens = body.get("max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
        key = "max_tokens"
    max_new = _number(body, key, 1024, 1, MAX_NEW_TOKENS, int)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise PayloadError("top_p must be greater than 0")
    seed = _number(body, "seed", None, -(2**63), 2**63 - 1, int)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 16 or not all(isinstance(s, str) and s for s in stop):
        raise PayloadError("stop must be a non-empty string or a list of at most 16 non-empty strings")
    req = GenerateRequest(messages=messages, max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                          prefix=prefix, stop=list(stop), seed=None if seed is None else seed % (2**63))
    parsed = ChatRequest(request=req, model=model, logprobs=bool(body.get("logprobs", False)),
                         return_token_ids=bool(body.get("return_token_ids", False)), stream=stream,
                         include_usage=include_usage, pending=pending)
    if decode:
        decode_pending(pending)
        parsed.pending = []
    return parsed


async def _until_disconnect(receive) -> None:
    """Return once the ASGI server reports that the client went away (the body is already read,
    so the only message left to receive is http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _retrieve(task: asyncio.Task) -> None:
    """Done-callback of a task whose outcome nobody awaits: fetch it so asyncio does not warn."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned task ended with %r", task.exception())


async def generate_while_connected(backend: Backend, req: GenerateRequest, receive) -> Completion | None:
    """The completion, or None if the client disconnected first, in which case the generation is
    cancelled: a gone client must not keep the model busy (the hf backend drops the cancelled row)."""
    gen = asyncio.ensure_future(backend.generate([req]))
    gone = asyncio.ensure_future(_until_disconnect(receive))
    gone.add_done_callback(_retrieve)
    try:
        await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (server shutdown)
        gone.cancel()
        if not gen.done():
            gen.add_done_callback(_retrieve)
            gen.cancel()
    if not gen.done() or gen.cancelled():  # a cancel() above is only a request: gen may still be running
        return None
    return gen.result()[0]


class StreamText:
    """What of a streamed completion may be sent yet. The final text ends before the first stop
    string (OpenAI semantics), and a sent chunk cannot be taken back, so the last (longest stop - 1)
    characters, which could be the beginning of a stop string, wait for the next piece (as vLLM's
    detokenizer does: constant work per piece, whatever the stop strings); with no stop strings
    every piece goes out at once."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.sent = ""
        self.held = ""

    def push(self, piece: str) -> str:
        """Take the next piece of the text; return what can be sent now."""
        self.held += piece
        if not self.stops:
            out, self.held = self.held, ""
            self.sent += out
            return out
        # a stop string may begin in the last (longest - 1) characters already sent
        window = self.sent[-(self.longest - 1):] if self.longest > 1 else ""
        text = window + self.held
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            end = max(cut - len(window), 0)  # the completion ends there: never send past it
        else:
            end = max(len(self.held) - (self.longest - 1), 0)
        out, self.held = self.held[:end], self.held[end:]
        self.sent += out
        return out

    def finish(self, final: str) -> str:
        """The rest of the final text (the backend's, which is the authority) not sent yet."""
        if final.startswith(self.sent):
            return final[len(self.sent):]
        log.warning("the streamed text (%d chars) is not a prefix of the final text (%d chars); the stream "
                    "differs from the non-streamed answer", len(self.sent), len(final))
        return ""


async def pump_generation(backend: Backend, req: GenerateRequest, out: asyncio.Queue) -> None:
    """The generation of a streamed request, as a task of its own (the HTTP response reads `out`):
    ("piece", str) as the backend decodes (hf's `generate_stream`; other backends produce no pieces),
    then ("done", Completion), or ("error", exception), or ("aborted", None) if the task was cancelled
    (a weight-update pause with mode=abort, or the client gone)."""
    try:
        stream = getattr(backend, "generate_stream", None)
        if stream is None:
            out.put_nowait(("done", (await backend.generate([req]))[0]))
            return
        async for item in stream(req):
            out.put_nowait(("done", item) if isinstance(item, Completion) else ("piece", item))
    except asyncio.CancelledError:
        out.put_nowait(("aborted", None))
        raise
    except Exception as e:  # noqa: BLE001 - the response reports it
        out.put_nowait(("error", e))


async def first_while_connected(out: asyncio.Queue, receive) -> tuple[str, Any] | None:
    """The first item a pump puts in `out`, or None if the client disconnected first."""
    get = asyncio.ensure_future(out.get())
    gone = asyncio.ensure_future(_until_disconnect(receive))
    gone.add_done_callback(_retrieve)
    try:
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not get.done():
            get.cancel()
    return get.result() if get.done() and not get.cancelled() else None


def sse(obj: Any) -> str:
    """One server-sent event carrying JSON, as the OpenAI API streams."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage_of(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"image_tokens": c.visual_tokens}}


async def stream_events(first: tuple[str, Any], out: asyncio.Queue, pump: asyncio.Task, parsed: ChatRequest,
                        model_name: str, error: Callable[[int, str, str], dict]) -> AsyncIterator[str]:
    """The SSE body of a streamed chat completion (module docstring), from the pump's items. Closing
    it (the client went away) cancels the pump, which drops the generation."""
    head = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model_name, "system_fingerprint": None}
    usage = {"usage": None} if parsed.include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> str:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    **usage})

    text = StreamText(parsed.request.stop)
    try:
        yield chunk({"role": "assistant", "content": ""})
        kind, value = first
        while kind == "piece":
            piece = text.push(value)
            if piece:
                yield chunk({"content": piece})
            kind, value = await out.get()
        if kind == "done" and not (value.finish_reason == "error" or value.error):
            rest = text.finish(value.text)
            if rest:
                yield chunk({"content": rest})
            yield chunk({}, value.finish_reason)
            if parsed.include_usage:
                yield sse({**head, "choices": [], "usage": usage_of(value)})
        elif kind == "done":
            yield sse(error(500, f"the model failed: {value.error or 'unknown error'}", "server_error"))
        elif kind == "aborted":
            yield sse(error(503, "aborted for a weight update (POST /pause?mode=abort); send it again",
                            "service_unavailable"))
        else:
            yield sse(error(*failure_of(value)))
        yield "data: [DONE]\n\n"
    finally:
        pump.cancel()


def failure_of(exc: BaseException) -> tuple[int, str, str]:
    """(status, message, type) of a failed generation: the client's fault (400) or the model's (500)."""
    if isinstance(exc, RequestRejected):
        return 400, str(exc), "invalid_request_error"
    if isinstance(exc, BackendError):
        return 500, f"the model failed: {exc}", "server_error"
    return 500, f"internal error: {type(exc).__name__}: {exc}", "server_error"


class PixelBudget:
    """The decoded image pixels all requests together may hold (server-wide), so that concurrent
    requests with large images queue instead of exhausting memory. Requests are served in arrival
    order (a large one is not starved by a stream of small ones); one that waits longer than
    `wait_s` is turned away (the caller answers 503 with Retry-After)."""

    def __init__(self, capacity: int, wait_s: float = PIXEL_WAIT_S):
        if capacity < 1:
            raise ValueError(f"max_inflight_pixels must be >= 1, got {capacity}")
        if wait_s < 0:
            raise ValueError(f"pixel_wait_s must be >= 0, got {wait_s}")
        self.capacity = capacity
        self.wait_s = wait_s
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    async def acquire(self, n: int) -> int | None:
        """Take `n` pixels (at most the whole budget: a request larger than it runs alone) once the
        requests before it leave room; the amount taken, or None after `wait_s` without room."""
        n = min(n, self.capacity)
        if not self._waiters and self.used + n <= self.capacity:
            self.used += n
            return n
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_s):
                await entry[1]
            return n
        except BaseException as e:  # a timeout, or the handler cancelled (shutdown, abort)
            if entry[1].done() and not entry[1].cancelled():  # granted just as it gave up: give it back
                self.release(n)
            else:
                self._waiters.remove(entry)
                self._grant()  # a large request at the head that gives up may unblock smaller ones
            if isinstance(e, TimeoutError):
                return None
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            n, fut = self._waiters.popleft()
            self.used += n
            fut.set_result(None)


class Reservation:
    """Pixels a request holds in a PixelBudget: shrunk once its images are decoded, given back once
    (`release` is idempotent, so every path out of a request may call it). The last request out
    hands the freed memory back to the system (`trim_memory`)."""

    def __init__(self, budget: PixelBudget | None = None, n: int = 0):
        self.budget, self.n = budget, n

    def shrink(self, n: int) -> None:
        if self.budget is not None and n < self.n:
            self.budget.release(self.n - n)
            self.n = n

    def release(self) -> None:
        had = self.n
        self.shrink(0)
        if had and self.budget is not None and self.budget.used == 0:
            trim_memory_soon()


def trim_memory() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).
    Decoding images frees hundreds of MB in pieces glibc keeps in its arenas (one per decoding
    thread); without this the server's RSS stays near its peak long after the requests left
    (measured: 808 MB after 16 requests of 16 4096x4096 images, 450-500 MB with it; 400 MB idle)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


def trim_memory_soon() -> None:
    """`trim_memory` on a thread of its own (it can take ~0.1 s, which the event loop must not wait
    for), at most one at a time."""
    if not _trimming.acquire(blocking=False):
        return

    def run() -> None:
        try:
            trim_memory()
        finally:
            _trimming.release()

    threading.Thread(target=run, name="paravt-trim", daemon=True).start()


_malloc_trim: Any = None
_trimming = threading.Lock()


class WeightGate:
    """Pause/resume around weight updates (the RL API): requests pass while it is open, wait while
    it is paused, and a pause can wait for, or cancel, the requests in flight."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.inflight: set[asyncio.Task] = set()
        self.version: str | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    async def enter(self) -> None:
        await self.open.wait()
        self.track(asyncio.current_task())

    def track(self, task: asyncio.Task) -> None:
        """Count `task` as a request in flight (a pause with mode=abort cancels it)."""
        self.inflight.add(task)
        self.idle.clear()

    def leave(self, task: asyncio.Task | None = None) -> None:
        self.inflight.discard(task or asyncio.current_task())
        if not self.inflight:
            self.idle.set()

    async def pause(self, mode: str) -> None:
        self.open.clear()
        if mode == "abort":
            for t in list(self.inflight):
                t.cancel()
        await self.idle.wait()

    def resume(self) -> None:
        self.open.set()

    @property
    def paused(self) -> bool:
        return not self.open.is_set()


def create_app(backend: Backend, model_name: str, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_image_pixels: int = MAX_IMAGE_PIXELS, max_images: int = MAX_IMAGES,
               max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False,
               max_inflight_pixels: int = MAX_INFLIGHT_PIXELS, pixel_wait_s: float = PIXEL_WAIT_S,
               image_fit: ImageFit | None = None):
    """The FastAPI app. Any Backend works (tests use fakes); `model_name` is the id /v1/models lists
    and the only one /v1/chat/completions accepts (as vLLM does, so a wrong model is a clear 404).
    The limits, the pixel budget and the RL weight-sync API (`rl_api`) are described in the module
    docstring. `image_fit` is the size the model resizes an image to (default: what the backend
    says, `model_image_fit`; None there: images are decoded as sent)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    limits = ImageLimits(max_image_pixels, max_images, max_total_pixels)
    budget = PixelBudget(max_inflight_pixels, pixel_wait_s)
    fit = image_fit or model_image_fit(backend)
    app = FastAPI(title="paravt serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
             503: "service_unavailable"}

    def error_body(status: int, message: str, kind: str | None = None) -> dict:
        return {"error": {"message": message, "type": kind or kinds.get(status, "server_error"), "code": status}}

    def error(status: int, message: str, kind: str | None = None, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content=error_body(status, message, kind), headers=headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error(422, str(exc.errors())[:1000])

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.exception("request failed")
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    gate = WeightGate()
    rl_paths = ("/pause", "/resume", "/is_paused", "/collective_rpc", "/update_weight_version", "/weight_info")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key and (request.url.path.startswith("/v1") or request.url.path in rl_paths):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong API key (send Authorization: Bearer KEY)")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_body_bytes:
            return error(413, f"request body of {length} bytes is over the limit of {max_body_bytes} bytes")
        try:
            return await call_next(request)
        except Exception as exc:  # noqa: BLE001 - answered here, the connection stays usable
            # (an exception left to Starlette's error middleware is re-raised after the 500, and
            # the server then closes the client's keep-alive connection)
            log.exception("request failed")
            return error(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "paravt"}]}

    async def read_request(request: Request) -> ChatRequest | JSONResponse:
        """The body, read in chunks (a chunked upload without Content-Length is stopped at the limit
        too) and parsed with its images' headers read, not their pixels. Nothing of the raw body
        outlives this call: the request keeps only what it needs."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return error(413, f"request body is over the limit of {max_body_bytes} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        del chunks
        try:
            body = json.loads(raw)
        except ValueError as e:
            return error(400, f"the body is not valid JSON: {e}")
        except RecursionError:  # not a ValueError: json gives up on deep nesting ([[[[...) this way
            return error(400, "the body is not valid JSON: nested too deeply")
        del raw
        try:
            # CPU work (tokens of text checked, image headers read): off the event loop
            return await asyncio.to_thread(parse_chat_request, body, limits=limits, fit=fit, decode=False)
        except PayloadError as e:
            return error(e.status, str(e))

    async def reserve(parsed: ChatRequest) -> Reservation | None:
        """Wait for room in the server's pixel budget for this request's images; None if none came."""
        need = parsed.pixels_needed()
        if not need:
            return Reservation()
        got = await budget.acquire(need)
        return None if got is None else Reservation(budget, got)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        parsed = await read_request(request)
        if not isinstance(parsed, ChatRequest):
            return parsed
        if parsed.model is not None and parsed.model != model_name:
            return error(404, f"model {parsed.model!r} is not served here; this server serves {model_name!r}")
        held = await reserve(parsed)
        if held is None:
            return error(503, f"the server holds as many decoded image pixels as it may ({budget.capacity} "
                         f"with the requests in flight; this one needs {parsed.pixels_needed()}); retry in "
                         f"{RETRY_AFTER_S} s", headers={"Retry-After": str(RETRY_AFTER_S)})
        handed_over = False
        try:
            if parsed.pending:
                try:
                    await asyncio.to_thread(decode_pending, parsed.pending)  # CPU work: off the event loop
                except PayloadError as e:
                    return error(e.status, str(e))
                held.shrink(parsed.pixels_held())
                parsed.pending = []
            if parsed.stream:
                response = await start_stream(parsed, request.receive, held)
                handed_over = isinstance(response, StreamingResponse)
                return response
            return await complete(parsed, request.receive)
        finally:
            if not handed_over:
                held.release()

    async def start_stream(parsed: ChatRequest, receive, held: Reservation):
        """Start the generation as a task of its own and wait for its first piece: a request that fails
        before any text (too long for the context, the model failing) is a plain JSON error; then the
        rest streams. The task holds the request's pixels until it ends."""
        await gate.open.wait()
        out: asyncio.Queue = asyncio.Queue()
        pump = asyncio.ensure_future(pump_generation(backend, parsed.request, out))
        gate.track(pump)  # a pause with mode=abort cancels the generation, not the HTTP response
        pump.add_done_callback(gate.leave)
        pump.add_done_callback(lambda _: held.release())
        pump.add_done_callback(_retrieve)
        try:
            first = await first_while_connected(out, receive)
        except BaseException:  # this handler cancelled (shutdown): nobody will read the stream
            pump.cancel()
            raise
        if first is None:
            pump.cancel()
            log.info("client disconnected: generation cancelled")
            return error(499, "the client closed the connection; the generation was cancelled", "client_closed")
        kind, value = first
        if kind == "error":
            return error(*failure_of(value))
        if kind == "aborted":
            return error(503, "aborted for a weight update (POST /pause?mode=abort); send it again")
        if kind == "done" and (value.finish_reason == "error" or value.error):
            return error(500, f"the model failed: {value.error or 'unknown error'}")
        events = stream_events(first, out, pump, parsed, model_name, error_body)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def complete(parsed: ChatRequest, receive):
        """The whole completion as one chat.completion object."""
        await gate.enter()
        try:
            c = await generate_while_connected(backend, parsed.request, receive)
        except RequestRejected as e:
            return error(400, str(e))
        except BackendError as e:
            return error(500, f"the model failed: {e}")
        except asyncio.CancelledError:
            if not gate.paused:
                raise
            return error(503, "aborted for a weight update (POST /pause?mode=abort); send it again")
        finally:
            gate.leave()
        if c is None:
            log.info("client disconnected: generation cancelled")
            return error(499, "the client closed the connection; the generation was cancelled", "client_closed")
        if c.finish_reason == "error" or c.error:
            return error(500, f"the model failed: {c.error or 'unknown error'}")
        choice: dict = {"index": 0, "message": {"role": "assistant", "content": c.text},
                        "finish_reason": c.finish_reason, "logprobs": None}
        if parsed.logprobs and c.logprobs is not None:
            ids = c.token_ids or []
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{ids[i]}" if i < len(ids) else "", "logprob": lp, "bytes": None,
                 "top_logprobs": []} for i, lp in enumerate(c.logprobs)]}
        out = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": usage_of(c),
        }
        if parsed.return_token_ids:
            choice["token_ids"] = list(c.token_ids or [])
            out["prompt_token_ids"] = list(c.prompt_ids or [])
        return out

    if rl_api:
        _add_rl_api(app, backend, gate, error)
    return app


def _add_rl_api(app, backend: Backend, gate: WeightGate, error) -> None:
    """vLLM's dev-mode RL endpoints (module docstring), over `backend.reload_weights(path)`."""
    from fastapi import Request

    @app.post("/pause")
    async def pause(mode: str = "abort"):
        if mode not in ("abort", "wait", "keep"):
            return error(400, f"mode must be abort, wait or keep, got {mode!r}")
        await gate.pause(mode)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume():
        gate.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused():
        return {"is_paused": gate.paused}

    @app.get("/weight_info")
    async def weight_info():
        return {"weight_version": gate.version}

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await _json_object(request)
        version = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(version, str):
            return error(400, 'the body must be {"new_version": "<string>"}')
        gate.version = version
        return {"success": True, "new_version": version}

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        body = await _json_object(request)
        if not isinstance(body, dict) or body.get("method") != "reload_weights":
            return error(400, 'only {"method": "reload_weights", "kwargs": {"weights_path": DIR}} is served here')
        path = (body.get("kwargs") or {}).get("weights_path")
        if not isinstance(path, str) or not path:
            return error(400, "reload_weights needs kwargs.weights_path, a directory of safetensors files")
        if not gate.paused:
            return error(409, "pause generation first (POST /pause): weights change under no request")
        reload = getattr(backend, "reload_weights", None)
        if reload is None:
            return error(400, "this server's backend cannot reload weights")
        try:
            await asyncio.to_thread(reload, path)
        except (OSError, ValueError) as e:
            return error(400, f"reload_weights failed: {e}")
        return {"results": [None]}


async def _json_object(request) -> object:
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):
        return None


def serve(model: str | None, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_batch: int = 16, max_model_len: int | None = None, max_images: int = MAX_IMAGES,
          max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False,
          max_inflight_pixels: int = MAX_INFLIGHT_PIXELS) -> None:
    """Load the model and serve it until interrupted. Without `model`, the default of `ask`, `eval`
    and `demo`: $PARAVT_MODEL, else the shipped trained tiny checkpoint (an untrained tiny model only
    if that is missing). `max_model_len` (None: the model's own) goes to the backend, which rejects
    longer prompts (400). The limits are checked before the model loads, so a typo fails fast."""
    import uvicorn
    from rich.console import Console

    from paravt.ask import default_model
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    limits = ImageLimits(max_images=max_images, max_total_pixels=max_total_pixels)
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    if max_inflight_pixels < 1:
        raise ValueError(f"max_inflight_pixels must be >= 1, got {max_inflight_pixels}")
    console = Console(stderr=True)
    named = model
    model = model or default_model()
    if model and model.startswith(("http://", "https://")):
        where = "--model" if named else "$PARAVT_MODEL"
        raise ValueError(f"{where} is a URL ({model}); paravt serve serves a checkpoint directory or a cached hub id")
    if model:
        if not named:
            console.print(f"[yellow]no --model given: serving {model} (paravt's default model; the shipped one is a "
                          "1.4 M-parameter toy trained on SynthVT only). Pass --model for a real checkpoint.[/yellow]")
        m, p = load_model(model)
        # a local directory is served under its folder name, a hub id under itself (as vLLM does)
        name = Path(model).expanduser().resolve().name if Path(model).expanduser().exists() else model
    else:
        from paravt.models.tiny import build_tiny

        console.print("[yellow]no --model given and no shipped model found: serving an untrained tiny Qwen3-VL "
                      "(its output is noise)[/yellow]")
        m, p = build_tiny()
        name = "tiny-untrained"
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach it can use it"
                      "[/yellow]")
    console.print(f"paravt serve: model [bold]{name}[/bold] at http://{host}:{port}/v1 (max batch {max_batch})")
    backend = HFBackend(m, p, max_batch=max_batch, max_model_len=max_model_len)
    if rl_api:
        console.print("RL weight-sync API on: /pause, /resume, /collective_rpc reload_weights, /weight_info")
    app = create_app(backend, name, api_key=api_key, max_images=limits.max_images,
                     max_total_pixels=limits.max_total_pixels, rl_api=rl_api, max_inflight_pixels=max_inflight_pixels)
    uvicorn.run(app, host=host, port=port, log_level="warning")
