"""The FastAPI app of `paravt serve`: the routes, and each step of a chat completion as a named
function (read and check the body, reserve pixels, decode, then answer whole or stream).

Each HTTP request awaits `backend.generate([request])` (a streamed one iterates
`backend.generate_stream(request)` where the backend has it); requests that arrive together are
therefore awaited together, and the hf backend merges them into one batched forward pass.

Safety, because a model server is a network service: binds 127.0.0.1 unless told otherwise (see
`paravt.serve.command`); a bearer key is checked on /v1/* (and the RL API) when given; bodies
over `max_body_bytes` are refused (413) while they stream in, not after; malformed JSON
(including nesting too deep for the parser) is 400 and the connection stays usable; a request the
model can never serve (the backend's RequestRejected, e.g. a prompt longer than --max-model-len)
is 400 with the backend's message; any other backend failure is 500.
"""

# no `from __future__ import annotations`: FastAPI resolves the handlers' annotations (Request) at runtime
import asyncio
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from paravt.backends.base import Backend, BackendError, Completion, RequestRejected
from paravt.serve.errors import PayloadError, error_body, failure_of
from paravt.serve.images import (MAX_IMAGE_PIXELS, MAX_IMAGES, MAX_TOTAL_PIXELS, ImageFit, ImageLimits,
                                 decode_pending, model_image_fit)
from paravt.serve.limits import (MAX_BODY_BYTES, MAX_INFLIGHT_PIXELS, PIXEL_WAIT_S, RETRY_AFTER_S, PixelBudget,
                                 Reservation)
from paravt.serve.rl_api import RL_PATHS, WeightGate, add_rl_api
from paravt.serve.schema import ChatRequest, parse_chat_request
from paravt.serve.tool_calls import read_calls
from paravt.webguard import add_cors, origin_of, read_body, refusal
from paravt.serve.streaming import (first_while_connected, generate_while_connected, pump_generation, retrieve,
                                    stream_events, usage_of)

log = logging.getLogger("paravt.serve")
BODY_TIMEOUT_S = 120.0  # a whole request body (up to max_body_bytes) must arrive within this


@dataclass
class Server:
    """What the handlers share: the backend and the name it is served under, the per-request image
    limits and the size the model resizes images to, the server-wide pixel budget, the weight gate."""

    backend: Backend
    model_name: str
    limits: ImageLimits
    fit: Optional[ImageFit]
    budget: PixelBudget
    gate: WeightGate
    max_body_bytes: int


def error(status: int, message: str, kind: Optional[str] = None, headers: Optional[dict] = None):
    """An OpenAI-shaped JSON error response."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content=error_body(status, message, kind), headers=headers)


def create_app(backend: Backend, model_name: str, api_key: Optional[str] = None,
               max_body_bytes: int = MAX_BODY_BYTES, max_image_pixels: int = MAX_IMAGE_PIXELS,
               max_images: int = MAX_IMAGES, max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False,
               max_inflight_pixels: int = MAX_INFLIGHT_PIXELS, pixel_wait_s: float = PIXEL_WAIT_S,
               image_fit: Optional[ImageFit] = None, loopback_only: bool = False,
               allowed_origins: tuple = (), named_hosts: Optional[tuple] = None):
    """The FastAPI app. Any Backend works (tests use fakes); `model_name` is the id /v1/models lists
    and the only one /v1/chat/completions accepts (as vLLM does, so a wrong model is a clear 404).
    The limits (paravt.serve.images, .limits) and the RL weight-sync API (`rl_api`, paravt.serve.rl_api)
    are described in their modules. `image_fit` is the size the model resizes an image to (default:
    what the backend says, `model_image_fit`; None there: images are decoded as sent). Cross-site
    requests are refused as `paravt.webguard` says (`loopback_only`: the server is bound to loopback,
    so a foreign Host is a rebinding page; `named_hosts`: bound beyond loopback without a key, the
    names besides IP addresses it answers as; `allowed_origins`: browser front-ends let in, whose
    preflights are answered and whose responses carry CORS headers)."""
    from fastapi import FastAPI, Request

    srv = Server(backend=backend, model_name=model_name,
                 limits=ImageLimits(max_image_pixels, max_images, max_total_pixels),
                 fit=image_fit or model_image_fit(backend), budget=PixelBudget(max_inflight_pixels, pixel_wait_s),
                 gate=WeightGate(), max_body_bytes=max_body_bytes)
    app = FastAPI(title="paravt serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    origins = tuple(origin_of(o) for o in allowed_origins)
    _add_guard(app, api_key, max_body_bytes, loopback_only, origins, named_hosts)
    add_cors(app, origins, methods=("GET", "POST"), headers=("authorization", "content-type"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "paravt"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await chat_completion(srv, request)

    if rl_api:
        add_rl_api(app, backend, srv.gate, error)
    return app


def _add_error_handlers(app) -> None:
    """Every error the framework raises answered as OpenAI-shaped JSON."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

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


JSON_PATHS = ("/v1/chat/completions", "/collective_rpc", "/update_weight_version")


