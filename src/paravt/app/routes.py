"""The FastAPI app of `paravt app`: the guard (loopback Host, API key, headers), the page and its
assets, and the /api/ routes, each a named function over the app's shared state."""

# no `from __future__ import annotations`: FastAPI resolves the handlers' annotations at runtime
import asyncio
import hmac
import json
import shutil
import tempfile
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

from paravt.app.episodes import open_reader, parse_ask, readable, stream_episode
from paravt.app.media import Uploads, safe_name, list_media
from paravt.app.models import Models, default_backend_factory
from paravt.webguard import refusal
from paravt.app.settings import (ASSETS, CSP, MAX_ASK_BYTES, AppError, AppSettings,
                                 BackendFactory)


@dataclass
class AppState:
    """What the routes share (also on `app.state`, by the same names, for tests and tools)."""

    settings: AppSettings
    uploads: Uploads
    models: Models
    finished: "OrderedDict[str, dict]"  # episode id -> finished trace, the last KEEP_EPISODES
    running: dict  # {"n": episodes streaming now}


def asset_text(name: str) -> str:
    return resources.files("paravt.report").joinpath("assets", name).read_text(encoding="utf-8")


def error(status: int, message: str):
    """The app's JSON error, `{"error": message}`."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": message})


def create_app(settings: AppSettings, backend_factory: Optional[BackendFactory] = None,
               upload_dir: Optional[Path] = None):
    """The FastAPI app. `backend_factory` makes a Backend from the page's model field (tests pass
    a scripted one); `upload_dir` holds uploads (default: a temporary folder removed at shutdown)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request

    own_dir = upload_dir is None
    folder = Path(tempfile.mkdtemp(prefix="paravt-app-")) if own_dir else Path(upload_dir)
    folder.mkdir(parents=True, exist_ok=True)
    state = AppState(settings=settings, uploads=Uploads(folder),
                     models=Models(backend_factory or default_backend_factory()), finished=OrderedDict(),
                     running={"n": 0})

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await state.models.aclose()
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)

    app = FastAPI(title="paravt app", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.uploads, app.state.models = state.uploads, state.models
    app.state.finished, app.state.running = state.finished, state.running
    _add_guard(app, settings)
    _add_page_routes(app)

    @app.get("/api/info")
    async def info():
        return api_info(settings)

    @app.get("/api/media")
    async def media():
        if settings.media_root is None:
            return {"files": [], "truncated": False, "root": None}
        files, cut = await asyncio.to_thread(list_media, settings.media_root)
        return {"files": files, "truncated": cut, "root": settings.media_root.name}

    @app.put("/api/upload")
    async def upload(request: Request, name: str = "upload"):
        return await upload_video(state, request, name)

    @app.post("/api/ask")
    async def ask(request: Request):
        return await ask_episode(state, request)

    @app.get("/api/episodes/{episode_id}")
    async def episode(episode_id: str):
        if episode_id not in state.finished:
            return error(404, "no finished episode with that id (the last few are kept while the app runs)")
        return state.finished[episode_id]

    return app


def _add_guard(app, settings: AppSettings) -> None:
    """Requests a web page could have sent refused (`paravt.webguard`: a foreign Host when bound to
    loopback, a foreign Origin, /api/ask not as JSON); the API key on every /api/ request; an AppError answered as its status; headers that keep the page private."""
    from fastapi import Request

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refused = refusal(request.method, request.url.path, request.headers, settings.loopback_hosts_only,
                          ("/api/ask",))
        if refused:
            return error(*refused)
        if settings.api_key and request.url.path.startswith("/api/"):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
                return error(401, "missing or wrong API key (send Authorization: Bearer KEY; the page's key field)")
        try:
            response = await call_next(request)
        except AppError as e:
            response = error(e.status, str(e))
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")  # a ?key= never leaves in a Referer
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(AppError)
    async def _app_error(request: Request, exc: AppError):
        return error(exc.status, str(exc))


def _add_page_routes(app) -> None:
    """The page, its scripts and styles (a fixed list), and no favicon."""
    from fastapi.responses import Response

    @app.get("/")
    async def page():
        return Response(asset_text("app.html"), media_type="text/html; charset=utf-8",
                        headers={"Content-Security-Policy": CSP})

    @app.get("/favicon.ico")
    async def favicon():
        return Response(status_code=204)  # none; a 404 would be an error in the browser's console

    @app.get("/assets/{name}")
    async def asset(name: str):
        if name not in ASSETS:
            return error(404, f"no asset {name!r}")
        kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        return Response(asset_text(name), media_type=f"{kind}; charset=utf-8")


def api_info(settings: AppSettings) -> dict:
    """GET /api/info: the form's defaults and limits."""
    from paravt import DEFAULT_MODEL
    from paravt import protocol as P
    from paravt.ask import default_model

    model = settings.default_model or default_model() or ""
    shipped = bool(model) and Path(model).resolve() == DEFAULT_MODEL.resolve()
    return {"modes": list(P.MODES), "question_types": ["auto", *P.QUESTION_TYPES],
            "frames": settings.default_frames, "model": model,
            "model_label": f"the shipped tiny model ({DEFAULT_MODEL.name})" if shipped else model,
            "media_root": settings.media_root is not None, "max_upload_bytes": settings.max_upload_bytes,
            "max_episodes": settings.max_episodes}


async def _chunks_while_they_come(request, idle_s: float):
    """The body's chunks, each within `idle_s` of the last: a client that stops sending (a dead link,
    a slowloris) gets a 408 instead of holding its connection and a half-written file for ever. It
    is a gap, not a deadline for the whole body, which would cut honest uploads over slow links."""
    reading = request.stream().__aiter__()
    while True:
        try:
            yield await asyncio.wait_for(reading.__anext__(), idle_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise AppError(408, f"the upload stalled: nothing arrived for {idle_s:g} s") from None


async def upload_video(state: AppState, request, name: str):
    """PUT /api/upload: the raw body stored under a random id (413 over the limit, from
    Content-Length or while it streams in; 408 if it stalls), then opened as a video (400 if it is
    not one)."""
    from paravt.video import VideoError, VideoReader

    limit = state.settings.max_upload_bytes
    too_big = (f"the file is over this app's upload limit of {limit / 2 ** 20:g} MB "
               "(paravt app --max-upload-mb)")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        return error(413, too_big)
    shown = safe_name(name)
    uid, path = state.uploads.new_path(shown)
    size = 0
    try:
        with open(path, "wb") as f:
            async for chunk in _chunks_while_they_come(request, state.settings.upload_idle_s):
                size += len(chunk)
                if size > limit:
                    raise AppError(413, too_big)
                f.write(chunk)
        if size == 0:
            raise AppError(400, "the upload is empty")
        try:
            reader = await asyncio.to_thread(VideoReader, path, media_root=state.uploads.folder)
            duration = reader.duration
            reader.close()
        except VideoError as e:
            raise AppError(400, f"{shown} is not a video paravt can read: "
                           f"{readable(str(e), path, shown)}") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    state.uploads.add(uid, path, shown)
    return {"id": uid, "name": shown, "bytes": size, "duration": duration}


async def ask_episode(state: AppState, request):
    """POST /api/ask: the question checked and its video opened before any stream starts (a wrong
    request is a plain 4xx), then the episode's events as a stream, within --max-episodes."""
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    from paravt.video import VideoError

    settings, running = state.settings, state.running
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return error(415, "send the question as application/json")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_ASK_BYTES:
            return error(413, f"the request is over {MAX_ASK_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return error(400, "the body is not valid JSON")
    req = parse_ask(body, state.uploads, settings)
    try:  # a bad file fails here, as a plain 400, before any model is loaded
        (await asyncio.to_thread(open_reader, req)).close()
    except VideoError as e:
        return error(400, f"{req.name} is not a video paravt can read: {readable(str(e), req.path, req.name)}")
    if running["n"] >= settings.max_episodes:
        return error(503, f"{settings.max_episodes} episode(s) are already running (--max-episodes): "
                     "try again when one has finished")
    running["n"] += 1
    released = []

    def release() -> None:  # once, from the stream's end or, if it never started, after the response
        if not released:
            released.append(True)
            running["n"] -= 1

    episode_id = uuid.uuid4().hex[:12]
    return StreamingResponse(stream_episode(req, episode_id, state.models, state.finished, release),
                             media_type="text/event-stream",
                             headers={"X-Accel-Buffering": "no", "X-Episode-Id": episode_id},
                             background=BackgroundTask(release))
