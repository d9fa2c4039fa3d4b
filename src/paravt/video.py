"""Video frames for the episode: overview(K), crop(start, end), resized to a pixel budget.

Decoder choice: PyAV. It ships FFmpeg inside its wheels (nothing to install on the host),
exposes keyframe seeking and pts directly, and releases the GIL while decoding so the
thread pool below overlaps crops. torchcodec needs host FFmpeg shared libraries and a
release pinned to the exact torch version; see benchmarks/bench_video.py for the
figures that went into this choice (they are quoted in the project notes).

Timestamps come from pts * time_base, never index / fps, so variable-frame-rate files
return the frames nearest the requested times.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_PIXELS = 50176  # 224 * 224
MIN_PIXELS = 784  # 28 * 28
FACTOR = 32  # Qwen3-VL: patch 16 x spatial merge 2


class VideoError(Exception):
    """A video that cannot be read, or a request outside it. The message names the file."""


@dataclass
class VideoInfo:
    duration: float
    fps: float
    num_frames: int
    width: int
    height: int


@dataclass
class Frame:
    image: np.ndarray  # H x W x 3, uint8, RGB, already resized
    timestamp: float  # seconds, of the decoded frame (not the requested time)


def resize_to_budget(
    height: int, width: int, max_pixels: int = MAX_PIXELS, min_pixels: int = MIN_PIXELS, factor: int = FACTOR
) -> tuple[int, int]:
    """Sides that are multiples of `factor`, keep the aspect ratio and fit the pixel budget."""
    if height <= 0 or width <= 0:
        raise ValueError(f"bad frame size {width}x{height}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def overview_times(duration: float, k: int) -> list[float]:
    """Middle of each of k equal segments: uniform cover without the first/last-frame bias."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [(i + 0.5) * duration / k for i in range(k)]


def sample_times(
    start: float,
    end: float,
    fps: float = 1.0,
    max_frames: int = 16,
    num_frames: int | None = None,
    duration: float | None = None,
) -> list[float]:
    """Timestamps of a crop: `fps` frames per second of the window, at least 1 frame,
    at most `max_frames` (or `num_frames` when given and not larger)."""
    if duration is not None:
        if start >= duration:
            raise ValueError(f"start {start:.2f}s is at or after the end of the video ({duration:.2f}s)")
        end = min(end, duration)
    if start < 0:
        raise ValueError(f"start {start:.2f}s is negative")
    if start >= end:
        raise ValueError(f"start {start:.2f}s must be before end {end:.2f}s")
    if num_frames is not None and num_frames >= 1:
        n = min(int(num_frames), max_frames)
    else:
        n = int(math.floor((end - start) * fps))
        n = max(1, min(n, max_frames))
    step = (end - start) / n
    return [start + (i + 0.5) * step for i in range(n)]


