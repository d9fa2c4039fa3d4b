"""`paravt serve`: an OpenAI-compatible chat server over any Backend (the hf one by default).

Concurrent HTTP requests are awaited together, so the hf backend batches them into one
forward pass. The server never fetches URLs or opens files: images must be data URLs.
"""


import base64
import binascii
import io
import time
import uuid

import numpy as np

from paravt.backends.base import Backend, BackendError, GenerateRequest, ImagePart, Message, TextPart

MAX_BODY_BYTES = 64 * 1024 * 1024


class PayloadError(ValueError):
    pass


def _decode_image(url: str) -> np.ndarray:
    from PIL import Image

    if not url.startswith("data:image/"):
        raise PayloadError("image_url must be a base64 data URL (data:image/...;base64,...); the server fetches nothing")
    try:
        header, b64 = url.split(",", 1)
        if ";base64" not in header:
            raise PayloadError("image data URL must be base64-encoded")
        img = Image.open(io.BytesIO(base64.b64decode(b64, validate=True))).convert("RGB")
    except (ValueError, binascii.Error, OSError) as e:
        raise PayloadError(f"image could not be decoded: {e}") from None
    return np.asarray(img)


def parse_messages(raw) -> tuple[list[Message], str]:
    """OpenAI messages -> our Messages; a trailing assistant message becomes the forced prefix."""
    if not isinstance(raw, list) or not raw:
        raise PayloadError("messages must be a non-empty list")
    msgs: list[Message] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise PayloadError(f"messages[{i}] needs a role of system, user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            msgs.append(Message(m["role"], content))
            continue
        if not isinstance(content, list):
            raise PayloadError(f"messages[{i}].content must be a string or a list of parts")
        parts: list = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text" and isinstance(p.get("text"), str):
                parts.append(TextPart(p["text"]))
            elif kind == "image_url" and isinstance(p.get("image_url"), (dict, str)):
                url = p["image_url"]["url"] if isinstance(p["image_url"], dict) else p["image_url"]
                parts.append(ImagePart(_decode_image(str(url))))
            else:
                raise PayloadError(f"messages[{i}].content[{j}] must be a text or image_url part")
        msgs.append(Message(m["role"], parts))
    return msgs, ""


def create_app(backend: Backend, model_name: str, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="paravt serve", version="1")

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return error(401, "missing or wrong API key", "authentication_error")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_body_bytes:
            return error(413, f"request body over {max_body_bytes} bytes")
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "paravt"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body_bytes = await request.body()
        if len(body_bytes) > max_body_bytes:
            return error(413, f"request body over {max_body_bytes} bytes")
        try:
            body = await request.json()
        except ValueError:
            return error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return error(400, "body must be a JSON object")
        try:
            if body.get("stream"):
                raise PayloadError("stream=true is not supported; send stream=false")
            if int(body.get("n", 1)) != 1:
                raise PayloadError("only n=1 is supported")
            messages, _ = parse_messages(body.get("messages"))
            prefix = ""
            if body.get("continue_final_message") and messages and messages[-1].role == "assistant":
                prefix = messages.pop().text()
            max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 512)
            temperature = float(body.get("temperature", 1.0))
            top_p = float(body.get("top_p", 1.0))
            if max_tokens < 1 or not 0 <= temperature <= 5 or not 0 < top_p <= 1:
                raise PayloadError("max_tokens >= 1, 0 <= temperature <= 5 and 0 < top_p <= 1 are required")
            stop = body.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            seed = body.get("seed")
            req = GenerateRequest(messages=messages, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                  prefix=prefix, stop=stop, seed=int(seed) if seed is not None else None)
        except (PayloadError, TypeError, ValueError) as e:
            return error(400, str(e))
        try:
            c = (await backend.generate([req]))[0]
        except BackendError as e:
            return error(500, str(e), "server_error")
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex[:16],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": c.finish_reason}],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens,
                      "prompt_tokens_details": {"image_tokens": c.visual_tokens}},
        }

    return app


def serve(model: str | None, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_batch: int = 16) -> None:
    import uvicorn

    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.models.tiny import build_tiny

    if model:
        m, p = load_model(model)
        name = model.rstrip("/").split("/")[-1]
    else:
        m, p = build_tiny()
        name = "tiny-untrained"
    app = create_app(HFBackend(m, p, max_batch=max_batch), name, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level="warning")
