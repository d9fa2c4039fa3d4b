"""`paravt app`: a local web page to ask a video a question and watch the episode unfold.

Pick a video (upload one, or a file under `--media-root`), write the question, choose K, the
dispatch mode and the model (a local checkpoint, by default the shipped one, or the URL of an
OpenAI-compatible server), and the page draws the episode as it runs: the overview frames on the
video's time axis, each crop window when the main agent dispatches it, each sub-agent's summary
when that sub-agent finishes, then the answer.

Why paravt's own FastAPI and not Gradio: the page streams the episode's own events (run_episode's
`on_event` hook, forwarded as Server-Sent Events, one per hook call, as they happen: nothing is
simulated or interpolated), it adds no heavy dependency (FastAPI and uvicorn are already there for
`paravt serve`), it works offline (every script and style ships in the package, no CDN), and it
draws the very same episode view as the HTML report (`paravt/report/assets/episode.js`), so a live
episode and a reported one look alike.

HTTP interface (JSON errors are `{"error": "message"}`):
- `GET /`: the page; `GET /assets/NAME`: its scripts and styles (a fixed list).
- `GET /api/info`: defaults and limits for the form.
- `GET /api/media`: the video files under --media-root (relative paths; empty without one).
- `PUT /api/upload?name=clip.mp4`: the video as the raw body (no multipart parser needed). Over
  --max-upload-mb: 413, from Content-Length before anything is stored, else while it streams in.
  A file paravt cannot read as a video: 400 with the decoder's reason. Answers `{id, name, duration}`.
- `POST /api/ask` (JSON `{video: {upload: ID} | {media: REL}, question, frames, mode, model,
  question_type}`): a `text/event-stream` (read with fetch, not EventSource, so that the API key
  travels as a header) of `start`, `loading_model`, `model_ready`, then run_episode's own events
  (`overview`, `turn_started`, `think`, `generated`, `calls_dispatched`, `subcall_finished`,
  `tool_response`, `answer`, payloads as run_episode emits them), `thumbnails` (small JPEGs of the
  overview frames, cut while the model runs, any time after `overview`), then `episode` (the final
  `Episode.to_dict(tokens=False)`), or `error` {message}, and last `done`. A client that goes away
  cancels its episode. A request that is wrong before the episode starts (bad JSON, unknown mode,
  no such video, a file that is not a video) is a plain 4xx instead.
- `GET /api/episodes/ID`: a finished episode's trace (the last few are kept in memory).

Safety, because the page reads files and runs models:
- binds 127.0.0.1 unless told otherwise; bound to loopback, requests whose Host header is not a
  loopback name are refused (421), so a web page cannot reach the app through DNS rebinding;
- `--api-key`: every /api/ request needs `Authorization: Bearer KEY`, as `paravt serve` (compared
  in constant time). The page has a key field, filled from `?key=` or `#key=` in its address (then
  removed from the address bar) and kept in the tab's sessionStorage; the page and its assets need
  no key (they hold no data). A cross-site page cannot send the request either: /api/ask wants
  `application/json` and the upload is a PUT, both of which a browser preflights, and the app
  answers no CORS;
- videos are only ever local files: an upload (stored under a private temporary folder, removed at
  exit, the oldest dropped beyond `KEEP_UPLOADS`) or a path under --media-root, resolved with its
  symlinks and refused (403) when it lands outside the root (`..`, absolute paths, links out);
  without --media-root no server path can be named at all;
- the model field is trusted input: whoever may use the page may make the server load a local
  checkpoint (safetensors, via transformers) or send the episode's frames to a URL. That is the
  person at the keyboard on loopback; a non-loopback bind without --api-key is warned about. A URL
  model is called without a key (the app's own key is never forwarded to a server someone typed);
- at most `--max-episodes` episodes run at once (503 beyond); one in-process model is kept loaded.
"""

# no `from __future__ import annotations`: FastAPI resolves the handlers' annotations at runtime
import asyncio
import base64
import hmac
import io
import json
import os
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional

