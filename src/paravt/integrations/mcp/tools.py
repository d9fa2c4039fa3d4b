"""The three tools' bodies, over paravt's own episode code and free of the MCP SDK: what a crop
returns, what a sub-agent says of a window, what a whole episode answers.

No second episode loop: a crop or a window is one call run through `paravt.agent.dispatch_calls`, the
function that runs the episode's own calls (its argument checks, its sampling of a window, its
sub-agent prompt and budgets), in `inline` mode for crop_video (the window's frames themselves: the
frames a sub-agent would see) and in the configured mode for watch_window; ask_video is
`run_episode`. Nothing here imports torch: a model is loaded (or a server client made) only when
watch_window or ask_video first needs one (`Models`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from paravt import protocol as P
from paravt.integrations.mcp.settings import MODES, McpSettings, ToolInputError, resolve_video

T = TypeVar("T")


@dataclass
class Window:
    """One call's window as the episode ran it: where, which frames, and what came back."""

    video: str
    duration: float
    start: float
    end: float
    frame_times: list[float]
    parts: list = field(default_factory=list)  # crop: TextPart timestamp + ImagePart per frame, as a sub-agent sees
    summary: str | None = None  # watch: the sub-agent's summary
    seconds: float = 0.0

    def info(self) -> dict[str, Any]:
        """The window as structured content (no pixels)."""
        d = {"video": self.video, "duration": round(self.duration, 3), "start": self.start, "end": self.end,
             "frame_times": self.frame_times, "seconds": round(self.seconds, 3)}
        if self.summary is not None:
            d["summary"] = self.summary
        return d


