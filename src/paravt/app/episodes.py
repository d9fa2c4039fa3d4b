"""An episode for the page: the /api/ask body checked, the model loaded (or reused), and the
episode's own events (run_episode's `on_event` hook) streamed as Server-Sent Events as they happen,
with the overview thumbnails cut while the model runs."""

import asyncio
import base64
import io
import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from paravt.app.media import Uploads, resolve_media
from paravt.app.models import Models
from paravt.app.settings import KEEP_EPISODES, THUMBS, AppError, AppSettings
from paravt.report.html import finite


def sse(name: str, payload: Any) -> bytes:
    """One Server-Sent Event. json.dumps escapes newlines, so the data is a single line."""
    return f"event: {name}\ndata: {json.dumps(finite(payload), ensure_ascii=False, default=str)}\n\n".encode()


def overview_thumbnails(path: Path, times: list[float], limit: int = THUMBS,
                        root: Optional[Path] = None) -> list[dict]:
    """The episode view's `thumbnails` ([{t, src, w, h}], src a JPEG data URL) for at most `limit`
    of the overview times: the frames at the times the model saw, cut small by the same reader,
    as the report's thumbnails are (paravt.report.thumbs). root: the folder the file must lie in, as
    opened (the media root, or the uploads' folder)."""
    from PIL import Image

    from paravt.report.thumbs import JPEG_QUALITY, THUMB_FACTOR, THUMB_PIXELS, pick_times
    from paravt.video import VideoReader

    wanted = pick_times(times, limit)
    if not wanted:
        return []
    with VideoReader(path, max_pixels=THUMB_PIXELS, factor=THUMB_FACTOR, decoder_threads=1, media_root=root) as reader:
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
    root: Optional[Path]  # the folder it must lie in as opened: the media root, or the uploads' folder
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
        root = uploads.folder
    elif isinstance(video, dict) and "media" in video:
        if settings.media_root is None:
            raise AppError(403, "this app has no --media-root: upload the video instead")
        path = resolve_media(settings.media_root, video["media"])
        root = settings.media_root
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
    return AskRequest(path=path, name=name, root=root, question=question, question_type=qtype,
                      model=(model or "").strip() or settings.default_model, config=cfg)


def open_reader(req: AskRequest):
    """The request's video opened, held to its folder as opened (VideoReader's media_root)."""
    from paravt.video import VideoReader

    return VideoReader(req.path, timeout_s=req.config.model_timeout_s, media_root=req.root)


def readable(message: str, path: Path, name: str) -> str:
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
            shots = await asyncio.to_thread(overview_thumbnails, req.path, times, THUMBS, req.root)
            emit("thumbnails", {"thumbnails": shots})
        except Exception as e:  # noqa: BLE001 - the episode goes on without pictures
            emit("thumbnails", {"thumbnails": [], "error": readable(str(e), req.path, req.name)})

    def on_event(name: str, payload: dict) -> None:
        emit(name, payload)
        if name == "overview":
            thumbs.append(asyncio.get_running_loop().create_task(cut_thumbnails(list(payload["times"]))))

    reader = None
    try:
        reader = await asyncio.to_thread(open_reader, req)
        ep = await run_episode(backend, reader, req.question, req.config, question_type=req.question_type,
                               on_event=on_event)
        if thumbs:
            await thumbs[0]
    finally:
        for t in thumbs:
            t.cancel()
        if reader is not None:
            reader.close()  # safe with a decode still running: the reader closes after it
        if owned:
            await backend.aclose()
    trace = ep.to_dict(tokens=False)
    trace["video"] = req.name
    trace["id"] = episode_id
    trace["model"] = label
    return trace



async def stream_episode(req: AskRequest, episode_id: str, models: Models, finished: "OrderedDict[str, dict]",
                         release: Callable[[], None]):
    """The episode's events as they happen. The episode runs in its own task and hands each
    event to this generator through a queue; leaving the generator (the client went away)
    cancels the task, and with it the model calls in flight. A finished trace is kept in
    `finished` (the last KEEP_EPISODES); `release` frees the episode's slot, once."""
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
            emit("error", {"message": readable(str(e), req.path, req.name), "kind": type(e).__name__})
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