from paravt.backends.base import Backend
from paravt.report.html import finite

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")
ASSETS = ("app.html", "app.js", "app.css", "episode.js", "episode.css")  # in paravt/report/assets
MAX_UPLOAD_MB = 512
MAX_ASK_BYTES = 256 * 1024  # a question is text; anything larger is not one
KEEP_UPLOADS = 16  # uploaded videos kept on disk; the oldest goes first
KEEP_EPISODES = 32  # finished traces kept for GET /api/episodes/ID
MAX_MEDIA_FILES = 5000  # files /api/media lists (a huge tree is cut, and says so)
MAX_EPISODES = 2  # episodes at once: each one holds a decoder and a share of the model's batch
THUMBS = 16  # overview thumbnails per episode, as the report's default
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# (model name or None for the default) -> Backend; runs in a worker thread (loading takes a while)
BackendFactory = Callable[[Optional[str]], Backend]


class AppError(Exception):
    """A request the app refuses, with its HTTP status and a message for the page."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class AppSettings:
    """What `paravt app`'s options set (see the module docstring for what each guards)."""

    media_root: Optional[Path] = None
    max_upload_bytes: int = MAX_UPLOAD_MB * 1024 * 1024
    api_key: Optional[str] = None
    default_model: Optional[str] = None  # None: $PARAVT_MODEL, else the shipped model (as paravt ask)
    default_frames: int = 64
    max_episodes: int = MAX_EPISODES
    loopback_hosts_only: bool = False  # refuse a Host header that is not a loopback name (DNS rebinding)


# ---------------------------------------------------------------------------------------------- media


def resolve_media(root: Path, rel: str) -> Path:
    """The file `rel` names under `root`, symlinks resolved. Refused (403) when it is absolute,
    climbs with `..`, or resolves outside the root (a link out); 404 when there is no such file.
    The page only ever sends what /api/media listed, but the check is here, on the server."""
    if not isinstance(rel, str) or not rel.strip() or "\x00" in rel:
        raise AppError(400, "no media path given")
    parts = Path(rel.replace("\\", "/")).parts
    if Path(rel).is_absolute() or rel.startswith(("/", "\\")) or ".." in parts:
        raise AppError(403, f"{rel!r} is outside the media root")
    base = root.resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base):
        raise AppError(403, f"{rel!r} is outside the media root")
    if not path.is_file():
        raise AppError(404, f"no video file {rel!r} under the media root")
    return path


def list_media(root: Path, limit: int = MAX_MEDIA_FILES) -> tuple[list[str], bool]:
    """(relative paths of the video files under `root`, whether the list was cut at `limit`).
    Hidden folders are skipped and folder links are not followed; a file link that points out of
    the root is left out (it could not be opened anyway)."""
    base = root.resolve()
    found: list[str] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(VIDEO_SUFFIXES):
                continue
            path = Path(folder) / name
            if not path.resolve().is_relative_to(base):
                continue
            found.append(path.relative_to(base).as_posix())
            if len(found) >= limit:
                return found, True
    return found, False


# ---------------------------------------------------------------------------------------------- uploads


def _safe_name(name: str) -> str:
    """The uploaded file's own name, for display only (never used as a path)."""
    name = os.path.basename(str(name or "").replace("\\", "/")).strip()
    return "".join(c for c in name if c.isprintable())[:200] or "upload"


class Uploads:
    """Uploaded videos in a private folder, under random ids; at most `keep` of them."""

    def __init__(self, folder: Path, keep: int = KEEP_UPLOADS):
        self.folder = folder
        self.keep = keep
        self.items: "OrderedDict[str, tuple[Path, str]]" = OrderedDict()  # id -> (file, display name)

    def new_path(self, name: str) -> tuple[str, Path]:
        suffix = Path(name).suffix.lower()
        suffix = suffix if suffix in VIDEO_SUFFIXES else ".bin"  # the decoder reads the content, not the name
        uid = uuid.uuid4().hex
        return uid, self.folder / f"{uid}{suffix}"

    def add(self, uid: str, path: Path, name: str) -> None:
        self.items[uid] = (path, name)
        while len(self.items) > self.keep:
            _, (old, _) = self.items.popitem(last=False)
            old.unlink(missing_ok=True)  # an episode still reading it keeps its open file (POSIX)

    def get(self, uid: str) -> tuple[Path, str]:
        if not isinstance(uid, str) or uid not in self.items:
            raise AppError(404, "no such upload (uploads are kept while the app runs, the last "
                           f"{self.keep}): upload the video again")
        return self.items[uid]


# ---------------------------------------------------------------------------------------------- models


