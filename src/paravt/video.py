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

Seeking is checked, never trusted. MP4/MKV keep a keyframe index, and a seek lands on the
index keyframe at or before the target. MPEG-TS (and other index-less containers) has none:
FFmpeg seeks it by bisecting byte positions on timestamps and lands on any packet, often after
the target, so the decoder would start at the next keyframe, seconds or a whole GOP late. So
every seek is verified: the first frame decoded after it must not be after the target, else an
earlier seek is tried, down to the file's start (see _land). Going back to the start is a
seek far before the first timestamp, which every demuxer answers with the first packet.

Damaged data is skipped, not fatal: after a demux or decode error, a corrupt packet or frame,
or data a demuxer skipped silently (Matroska: a jump in byte positions; MPEG-TS: in dts),
nothing is decoded until the next keyframe, because frames built on missing references come
out of H.264's error concealment showing older pictures, mostly unflagged; B-frames are held
until their backward references came out clean (see _Pass). A request whose nearer frames
could not be decoded gets the nearest decodable frame, with its own true time and
Frame.substituted set. A demuxer that stops at garbage (Matroska) is resumed past it. The MP4
index (moov) itself is not recovered: without it the file is refused.

Rotation: a display matrix (phones' portrait clips) is applied, so frames, probe() and
frame_size are in the displayed orientation.

Counts are bounded: overview(k) returns at most the video's frames (every frame once when
k >= num_frames), a crop at most the frames in its window, and no call more than MAX_FRAMES.

Timestamps that jump (a camera clock reset, files joined without re-timing: pts leaping by
hours mid-file) leave spans where nothing was recorded. The nearest frame to a time in such a
span is from elsewhere, hours away, so the probe finds the jumps (steps of the demuxer's index
over JUMP_S and JUMP_FRAMES frame steps, each confirmed on the packets between its two entries:
one GOP demuxed, nothing decoded) and sampling skips them: overview(k) and a crop spread their
frames over the recorded parts only, a crop wholly inside a jump is a VideoError saying so, and
frames_at() flags a frame it returns for a time inside a jump (Frame.substituted). fps and
num_frames then come from the packets (median frame step, the stated or recorded count), not
from duration x fps. Containers without an index (MPEG-TS) are not checked for jumps.

