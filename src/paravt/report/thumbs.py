"""Small JPEG thumbnails of the overview frames, cut from the run's videos when the report is
written (paravt.video.VideoReader, the reader the episode used, so a thumbnail shows the frame
the model saw at that time). A video that is gone or unreadable gives no thumbnails, never a
failed report. Files are named by the video and the time, so a rerun, or several runs over the
same videos, decode each frame once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

THUMB_PIXELS = 160 * 96  # about 160 x 90 for 16:9: enough to recognise a scene on the time axis
THUMB_FACTOR = 8  # sides rounded to multiples of 8 (the JPEG block), not the model's 32
JPEG_QUALITY = 70
DEFAULT_MAX_THUMBS = 16  # per episode: 16 fit side by side on a page-wide time axis


def pick_times(times: list[float], limit: int) -> list[float]:
    """At most `limit` of the overview times, spread evenly (all of them when they fit): K = 64
    thumbnails on a 1000-pixel axis would be 15 pixels wide each."""
    if limit <= 0:
        return []
    if len(times) <= limit:
        return list(times)
    step = len(times) / limit
    return [times[int(i * step + step / 2)] for i in range(limit)]


def _video_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]


def thumb_name(path: Path, t: float) -> str:
    """The file of the frame at `t` of `path`: changes when the video file does."""
    return f"{_video_key(path)}_{int(round(t * 1000))}.jpg"


@dataclass
class Thumbnails:
    """Thumbnails written so far: (video, time) -> (file name, width, height); videos that failed."""

    made: dict[tuple[Path, float], tuple[str, int, int]] = field(default_factory=dict)
    failed: dict[Path, str] = field(default_factory=dict)

    def for_episode(self, video: Path, times: list[float], prefix: str) -> list[dict]:
        """The episode view's `thumbnails`: [{t, src, w, h}], src relative to the page."""
        out = []
        for t in times:
            got = self.made.get((video, t))
            if got:
                out.append({"t": t, "src": f"{prefix}/{got[0]}", "w": got[1], "h": got[2]})
        return out


def _cached(dest: Path, name: str) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(dest / name) as im:
            return im.size
    except OSError:
        return None


DURATION_SLACK_S = 1.0  # a video whose length differs more from what the episode saw is another video


def _extract_one(video: Path, times: list[float], dest: Path, out: Thumbnails, duration: float | None) -> None:
    from PIL import Image

    from paravt.video import VideoError, VideoReader

    todo = []
    for t in times:
        name = thumb_name(video, t)
        size = _cached(dest, name)
        if size:
            out.made[(video, t)] = (name, *size)
        else:
            todo.append((t, name))
    if not todo:
        return
    try:
        with VideoReader(video, max_pixels=THUMB_PIXELS, factor=THUMB_FACTOR, decoder_threads=1) as reader:
            if duration is not None and abs(reader.duration - duration) > DURATION_SLACK_S:
                # found by a relative path or a name, but not the file the episode read
                out.failed[video] = (f"{video} lasts {reader.duration:.1f} s, the episode's video {duration:.1f} s: "
                                     "not the same video")
                return
            frames = reader.frames_at([t for t, _ in todo])
    except (VideoError, OSError) as e:
        out.failed[video] = str(e)
        return
    for (t, name), f in zip(todo, frames):
        img = Image.fromarray(f.image)
        img.save(dest / name, quality=JPEG_QUALITY)
        out.made[(video, t)] = (name, img.width, img.height)


def extract(wanted: dict[Path, set[float]], dest: Path, progress: bool = False,
            durations: dict[Path, float] | None = None) -> Thumbnails:
    """Write the thumbnails of `wanted` ({video: overview times}) into `dest`, a rich progress bar
    over the videos when `progress` (a large run has thousands). `durations`: each video's length as
    the episodes saw it; a file found under that name with another length gives no thumbnails."""
    dest.mkdir(parents=True, exist_ok=True)
    out = Thumbnails()
    videos = sorted(wanted, key=str)
    durations = durations or {}
    if not progress or not videos:
        for v in videos:
            _extract_one(v, sorted(wanted[v]), dest, out, durations.get(v))
        return out
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("thumbnails"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=True) as bar:
        task = bar.add_task("thumbnails", total=len(videos))
        for v in videos:
            _extract_one(v, sorted(wanted[v]), dest, out, durations.get(v))
            bar.advance(task)
    return out
