"""Caption rows: a warm-up SFT stage that teaches a from-scratch tiny model to see.

Learning perception only through long agentic trajectories is too slow on a CPU: a 1,000-token
main row carries a handful of answer tokens that depend on the pixels, and after an epoch the
tiny model's predictions did not change when its frames were blanked. These rows are
LLaVA-style alignment data: 1-3 timestamped frames and a one-sentence description, written with
the same wording the sub-agent summaries use (`questions.describe_frames`), so what is learned
here is what the crops need. About 40 tokens a row, so thousands of rows fit in minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paravt import protocol as P
from paravt.synth.questions import describe_frames
from paravt.synth.render import VideoSpec

CAPTION_PROMPT = "Describe briefly what these frames show."


def caption_rows(spec: VideoSpec, video: str, video_id: str, rng: np.random.Generator, n: int) -> list[dict]:
    """`n` rows for one video; half of the first frames fall inside an event so shapes are common."""
    grid = np.arange(0.0, spec.duration - 0.25, 1.0 / spec.fps)  # the video's frame times
    inside = [t for t in grid if spec.events_at(float(t))]
    rows = []
    for j in range(n):
        k = int(rng.integers(1, 4))
        pool = inside if inside and j % 2 == 0 else list(grid)
        first = float(pool[int(rng.integers(len(pool)))])
        times = sorted({first, *(float(grid[int(rng.integers(len(grid)))]) for _ in range(k - 1))})
        content: list[dict] = []
        for t in times:
            content += [{"type": "text", "text": P.timestamp_text(t)}, {"type": "frame", "time": t}]
        content.append({"type": "text", "text": "\n" + CAPTION_PROMPT})
        caption = describe_frames(spec, times)
        rows.append({"id": f"{video_id}-c{j}", "kind": "caption", "video": video, "question_type": "oe",
                     "answer": caption, "question_id": f"{video_id}-c{j}", "k": len(times),
                     "messages": json.dumps([{"role": "user", "content": content},
                                             {"role": "assistant", "content": [{"type": "text", "text": caption}]}])})
    return rows


def write_captions(split_dir: str | Path, per_video: int = 8, seed: int = 0) -> Path:
    """captions.parquet beside a split's sft.parquet, from its annotations.jsonl (no re-rendering)."""
    from paravt.synth.dataset import _write_parquet

    split_dir = Path(split_dir)
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for line in (split_dir / "annotations.jsonl").read_text().splitlines():
        if line.strip():
            a = json.loads(line)
            rows += caption_rows(VideoSpec.from_dict(a), a["video"], a["video_id"], rng, per_video)
    out = split_dir / "captions.parquet"
    _write_parquet(out, rows)
    return out