def default_backend_factory(timeout_s: float = 600.0) -> BackendFactory:
    """paravt ask's make_backend: a URL is the OpenAI-compatible client (called without a key),
    anything else loads in-process; None is $PARAVT_MODEL or the shipped model."""

    def make(model: Optional[str]) -> Backend:
        from rich.console import Console

        from paravt.ask import make_backend

        return make_backend(model, console=Console(stderr=True), timeout_s=timeout_s)

    return make


class Models:
    """One in-process model kept loaded (loading one takes from a second to minutes); a URL model
    gets a fresh client per episode, closed after it. Asking for another local model replaces the
    loaded one once its rows in flight are done (HFBackend.aclose)."""

    def __init__(self, factory: BackendFactory):
        self.factory = factory
        self.key: Optional[str] = None
        self.backend: Optional[Backend] = None
        self.lock = asyncio.Lock()

    def is_loaded(self, model: Optional[str]) -> bool:
        return self.backend is not None and self.key == (model or "")

    async def acquire(self, model: Optional[str]) -> tuple[Backend, bool]:
        """(backend, whether the caller closes it)."""
        from paravt.video import is_url

        if is_url(model):
            return await asyncio.to_thread(self.factory, model), True
        async with self.lock:
            if self.is_loaded(model):
                return self.backend, False
            new = await asyncio.to_thread(self.factory, model or None)
            old, self.backend, self.key = self.backend, new, model or ""
        if old is not None:
            await old.aclose()
        return new, False

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()
            self.backend = None


# ---------------------------------------------------------------------------------------------- events


def sse(name: str, payload: Any) -> bytes:
    """One Server-Sent Event. json.dumps escapes newlines, so the data is a single line."""
    return f"event: {name}\ndata: {json.dumps(finite(payload), ensure_ascii=False, default=str)}\n\n".encode()


def overview_thumbnails(path: Path, times: list[float], limit: int = THUMBS) -> list[dict]:
    """The episode view's `thumbnails` ([{t, src, w, h}], src a JPEG data URL) for at most `limit`
    of the overview times: the frames at the times the model saw, cut small by the same reader,
    as the report's thumbnails are (paravt.report.thumbs)."""
    from PIL import Image

    from paravt.report.thumbs import JPEG_QUALITY, THUMB_FACTOR, THUMB_PIXELS, pick_times
    from paravt.video import VideoReader

    wanted = pick_times(times, limit)
    if not wanted:
        return []
    with VideoReader(path, max_pixels=THUMB_PIXELS, factor=THUMB_FACTOR, decoder_threads=1) as reader:
        frames = reader.frames_at(wanted)
    out = []
    for t, f in zip(wanted, frames):
        img = Image.fromarray(f.image)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=JPEG_QUALITY)
        out.append({"t": t, "src": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode(),
                    "w": img.width, "h": img.height})
    return out


@dataclass
class AskRequest:
    """A checked /api/ask body."""

    path: Path  # the local file
    name: str  # what the page shows (the upload's name, the path under the media root)
    question: str
    question_type: str
    model: Optional[str]
    config: Any  # EpisodeConfig


def parse_ask(body: Any, uploads: Uploads, settings: AppSettings) -> AskRequest:
    """The ask body checked before any stream starts, so a wrong request is a plain 4xx."""
    from paravt.agent import EpisodeConfig
    from paravt.ask import question_type_of

    if not isinstance(body, dict):
        raise AppError(400, "the body must be a JSON object")
    video = body.get("video")
    if isinstance(video, dict) and "upload" in video:
        path, name = uploads.get(video["upload"])
    elif isinstance(video, dict) and "media" in video:
        if settings.media_root is None:
            raise AppError(403, "this app has no --media-root: upload the video instead")
        path = resolve_media(settings.media_root, video["media"])
        name = path.relative_to(settings.media_root.resolve()).as_posix()
    else:
        raise AppError(400, "choose a video: {\"upload\": ID} or {\"media\": PATH}")
    question = body.get("question")
    if not isinstance(question, str) or not question.strip():
        raise AppError(400, "the question is empty")
    model = body.get("model") or None
    if model is not None and not isinstance(model, str):
        raise AppError(400, "model must be a string: a checkpoint directory or an http(s) URL")
    frames = body.get("frames", settings.default_frames)
    if isinstance(frames, bool) or not isinstance(frames, int):
        raise AppError(400, f"frames (K) must be a whole number, got {frames!r}")
    try:
        qtype = question_type_of(question, str(body.get("question_type") or "auto"))
        cfg = EpisodeConfig(mode=str(body.get("mode") or "parallel"), frames=frames)
    except ValueError as e:
        raise AppError(400, str(e)) from None
    return AskRequest(path=path, name=name, question=question, question_type=qtype,
                      model=(model or "").strip() or settings.default_model, config=cfg)


