"""The MCP server (the official `mcp` SDK's FastMCP): the three tools, stdio and streamable HTTP.

Each tool answers a call that goes wrong (a path outside the media root, a window outside the video,
an unreadable file, a model that fails, the deadline) with a tool error, `isError: true` and one line
of text, as FastMCP reports an exception a tool raises ("Error executing tool crop_video: ..."), the
form lmms-eval's LongVT example server gives too; the server goes on.
"""

# no `from __future__ import annotations`: FastMCP reads the tools' annotations, which name locals
import base64
import io
import os
import sys
from typing import Annotated, Any, Callable, Literal, Optional

import numpy as np

from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import Field

from paravt import protocol as P
from paravt.integrations.mcp.settings import McpSettings
from paravt.integrations.mcp.tools import Models, Window, ask, episode_summary, run_window, within

MCP_PATH = "/mcp"
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
            content.append(ImageContent(type="image", data=png(part.image), mimeType="image/png"))
    return CallToolResult(content=content, structuredContent=w.info())


class ParavtMCP(FastMCP):
    """FastMCP whose argument errors are one line ("end_time: Field required") like every other tool
    error, instead of pydantic's multi-line report."""

    video: Optional[str] = None  # McpSettings.video: the file every call reads

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        from mcp.server.fastmcp.exceptions import ToolError
        from pydantic import ValidationError

        if self.video is not None and isinstance(arguments, dict):
            arguments = {**arguments, "video_path": self.video}
        try:
            return await super().call_tool(name, arguments)
        except ToolError as e:
            if not isinstance(e.__cause__, ValidationError):
                raise
            why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}"
                            for err in e.__cause__.errors())
            raise ToolError(f"Error executing tool {name}: {why}") from None


def build_server(settings: McpSettings, models: Models | None = None, *, host: str = "127.0.0.1",
                 port: int = 8765) -> FastMCP:
    """A FastMCP server whose tools run under `settings` (watch_window and ask_video on `models`'
    backend). Its own DNS-rebinding check is off: the HTTP transport runs behind paravt.webguard's
    (see `http_app`), the one rule of every paravt server."""
    server = ParavtMCP("paravt", instructions=INSTRUCTIONS, host=host, port=port, log_level="WARNING",
                     streamable_http_path=MCP_PATH,
                     transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    server.video = settings.video
    models = models or Models(settings)

    @server.tool(name="crop_video", description=(
        f"Crop a video to a time window: its frames (1 per second, at most {P.MAX_CALL_FRAMES}, spread evenly over "
        "longer windows; the end is clamped to the video's end), each after a text with its time in seconds."))
    async def crop_video(video_path: VideoPath, start_time: Start, end_time: End,
                         num_frames: Annotated[Optional[int], Field(description="Optional number of frames to sample "
                                               f"from the window (1-{P.MAX_CALL_FRAMES})")] = None) -> CallToolResult:
        w = await within(settings, "crop_video", run_window(settings, video_path, start_time, end_time,
                                                            num_frames=num_frames))
        return crop_result(w)

    @server.tool(name="watch_window", description=(
        "A helper model watches one time window of a video (1 frame per second, at most "
        f"{P.MAX_CALL_FRAMES}) with the question in mind and returns a short factual summary of what appears and "
        "when. Several calls at once are watched side by side."))
    async def watch_window(video_path: VideoPath, start_time: Start, end_time: End,
                           question: Annotated[str, Field(description="What to look for (the question being "
                                                          "answered)")] = "") -> CallToolResult:
        w = await within(settings, "watch_window", run_window(settings, video_path, start_time, end_time,
                                                              question=question, models=models))
        return CallToolResult(content=[TextContent(type="text", text=window_text(w, "Summary of") + ":\n"
                                                   + (w.summary or ""))], structuredContent=w.info())

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
        ep = await within(settings, "ask_video", ask(settings, models, video_path, question, frames, mode))
        info = episode_summary(ep)
        lines = [f"Answer: {ep.answer if ep.answer is not None else '(none)'}"]
        if ep.error:
            lines.append(f"Error: {ep.error}")
        for t in info["turns"]:
            for c in t["calls"]:
                span = f"{c['start']:.1f}-{c['end']:.1f} s" if c["start"] is not None else "?"
                lines.append(f"turn {t['turn'] + 1}, window {span}: " + (c["summary"] or f"error: {c['error']}"))
        return CallToolResult(content=[TextContent(type="text", text="\n".join(lines))], structuredContent=info)

    return server


def http_app(server: FastMCP, loopback_only: bool = True, allowed_origins: tuple[str, ...] = ()) -> Callable:
    """The streamable HTTP app behind paravt.webguard's checks, as `paravt serve` and `paravt app`: a
    Host that is not a loopback name (DNS rebinding), a foreign Origin, a POST to /mcp that is not
    JSON are refused before the MCP SDK sees them."""
    from starlette.datastructures import Headers
    from starlette.responses import JSONResponse

    from paravt.webguard import refusal

    inner = server.streamable_http_app()
    origins = tuple(o.rstrip("/") for o in allowed_origins)

    async def guarded(scope, receive, send) -> None:
        if scope["type"] == "http":
            why = refusal(scope["method"], scope["path"].rstrip("/") or "/", Headers(scope=scope), loopback_only,
                          json_paths=(MCP_PATH,), allowed_origins=origins)
            if why is not None:
                await JSONResponse({"error": why[1]}, status_code=why[0])(scope, receive, send)
                return
        await inner(scope, receive, send)

    return guarded


async def _serve_stdio(server: FastMCP) -> None:
    """stdio with the protocol on its own copy of stdout: whatever else writes to stdout (a print, a
    library's progress line) lands on stderr instead of breaking the JSON-RPC stream."""
    import anyio
    from mcp.server.stdio import stdio_server

    proto = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out = anyio.wrap_file(io.TextIOWrapper(os.fdopen(proto, "wb"), encoding="utf-8"))
    low = server._mcp_server  # FastMCP.run_stdio_async's own server object, fed our stdout
    async with stdio_server(stdout=out) as (read, write):
        await low.run(read, write, low.create_initialization_options())


def run(settings: McpSettings, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765,
        allowed_origins: tuple[str, ...] = ()) -> None:
    """Serve until the client goes away (stdio) or until interrupted (http)."""
    import anyio

    from paravt.webguard import is_loopback

    models = Models(settings)
    server = build_server(settings, models, host=host, port=port)
    if transport == "stdio":
        async def main_stdio() -> None:
            try:
                await _serve_stdio(server)
            finally:
                await models.aclose()

        anyio.run(main_stdio)
        return
    if transport != "http":
        raise ValueError(f"transport must be stdio or http, got {transport!r}")
    if not is_loopback(host):
        raise ValueError(f"--host {host}: the MCP server binds a loopback address only (it has no authentication; "
                         "put a proxy that authenticates in front of it to reach it from elsewhere)")
    import uvicorn

    from paravt.webguard import h11_protocol

    print(f"paravt mcp: streamable HTTP at http://{host}:{port}{MCP_PATH}", file=sys.stderr, flush=True)
    uvicorn.run(http_app(server, True, allowed_origins), host=host, port=port, log_level="warning",
                http=h11_protocol())


def main(settings: dict[str, Any] | None = None) -> None:
    """Entry point of a written server script (`paravt mcp --write-script`): stdio, bound to `settings`."""
    run(McpSettings.from_dict(settings or {}))