Video URLs (http://, https://) are read through FFmpeg's network protocols, which seek with
range requests (an MP4's index at the end costs one request, a crop a few). Every network
operation has a deadline (timeout_s: connect and each read, as a model call's); a refused
connection, an HTTP error or a deadline is a VideoError naming the URL and the cause, never
taken for damaged data.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import math
import os
import re
import statistics
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_PIXELS = 50176  # 224 * 224
MIN_PIXELS = 784  # 28 * 28
FACTOR = 32  # Qwen3-VL: patch 16 x spatial merge 2
SEEK_COST = 0.5  # s of decoding a seek must skip to be worth it (flush + refill of the decoder)
NO_INDEX_GAP = 2.0  # s; without a demuxer index, re-seek only past this gap
MAX_FRAMES = 10000  # frames one call may return: ~1.5 GB at the default pixel budget
REWIND = 1000.0  # s before the first timestamp: a seek there lands on the file's first packet
GAP_STEP = 1.5  # MPEG-TS/PS: a dts step of more packet durations than this is lost data
GAP_FRAMES = 4  # ... of more frame durations, for packets without a duration
LOST_BYTES = 1024  # Matroska: bytes skipped between packets (headers take < 32) that mean a resync
MAX_RESUMES = 256  # forward seeks to get past data a demuxer stopped at, per pass
EPS = 1e-6  # s; timestamps closer than this are the same
JUMP_S = 60.0  # s; a step between consecutive frames over this, and over JUMP_FRAMES typical
JUMP_FRAMES = 100  # frame steps, is a jump of the timestamps, not a long still (VFR) frame
NET_TIMEOUT_S = 600.0  # s; deadline of one network operation on a URL (EpisodeConfig.model_timeout_s's default)
URL_SCHEMES = ("http://", "https://")
NET_ERRNOS = {errno.EIO, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ECONNABORTED,
              errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE}  # FFmpeg's network failures
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def is_url(source: object) -> bool:
    """Whether `source` is a video URL paravt reads over the network (http or https)."""
    return isinstance(source, str) and source.lower().startswith(URL_SCHEMES)


class VideoError(Exception):
    """A video that cannot be read, or a request outside it. The message names the file."""


@dataclass
class VideoInfo:
    duration: float
    fps: float  # mean rate of the recorded parts
    num_frames: int
    width: int  # as displayed (after the rotation of a display matrix)
    height: int
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (from, to) s: timestamp jumps, nothing recorded


@dataclass
class Frame:
    """One returned frame.

    image: H x W x 3, uint8, RGB, upright, already resized.
    timestamp: seconds from the video's start of the frame decoded (not the time asked for).
    requested: the time asked for, or None where none was (overview returning every frame).
    substituted: True when this frame is not what the video shows at `requested`: the nearer
        ones could not be decoded (damaged data), or `requested` lies in a jump of the timestamps
        where nothing was recorded. It is then the nearest decodable frame, and `timestamp` is
        still its own true time, so the caller can tell how far off it is.
    """

    image: np.ndarray
    timestamp: float
    requested: float | None = None
    substituted: bool = False


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
    source_fps: float | None = None,
) -> list[float]:
    """Timestamps of a crop: `fps` frames per second of the window, at least 1 frame,
    at most `max_frames` (or `num_frames` when given and not larger), and at most the frames
    the window holds at the video's mean rate `source_fps` (more would repeat frames)."""
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
    if source_fps:
        n = max(1, min(n, math.floor((end - start) * source_fps + EPS)))
    step = (end - start) / n
    return [start + (i + 0.5) * step for i in range(n)]


def _median_step(pts: list[int], time_base) -> float:
    """The typical step (s) between consecutive frame timestamps (0 with fewer than two): a frame
    rate that a jump of the timestamps, or a few long VFR frames, does not move. On the integer
    pts, so that 0.1 s steps far into a file stay 0.1, not 0.1 plus float noise."""
    pts = sorted(set(pts))
    steps = [b - a for a, b in zip(pts, pts[1:])]
    return float(statistics.median_low(steps) * time_base) if steps else 0.0


def _recorded_spans(jumps: list[tuple[float, float]], start: float, step: float,
                    duration: float) -> list[tuple[float, float]]:
    """The parts of the video clock (0..duration) that hold frames, around timestamp jumps given
    as (last frame before, first frame after) on the stream clock; the frame before a jump lasts
    one typical step."""
    spans, lo = [], 0.0
    for a, b in jumps:
        spans.append((lo, round(a - start + step, 6)))
        lo = round(b - start, 6)
    spans.append((lo, duration))
    return spans


def _share(pieces: list[tuple[float, float]], n: int) -> list[float]:
    """The middles of n equal shares of the pieces' total time, placed on the pieces: uniform
    sampling of the recorded time, as if the jumps between the pieces were not there."""
    total = sum(b - a for a, b in pieces)
    out, j, before = [], 0, 0.0  # before: recorded time in pieces[:j]
    for i in range(n):
        u = (i + 0.5) * total / n
        while j < len(pieces) - 1 and u > before + (pieces[j][1] - pieces[j][0]):
            before += pieces[j][1] - pieces[j][0]
            j += 1
        out.append(min(pieces[j][0] + (u - before), pieces[j][1]))
    return out


class _Losses:
    """Stream times where a pass could not deliver frames: `points`, frames seen (their packets)
    but not decodable; `spans`, open intervals where data was lost unseen (frames may be anywhere)."""

    def __init__(self) -> None:
        self.points: list[float] = []
        self.spans: list[tuple[float, float]] = []

    def add(self, t: float | None) -> None:
        if t is not None:
            bisect.insort(self.points, t)

    def add_span(self, a: float, b: float) -> None:
        if b > a:
            self.spans.append((a, b))

    def nearer(self, target: float, d: float) -> bool:
        """Whether a frame that was lost may lie nearer to `target` than `d` seconds."""
        d -= EPS
        if d <= 0:
            return False
        j = bisect.bisect_right(self.points, target - d)
        if j < len(self.points) and self.points[j] < target + d:
            return True
        return any(a < target + d and b > target - d for a, b in self.spans)


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
    ) -> None:
        """Opens and probes now, so a bad file (or URL) fails here with a VideoError.

        path: a file, or an http(s) URL (kept as the string it is: `path` is then a str).
        decoder_threads: FFmpeg decoding threads per open decoder (0: FFmpeg picks by core
        count; frame threads cut one crop's latency at about the same CPU); 1 keeps cores
        free when many crops already run side by side on the pool.
        timeout_s: deadline of each network operation on a URL (connecting, each read).
        """
        self.remote = is_url(path)
        if not self.remote and isinstance(path, str) and _SCHEME.match(path):
            raise VideoError(f"{path}: only http:// and https:// URLs are read (for an object store, use its "
                             "https URL, e.g. a presigned one)")
        if not timeout_s > 0:
            raise VideoError(f"{path}: timeout_s must be positive, got {timeout_s!r}")
        self.path: Path | str = path if self.remote else Path(path)
        self.timeout_s = float(timeout_s)
        self.decoder_threads = decoder_threads
        self.max_pixels = max_pixels
        self.min_pixels = min_pixels
        self.factor = factor
        self._local = threading.local()
        self._containers: list = []
        self._lock = threading.Lock()
        self._active = 0  # decodes running on the pool: close() waits for them (see close)
        self._closing = False
        self.frames_decoded = 0  # counter for tests and benchmarks (approximate under threads)
        self._check_file()
        self._info = self._probe()

    # ---------- opening and probing ----------
    def _check_file(self) -> None:
        if self.remote:
            return  # the server answers for it when opened
        if not self.path.exists():
            raise VideoError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise VideoError(f"{self.path}: is a directory, not a video file")
        if self.path.stat().st_size == 0:
            raise VideoError(f"{self.path}: file is empty (0 bytes)")

    def _open(self):
        import av

        try:
            if self.remote:
                # FFmpeg's own socket deadline (connect and each read: "Connection timed out") and
                # PyAV's interrupt, which also ends a read that trickles (data, but too slowly)
                us = str(min(int(self.timeout_s * 1e6), 2**31 - 1))
                container = av.open(self.path, mode="r", timeout=self.timeout_s, container_options={"timeout": us})
            else:
                container = av.open(str(self.path), mode="r")
        except Exception as e:  # av.error.* (InvalidDataError, ...), OSError
            if self._network_failure(e):
                raise self._network_error(e) from None
            raise VideoError(f"{self.path}: not a readable video ({type(e).__name__}: {e})") from None
        if not container.streams.video:
            container.close()
            raise VideoError(f"{self.path}: has no video stream (audio-only or data file)")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = self.decoder_threads
        return container

    def _network_failure(self, e: BaseException) -> bool:
        """Whether `e` is the network failing (a URL's server refused, timed out, answered an HTTP
        error, or the connection broke), as opposed to bad data: never skipped as damage."""
        if not self.remote:
            return False
        import av

        err = av.error
        if isinstance(e, (ConnectionError, TimeoutError, err.ExitError, err.HTTPError, err.HTTPClientError,
                          err.HTTPServerError)):
            return True
        return isinstance(e, OSError) and e.errno in NET_ERRNOS  # not EPERM: a seek an MPEG-TS refuses

    def _failed_network(self, e: BaseException) -> VideoError | None:
        """For a URL, the VideoError of a network failure behind the read error `e`, else None
        (bad data: skipped as damage, as in a file). Demuxers report a connection lost mid-read
        as bad data (MP4: InvalidDataError), so such an error is checked by opening the URL again."""
        if not self.remote:
            return None
        if self._network_failure(e):
            return self._network_error(e)
        try:
            self._open().close()
        except VideoError as v:  # refused, timed out, an HTTP error, or no longer a video
            return v
        return None

    def _network_error(self, e: BaseException) -> VideoError:
        """One line naming the URL and the cause ("Connection refused", "Server returned 404 Not
        Found", "no data within 5 s")."""
        import av

        if isinstance(e, (av.error.ExitError, TimeoutError)):
            cause = f"no data within {self.timeout_s:g} s"
        else:
            cause = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return VideoError(f"{self.path}: cannot read ({cause})")

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
        # Before any seek: seeking an MPEG-TS fills its index with guesses (every packet a "keyframe").
        self._indexed = len(getattr(s, "index_entries", ())) > 0
        fmt = c.format.name or ""
        self._resync = "bytes" if "matroska" in fmt else "dts" if fmt in ("mpegts", "mpeg") else None
        size = (c.size or 0) if self.remote else self.path.stat().st_size
        self._cut = fmt == "mpegts" and all(size % n for n in (188, 192, 204))  # ends inside a TS packet
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
        last_pts, count, tail = None, 0, []
        for scan_from in ([max(duration - 10.0, 0.0), None] if duration else [None]):
            if scan_from is not None:
                if not self._seek(c, s, scan_from + start):
                    continue
            elif duration:
                self._rewind(c, s)
            last_pts, count, tail = self._scan_pts(c, s)
            if count:
                break
        if count == 0:
            raise VideoError(f"{self.path}: video stream holds no frames (truncated or empty)")
        step = _median_step(tail, s.time_base) or (1.0 / fps if fps > 0 else 0.0)
        jumps = self._find_jumps(c, s, step) if step > 0 else []
        if jumps:  # a mean rate over the stated span counts the jumps' empty hours: the typical step instead
            fps = 1.0 / step
        frame_dur = 1.0 / fps if fps > 0 else 0.0
        measured = last_pts - start + frame_dur
        truncated = duration is None or duration <= 0 or measured < duration - 2 * frame_dur
        if truncated:
            duration = measured
        self._spans = _recorded_spans(jumps, start, step, duration) if jumps else None
        recorded = sum(b - a for a, b in self._spans) if self._spans else duration
        if truncated and fps > 0 and num_frames:  # a count stated for the whole file: cut to what is there
            num_frames = min(num_frames, int(round(recorded * fps)))
        if fps <= 0:
            fps = 25.0  # unknown rate: timestamps still come from pts, fps only sets the crop gap
        self._start, self._last_pts, self._frame_dur = start, last_pts, 1.0 / fps
        self._turns = self._probe_rotation(c, s)
        self.frames_decoded = 0
        w, h = s.codec_context.width, s.codec_context.height
        if not w or not h:
            raise VideoError(f"{self.path}: video stream has no frame size")
        if self._turns % 2:
            w, h = h, w
        gaps = [(a, b) for (_, a), (b, _) in zip(self._spans, self._spans[1:])] if self._spans else []
        return VideoInfo(duration=duration, fps=fps, num_frames=num_frames or int(round(recorded * fps)), width=w,
                         height=h, gaps=gaps)

    def _scan_pts(self, c, s) -> tuple[float | None, int, list[int]]:
        """Latest packet time (stream clock), packet count and the last 512 packets' pts, from the
        current position to the end. A demux error ends the scan (damaged data) but fails only if
        no packet came before it; a network failure always fails."""
        last, count, recent = None, 0, deque(maxlen=512)
        try:
            for packet in c.demux(s):
                if packet.pts is not None:
                    t = float(packet.pts * s.time_base)
                    last = t if last is None else max(last, t)
                    count += 1
                    recent.append(packet.pts)
        except Exception as e:
            if (err := self._failed_network(e)) is not None:
                raise err from None
            if count == 0:
                raise VideoError(f"{self.path}: corrupt or truncated video ({type(e).__name__}: {e})") from None
        return last, count, list(recent)

    def _find_jumps(self, c, s, step: float) -> list[tuple[float, float]]:
        """(last frame before, first frame after), stream clock, of each jump of the timestamps: a
        step between consecutive frames over JUMP_S and JUMP_FRAMES typical steps. Candidates are
        steps of the demuxer's index (in memory: MP4's every sample, Matroska's cues), each checked
        on the packets between its two entries. Without an index (MPEG-TS) none is looked for."""
        if not self._indexed:
            return []
        tb = float(s.time_base)
        limit = max(JUMP_S, JUMP_FRAMES * step)
        ticks = [e.timestamp for e in s.index_entries]  # FFmpeg keeps them in time order
        over = limit / tb
        jumps: set[tuple[float, float]] = set()
        for a, b in zip(ticks, ticks[1:]):
            if b - a > over:
                jumps.update(self._jumps_between(c, s, a * tb, b * tb, limit))
        return sorted(jumps)

    def _jumps_between(self, c, s, a: float, b: float, limit: float) -> list[tuple[float, float]]:
        """The jumps among the packets from index time `a` to `b` (demuxed, not decoded)."""
        if not self._seek(c, s, a):
            return []
        tb, times = float(s.time_base), []
        try:
            for packet in c.demux(s):
                if packet.pts is None:
                    continue
                times.append(float(packet.pts * tb))
                if times[-1] >= b - EPS:
                    break
        except Exception as e:  # damaged data: what was read is what there is
            if (err := self._failed_network(e)) is not None:
                raise err from None
        times.sort()
        return [(x, y) for x, y in zip(times, times[1:]) if y - x > limit]

    def _probe_rotation(self, c, s) -> int:
        """Counter-clockwise quarter turns that bring a decoded frame upright: the display matrix
        FFmpeg attaches to every frame (read off the first one), else the old `rotate` stream tag
        (clockwise degrees). Mirroring matrices are not undone."""
        degrees = 0.0
        try:
            self._rewind(c, s)
            frames = self._clean_frames(c, s, _Losses(), self._start)
            first = next(frames, None)
            frames.close()
            degrees = float(getattr(first[0], "rotation", 0) or 0) if first else 0.0
        except Exception:  # undecodable start: reading frames will say so, with the time
            pass
        if not degrees:
            try:
                degrees = -float(s.metadata.get("rotate", 0))
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
        """The frame resized to frame_size and turned upright."""
        h, w = self.frame_size
        if self._turns % 2:
            h, w = w, h
        img = frame.to_ndarray(format="rgb24", width=w, height=h, interpolation="BILINEAR")
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
        The primitive under overview() and crop(); see _decode_nearest for the seek policy.
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
        with self._lock:
            self._active += 1
        try:
            found = self._decode_nearest([timestamps[i] + self._start for i in order])
        finally:
            self._done_decoding()
        out: list[Frame | None] = [None] * len(timestamps)
        for j, i in enumerate(order):
            img, t, substituted = found[j]
            out[i] = Frame(image=img, timestamp=round(t - self._start, 6), requested=timestamps[i],
                           substituted=substituted or self._in_jump(timestamps[i]))
        return out  # type: ignore[return-value]

    def _in_jump(self, t: float) -> bool:
        """Whether `t` (video clock) lies where the timestamps jump and nothing was recorded."""
        return self._spans is not None and not any(a - EPS <= t <= b + EPS for a, b in self._spans)

    def _recorded(self, start: float, end: float) -> list[tuple[float, float]]:
        """The parts of [start, end] (video clock) that hold frames."""
        if self._spans is None:
            return [(start, end)]
        return [(max(a, start), min(b, end)) for a, b in self._spans if min(b, end) > max(a, start)]

    def _decode_nearest(self, wanted: list[float]) -> list[tuple[np.ndarray, float, bool]]:
        """For sorted target times (stream clock): (image, time, substituted) of the decoded
        frame nearest each.

        One forward pass serves every target it reaches; it breaks off and seeks only when
        the keyframe a seek would land on lies well past the frame just decoded, i.e. when
        seeking skips real work. So sparse targets cost one GOP each, and targets denser
        than keyframes are decoded in one sequential pass, each frame at most once.
        """
        c = self._container()
        s = c.streams.video[0]
        losses = _Losses()
        results: list = []
        i, n = 0, len(wanted)
        try:
            while i < n:
                frames, first = self._land(c, s, wanted[i], losses)
                if first is None:
                    raise VideoError(f"{self.path}: no frame decodable near {wanted[i] - self._start:.2f}s")
                pick = _Picker(self, losses)
                prev = None  # (frame, t) of the last frame before the current one
                resolved = False  # a seek is followed by another only after it served a target
                for frame, t in _chain(first, frames):
                    while i < n and t >= wanted[i]:  # resolve every target this frame passes
                        results.append(pick(wanted[i], prev, (frame, t)))
                        i += 1
                        resolved = True
                    if i >= n:
                        break
                    prev = (frame, t)
                    if resolved and self._seek_saves_work(t, wanted[i]):
                        break
                else:
                    while i < n:  # end of stream: the remaining targets get the last frame
                        results.append(pick(wanted[i], prev, None))
                        i += 1
                frames.close()
        except VideoError:
            raise
        except Exception as e:  # the demuxer or decoder failing beyond what _clean_frames skips
            if (err := self._failed_network(e)) is not None:
                raise err from None
            raise VideoError(f"{self.path}: decode failed ({type(e).__name__}: {e})") from None
        return results

    def _land(self, c, s, target: float, losses: _Losses) -> tuple[Iterator, tuple | None]:
        """Seek for `target` and check where it landed: the first frame decodable from there must
        not be after the target, else an earlier seek is tried, down to the file's start (whose
        first decodable frame is taken as it is). Returns the frames after the first, and the first."""
        for seek_t in self._seek_points(target):
            if seek_t is None:
                self._rewind(c, s)
                frames = self._clean_frames(c, s, losses, self._start)
            elif self._seek(c, s, seek_t):
                frames = self._clean_frames(c, s, losses, seek_t, key_by=target)
            else:
                continue
            first = next(frames, None)
            if seek_t is None or (first is not None and first[1] <= target + EPS):
                return frames, first
            frames.close()
        raise AssertionError("unreachable: _seek_points ends with the rewind")

    def _seek_points(self, target: float) -> Iterator[float | None]:
        """Seek times for `target`, most promising first, then None: rewind to the start.

        With an index: the target, then ever earlier (a seek lands one keyframe late when a
        keyframe's pts is after its dts, the index's time, or where the keyframe is damaged),
        skipping times whose landing keyframe was tried already. Without one the landing is a
        guess, so: 1, 2, 4, ... s before the target.
        """
        tried = set()
        back = 0.0 if self._indexed else 1.0
        while target - back > self._start:
            t = target - back
            key = self._keyframe_before(t) if self._indexed else t
            if key not in tried:
                tried.add(key)
                yield t
            back = max(1.0, 2 * back)
        yield None

    def _seek(self, c, s, t: float) -> bool:
        """Backward seek to `t` (stream clock); False where the demuxer refuses (a TS whose
        timestamps it cannot find by bisection), which callers treat as a landing that failed."""
        try:
            c.seek(round(t / float(s.time_base)), stream=s, backward=True, any_frame=False)
            return True
        except Exception as e:
            if self._network_failure(e):
                raise self._network_error(e) from None
            return False

    def _rewind(self, c, s) -> None:
        """To the first packet: a seek before the first timestamp (a seek *to* the first
        timestamp in an MPEG-TS can land a few packets in, past the first keyframe), else to
        byte 0 (formats that seek by bytes)."""
        if self._seek(c, s, self._start_time(s) - REWIND):
            return
        try:
            c.seek(0, stream=s, unsupported_byte_offset=True)
        except Exception as e:
            if self._network_failure(e):
                raise self._network_error(e) from None
            raise VideoError(f"{self.path}: cannot seek to the start ({type(e).__name__}: {e})") from None

    def _start_time(self, s) -> float:
        return float(s.start_time * s.time_base) if s.start_time is not None else 0.0

    def _clean_frames(self, c, s, losses: _Losses, origin: float, key_by: float | None = None) -> Iterator[tuple]:
        """(frame, time) of the frames decodable from the current position, in time order; see _Pass."""
        return iter(_Pass(self, c, s, losses, origin, key_by))

    def _resume_points(self, s, after: float) -> Iterator[float]:
        """Seek times past `after` to resume a stream that stopped early: the index's next
        keyframes, or without an index steps growing from 1 s."""
        tb = float(s.time_base)
        if self._indexed:
            entries = s.index_entries
            ts = math.floor(after / tb) + 1
            while (j := entries.search_timestamp(ts, backward=False)) >= 0:
                e = entries[j]
                yield e.timestamp * tb
                ts = e.timestamp + 1
            return
        step = 1.0
        while after + step <= self._last_pts:
            yield after + step
            step *= 1.5

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
        demuxer's index (MP4/MKV keep one in memory after opening; nothing is read). None
        without an index: what an MPEG-TS demuxer fills in while seeking is guesswork."""
        if not self._indexed:
            return None
        s = self._container().streams.video[0]
        entries = s.index_entries
        if len(entries) == 0:
            return None
        j = entries.search_timestamp(round(target / float(s.time_base)), backward=True)
        if j < 0:
            return self._start
        return float(entries[j].timestamp * s.time_base)

    def _every_frame(self) -> list[Frame]:
        """Every decodable frame once, in time order: one pass from the start."""
        c = self._container()
        s = c.streams.video[0]
        out = []
        try:
            self._rewind(c, s)
            for frame, t in self._clean_frames(c, s, _Losses(), self._start):
                out.append(Frame(image=self._image(frame), timestamp=round(t - self._start, 6)))
        except VideoError:
            raise
        except Exception as e:
            if (err := self._failed_network(e)) is not None:
                raise err from None
            raise VideoError(f"{self.path}: decode failed ({type(e).__name__}: {e})") from None
        if not out:
            raise VideoError(f"{self.path}: no frame decodable")
        return out

    def overview(self, k: int) -> list[Frame]:
        """k frames spread over the whole video, one from the middle of each of k equal segments.

        k >= num_frames returns every frame once, in order (so at most the frames the video has,
        with requested=None): sampling more would return repeats. k must be 1..MAX_FRAMES.
        """
        k = self._count(k, "overview k")
        if k >= self._info.num_frames:
            return self._every_frame()
        if self._spans is not None:  # timestamps that jump: spread over the recorded time only
            return self.frames_at(_share(self._spans, k))
        return self.frames_at(overview_times(self._info.duration, k))

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
            if self._spans is None:
                return self.frames_at(times)
            pieces = self._recorded(start, min(end, self._info.duration))
            if not pieces:
                raise VideoError(self._nothing_recorded(start, end))
            held = sum(b - a for a, b in pieces)
            n = len(sample_times(0.0, held, fps, max_frames, num_frames, source_fps=self._info.fps))
        except ValueError as e:
            raise VideoError(f"{self.path}: bad crop [{start}, {end}]: {e}") from None
        return self.frames_at(_share(pieces, n))

    def _nothing_recorded(self, start: float, end: float) -> str:
        gap = next(((a, b) for a, b in self._info.gaps if a <= start and end <= b), None)
        where = f"its timestamps jump from {gap[0]:.2f} s to {gap[1]:.2f} s" if gap else "its timestamps jump there"
        return (f"{self.path}: no frames in [{start:g}, {end:g}] s: nothing was recorded there ({where}; "
                f"recorded: {', '.join(f'{a:.2f}-{b:.2f} s' for a, b in self._spans)})")

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
        """Release the decoders. A decode still running (an episode cancelled or timed out while
        its crop decodes on the pool) keeps its container until it ends: closing a container
        under a running FFmpeg decode crashes the process. The last decode to finish closes them.
        A closed reader reopens its decoders when used again."""
        with self._lock:
            self._closing = True
            if self._active:
                return
            self._close_containers()

    def _done_decoding(self) -> None:
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

    def __enter__(self) -> "VideoReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        i = self._info
        return f"VideoReader({str(self.path)!r}, {i.duration:.1f}s, {i.width}x{i.height}@{i.fps:.2f})"


class _Picker:
    """Chooses between the frames around a target and converts the choice once (consecutive
    targets often share a frame)."""

    def __init__(self, reader: VideoReader, losses: _Losses) -> None:
        self.reader, self.losses = reader, losses
        self.last = (None, None)

    def __call__(self, target: float, prev: tuple | None, cur: tuple | None) -> tuple[np.ndarray, float, bool]:
        frame, t = cur if prev is None or (cur is not None and abs(cur[1] - target) < abs(prev[1] - target)) else prev
        if self.last[0] is frame:  # a repeat gets its own copy: callers may draw on images
            img = self.last[1].copy()
        else:
            img = self.reader._image(frame)
            self.last = (frame, img)
        return img, t, self.losses.nearer(target, abs(t - target))


class _Pass:
    """One forward read from the container's position: (frame, time) of clean frames, in time order.

    Decoders conceal damage with older pictures and flag only some of it (under frame threads,
    not even reliably), so frames are trusted by rule, not by flag:
    - after the seek, and after damage (a demux or decode error, a corrupt packet or frame, or
      data the demuxer skipped silently, see _skipped) the decoder is flushed and fed nothing
      before the next keyframe, so no frame is built on missing references;
    - a frame is held until the frames it may predict from backwards (B-frames: fed earlier,
      later time) came out clean, and dropped if one did not;
    - in MPEG-TS/PS a frame is held until the next packet is read: the packet before a resync,
      and the last one of a file cut inside a TS packet, hold bytes of other frames.
    Frames due but not delivered go to `losses`. A stream that ends before the probed end (a
    Matroska demuxer stops at garbage) is resumed by seeking forward past the damage.
    origin: the time sought (stream clock). key_by: end at once if packets pass this time
    before any keyframe: the seek landed too late (see VideoReader._land).
    """

    def __init__(self, reader: VideoReader, c, s, losses: _Losses, origin: float, key_by: float | None) -> None:
        self.r, self.c, self.s, self.losses, self.origin, self.key_by = reader, c, s, losses, origin, key_by
        self.tb, self.index = float(s.time_base), s.index
        self.need_key = True  # after a seek or damage: feed nothing before a keyframe
        self.drop = (-math.inf, -math.inf)  # frames timed inside are spoiled (open-GOP leaders after a loss)
        self.fed_key: float | None = None  # latest keyframe fed (decoders output a few frames late)
        self.pending: list[float] = []  # times of packets fed whose frames have not come out, in feed order
        self.held: list[tuple] = []  # (frame, time, references not yet out): clean frames not yet trusted
        self.last_out = -math.inf
        self.frontier: float | None = None  # latest packet time read
        self.span_open: float | None = None  # start of data lost unseen, closed by the next packet after it
        self.last_dts: int | None = None
        self.prev_dur = 0.0
        self.byte_end: int | None = None  # end of the last packet read, any stream
        self.bytes_skipped = False  # the demuxer skipped bytes since our last packet
        self.last_pkt: float | None = None  # time of our last packet read
        self.bad: set[float] = set()  # frames not to deliver when they come out
        self.lookahead = reader._resync == "dts"  # a TS packet is trusted once the next one is read
        self.recent: deque[float] = deque(maxlen=32)  # times of the last packets read

    def __iter__(self) -> Iterator[tuple]:
        resumes, tries = None, 0
        while True:
            before = self.frontier
            self.last_dts = self.byte_end = None
            for packet in _demux(self.c, self.r._failed_network):
                if packet is not None and packet.stream_index != self.index:
                    self._follow_bytes(packet)
                    continue
                previous = self.last_pkt
                frames = self._feed(packet)
                if frames is None:  # landed too late
                    return
                if self.lookahead and previous is not None and self.last_pkt != previous:
                    yield from self._release(("next", previous))  # the packet before this one is sound
                yield from self._accept(frames)
            # the stream ended: at the probed end, or early, stopped by damage
            if self.lookahead and self.last_pkt is not None:
                if self.r._cut:  # the last PES is partial
                    self._distrust(self.last_pkt)
                yield from self._release(("next", self.last_pkt))
            self._lose_pending()
            reach = self.frontier if self.frontier is not None else self.origin
            if reach >= self.r._last_pts - self.r._frame_dur / 2:
                if self.span_open is not None:
                    self.losses.add_span(self.span_open, math.inf)
                return
            if resumes is None or self.frontier != before:  # fresh seek points after progress
                resumes = self.r._resume_points(self.s, reach)
            t, tries = next(resumes, None), tries + 1
            if t is None or tries > MAX_RESUMES:
                self.losses.add_span(self.span_open if self.span_open is not None else reach, math.inf)
                return
            self._lost_from(min(reach, self._loss_start()))
            self._damage()
            self.r._seek(self.c, self.s, t)  # a refused seek reads on from EOF: the next point is tried

    def _feed(self, packet) -> list | None:
        """Checks a packet and decodes it: its frames ([] when skipped), None to stop the pass."""
        if packet is None:  # the demuxer failed: bytes lost here
            self._lost_from(self._loss_start())
            self._damage()
            return []
        if packet.size == 0:  # end-of-stream packet: drain the decoder
            self._end_holes()  # before the last frames come out and resolve requests
            return [] if self.need_key else (_decode(packet) or [])
        t = packet.pts * self.tb if packet.pts is not None else None
        self._track(packet, t)
        self.last_pkt = t if t is not None else self.last_pkt
        if self.need_key:
            if not packet.is_keyframe:
                if self.key_by is not None and self.last_out == -math.inf and t is not None and t > self.key_by:
                    return None  # no keyframe at or before key_by follows
                self.losses.add(t)
                return []
            self.need_key, self.drop = False, (-math.inf, t if t is not None else -math.inf)
        if packet.is_keyframe:
            self.fed_key = t
        if packet.is_corrupt:
            self.losses.add(t)
            self._damage()
            return []
        if t is not None:
            self.pending.append(t)
        frames = _decode(packet)
        if frames is None:  # the decoder rejected the packet
            self._damage()
            return []
        return frames

    def _track(self, packet, t: float | None) -> None:
        """Follows packet times: data lost unseen between packets, the frontier of what was read."""
        self._follow_bytes(packet)
        if self._skipped(packet):
            start = self._loss_start()
            self.losses.add_span(start, t or 0.0)
            if self.lookahead and self.last_pkt is not None:
                self._distrust(self.last_pkt)  # a TS demuxer appends bytes after a resync to the PES in hand
            if packet.is_keyframe:  # the decoder can go on from here
                self.drop = (start, t if t is not None else -math.inf)
            else:
                self._damage()
        if packet.dts is not None:
            self.last_dts, self.prev_dur = packet.dts, (packet.duration or 0) * self.tb
        if t is not None:
            self.recent.append(t)
            if self.span_open is not None and t > self.span_open:
                self.losses.add_span(self.span_open, t)
                self.span_open = None
            if self.frontier is None or t > self.frontier:
                self.frontier = t

    def _follow_bytes(self, packet) -> None:
        if packet.pos is None or packet.pos < 0 or not packet.size:
            return
        if self.byte_end is not None and packet.pos - self.byte_end > LOST_BYTES:
            self.bytes_skipped = True
        self.byte_end = max(self.byte_end or 0, packet.pos + packet.size)

    def _skipped(self, packet) -> bool:
        """Whether the demuxer dropped data before this packet without an error, as Matroska and
        MPEG-TS demuxers resync past garbage. Matroska: it skipped bytes (between packets there
        are only headers; its dts are made up by FFmpeg, so they cannot tell). MPEG-TS/PS: the dts
        steps back, or over more than the previous packet's duration (the parser's, pulldown
        included: there the step equals it; null packets make byte gaps normal there).
        Variable-frame-rate gaps skip no bytes; MP4 is read by its sample table and skips nothing."""
        if self.r._resync == "bytes":
            skipped, self.bytes_skipped = self.bytes_skipped, False
            return skipped
        if self.r._resync == "dts" and self.last_dts is not None and packet.dts is not None:
            step = (packet.dts - self.last_dts) * self.tb
            limit = GAP_STEP * self.prev_dur if self.prev_dur > 0 else GAP_FRAMES * self.r._frame_dur
            return step < 0 or step > limit + EPS
        return False

    def _accept(self, frames: list) -> Iterator[tuple]:
        """The clean ones of the decoder's output, in time order."""
        for f in frames:
            if f.pts is None:
                continue
            t = f.pts * self.tb
            self.r.frames_decoded += 1
            if f.is_corrupt:
                self.losses.add(t)
                self._spoiled(t)
                if self.fed_key is not None and self.fed_key > t + EPS:
                    self.drop = (t, self.fed_key)  # a later keyframe is in the decoder already: keep it
                    continue
                self._damage()
                return
            if t <= self.last_out + EPS:  # delivered already (a resume re-read it)
                continue
            if t in self.bad:
                self._spoiled(t)
                continue
            if self.drop[0] < t < self.drop[1] - EPS:
                self.losses.add(t)
                continue
            self.last_out = t
            refs = self._references(t)  # may drop held frames: before the append
            self.held.append((f, t, refs))
            yield from self._release(t)

    def _references(self, t: float) -> set[float]:
        """Times of the frames this one may predict from that have not come out: packets fed
        before its own with a later time (a B-frame's backward references). Takes the frame's
        own packet, and packets due before it that never came out, off `pending`."""
        pending = self.pending
        if pending and abs(pending[0] - t) <= EPS:  # out in feed order: waits on nothing
            pending.pop(0)
            refs: set = set()
        else:
            i = next((j for j, p in enumerate(pending) if abs(p - t) <= EPS), len(pending))
            refs = {p for p in pending[:i] if p > t + EPS}
            for p in pending:
                if p < t - EPS:  # due before this frame, never came out
                    self.losses.add(p)
                    self._spoiled(p)
            self.pending = [p for p in pending if p > t + EPS]
        if self.lookahead and self.last_pkt is not None and abs(t - self.last_pkt) <= EPS:
            refs.add(("next", self.last_pkt))  # its packet is the last read: wait for the next
        return refs

    def _release(self, t: float) -> Iterator[tuple]:
        """Frames whose references all came out clean, in time order: a damaged reference is
        flagged only on the frame itself, never on the B-frames built on it (output earlier)."""
        for _, _, refs in self.held:
            refs.discard(t)
        while self.held and not self.held[0][2]:
            f, u, _ = self.held.pop(0)
            yield f, u

    def _spoiled(self, t: float) -> None:
        """Drops the held frames that may predict from the corrupt frame at `t`."""
        for _, u, refs in self.held:
            if t in refs:
                self.losses.add(u)
        self.held[:] = [h for h in self.held if t not in h[2]]

    def _damage(self) -> None:
        """Drop what the decoder holds and wait for a keyframe."""
        self.s.codec_context.flush_buffers()
        self._lose_pending()
        self.need_key = True

    def _lose_pending(self) -> None:
        """What the decoder held is gone: frames fed and not out, frames waiting on those."""
        for p in self.pending:
            self.losses.add(p)
        for _, u, _ in self.held:
            self.losses.add(u)
        self.pending.clear()
        self.held.clear()

    def _lost_from(self, t: float) -> None:
        if self.span_open is None:
            self.span_open = t

    def _loss_start(self) -> float:
        """Where frames lost unseen may start: after our last packet's dts (frames decoded after
        it have later dts, and pts >= dts), which B-frames put before the latest pts read."""
        start = self.frontier if self.frontier is not None else self.origin
        return min(start, self.last_dts * self.tb) if self.last_dts is not None else start

    def _end_holes(self) -> None:
        """A stream cut off (truncated, or garbage to the end) misses the frames that would follow
        its last packet in decode order: a complete one has a packet for every frame between
        that packet's dts and the latest pts read, so holes there are losses."""
        if self.last_dts is None or self.frontier is None:
            return
        d0 = self.last_dts * self.tb
        step = GAP_STEP * (self.prev_dur or self.r._frame_dur)
        prev = max((t for t in self.recent if t <= d0 + EPS), default=d0)
        for t in sorted(t for t in self.recent if t > d0 + EPS) + [self.frontier]:
            if t - prev > step + EPS:
                self.losses.add_span(prev, t)
            prev = max(prev, t)

    def _distrust(self, t: float) -> None:
        """The frame of the packet at `t` may be built from damaged bytes: not delivered."""
        self.losses.add(t)
        self.bad.add(t)
        self._spoiled(("next", t))
        self._spoiled(t)


def _demux(c, fatal=lambda e: None) -> Iterator:
    """Packets of every stream (their byte positions show what a demuxer skipped); None marks a
    demux error (bytes lost there), after which demuxing goes on (a few times: a demuxer that
    keeps failing has nothing left to give). Where `fatal(error)` gives an exception (the
    network failed, not the data), that is raised instead."""
    for _ in range(16):
        try:
            yield from c.demux()
            return
        except Exception as e:
            if (err := fatal(e)) is not None:
                raise err from None
            yield None


def _decode(packet) -> list | None:
    """The packet's frames, or None when the decoder rejects it (damaged data)."""
    try:
        return packet.decode()
    except Exception:
        return None


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
