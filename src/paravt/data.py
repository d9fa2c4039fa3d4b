"""ParaVT-Parquet RL rows (SPEC §4), shared by training and evaluation.

A row: `prompt` (list of {role, content}; the user text holds a `<video>` placeholder),
`videos` (list of {"video": path relative to a video root}), `extra_info` (JSON string or
dict with `answer` and `question_type`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """A data file that does not follow the expected row format; the message names the row."""


@dataclass
class RLSample:
    id: str
    video: str  # absolute path
    question: str  # the user text without the <video> placeholder
    answer: str
    question_type: str
    extra: dict = field(default_factory=dict)


def _user_text(prompt) -> str:
    for m in prompt:
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content)
    raise DataError("prompt has no user message")


def load_rl_rows(parquet_path: str | Path, video_root: str | Path | None = None) -> list[RLSample]:
    import pyarrow.parquet as pq

    parquet_path = Path(parquet_path)
    root = Path(video_root) if video_root is not None else parquet_path.parent
    rows = pq.read_table(parquet_path).to_pylist()
    out = []
    for i, r in enumerate(rows):
        try:
            extra = r["extra_info"]
            extra = json.loads(extra) if isinstance(extra, str) else dict(extra)
            videos = r["videos"]
            video = videos[0]["video"] if isinstance(videos[0], dict) else str(videos[0])
            text = _user_text(r["prompt"]).replace("<video>", "").strip()
            qtype = extra["question_type"]
            answer = extra["answer"]
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
            raise DataError(f"{parquet_path} row {i}: not a ParaVT-Parquet RL row ({type(e).__name__}: {e})") from None
        vpath = Path(video)
        out.append(RLSample(id=str(extra.get("id", r.get("id", i))), video=str(vpath if vpath.is_absolute() else root / vpath),
                            question=text, answer=str(answer), question_type=str(qtype), extra=extra))
    return out
