"""VideoReader: a video's frames for the episode: overview(K), crop(start, end), frames_at(times),
resized to a pixel budget, on a bounded decode pool for async callers.

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
tie to the torch version, exposes the demuxer's keyframe index (used by the seek policy,
paravt.video.decode) and per-frame pts, and releases the GIL while decoding, so the thread pool
below overlaps crops.

Where the rest lives: sources (files and URLs), index (the probe, timestamps that jump),
decode (seeking and the nearest frame), passes (damaged data), sampling (which times, what size).

Rotation: a display matrix (phones' portrait clips) is applied, so frames, probe() and
frame_size are in the displayed orientation. So is the sample aspect ratio (anamorphic DVD and
broadcast video): frames are resized to the shape shown, not the stored one (sampling.display_size),
before the rotation turns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from paravt.video.decode import Track, decode_nearest, every_frame
from paravt.video.errors import VideoError
from paravt.video.frames import Frame, VideoInfo
from paravt.video.index import probe, rewind
from paravt.video.passes import Losses
from paravt.video.sampling import (FACTOR, MAX_FRAMES, MAX_PIXELS, MIN_PIXELS, display_size, overview_times,
                                   resize_to_budget, sample_times, share)
from paravt.video.sources import MAX_VIDEO_PIXELS, NET_TIMEOUT_S, Source


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
        timeout_s: float = NET_TIMEOUT_S,
        media_root: str | os.PathLike | None = None,
        max_video_pixels: int = MAX_VIDEO_PIXELS,
        stop: threading.Event | None = None,
    ) -> None:
        """Opens and probes now, so a bad file (or URL) fails here with a VideoError.

        path: a file, or an http(s) URL (kept as the string it is: `path` is then a str).
        decoder_threads: FFmpeg decoding threads per open decoder (0: FFmpeg picks by core
        count; frame threads cut one crop's latency at about the same CPU); 1 keeps cores
        free when many crops already run side by side on the pool.
        timeout_s: deadline of each network operation on a URL (connecting, each read), and of
        each operation on it (the probe, an overview, a crop) as a whole.
        media_root: the file must lie under this folder, as opened (paravt.video.media): a server's
        promise; every decoder reads the descriptor checked, never the name again.
        max_video_pixels: frames larger than this are refused (and no decoder allocates one).
        stop: once set (a caller's deadline passed), every read ends at its next packet (a Stopped error).
        """
        self.source = Source.of(path, timeout_s, decoder_threads, media_root, max_video_pixels, stop)
        self.max_pixels = max_pixels
        self.min_pixels = min_pixels
        self.factor = factor
        self._local = threading.local()
        self._containers: list = []
        self._lock = threading.Lock()
        self._active = 0  # decodes running on the pool: close() waits for them (see close)
        self._closing = False
        self.frames_decoded = 0  # counter for tests and benchmarks (approximate under threads)
        self._overviews: dict = {}  # k -> the concurrent.futures.Future of an overview decoding now
        self._info = self._probe()

    @property
    def path(self) -> Path | str:
        """The file (a Path), or the URL (the str it was given as)."""
        return self.source.path

    @property
    def remote(self) -> bool:
        return self.source.remote

    @property
    def timeout_s(self) -> float:
        return self.source.timeout_s

    @property
    def decoder_threads(self) -> int:
        return self.source.decoder_threads

    # ---------- opening and probing ----------
    def _container(self):
        c = getattr(self._local, "container", None)
        if c is None:
            c = self.source.open()
            self._local.container = c
            with self._lock:
                self._containers.append(c)
        return c

    def _track(self) -> Track:
        """This thread's container, ready to read."""
        c = self._container()
        return Track(self.source, self._index, c, self.source.stream(c), self._count_decoded)

    def _count_decoded(self) -> None:
        self.frames_decoded += 1

    def _probe(self) -> VideoInfo:
        try:
            with self.source.operation():
                return self._probe_info()
        except BaseException:
            self.close()
            raise

    def _probe_info(self) -> VideoInfo:
        c = self._container()
        s = self.source.stream(c)
        self._index, info = probe(self.source, c, s)
        self._turns = self._probe_rotation()
        self.frames_decoded = 0
        if not info.width or not info.height:
            raise VideoError(f"{self.path}: video stream has no frame size")
        # FFmpeg's guess of the pixel shape: the container's, else the codec's (av_guess_sample_aspect_ratio)
        info.width, info.height = display_size(info.width, info.height, getattr(s, "sample_aspect_ratio", None))
        if self._turns % 2:
            info.width, info.height = info.height, info.width
        return info

    def _probe_rotation(self) -> int:
        """Counter-clockwise quarter turns that bring a decoded frame upright: the display matrix
        FFmpeg attaches to every frame (read off the first one), else the old `rotate` stream tag
        (clockwise degrees). Mirroring matrices are not undone."""
        track = self._track()
        degrees = 0.0
        try:
            rewind(track.source, track.c, track.s)
            frames = track.clean_frames(Losses(), self._index.start)
            first = next(frames, None)
            frames.close()
            degrees = float(getattr(first[0], "rotation", 0) or 0) if first else 0.0
        except Exception:  # undecodable start: reading frames will say so, with the time
            pass
        if not degrees:
            try:
                degrees = -float(track.s.metadata.get("rotate", 0))
            except ValueError:
                degrees = 0.0
        return round(degrees / 90) % 4

    def probe(self) -> VideoInfo:
        """Duration (s), mean fps, frame count and displayed size, measured when the reader opened."""
        return self._info

    @property
    def duration(self) -> float:
        return self._info.duration

    @property
    def frame_size(self) -> tuple[int, int]:
        """(height, width) of returned frames."""
        return resize_to_budget(self._info.height, self._info.width, self.max_pixels, self.min_pixels, self.factor)

    def _image(self, frame) -> np.ndarray:
        """The frame resized to frame_size and turned upright. Through this thread's reformatter:
        `frame.to_ndarray(format=...)` sets up a new swscale context for every frame, which cost more
        than the conversion (CPU a frame: 0.36 vs 0.03 ms at SynthVT's 64x64, 1.06 vs 0.41 ms for
        640x360 to 288x160; the same pixels)."""
        h, w = self.frame_size
        if self._turns % 2:
            h, w = w, h
        reformatter = getattr(self._local, "reformatter", None)
        if reformatter is None:
            from av.video.reformatter import VideoReformatter

            reformatter = self._local.reformatter = VideoReformatter()
        img = reformatter.reformat(frame, width=w, height=h, format="rgb24", interpolation="BILINEAR").to_ndarray()
        return np.ascontiguousarray(np.rot90(img, self._turns)) if self._turns else img

    def _count(self, n, what: str) -> int:
        """A whole number of frames from 1 to MAX_FRAMES, or a VideoError (not a 1.5 GB allocation)."""
        whole = isinstance(n, (int, np.integer)) or (isinstance(n, float) and n.is_integer())
        if isinstance(n, bool) or not whole or not 1 <= n <= MAX_FRAMES:
            raise VideoError(f"{self.path}: {what} must be a whole number from 1 to {MAX_FRAMES}, got {n!r}")
        return int(n)

    # ---------- decoding ----------
    def frames_at(self, timestamps: list[float]) -> list[Frame]:
        """The decoded frames nearest each requested time (seconds from the video's start),
        in request order; each Frame carries the decoded frame's own time (pts * time_base),
        the time requested, and whether damage forced a farther frame (Frame.substituted).
        The primitive under overview() and crop(); see paravt.video.decode for the seek policy.
        """
        if not timestamps:
            return []
        if len(timestamps) > MAX_FRAMES:
            raise VideoError(f"{self.path}: {len(timestamps)} frames asked for at once, more than {MAX_FRAMES}")
        d = self._info.duration
        for t in timestamps:
            if not (0 <= t <= d + 1e-6) or math.isnan(t):
                raise VideoError(f"{self.path}: time {t:.2f}s is outside the video (0–{d:.2f}s)")
        order = sorted(range(len(timestamps)), key=lambda i: timestamps[i])
        zero = self._index.zero  # the file's time zero on the stream clock
        with self._decoding():
            found = decode_nearest(self._track(), [timestamps[i] + zero for i in order], self._image)
        out: list[Frame | None] = [None] * len(timestamps)
        for j, i in enumerate(order):
            img, t, substituted = found[j]
            out[i] = Frame(image=img, timestamp=round(t - zero, 6), requested=timestamps[i],
                           substituted=substituted or self._index.in_jump(timestamps[i]))
        return out  # type: ignore[return-value]

    def overview(self, k: int) -> list[Frame]:
        """k frames spread over the whole video, one from the middle of each of k equal segments.

        k >= num_frames returns every frame once, in order (so at most the frames the video has,
        with requested=None): sampling more would return repeats. k must be 1..MAX_FRAMES.
        """
        k = self._count(k, "overview k")
        if k >= self._info.num_frames:
            with self._decoding():
                return every_frame(self._track(), self._image)
        return self.frames_at(self._overview_times(k))

    def _overview_times(self, k: int) -> list[float]:
        """The times of overview(k) for k under the frame count."""
        if self._index.spans is not None:  # timestamps that jump: spread over the recorded time only
            return share(self._index.spans, k)
        return overview_times(self._info.duration, k)

    def overviews(self, ks) -> dict[int, list[Frame]]:
        """overview(k) for every k in `ks`, the frames nearest all their times found in one pass: a
        frame or a GOP two budgets share is decoded once (SynthVT labels what each K's overview
        shows; K = 4 to 64 of 15 of its videos: 1.2 s of CPU one overview at a time, 0.5 s at once)."""
        ks = sorted({self._count(k, "overview k") for k in ks})
        times: dict[int, list[float]] = {}
        every = None  # k >= the frame count: every frame once, the same for each such k
        for k in ks:
            if k >= self._info.num_frames:
                every = every or self.overview(k)
            else:
                times[k] = self._overview_times(k)
        union = sorted({t for ts in times.values() for t in ts})
        decoded = [f for i in range(0, len(union), MAX_FRAMES) for f in self.frames_at(union[i:i + MAX_FRAMES])]
        at = dict(zip(union, decoded))
        return {k: [at[t] for t in times[k]] if k in times else list(every) for k in ks}

    def crop(
        self, start: float, end: float, fps: float = 1.0, max_frames: int = 16, num_frames: int | None = None
    ) -> list[Frame]:
        """Frames of [start, end] at `fps` (>= 1, <= max_frames, <= the frames in the window at the
        video's mean rate; see sample_times); end is clamped to the duration; start >= end,
        start >= duration or a negative time is a VideoError, and so is max_frames outside
        1..MAX_FRAMES. Where the timestamps jump, the frames are spread over the recorded parts of
        the window, counted on their time; a window with none is a VideoError that says so."""
        max_frames = self._count(max_frames, "crop max_frames")
        try:
            times = sample_times(start, end, fps, max_frames, num_frames, duration=self._info.duration,
                                 source_fps=self._info.fps)
            if self._index.spans is None:
                return self.frames_at(times)
            pieces = self._index.recorded(start, min(end, self._info.duration))
            if not pieces:
                raise VideoError(self._nothing_recorded(start, end))
            held = sum(b - a for a, b in pieces)
            n = len(sample_times(0.0, held, fps, max_frames, num_frames, source_fps=self._info.fps))
        except ValueError as e:
            raise VideoError(f"{self.path}: bad crop [{start}, {end}]: {e}") from None
        return self.frames_at(share(pieces, n))

    def _nothing_recorded(self, start: float, end: float) -> str:
        gap = next(((a, b) for a, b in self._info.gaps if a <= start and end <= b), None)
        lead = self._info.start
        if gap:
            where = f"its timestamps jump from {gap[0]:.2f} s to {gap[1]:.2f} s"
        elif end <= lead + 1e-6:
            where = f"the video starts at {lead:.2f} s on the file's clock: its audio starts first"
        else:
            where = "its timestamps jump there"
        return (f"{self.path}: no frames in [{start:g}, {end:g}] s: nothing was recorded there ({where}; "
                f"recorded: {', '.join(f'{a:.2f}-{b:.2f} s' for a, b in self._index.spans)})")

    # ---------- async: decoding runs on a bounded pool, never on the event loop ----------
    async def aframes_at(self, timestamps: list[float]) -> list[Frame]:
        return await asyncio.get_running_loop().run_in_executor(_pool(), self.frames_at, timestamps)

    async def aoverview(self, k: int) -> list[Frame]:
        """overview(k) on the pool. Callers that ask for the same k while it decodes share the one
        decode: a GRPO group's rollouts open on the same overview, and decoding it once instead of
        once a rollout also lets their first prompts reach the model together (prefilled once)."""
        with self._lock:
            shared = self._overviews.get(k)
            first = shared is None
            if first:
                shared = self._overviews[k] = _pool().submit(self.overview, k)
        if first:  # outside the lock: a decode already over runs the callback here, and it takes the lock
            shared.add_done_callback(lambda f: self._forget_overview(k, f))
        # shielded: one caller giving up must not cancel the decode the others wait for
        return list(await asyncio.shield(asyncio.wrap_future(shared)))

    def _forget_overview(self, k: int, done) -> None:
        with self._lock:
            if self._overviews.get(k) is done:
                del self._overviews[k]

    async def acrop(
        self, start: float, end: float, fps: float = 1.0, max_frames: int = 16, num_frames: int | None = None
    ) -> list[Frame]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_pool(), lambda: self.crop(start, end, fps, max_frames, num_frames))

    def close(self) -> None:
        """Release the decoders. A decode still running (an episode cancelled or timed out while
        its crop decodes on the pool) keeps its container until it ends: closing a container
        under a running FFmpeg decode crashes the process. The last decode to finish closes them.
        A closed reader reopens its decoders when used again."""
        with self._lock:
            self._closing = True
            if self._active:
                return
            self._close_containers()

    @contextlib.contextmanager
    def _decoding(self):
        """One decode on this thread: counted (close() waits for it), and one operation of the source
        (a URL's budget of bytes and time)."""
        with self._lock:
            self._active += 1
        try:
            with self.source.operation():
                yield
        finally:
            with self._lock:
                self._active -= 1
                if self._closing and not self._active:
                    self._close_containers()

    def _close_containers(self) -> None:
        """With the lock held and no decode running."""
        self._closing = False
        for c in self._containers:
            try:
                c.close()
            except Exception:
                pass
        self._containers.clear()
        self._local = threading.local()
        self.source.release()

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