class Models:
    """The model watch_window and ask_video use, made once per server process on first use (an
    in-process checkpoint loads once; a URL is a client)."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self.backend = None
        self._lock = asyncio.Lock()

    async def get(self):
        async with self._lock:
            if self.backend is None:
                self.backend = await asyncio.to_thread(self._make)
        return self.backend

    def _make(self):
        from rich.console import Console

        from paravt.ask import make_backend

        return make_backend(self.settings.model, api_key=self.settings.api_key, console=Console(stderr=True),
                            timeout_s=self.settings.timeout_s)

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()
            self.backend = None


async def within(settings: McpSettings, what: str, work: Callable[[threading.Event], Awaitable[T]]) -> T:
    """`work(stop)` under the tool's deadline (settings.timeout_s), as a model call is bounded. When
    the call ends, past its deadline or cancelled (the client left) or done, `stop` is set: whatever
    the call still reads on a thread (a probe, a decode, a URL's download: see paravt.video.Source)
    ends at its next packet, so it stops using CPU, memory and network and frees its worker."""
    stop = threading.Event()
    try:
        return await asyncio.wait_for(work(stop), settings.timeout_s)
    except asyncio.TimeoutError:
        raise ToolInputError(f"{what} took longer than {settings.timeout_s:g} s (the server's --timeout)") from None
    finally:
        stop.set()


def _video_error(e: Exception) -> ToolInputError:
    from paravt.video import VideoError

    if isinstance(e, VideoError):
        return ToolInputError(f"cannot read the video: {e}")
    return ToolInputError(str(e))


async def open_video(settings: McpSettings, video_path: str, stop: threading.Event):
    """A VideoReader of the file (or URL) the call names, reading until `stop` is set, or a
    ToolInputError saying why not."""
    from paravt.video import VideoError, VideoReader

    path = resolve_video(settings, video_path)
    root = None if isinstance(path, str) else settings.media_root  # a URL is no file under it
    try:
        return await asyncio.to_thread(VideoReader, path, timeout_s=settings.timeout_s, media_root=root,
                                       stop=stop)
    except VideoError as e:
        raise _video_error(e) from None


async def run_window(settings: McpSettings, video_path: str, start_time: Any, end_time: Any, stop: threading.Event,
                     *, num_frames: int | None = None, question: str | None = None,
                     models: Models | None = None) -> Window:
    """One crop_video call run by the episode's own dispatch: inline (its frames returned) without
    `models`, else by a sub-agent with a fresh context on their backend, which sees `question` as the
    episode's do. The path and the window are checked before any model is loaded."""
    from paravt.agent import dispatch_calls

    args: dict[str, Any] = {"start_time": start_time, "end_time": end_time}
    if num_frames is not None:
        args["num_frames"] = num_frames
    call = P.ToolCall(P.TOOL_NAME, args)
    call.raw = call.to_text()
    cfg = settings.episode_config(mode="inline" if models is None else "parallel",
                                  subagent_sees_question=bool(question))
    reader = await open_video(settings, video_path, stop)
    t0 = time.perf_counter()
    try:
        backend = None
        if models is not None:
            try:
                P.crop_args(call, reader.duration)  # what dispatch checks first: a bad window loads no model
            except P.ToolCallError as e:
                raise ToolInputError(str(e)) from None
            backend = await models.get()
        subs, responses = await dispatch_calls(backend, reader, P.Turn(text=call.raw, calls=[call]), 0, cfg,
                                               question or "", lambda: time.perf_counter() - t0, lambda n, p: None)
    finally:
        reader.close()
    sub = subs[0]
    if sub.status != "ok":
        raise ToolInputError(sub.error or "the call failed")
    # inline: [<tool_response> text, (timestamp, frame) per frame, </tool_response>]: the frames as sent
    parts = responses[0][1:-1] if backend is None else []
    return Window(video=str(reader.path), duration=reader.duration, start=sub.start, end=sub.end,
                  frame_times=sub.frame_times, parts=parts, summary=None if backend is None else sub.response,
                  seconds=sub.finished - sub.started)


async def ask(settings: McpSettings, models: Models, video_path: str, question: str, frames: int | None,
              mode: str | None, stop: threading.Event, question_type: str = "auto"):
    """The whole episode (`run_episode`) on the named video; returns the Episode."""
    from paravt.agent import run_episode
    from paravt.ask import question_type_of

    if not isinstance(question, str) or not question.strip():
        raise ToolInputError("the question is empty")
    k = settings.frames if frames is None else frames
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= settings.max_frames:
        raise ToolInputError(f"frames must be a whole number from 1 to {settings.max_frames}, got {k!r}")
    mode = mode or settings.mode
    if mode not in MODES:
        raise ToolInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        qtype = question_type_of(question, question_type)
    except ValueError as e:
        raise ToolInputError(str(e)) from None
    reader = await open_video(settings, video_path, stop)
    try:
        backend = await models.get()
        from paravt.backends.base import BackendError

        try:
            return await run_episode(backend, reader, question, settings.episode_config(mode=mode, frames=k),
                                     question_type=qtype)
        except BackendError as e:
            raise ToolInputError(f"the model failed: {e}") from None
        except Exception as e:  # noqa: BLE001 - the video failing mid-episode (VideoError) is the caller's to read
            raise _video_error(e) from None
    finally:
        reader.close()


def episode_summary(ep) -> dict[str, Any]:
    """An episode as structured content: the answer, then every main turn's calls with each
    window, its status and its sub-agent's summary (or error); no prompts, no tokens, no pixels."""
    turns = []
    for t in ep.turns:
        turns.append({
            "turn": t.index, "think": t.parsed.get("think"), "forced_answer": t.forced_answer,
            "calls": [{"start": c.start, "end": c.end, "status": c.status, "frame_times": c.frame_times,
                       "summary": c.response if c.status == "ok" else None, "error": c.error} for c in t.calls],
        })
    return {"answer": ep.answer, "question_type": ep.question_type, "mode": ep.config.mode,
            "frames": len(ep.overview_times), "duration": round(ep.duration, 3), "error": ep.error,
            "n_executed_calls": ep.n_executed_calls, "wall_time": round(ep.wall_time, 3), "turns": turns}
