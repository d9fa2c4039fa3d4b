"""`paravt serve`: an OpenAI-compatible chat server over any Backend (the in-process hf one by default).

Each HTTP request awaits `backend.generate([request])`; requests that arrive together are
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

Supported: string or list content with text and image_url parts; temperature, top_p,
max_tokens / max_completion_tokens, seed, stop, n=1, stream=false, logprobs (tokens are
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
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paravt.backends.base import (Backend, BackendError, Completion, GenerateRequest, ImagePart, Message,
                                  RequestRejected, TextPart)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGES = 256
MAX_TOTAL_PIXELS = 256 * 1024 * 1024
MAX_NEW_TOKENS = 32768
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
class ChatRequest:
    """A parsed /v1/chat/completions body."""

    request: GenerateRequest
    model: str | None
    logprobs: bool
    return_token_ids: bool = False


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


def to_rgb(img) -> np.ndarray:
    """Decode a lazily opened PIL image's pixels -> HxWx3 uint8 RGB."""
    try:
        return np.asarray(img.convert("RGB"))
    except Exception as e:
        raise PayloadError(f"image could not be decoded: {type(e).__name__}: {e}") from None


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


def parse_messages(raw: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None) -> list[Message]:
    """OpenAI chat messages -> our Messages (images decoded to arrays). The request's image count and
    total pixels are checked against `limits` from the headers before any image is decoded."""
    limits = limits or ImageLimits(max_pixels=max_pixels)
    if not isinstance(raw, list) or not raw:
        raise PayloadError("messages must be a non-empty list")
    n_images = count_images(raw)
    if n_images > limits.max_images:
        raise PayloadError(f"the request holds {n_images} images, over the limit of {limits.max_images} images "
                           "per request")
    msgs: list[Message] = []
    pending: list[tuple[list, int, Any, str]] = []  # (parts, index, lazily opened image, where)
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
                pending.append((parts, len(parts), img, where))
                parts.append(None)  # decoded below, once every image's size is known to fit
            else:
                raise PayloadError(f"messages[{i}].content[{j}] must be a text part or an image_url part "
                                   f"(got type {kind!r})")
        msgs.append(Message(role, parts))
    if total > limits.max_total_pixels:
        raise PayloadTooLarge(f"the request's {n_images} images decode to {total} pixels, over the limit of "
                              f"{limits.max_total_pixels} pixels per request")
    for parts, k, img, where in pending:
        try:
            parts[k] = ImagePart(to_rgb(img))
        except PayloadError as e:
            raise PayloadError(f"{where}: {e}") from None
    return msgs


def _number(body: dict, key: str, default: float, lo: float, hi: float, kind: type = float) -> Any:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise PayloadError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise PayloadError(f"{key} must be between {lo:g} and {hi:g}, got {v!r}")
    return kind(v)


def parse_chat_request(body: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None) -> ChatRequest:
    """Validate a /v1/chat/completions body and turn it into a GenerateRequest; PayloadError says what is
    wrong (its `status` is 400, or 413 for images over the pixel budget)."""
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    check_text(body)
    if body.get("stream"):
        raise PayloadError("stream=true is not supported; send stream=false")
    if _number(body, "n", 1, 1, 128, int) != 1:
        raise PayloadError("only n=1 is supported")
    if body.get("tools") or body.get("functions"):
        raise PayloadError("native tool calling is not supported; crop_video calls are written as text tags")
    if _number(body, "top_logprobs", 0, 0, 20, int):
        raise PayloadError("top_logprobs is not supported (logprobs=true gives the sampled tokens' logprobs)")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise PayloadError("model must be a string")
    messages = parse_messages(body.get("messages"), max_pixels, limits)
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
    return ChatRequest(request=req, model=model, logprobs=bool(body.get("logprobs", False)),
                       return_token_ids=bool(body.get("return_token_ids", False)))


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
        self.inflight.add(asyncio.current_task())
        self.idle.clear()

    def leave(self) -> None:
        self.inflight.discard(asyncio.current_task())
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
               max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False):
    """The FastAPI app. Any Backend works (tests use fakes); `model_name` is the id /v1/models lists
    and the only one /v1/chat/completions accepts (as vLLM does, so a wrong model is a clear 404).
    The limits and the RL weight-sync API (`rl_api`) are described in the module docstring."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    limits = ImageLimits(max_image_pixels, max_images, max_total_pixels)
    app = FastAPI(title="paravt serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error"}

    def error(status: int, message: str, kind: str | None = None) -> JSONResponse:
        kind = kind or kinds.get(status, "server_error")
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})

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

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        # Read the body in chunks so a chunked upload without Content-Length is stopped at the limit too.
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return error(413, f"request body is over the limit of {max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError as e:
            return error(400, f"the body is not valid JSON: {e}")
        except RecursionError:  # not a ValueError: json gives up on deep nesting ([[[[...) this way
            return error(400, "the body is not valid JSON: nested too deeply")
        try:
            # image decoding is CPU work: off the event loop, so other requests keep flowing
            parsed = await asyncio.to_thread(parse_chat_request, body, limits=limits)
        except PayloadError as e:
            return error(e.status, str(e))
        if parsed.model is not None and parsed.model != model_name:
            return error(404, f"model {parsed.model!r} is not served here; this server serves {model_name!r}")
        await gate.enter()
        try:
            c = await generate_while_connected(backend, parsed.request, request.receive)
        except RequestRejected as e:
            return error(400, str(e))
        except BackendError as e:
            return error(500, f"the model failed: {e}")
        except asyncio.CancelledError:
            if not gate.paused:
                raise
            return error(503, "aborted for a weight update (POST /pause?mode=abort); send it again",
                         "service_unavailable")
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
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens,
                      "prompt_tokens_details": {"image_tokens": c.visual_tokens}},
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
          max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False) -> None:
    """Load the model (or build an untrained tiny one) and serve it until interrupted. `max_model_len`
    (None: the model's own) goes to the backend, which rejects longer prompts (400). The limits are
    checked before the model loads, so a typo fails fast."""
    import uvicorn
    from rich.console import Console

    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    limits = ImageLimits(max_images=max_images, max_total_pixels=max_total_pixels)
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    console = Console(stderr=True)
    if model:
        m, p = load_model(model)
        # a local directory is served under its folder name, a hub id under itself (as vLLM does)
        name = Path(model).expanduser().resolve().name if Path(model).expanduser().exists() else model
    else:
        from paravt.models.tiny import build_tiny

        console.print("[yellow]no --model given: serving an untrained tiny Qwen3-VL (its output is noise)[/yellow]")
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
                     max_total_pixels=limits.max_total_pixels, rl_api=rl_api)
    uvicorn.run(app, host=host, port=port, log_level="warning")
