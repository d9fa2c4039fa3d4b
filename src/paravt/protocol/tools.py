"""The crop_video tool: its schema, a call (ToolCall), its checked arguments (crop_args; a time may
be written as seconds, MM:SS or '1m30s'), and the text of calls and responses as the model reads them."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from paravt.protocol.tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN

TOOL_NAME = "crop_video"
MAX_CALL_FRAMES = 16  # a sub-agent sees at most this many frames of its window (sampled at 1 fps up to this)

CROP_VIDEO_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Look closely at one time window of the video. A helper watches the window at one frame per "
            f"second (at most {MAX_CALL_FRAMES} frames, spread evenly over longer windows) and replies with "
            "a short factual summary of what appears and when."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "start_time": {"type": "number", "description": "Window start, in seconds from the beginning of the video."},
                "end_time": {"type": "number", "description": "Window end, in seconds; must be after start_time."},
                "num_frames": {
                    "type": "integer",
                    "description": f"Optional number of frames to sample from the window (1-{MAX_CALL_FRAMES}).",
                },
            },
            "required": ["start_time", "end_time"],
        },
    },
}
# Deliberately no `video_path` parameter: the episode's own video is always the one cropped (a model
# must never choose a file on the host).


@dataclass
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""

    def to_text(self) -> str:
        """The canonical Hermes block, as the chat templates of Qwen-family models write it."""
        body = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


class ToolCallError(ValueError):
    """A tool call that cannot be executed; the message is written for the model to read."""


@dataclass
class CropArgs:
    start: float
    end: float
    num_frames: int | None = None


_CLOCK_RE = re.compile(r"^(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_UNITS_RE = re.compile(
    r"^(?:(\d+(?:\.\d+)?)\s*h(?:ours?|rs?)?)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in(?:utes?)?)?)?\s*"
    r"(?:(\d+(?:\.\d+)?)\s*s(?:ec(?:ond)?s?)?)?$"
)


def parse_seconds(value) -> float:
    """Seconds from a number, a numeric string, 'MM:SS', 'HH:MM:SS', '75s', '1m30s' or '2 min'."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ToolCallError(f"a time must be a number of seconds, got {value!r}")
    if isinstance(value, str):
        s = value.strip().lower()
        m = _CLOCK_RE.match(s)
        u = _UNITS_RE.match(s) if s and not m else None
        if m:
            h, mnt, sec = m.groups()
            v = int(h or 0) * 3600 + int(mnt) * 60 + float(sec)
        elif u and any(u.groups()):
            h, mnt, sec = (float(x) if x else 0.0 for x in u.groups())
            v = h * 3600 + mnt * 60 + sec
        else:
            try:
                v = float(s)
            except ValueError:
                raise ToolCallError(f"cannot read {value!r} as a time in seconds") from None
    else:
        v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ToolCallError(f"a time must be a finite number of seconds, got {value!r}")
    return v


def crop_args(call: ToolCall, duration: float | None = None) -> CropArgs:
    """Validated arguments of a crop_video call; the end is clamped to the video's duration.

    Any `video_path` argument is ignored: the episode's own video is always the one cropped
    (a model must never choose a file on the host)."""
    if call.name != TOOL_NAME:
        raise ToolCallError(f"unknown tool {call.name!r}; the only tool is {TOOL_NAME}")
    a = call.arguments if isinstance(call.arguments, dict) else {}
    start_v = a.get("start_time", a.get("start"))
    end_v = a.get("end_time", a.get("end"))
    if start_v is None or end_v is None:
        raise ToolCallError(f"{TOOL_NAME} needs start_time and end_time, in seconds")
    start, end = parse_seconds(start_v), parse_seconds(end_v)
    if start < 0:
        raise ToolCallError(f"start_time {start:g} is negative; times count from 0 seconds")
    if start >= end:
        raise ToolCallError(f"start_time {start:g} must be smaller than end_time {end:g}")
    if duration is not None:
        if start >= duration:
            raise ToolCallError(f"start_time {start:g} is outside the video, which lasts {duration:.1f} seconds")
        end = min(end, duration)
    n = a.get("num_frames")
    num_frames = None
    if n is not None:
        if isinstance(n, bool):
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}")
        try:
            f = float(n)
        except (TypeError, ValueError):
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}") from None
        if not f.is_integer():
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}")
        num_frames = int(f)
        if num_frames < 1:
            raise ToolCallError(f"num_frames must be at least 1, got {num_frames}")
    return CropArgs(start=start, end=end, num_frames=num_frames)


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def format_tool_call(start: float, end: float, num_frames: int | None = None) -> str:
    args: dict = {"start_time": _num(start), "end_time": _num(end)}
    if num_frames is not None:
        args["num_frames"] = int(num_frames)
    return ToolCall(TOOL_NAME, args).to_text()


def format_tool_response(text: str) -> str:
    return f"{TOOL_RESPONSE_OPEN}\n{text.strip()}\n{TOOL_RESPONSE_CLOSE}"


def format_tool_responses(texts: list[str]) -> str:
    """All responses of one turn, in call order, as the content of one user turn."""
    return "\n".join(format_tool_response(t) for t in texts)


def format_error(message: str) -> str:
    """The text a failed call returns (inside its own tool_response): the model reads it."""
    return f"Error: {message.strip()}"


def timestamp_text(t: float) -> str:
    return f"<{t:.1f} seconds>"


def tool_schema(mode: str = "parallel") -> dict:
    """The crop_video schema as a mode presents it: in `inline` mode the call returns the window's
    frames to the main agent itself, in the others a helper's summary (CROP_VIDEO_TOOL)."""
    if mode != "inline":
        return CROP_VIDEO_TOOL
    schema = json.loads(json.dumps(CROP_VIDEO_TOOL))
    schema["function"]["description"] = (
        f"Look closely at one time window of the video: its frames, one per second (at most {MAX_CALL_FRAMES}, "
        "spread evenly over longer windows), each labelled with its time, are shown to you."
    )
    return schema
