"""Video frames for the episode: overview(K), crop(start, end), resized to a pixel budget.

Decoder choice: PyAV (measured against torchcodec; `benchmarks/bench_video.py`, same
30-min 640x360 H.264 file, keyframe every 5 s, frames resized to 288x160, median per op,
on the shared 2-core dev box under load ~7, so compare columns, not absolutes):

    op                 PyAV wall / CPU   torchcodec 0.13 wall / CPU   ffmpeg CLI wall / CPU
    open + probe         24 /   11 ms            -                       195 /   107 ms (ffprobe)
    overview(64)       5349 / 2684 ms    4462 / 2218 ms               20424 / 10193 ms (64 runs)
    overview(8)         703 /  359 ms     568 /  283 ms                2509 /  1264 ms (8 runs)
    crop 10 s @ 1 fps   280 /  180 ms     294 /  146 ms                 520 /   331 ms

The two are within ~20% of each other (both drive FFmpeg's decoder; the work is the
frames from the keyframe to the target). torchcodec does not fit this project: its PyPI
wheels 0.15-0.17 are CUDA builds (`import torchcodec` against torch 2.13+cpu fails with
"OSError: libnvrtc.so.13: cannot open shared object file"), 0.10 fails on ABI
("undefined symbol: _ZN3c1013MessageLoggerC1EPKciib"), and only 0.13.0 happens to load; it
also needs the host's FFmpeg shared libraries. PyAV bundles FFmpeg in its wheel, has no
tie to the torch version, exposes the demuxer's keyframe index (used by the seek policy
below) and per-frame pts, and releases the GIL while decoding, so the thread pool below
overlaps crops.

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
SEEK_COST = 0.5  # s of decoding a seek must skip to be worth it (flush + refill of the decoder)
NO_INDEX_GAP = 2.0  # s; without a demuxer index, re-seek only past this gap


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
    """Sides that are multiples of `factor`, keep the aspect ratio and fit the pixel budget.

    Qwen-VL's smart_resize rule. Written out rather than imported: transformers' copy lives
    in its image-processor modules (seconds to import, torchvision for the fast one) and
    rounds a side under factor/2 to 0; here a side is at least one `factor`.
    """
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
    if math.isnan(start) or math.isnan(end) or math.isinf(start):
        raise ValueError(f"times must be numbers, got start={start}, end={end}")
    if math.isinf(end) and duration is None:
        raise ValueError("an open-ended crop needs the video's duration")
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
        decoder_threads: int = 0,
    ) -> None:
        """Opens and probes now, so a bad file fails here with a VideoError.

        decoder_threads: FFmpeg decoding threads per open decoder (0: FFmpeg picks by core
        count; frame threads cut one crop's latency at about the same CPU); 1 keeps cores
        free when many crops already run side by side on the pool.
        """
        self.path = Path(path)
        self.decoder_threads = decoder_threads
        self.max_pixels = max_pixels
        self.min_pixels = min_pixels
        self.factor = factor
        self._local = threading.local()
        self._containers: list = []
        self._lock = threading.Lock()
        self.frames_decoded = 0  # counter for tests and benchmarks (approximate under threads)
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
        stream.codec_context.thread_count = self.decoder_threads
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
            # tail first; the whole stream only if the tail holds nothing (file cut short)
            for scan_from in ([max(duration - 10.0, 0.0), None] if duration else [None]):
                if scan_from is not None:
                    c.seek(int(scan_from / float(s.time_base)), stream=s, backward=True, any_frame=False)
                elif duration:
                    c.seek(0, stream=s, backward=True, any_frame=False)
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
        w, h = s.codec_context.width, s.codec_context.height
        if not w or not h:
            raise VideoError(f"{self.path}: video stream has no frame size")
        return VideoInfo(duration=duration, fps=fps, num_frames=num_frames or int(round(duration * fps)), width=w, height=h)

    def probe(self) -> VideoInfo:
        """Duration (s), mean fps, frame count and size, measured when the reader opened."""
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
        """The decoded frames nearest each requested time (seconds from the video's start),
        in request order; each Frame carries the decoded frame's own time (pts * time_base).
        The primitive under overview() and crop(); see _decode_nearest for the seek policy.
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

    def _decode_nearest(self, wanted: list[float]) -> list[tuple]:
        """For sorted target times (stream clock): (frame, time) of the decoded frame nearest each.

        One forward pass serves every target it reaches; it breaks off and seeks only when
        the keyframe a seek would land on lies well past the frame just decoded, i.e. when
        seeking skips real work. So sparse targets cost one GOP each, and targets denser
        than keyframes are decoded in one sequential pass, each frame at most once.
        """
        c = self._container()
        s = c.streams.video[0]
        tb = float(s.time_base)
        results: list = []
        i, n = 0, len(wanted)
        try:
            while i < n:
                target = wanted[i]
                # With B-frames a keyframe's pts is after its dts (what the index holds), so a
                # seek can land one keyframe late; step back until the first frame is not after
                # the target.
                back = 0.0
                for _ in range(4):
                    seek_t = max(target - back, self._start)
                    c.seek(round(seek_t / tb), stream=s, backward=True, any_frame=False)
                    frames = c.decode(s)
                    first = next((f for f in frames if f.pts is not None), None)
                    if first is None or first.pts * tb <= target + 1e-9 or seek_t <= self._start:
                        break
                    back = max(1.0, 2 * back)
                if first is None:
                    raise VideoError(f"{self.path}: no frame decodable near {target - self._start:.2f}s")
                prev = None  # (frame, t) of the last frame before the current one
                resolved = False  # a seek is followed by another only after it served a target
                for frame in _chain(first, frames):
                    if frame.pts is None:
                        continue
                    t = frame.pts * tb
                    self.frames_decoded += 1
                    while i < n and t >= wanted[i]:  # resolve every target this frame passes
                        if prev is not None and abs(prev[1] - wanted[i]) <= abs(t - wanted[i]):
                            results.append(prev)
                        else:
                            results.append((frame, t))
                        i += 1
                        resolved = True
                    if i >= n:
                        break
                    prev = (frame, t)
                    if resolved and self._seek_saves_work(t, wanted[i]):
                        break
                else:
                    # end of stream: the remaining targets get the last frame
                    while i < n:
                        results.append(prev)
                        i += 1
        except VideoError:
            raise
        except Exception as e:  # decoder errors in a damaged file
            raise VideoError(f"{self.path}: decode failed ({type(e).__name__}: {e})") from None
        return results

    def _seek_saves_work(self, t: float, target: float) -> bool:
        """Whether seeking for `target` skips more than SEEK_COST seconds of decoding from `t`."""
        if target - t <= SEEK_COST:
            return False
        landing = self._keyframe_before(target)
        if landing is None:  # no demuxer index (e.g. MPEG-TS): assume a keyframe every few seconds
            return target - t > NO_INDEX_GAP
        return landing - t > SEEK_COST

    def _keyframe_before(self, target: float) -> float | None:
        """Time (stream clock) of the keyframe a backward seek to `target` lands on, from the
        demuxer's index (MP4/MKV keep one in memory after opening; nothing is read)."""
        s = self._container().streams.video[0]
        entries = s.index_entries
        if len(entries) == 0:
            return None
        j = entries.search_timestamp(round(target / float(s.time_base)), backward=True)
        if j < 0:
            return self._start
        return float(entries[j].timestamp * s.time_base)

    def overview(self, k: int) -> list[Frame]:
        """k frames spread over the whole video, one from the middle of each of k equal segments."""
        try:
            times = overview_times(self._info.duration, k)
        except ValueError as e:
            raise VideoError(f"{self.path}: bad overview: {e}") from None
        return self.frames_at(times)

    def crop(
        self, start: float, end: float, fps: float = 1.0, max_frames: int = 16, num_frames: int | None = None
    ) -> list[Frame]:
        """Frames of [start, end] at `fps` (>= 1, <= max_frames; see sample_times); end is
        clamped to the duration; start >= end, start >= duration or a negative time is a VideoError."""
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


def _chain(first, rest):
    yield first
    yield from rest


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
