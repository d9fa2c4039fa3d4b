"""ParaVT-Parquet RL rows, shared by training and evaluation.

A row: `prompt` (list of {role, content}; the user text holds a `<video>` placeholder),
`videos` (list of {"video": path relative to a video root}), `extra_info` (JSON string or
dict with `answer` and `question_type`). SynthVT writes exactly this format, so the same
loader reads SynthVT and the real training data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

QUESTION_TYPES = ("mcq", "tvg", "oe")
VIDEO_PLACEHOLDER = "<video>"


class DataError(ValueError):
    """A data file that does not follow the expected row format; the message names the row."""


@dataclass
class RLSample:
    id: str
    video: str  # path: absolute when the row's path is, else under the video root
    question: str  # the user text without the <video> placeholder
    answer: str
    question_type: str  # mcq | tvg | oe
    extra: dict = field(default_factory=dict)  # the whole extra_info
    # the row's own system prompt, when it has one (kept: the official profile appends its tool block to it)
    system: str | None = None


def _json(value, what: str):
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{what} is not valid JSON ({e})") from None
    return value


def _text_of(role: str, prompt: list) -> str | None:
    """The text of the first message with `role` (OpenAI-style parts: the text ones joined)."""
    for m in prompt:
        if isinstance(m, dict) and m.get("role") == role:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise DataError(f"the {role} message has no text content")
            return content
    return None


def _messages(prompt) -> tuple[str | None, str]:
    """(system prompt or None, user text) of a row's `prompt`."""
    prompt = _json(prompt, "prompt")
    if not isinstance(prompt, list) or not prompt:
        raise DataError("prompt must be a non-empty list of {role, content}")
    user = _text_of("user", prompt)
    if user is None:
        raise DataError("prompt has no user message")
    system = _text_of("system", prompt)
    return (system if system and system.strip() else None), user


def _video(videos) -> str:
    videos = _json(videos, "videos")
    if not isinstance(videos, list) or not videos:
        raise DataError("videos must be a non-empty list of {\"video\": path}")
    v = videos[0]
    path = v.get("video") if isinstance(v, dict) else v
    if not isinstance(path, str) or not path:
        raise DataError(f"videos[0] has no video path: {v!r}")
    return path


def load_rl_rows(parquet_path: str | Path, video_root: str | Path | None = None) -> list[RLSample]:
    """Every row of a ParaVT-Parquet RL file. Relative video paths resolve under `video_root`
    (default: the parquet's directory). Raises DataError naming the file and row on a bad row."""
    import pyarrow.parquet as pq

    parquet_path = Path(parquet_path)
    if not parquet_path.is_file():
        raise DataError(f"{parquet_path}: no such file")
    root = Path(video_root) if video_root is not None else parquet_path.parent
    try:
        rows = pq.read_table(parquet_path).to_pylist()
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-parquet files
        raise DataError(f"{parquet_path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    out = []
    for i, r in enumerate(rows):
        try:
            for col in ("prompt", "videos", "extra_info"):
                if col not in r:
                    raise DataError(f"missing column {col!r}")
            extra = _json(r["extra_info"], "extra_info")
            if not isinstance(extra, dict):
                raise DataError("extra_info must be a dict or a JSON object")
            for key in ("answer", "question_type"):
                if key not in extra:
                    raise DataError(f"extra_info has no {key!r}")
            qtype = str(extra["question_type"])
            if qtype not in QUESTION_TYPES:
                raise DataError(f"question_type must be one of {QUESTION_TYPES}, got {qtype!r}")
            video = _video(r["videos"])
            system, user = _messages(r["prompt"])
            text = user.replace(VIDEO_PLACEHOLDER, "").strip()
        except DataError as e:
            raise DataError(f"{parquet_path} row {i}: not a ParaVT-Parquet RL row: {e}") from None
        vpath = Path(video)
        out.append(RLSample(id=str(extra.get("id", r.get("id", i))),
                            video=str(vpath if vpath.is_absolute() else root / vpath),
                            question=text, answer=str(extra["answer"]), question_type=qtype, extra=extra,
                            system=system))
    return out