class VideoReader:
    """Reads frames at timestamps. Thread-safe: one decoder per thread, opened lazily."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_pixels: int = MAX_PIXELS,
        min_pixels: int = MIN_PIXELS,
        factor: int = FACTOR,
    ) -> None:
        self.path = Path(path)
        self.max_pixels = max_pixels
        self.min_pixels = min_pixels
        self.factor = factor
        self._local = threading.local()
        self._containers: list = []
        self._lock = threading.Lock()
        self._check_file()
        self._info = self._probe()

    # ---------- opening and probing ----------
    def _check_file(self) -> None:
        if not self.path.exists():
            raise VideoError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise VideoError(f"{self.path}: is a directory, not a video file")
        if self.path.stat().st_size == 0:
            raise VideoError(f"{self.path}: file is empty (0 bytes)")

    def _open(self):
        import av

        try:
            container = av.open(str(self.path), mode="r")
        except Exception as e:  # av.error.* (InvalidDataError, ...), OSError
            raise VideoError(f"{self.path}: not a readable video ({type(e).__name__}: {e})") from None
        if not container.streams.video:
            container.close()
            raise VideoError(f"{self.path}: has no video stream (audio-only or data file)")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return container

    def _container(self):
        c = getattr(self._local, "container", None)
        if c is None:
            c = self._open()
            self._local.container = c
            with self._lock:
                self._containers.append(c)
        return c

    def _probe(self) -> VideoInfo:
        c = self._container()
        s = c.streams.video[0]
        fps = float(s.average_rate or s.guessed_rate or 0) or 0.0
        duration = None
        if s.duration is not None and s.time_base is not None:
            duration = float(s.duration * s.time_base)
        elif c.duration is not None:
            duration = c.duration / 1_000_000
        start = float(s.start_time * s.time_base) if s.start_time is not None and s.time_base else 0.0
        num_frames = int(s.frames or 0)
        # Demux packet timestamps (cheap, no decoding) to check the file holds frames and
        # that its stated duration is real: a truncated file states more than it has.
        # Only the tail is read when a duration is stated (a long file is not scanned whole).
        last_pts, count = None, 0
        try:
            for tail_from in ([duration - 10.0, None] if duration else [None]):
                if tail_from is not None:
                    c.seek(int(max(tail_from, 0.0) / float(s.time_base)), stream=s, backward=True, any_frame=False)
                else:
                    c.seek(0, stream=s, backward=True, any_frame=False) if duration else None
                for packet in c.demux(s):
                    if packet.pts is not None:
                        t = float(packet.pts * s.time_base)
                        last_pts = t if last_pts is None else max(last_pts, t)
                        count += 1
                if count:
                    break
        except Exception as e:
            raise VideoError(f"{self.path}: corrupt or truncated video ({type(e).__name__}: {e})") from None
        if count == 0:
            raise VideoError(f"{self.path}: video stream holds no frames (truncated or empty)")
        frame_dur = 1.0 / fps if fps > 0 else 0.0
        measured = last_pts - start + frame_dur
        if duration is None or duration <= 0 or measured < duration - 2 * frame_dur:
            duration = measured
        if fps <= 0:
            fps = 25.0  # unknown rate: timestamps still come from pts, fps only sets the crop gap
        self._start = start
        self._keyframe_sparse = None
        w, h = s.codec_context.width, s.codec_context.height
        if not w or not h:
            raise VideoError(f"{self.path}: video stream has no frame size")
        return VideoInfo(duration=duration, fps=fps, num_frames=num_frames or int(round(duration * fps)), width=w, height=h)

    def probe(self) -> VideoInfo:
        return self._info

    @property
    def duration(self) -> float:
        return self._info.duration

    @property
    def frame_size(self) -> tuple[int, int]:
        """(height, width) of returned frames."""
        return resize_to_budget(self._info.height, self._info.width, self.max_pixels, self.min_pixels, self.factor)

    # ---------- decoding ----------
    def frames_at(self, timestamps: list[float]) -> list[Frame]:
        """The decoded frames nearest each requested time, in request order.

        Seeks to the keyframe before each run of targets and decodes forward; targets close
        together (within a few seconds) share one forward pass instead of re-seeking.
        """
        if not timestamps:
            return []
        d = self._info.duration
        for t in timestamps:
            if not (0 <= t <= d + 1e-6) or math.isnan(t):
                raise VideoError(f"{self.path}: time {t:.2f}s is outside the video (0–{d:.2f}s)")
        order = sorted(range(len(timestamps)), key=lambda i: timestamps[i])
        wanted = [timestamps[i] + self._start for i in order]
        found = self._decode_nearest(wanted)
        out: list[Frame | None] = [None] * len(timestamps)
        h, w = self.frame_size
        for j, i in enumerate(order):
            frame, ts = found[j]
            img = frame.to_ndarray(format="rgb24", width=w, height=h, interpolation="BILINEAR")
            out[i] = Frame(image=img, timestamp=round(ts - self._start, 6))
        return out  # type: ignore[return-value]

    def _decode_nearest(self, wanted: list[float]):
        """For sorted target times: (frame, time) of the decoded frame nearest each."""
        c = self._container()
        s = c.streams.video[0]
        tb = float(s.time_base)
        gap = max(2.0, 4.0 / max(self._info.fps, 1e-6))  # re-seek only past this gap
        results: list = []
        i = 0
        try:
            while i < len(wanted):
                target = wanted[i]
                c.seek(int(max(target - 1e-3, 0) / tb), stream=s, backward=True, any_frame=False)
                prev = None  # (frame, t)
                resolved_here = False
                for frame in c.decode(s):
                    if frame.pts is None:
                        continue
                    t = frame.pts * tb
                    # resolve every target that this frame passes
                    while i < len(wanted) and t >= wanted[i]:
                        if prev is not None and abs(prev[1] - wanted[i]) <= abs(t - wanted[i]):
                            results.append(prev)
                        else:
                            results.append((frame, t))
                        i += 1
                        resolved_here = True
                    if i >= len(wanted):
                        break
                    prev = (frame, t)
                    # next target far ahead: seek instead of decoding through (only after this
                    # seek served a target, so a target past a long GOP still gets reached)
                    if resolved_here and wanted[i] - t > gap:
                        break
                else:
                    # end of stream: remaining targets get the last frame
                    while i < len(wanted):
                        if prev is None:
                            raise VideoError(f"{self.path}: no frame decodable near {wanted[i] - self._start:.2f}s")
                        results.append(prev)
                        i += 1
        except VideoError:
            raise
        except Exception as e:  # decoder errors in a damaged file
            raise VideoError(f"{self.path}: decode failed ({type(e).__name__}: {e})") from None
        return results

    def overview(self, k: int) -> list[Frame]:
        return self.frames_at(overview_times(self._info.duration, k))

    def crop(
        self, start: float, end: float, fps: float = 1.0, max_frames: int = 16, num_frames: int | None = None
    ) -> list[Frame]:
        try:
            times = sample_times(start, end, fps, max_frames, num_frames, duration=self._info.duration)
        except ValueError as e:
            raise VideoError(f"{self.path}: bad crop [{start}, {end}]: {e}") from None
        return self.frames_at(times)

    # ---------- async: decoding runs on a bounded pool, never on the event loop ----------
    async def aframes_at(self, timestamps: list[float]) -> list[Frame]:
        return await asyncio.get_running_loop().run_in_executor(_pool(), self.frames_at, timestamps)

    async def aoverview(self, k: int) -> list[Frame]:
        return await asyncio.get_running_loop().run_in_executor(_pool(), self.overview, k)

    async def acrop(
        self, start: float, end: float, fps: float = 1.0, max_frames: int = 16, num_frames: int | None = None
    ) -> list[Frame]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_pool(), lambda: self.crop(start, end, fps, max_frames, num_frames))

    def close(self) -> None:
        with self._lock:
            for c in self._containers:
                try:
                    c.close()
                except Exception:
                    pass
            self._containers.clear()
        self._local = threading.local()

    def __enter__(self) -> "VideoReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self._info
        return f"VideoReader({str(self.path)!r}, {i.duration:.1f}s, {i.width}x{i.height}@{i.fps:.2f})"


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One process-wide decode pool, bounded so many concurrent crops do not oversubscribe cores."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = int(os.environ.get("PARAVT_DECODE_WORKERS", max(2, min(8, (os.cpu_count() or 2)))))
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="paravt-decode")
        return _POOL
