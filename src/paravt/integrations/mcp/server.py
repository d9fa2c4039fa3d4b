"""The MCP server on the official `mcp` SDK 2.x (MCPServer): the three tools, the stdio transport,
and the process's start and end (`run`). HTTP: paravt.integrations.mcp.web.

Both protocol eras are served, on either transport (the SDK decides each connection by its first
request): the `initialize` handshake that mcp 1.x clients open with (lmms-eval 0.7.3's; versions
2024-11-05 to 2025-11-25) and 2026-07-28's `server/discover`. Each tool answers a call that goes wrong
(a path outside the media root, a window outside the video, an unreadable file, a model that fails,
the deadline) with a tool error, `is_error` and one line of text ("Error executing tool crop_video:
..."), the form lmms-eval's LongVT example server gives too; the server goes on.

The end: when stdin closes (stdio), the calls running are stopped (their reads end at the next
packet, `tools.within`), the model client is closed, and the process exits without waiting for a
thread the kernel still holds (a read of a stalled URL, an open of a FIFO): an MCP server must not
outlive its client. Over HTTP a signal stops it: uvicorn cancels the requests still running after
`web.SHUTDOWN_S`, and the signal, raised again, ends the process.
"""

# no `from __future__ import annotations`: MCPServer reads the tools' annotations, which name locals
import base64
import io
import logging
import os
import sys
from typing import Annotated, Any, Literal, Optional

import numpy as np

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import Field

from paravt import __version__
from paravt import protocol as P
from paravt.integrations.mcp import wire
from paravt.integrations.mcp.settings import McpSettings, ToolInputError
from paravt.integrations.mcp.tools import Models, Window, ask, episode_summary, run_window, within

INSTRUCTIONS = (
    "Tools for long videos. crop_video returns the frames of one time window (1 frame per second, at most "
    f"{P.MAX_CALL_FRAMES}, each labelled with its time). watch_window has a helper model watch one window and "
    "summarise it, so the frames stay out of your context; call it for several windows at once. ask_video runs "
    "paravt's whole parallel episode (overview frames, several windows watched by helpers) and returns its "
    "answer. Videos are files under the server's media root (absolute paths inside it, or relative to it)."
)

VideoPath = Annotated[str, Field(description="Path to the video file (under the server's media root)")]
Start = Annotated[float, Field(description="Start time in seconds")]
End = Annotated[float, Field(description="End time in seconds, must be > start_time")]


def png(image: "np.ndarray") -> str:
    """A frame (HxWx3 uint8) as base64 PNG: lossless, and the type lmms-eval labels every image as."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=1)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def window_text(w: Window, what: str) -> str:
    return (f"{what} {w.start:.1f}-{w.end:.1f} s of {os.path.basename(w.video)} (the video lasts {w.duration:.1f} s; "
            f"{len(w.frame_times)} frames at " + ", ".join(f"{t:.1f}" for t in w.frame_times) + " s)")


def crop_result(w: Window) -> CallToolResult:
    """The frames as a sub-agent sees them: each frame's time as text, then the frame."""
    content: list = [TextContent(type="text", text=window_text(w, "Frames of"))]
    for part in w.parts:
        if part.type == "text":
            content.append(TextContent(type="text", text=part.text))
        else:
            content.append(ImageContent(type="image", data=png(part.image), mime_type="image/png"))
    return CallToolResult(content=content, structured_content=w.info())


class ParavtMCP(MCPServer):
    """MCPServer whose tool errors are one line naming the tool: an argument error ("end_time: Field
    required") instead of pydantic's multi-line report, a ToolInputError's own text (the SDK withholds
    the text of any exception but its ToolError), and a call holding a lone surrogate refused before
    it runs (its text could never be written back)."""

    video: Optional[str] = None  # McpSettings.video: the file every call reads

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        from pydantic import ValidationError

        bad = wire.lone_surrogate({"name": name, "arguments": arguments}, "the call")
        if bad is not None:
            raise ToolError(f"Error executing tool {ascii(name)[1:-1]}: {bad}")
        if self.video is not None and isinstance(arguments, dict):
            arguments = {**arguments, "video_path": self.video}
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            if isinstance(e.__cause__, ToolInputError):
                raise ToolError(f"Error executing tool {name}: {e.__cause__}") from None
            if not isinstance(e.__cause__, ValidationError):
                raise
            why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}"
                            for err in e.__cause__.errors())
            raise ToolError(f"Error executing tool {name}: {why}") from None