def _readable(message: str, path: Path, name: str) -> str:
    """An error about the file, naming it as the page does (not by its server-side path)."""
    return message.replace(str(path), name)


async def run_ask(req: AskRequest, models: Models, emit: Callable[[str, Any], None], episode_id: str) -> dict:
    """Load (or reuse) the model and run the episode, emitting every event; returns the final
    trace (its `video` is the name the page shows). Raises what run_episode raises."""
    from paravt.agent import run_episode

    label = req.model or "the default model"
    loading = not models.is_loaded(req.model)
    emit("loading_model", {"model": label, "cached": not loading})
    t0 = time.perf_counter()
    backend, owned = await models.acquire(req.model)
    emit("model_ready", {"model": label, "seconds": time.perf_counter() - t0, "cached": not loading})
    thumbs: list[asyncio.Task] = []

    async def cut_thumbnails(times: list[float]) -> None:
        try:
            emit("thumbnails", {"thumbnails": await asyncio.to_thread(overview_thumbnails, req.path, times)})
        except Exception as e:  # noqa: BLE001 - the episode goes on without pictures
            emit("thumbnails", {"thumbnails": [], "error": _readable(str(e), req.path, req.name)})

    def on_event(name: str, payload: dict) -> None:
        emit(name, payload)
        if name == "overview":
            thumbs.append(asyncio.get_running_loop().create_task(cut_thumbnails(list(payload["times"]))))

    try:
        ep = await run_episode(backend, req.path, req.question, req.config, question_type=req.question_type,
                               on_event=on_event)
        if thumbs:
            await thumbs[0]
    finally:
        for t in thumbs:
            t.cancel()
        if owned:
            await backend.aclose()
    trace = ep.to_dict(tokens=False)
    trace["video"] = req.name
    trace["id"] = episode_id
    trace["model"] = label
    return trace


# ---------------------------------------------------------------------------------------------- the app


def asset_text(name: str) -> str:
    return resources.files("paravt.report").joinpath("assets", name).read_text(encoding="utf-8")