def _add_guard(app, api_key: Optional[str], max_body_bytes: int, loopback_only: bool,
               allowed_origins: tuple, named_hosts: Optional[tuple] = None) -> None:
    """Requests a web page could have sent refused (`paravt.webguard`), the bearer key on /v1/* and
    the RL API, a declared body over the limit refused before it is read, and any exception answered
    here (500) so the connection stays usable."""
    from fastapi import Request
    from starlette.requests import ClientDisconnect

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refused = refusal(request.method, request.url.path, request.headers, loopback_only, JSON_PATHS,
                          allowed_origins, named_hosts)
        if refused:
            return error(*refused)
        if api_key and (request.url.path.startswith("/v1") or request.url.path in RL_PATHS):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong API key (send Authorization: Bearer KEY)")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_body_bytes:
            return error(413, f"request body of {length} bytes is over the limit of {max_body_bytes} bytes")
        try:
            return await call_next(request)
        except ClientDisconnect:  # the client left while its body was read: an event, not a failure
            log.warning("client disconnected before its request was read: %s %s", request.method, request.url.path)
            return error(499, "the client closed the connection", "client_closed")
        except Exception as exc:  # noqa: BLE001 - answered here, the connection stays usable
            # (an exception left to Starlette's error middleware is re-raised after the 500, and
            # the server then closes the client's keep-alive connection)
            log.exception("request failed")
            return error(500, f"internal error: {type(exc).__name__}: {exc}")


async def chat_completion(srv: Server, request):
    """POST /v1/chat/completions: read and check the body, wait for room in the pixel budget, decode
    the images, then answer whole or as a stream. The pixels are given back once the answer is sent
    (a stream's by its generation task, when that ends)."""
    parsed = await read_request(srv, request)
    if not isinstance(parsed, ChatRequest):
        return parsed
    if parsed.model is not None and parsed.model != srv.model_name:
        return error(404, f"model {parsed.model!r} is not served here; this server serves {srv.model_name!r}")
    held = await reserve(srv, parsed)
    if held is None:
        return error(503, f"the server holds as many decoded image pixels as it may ({srv.budget.capacity} "
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
            from fastapi.responses import StreamingResponse

            response = await start_stream(srv, parsed, request.receive, held)
            handed_over = isinstance(response, StreamingResponse)
            return response
        return await complete(srv, parsed, request.receive)
    finally:
        if not handed_over:
            held.release()


async def read_request(srv: Server, request):
    """The body, read in chunks (a chunked upload without Content-Length is stopped at the limit
    too) and parsed with its images' headers read, not their pixels: a ChatRequest, or the error
    response. Nothing of the raw body outlives this call: the request keeps only what it needs."""
    raw = await read_body(request.stream(), srv.max_body_bytes, BODY_TIMEOUT_S)
    if isinstance(raw, tuple):
        return error(*raw)
    try:
        body = json.loads(raw)
    except ValueError as e:
        return error(400, f"the body is not valid JSON: {e}")
    except RecursionError:  # not a ValueError: json gives up on deep nesting ([[[[...) this way
        return error(400, "the body is not valid JSON: nested too deeply")
    del raw
    try:
        # CPU work (tokens of text checked, image headers read): off the event loop
        return await asyncio.to_thread(parse_chat_request, body, limits=srv.limits, fit=srv.fit, decode=False)
    except PayloadError as e:
        return error(e.status, str(e))


async def reserve(srv: Server, parsed: ChatRequest) -> Optional[Reservation]:
    """Wait for room in the server's pixel budget for this request's images; None if none came."""
    need = parsed.pixels_needed()
    if not need:
        return Reservation()
    got = await srv.budget.acquire(need)
    return None if got is None else Reservation(srv.budget, got)


async def start_stream(srv: Server, parsed: ChatRequest, receive, held: Reservation):
    """Start the generation as a task of its own and wait for its first piece: a request that fails
    before any text (too long for the context, the model failing) is a plain JSON error; then the
    rest streams. The task holds the request's pixels until it ends."""
    from fastapi.responses import StreamingResponse

    gate = srv.gate
    await gate.open.wait()
    out: asyncio.Queue = asyncio.Queue()
    pump = asyncio.ensure_future(pump_generation(srv.backend, parsed.request, out))
    gate.track(pump)  # a pause with mode=abort cancels the generation, not the HTTP response
    pump.add_done_callback(gate.leave)
    pump.add_done_callback(lambda _: held.release())
    pump.add_done_callback(retrieve)
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
    events = stream_events(first, out, pump, parsed, srv.model_name, error_body)
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def complete(srv: Server, parsed: ChatRequest, receive):
    """The whole completion as one chat.completion object."""
    gate = srv.gate
    await gate.enter()
    try:
        c = await generate_while_connected(srv.backend, parsed.request, receive)
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
    return completion_body(parsed, c, srv.model_name)


def completion_body(parsed: ChatRequest, c: Completion, model_name: str) -> dict:
    """The chat.completion object of a finished generation (logprobs and token ids when asked for)."""
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason, "logprobs": None}
    read = read_calls(c.text, parsed.tools)
    if read is not None:  # as vLLM's hermes parser answers (paravt.serve.tool_calls)
        choice["message"] = {"role": "assistant", "content": read.content, "tool_calls": read.calls}
        choice["finish_reason"] = "tool_calls"
    if parsed.logprobs and c.logprobs is not None:
        ids = c.token_ids or []
        choice["logprobs"] = {"content": [
            {"token": f"token_id:{ids[i]}" if i < len(ids) else "", "logprob": lp, "bytes": None,
             "top_logprobs": []} for i, lp in enumerate(c.logprobs)]}
    out: dict[str, Any] = {
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