def build_server(settings: McpSettings, models: Models | None = None) -> MCPServer:
    """The server whose tools run under `settings` (watch_window and ask_video on `models`' backend)."""
    server = ParavtMCP("paravt", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    server.video = settings.video
    models = models or Models(settings)

    @server.tool(name="crop_video", description=(
        f"Crop a video to a time window: its frames (1 per second, at most {P.MAX_CALL_FRAMES}, spread evenly over "
        "longer windows; the end is clamped to the video's end), each after a text with its time in seconds."))
    async def crop_video(video_path: VideoPath, start_time: Start, end_time: End,
                         num_frames: Annotated[Optional[int], Field(description="Optional number of frames to sample "
                                               f"from the window (1-{P.MAX_CALL_FRAMES})")] = None) -> CallToolResult:
        w = await within(settings, "crop_video", lambda stop: run_window(settings, video_path, start_time, end_time,
                                                                         stop, num_frames=num_frames))
        return crop_result(w)

    @server.tool(name="watch_window", description=(
        "A helper model watches one time window of a video (1 frame per second, at most "
        f"{P.MAX_CALL_FRAMES}) with the question in mind and returns a short factual summary of what appears and "
        "when. Several calls at once are watched side by side."))
    async def watch_window(video_path: VideoPath, start_time: Start, end_time: End,
                           question: Annotated[str, Field(description="What to look for (the question being "
                                                          "answered)")] = "") -> CallToolResult:
        w = await within(settings, "watch_window", lambda stop: run_window(
            settings, video_path, start_time, end_time, stop, question=question, models=models))
        return CallToolResult(content=[TextContent(type="text", text=window_text(w, "Summary of") + ":\n"
                                                   + (w.summary or ""))], structured_content=w.info())

    @server.tool(name="ask_video", description=(
        "Answer a question about a video with paravt's parallel episode: the model sees overview frames, has "
        "helpers watch several windows at once, and answers. Returns the answer, and every window watched with "
        "its summary. For a multiple-choice question put the options in it as 'A. ...' lines."))
    async def ask_video(video_path: VideoPath,
                        question: Annotated[str, Field(description="The question")],
                        frames: Annotated[Optional[int], Field(description="Overview frames K (default: the "
                                                               f"server's, {settings.frames})")] = None,
                        mode: Annotated[Optional[Literal["parallel", "sequential", "inline", "none"]], Field(
                            description=f"How crops run (default: {settings.mode})")] = None) -> CallToolResult:
        ep = await within(settings, "ask_video", lambda stop: ask(settings, models, video_path, question, frames, mode,
                                                                  stop))
        info = episode_summary(ep)
        lines = [f"Answer: {ep.answer if ep.answer is not None else '(none)'}"]
        if ep.error:
            lines.append(f"Error: {ep.error}")
        for t in info["turns"]:
            for c in t["calls"]:
                span = f"{c['start']:.1f}-{c['end']:.1f} s" if c["start"] is not None else "?"
                lines.append(f"turn {t['turn'] + 1}, window {span}: " + (c["summary"] or f"error: {c['error']}"))
        return CallToolResult(content=[TextContent(type="text", text="\n".join(lines))], structured_content=info)

    return server


async def serve_stdio(server: MCPServer) -> None:
    """stdio as the SDK serves it (the protocol on private descriptors: a print or a library's progress
    line lands on stderr, not in the JSON-RPC stream), with the lines its parser refuses that are
    requests answered (`wire.AnsweringReads`: a lone surrogate) instead of dropped unanswered."""
    from mcp.server.stdio import stdio_server

    low = server._lowlevel_server  # what MCPServer.run_stdio_async serves, on a read stream of ours
    async with stdio_server() as (read, write):
        await low.run(wire.AnsweringReads(read, write), write, low.create_initialization_options())


def one_line_logging(level: int = logging.WARNING) -> None:
    """Every log record as one line on stderr, the exception's type and text at its end, in place of the
    SDK's rich tracebacks (a traceback per dropped connection, rendered on the event loop, once froze
    the server for a minute). Set before the SDK's own, which then adds none."""

    class OneLine(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            line = f"paravt mcp: {record.levelname.lower()}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                e = record.exc_info[1]
                line += f" ({type(e).__name__}: {e})"
            return line.replace("\n", " ")[:2000]

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    logging.basicConfig(level=level, handlers=[handler], force=True)


def run(settings: McpSettings, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765,
        allowed_origins: tuple[str, ...] = ()) -> None:
    """Serve until the client goes away (stdio: stdin closes) or until stopped (http), then exit."""
    import anyio

    from paravt.integrations.mcp import web

    if transport not in ("stdio", "http"):
        raise ValueError(f"transport must be stdio or http, got {transport!r}")
    if transport == "http":
        web.check_http_options(host, allowed_origins)
    one_line_logging()
    models = Models(settings)
    server = build_server(settings, models)
    if transport == "http":
        app = web.http_app(server, True, allowed_origins)
        print(f"paravt mcp: streamable HTTP at http://{host}:{port}{web.MCP_PATH}", file=sys.stderr, flush=True)

    async def main() -> None:
        status = 1
        try:
            await (serve_stdio(server) if transport == "stdio" else web.serve(app, host, port))
            status = 0
        except SystemExit as e:  # uvicorn's, e.g. when the port is taken (it has said why)
            status = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - said, then the same end as any other
            logging.getLogger("paravt.mcp").exception("the server failed")
        finally:
            with anyio.move_on_after(5, shield=True):
                await models.aclose()
            leave(status)

    anyio.run(main)


def leave(status: int) -> None:
    """End the process now: output flushed, no thread waited for. A tool call's thread that still
    runs has been told to stop (its reads end at the next packet), but one the kernel holds (a
    read of a stalled URL, an open of a FIFO) would keep Python's exit waiting forever."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def main(settings: dict[str, Any] | None = None) -> None:
    """Entry point of a written server script (`paravt mcp --write-script`): stdio, bound to `settings`."""
    run(McpSettings.from_dict(settings or {}))