def create_app(settings: AppSettings, backend_factory: Optional[BackendFactory] = None,
               upload_dir: Optional[Path] = None):
    """The FastAPI app. `backend_factory` makes a Backend from the page's model field (tests pass
    a scripted one); `upload_dir` holds uploads (default: a temporary folder removed at shutdown)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask

    own_dir = upload_dir is None
    folder = Path(tempfile.mkdtemp(prefix="paravt-app-")) if own_dir else Path(upload_dir)
    folder.mkdir(parents=True, exist_ok=True)
    uploads = Uploads(folder)
    models = Models(backend_factory or default_backend_factory())
    finished: "OrderedDict[str, dict]" = OrderedDict()
    running = {"n": 0}

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await models.aclose()
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)

    app = FastAPI(title="paravt app", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.uploads, app.state.models, app.state.finished, app.state.running = uploads, models, finished, running

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": message})

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if settings.loopback_hosts_only:
            host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
            if host not in LOOPBACK_NAMES:
                return error(421, "this app answers on its loopback address only (open it as http://127.0.0.1:PORT)")
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

    @app.get("/api/info")
    async def info():
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

    @app.get("/api/media")
    async def media():
        if settings.media_root is None:
            return {"files": [], "truncated": False, "root": None}
        files, cut = await asyncio.to_thread(list_media, settings.media_root)
        return {"files": files, "truncated": cut, "root": settings.media_root.name}

    @app.put("/api/upload")
    async def upload(request: Request, name: str = "upload"):
        from paravt.video import VideoError, VideoReader

        limit = settings.max_upload_bytes
        too_big = (f"the file is over this app's upload limit of {limit / 2 ** 20:g} MB "
                   "(paravt app --max-upload-mb)")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            return error(413, too_big)
        shown = _safe_name(name)
        uid, path = uploads.new_path(shown)
        size = 0
        try:
            with open(path, "wb") as f:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise AppError(413, too_big)
                    f.write(chunk)
            if size == 0:
                raise AppError(400, "the upload is empty")
            try:
                reader = await asyncio.to_thread(VideoReader, path)
                duration = reader.duration
                reader.close()
            except VideoError as e:
                raise AppError(400, f"{shown} is not a video paravt can read: "
                               f"{_readable(str(e), path, shown)}") from None
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        uploads.add(uid, path, shown)
        return {"id": uid, "name": shown, "bytes": size, "duration": duration}

    @app.post("/api/ask")
    async def ask(request: Request):
        from paravt.video import VideoError, VideoReader

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
        req = parse_ask(body, uploads, settings)
        try:  # a bad file fails here, as a plain 400, before any model is loaded
            (await asyncio.to_thread(VideoReader, req.path)).close()
        except VideoError as e:
            return error(400, f"{req.name} is not a video paravt can read: {_readable(str(e), req.path, req.name)}")
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
        return StreamingResponse(stream_episode(req, episode_id, release), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no", "X-Episode-Id": episode_id},
                                 background=BackgroundTask(release))

    async def stream_episode(req: AskRequest, episode_id: str, release: Callable[[], None]):
        """The episode's events as they happen. The episode runs in its own task and hands each
        event to this generator through a queue; leaving the generator (the client went away)
        cancels the task, and with it the model calls in flight."""
        from paravt.backends.base import BackendError
        from paravt.models import ModelLoadError
        from paravt.video import VideoError

        events: asyncio.Queue = asyncio.Queue()
        t0 = time.perf_counter()

        def emit(name: str, payload: Any) -> None:  # run_episode calls its hook on the event loop
            events.put_nowait((name, payload, time.perf_counter() - t0))

        async def run() -> None:
            try:
                trace = await run_ask(req, models, emit, episode_id)
                finished[episode_id] = trace
                while len(finished) > KEEP_EPISODES:
                    finished.popitem(last=False)
                emit("episode", trace)
            except (VideoError, ModelLoadError, BackendError, ValueError, OSError) as e:
                emit("error", {"message": _readable(str(e), req.path, req.name), "kind": type(e).__name__})
            except Exception as e:  # noqa: BLE001 - the page says what failed, the app keeps serving
                emit("error", {"message": f"{type(e).__name__}: {e}", "kind": type(e).__name__})
            finally:
                events.put_nowait(None)

        emit("start", {"id": episode_id, "video": req.name, "question": req.question,
                       "question_type": req.question_type, "config": asdict(req.config),
                       "model": req.model or "the default model"})
        task = asyncio.create_task(run())
        try:
            while (item := await events.get()) is not None:
                name, payload, t = item
                yield sse(name, payload if name == "episode" else {**payload, "t": round(t, 3)})
            yield sse("done", {"id": episode_id, "t": round(time.perf_counter() - t0, 3)})
        finally:
            task.cancel()
            release()

    @app.get("/api/episodes/{episode_id}")
    async def episode(episode_id: str):
        if episode_id not in finished:
            return error(404, "no finished episode with that id (the last few are kept while the app runs)")
        return finished[episode_id]

    return app


def serve_app(host: str = "127.0.0.1", port: int = 8080, media_root: Optional[str] = None,
              max_upload_mb: float = MAX_UPLOAD_MB, api_key: Optional[str] = None, model: Optional[str] = None,
              frames: int = 64, max_episodes: int = MAX_EPISODES) -> None:
    """`paravt app`: check the options, say where the page is, serve it until interrupted."""
    import uvicorn
    from rich.console import Console

    from paravt.agent import EpisodeConfig

    console = Console(stderr=True)
    root = None
    if media_root:
        root = Path(media_root).expanduser()
        if not root.is_dir():
            raise ValueError(f"--media-root {media_root}: not a directory")
    if not max_upload_mb > 0:
        raise ValueError(f"--max-upload-mb must be positive, got {max_upload_mb}")
    if max_episodes < 1:
        raise ValueError(f"--max-episodes must be >= 1, got {max_episodes}")
    EpisodeConfig(frames=frames)  # checks --frames now
    loopback = host in LOOPBACK_NAMES
    if not loopback and not api_key:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach it can read "
                      "the videos under --media-root and make it load models[/yellow]")
    settings = AppSettings(media_root=root, max_upload_bytes=int(max_upload_mb * 1024 * 1024), api_key=api_key,
                           default_model=model, default_frames=frames, max_episodes=max_episodes,
                           loopback_hosts_only=loopback)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"paravt app: open http://{shown}:{port}/"
                  + ("  (it asks for the API key; or add #key=KEY to the address)" if api_key else ""))
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
