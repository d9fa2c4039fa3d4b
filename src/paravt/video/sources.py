"""Where a video's bytes come from: a local file, or an http(s) URL read through FFmpeg's network
protocols, which seek with range requests (an MP4's index at the end costs one request, a crop a
few). Every network operation has a deadline (timeout_s: connect and each read, as a model
call's), and each operation on a URL a budget of bytes and time (paravt.video.net); a refused
connection, an HTTP error, a server that ignores ranges or a deadline is a VideoError naming the
URL and the cause, never taken for damaged data.

A local file is opened once and checked on what was opened (paravt.video.media: a regular file,
under the media root when there is one); FFmpeg reads that descriptor, and opens only single-file
containers with no protocol but `file` (no playlist or concat list naming other files)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from paravt.video.errors import VideoError
from paravt.video.media import (FILE_PROTOCOLS, FORMAT_WHITELIST, URL_PROTOCOLS, OpenedFile, open_video_file,
                                sniff)
from paravt.video.net import Budget, check_ranges
from paravt.video.streams import candidates, choose_stream

NET_TIMEOUT_S = 600.0  # s; deadline of one network operation on a URL (EpisodeConfig.model_timeout_s's default)
URL_SCHEMES = ("http://", "https://")
NET_ERRNOS = {errno.EIO, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ECONNABORTED,
              errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE}  # FFmpeg's network failures
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
# Frames larger than DCI 8K are refused when a file is opened: FFmpeg's decoders are held to it
# (their max_pixels), so a 1.5 MB file of 16000x16000 frames costs no gigabytes (one such frame
# decoded is 384 MB, and frame threads hold several); as serve caps an image's pixels.
MAX_VIDEO_PIXELS = 8192 * 4320
# Frame threads each hold a frame being decoded: FFmpeg's automatic count (up to 16) is cut so that
# they hold at most this many bytes (8K: 4 threads; 4K and below: no cut).
THREAD_FRAME_BYTES = 256 << 20


def is_url(source: object) -> bool:
    """Whether `source` is a video URL paravt reads over the network (http or https)."""
    return isinstance(source, str) and source.lower().startswith(URL_SCHEMES)


@dataclass
class Source:
    """A video file or URL, and how to open it: one PyAV container per call of `open`. Tells the
    network failing (never skipped as damage) from bad data."""

    path: Path | str  # a Path for a file; a URL stays the str it is
    remote: bool
    timeout_s: float
    decoder_threads: int = 0
    media_root: Path | None = None  # a file must really lie under it (checked on the open descriptor)
    max_video_pixels: int = MAX_VIDEO_PIXELS  # a coded frame's pixels at most
    stop: threading.Event | None = None  # set by a caller that gave up: every read ends at its next packet
    length: int | None = None  # a URL's bytes, as its server stated them
    stream_index: int | None = None  # the video stream read, chosen on the first open
    _file: OpenedFile | None = field(default=None, repr=False, compare=False)
    _identity: tuple | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _ops: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    @classmethod
    def of(cls, path: str | os.PathLike, timeout_s: float = NET_TIMEOUT_S, decoder_threads: int = 0,
           media_root: str | os.PathLike | None = None, max_video_pixels: int = MAX_VIDEO_PIXELS,
           stop: threading.Event | None = None) -> "Source":
        """The source `path` names, checked: a URL scheme other than http(s), a bad deadline, a
        missing, empty, non-regular or directory file (one outside `media_root`), or a URL whose
        server fails or ignores ranges is a VideoError now."""
        remote = is_url(path)
        if not remote and isinstance(path, str) and _SCHEME.match(path):
            raise VideoError(f"{path}: only http:// and https:// URLs are read (for an object store, use its "
                             "https URL, e.g. a presigned one)")
        if not timeout_s > 0:
            raise VideoError(f"{path}: timeout_s must be positive, got {timeout_s!r}")
        if remote and media_root is not None:
            raise VideoError(f"{path}: a URL is not a file under the media root")
        src = cls(path if remote else Path(path), remote, float(timeout_s), decoder_threads,
                  Path(media_root) if media_root is not None else None, int(max_video_pixels), stop)
        if remote:
            src.length = check_ranges(src.path, src.timeout_s)
        else:
            src.acquire()
        return src

    def acquire(self) -> OpenedFile | None:
        """The local file held open and checked (again after `release`: then it must be the same
        file, not one swapped in since)."""
        if self.remote:
            return None
        with self._lock:
            if self._file is None:
                opened = open_video_file(self.path, self.media_root)
                if self._identity is not None and opened.identity != self._identity:
                    opened.close()
                    raise VideoError(f"{self.path}: is another file than the one opened before (replaced since)")
                self._file, self._identity = opened, opened.identity
            return self._file

    def release(self) -> None:
        """Closes the descriptor (containers already opened from it keep their own)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __del__(self) -> None:
        if self._file is not None:
            self._file.close()

    def size(self, container) -> int:
        """Bytes of the file (of the URL's resource, as its server stated)."""
        if self.remote:
            return self.length or container.size or 0
        return self.acquire().size

    def open(self):
        """A PyAV container with a video stream, its decoder threads set; else a VideoError."""
        cap = {"max_pixels": str(self.max_video_pixels)}  # the decoders' bound, from the probe's on
        try:
            container = self._av_open(cap)
        except Exception as e:  # av.error.* (InvalidDataError, ...), OSError
            if self.network_failure(e):
                raise self.network_error(e) from None
            what = None if self.remote else sniff(self.acquire().fd)
            if what or getattr(e, "errno", None) == errno.EINVAL:  # EINVAL: a format not on the whitelist
                raise VideoError(self._not_single_file(what)) from None
            cause = getattr(e, "strerror", None) or str(e)  # not str(e): it names the /proc descriptor
            raise VideoError(f"{self.path}: not a readable video ({type(e).__name__}: {cause})") from None
        if self.stream_index is None:
            stream = choose_stream(container)
            if stream is not None:
                self.stream_index = stream.index
                if len(candidates(container)) > 1:  # packets were read to choose: start afresh
                    container.close()
                    return self.open()
        try:
            stream = self._checked_stream(container)
        except VideoError:
            container.close()
            raise
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = self._threads(stream)
        stream.codec_context.options = {**(stream.codec_context.options or {}), **cap}
        return container

    def _threads(self, stream) -> int:
        """decoder_threads, where 0 (FFmpeg's choice) is bounded for large frames (THREAD_FRAME_BYTES)."""
        frame = (stream.codec_context.width or 0) * (stream.codec_context.height or 0) * 3 // 2
        if self.decoder_threads or frame * 16 <= THREAD_FRAME_BYTES:
            return self.decoder_threads
        return max(1, THREAD_FRAME_BYTES // frame)

    def _av_open(self, options: dict):
        """av.open of the URL, or of the checked descriptor: single-file formats, our protocols only."""
        import av

        opts = {"format_whitelist": FORMAT_WHITELIST}
        if not self.remote:
            return av.open(self.acquire().for_ffmpeg(), mode="r", options=options,
                           container_options={**opts, "protocol_whitelist": FILE_PROTOCOLS})
        # FFmpeg's own socket deadline (connect and each read: "Connection timed out") and PyAV's
        # interrupt, which also ends a read that trickles (data, but too slowly)
        us = str(min(int(self.timeout_s * 1e6), 2**31 - 1))
        return av.open(self.path, mode="r", timeout=self.timeout_s, options=options,
                       container_options={**opts, "timeout": us, "protocol_whitelist": URL_PROTOCOLS})

    def _checked_stream(self, container):
        """The chosen stream, if it is there and its frames are within max_video_pixels."""
        stream = self.stream(container)
        if stream is None:
            raise VideoError(f"{self.path}: has no video stream (audio-only, audio with cover art, or data file)")
        w, h = stream.codec_context.width or 0, stream.codec_context.height or 0
        if not w * h:  # a decoder that met a frame over the bound leaves the size unset: read it undecoded
            w, h = self._stated_size()
        if w * h > self.max_video_pixels:
            raise VideoError(f"{self.path}: its frames are {w}x{h}, over the {self.max_video_pixels / 1e6:.1f} million "
                             f"pixels a frame may have (one decoded would take {w * h * 1.5 / 2**20:.0f} MB): make a "
                             "smaller copy first (ffmpeg -i IN -vf scale=-2:2160 OUT.mp4)")
        return stream

    def _stated_size(self) -> tuple[int, int]:
        """The chosen stream's frame size as the container and parser state it, nothing decoded."""
        try:
            with self._av_open({"skip_frame": "all"}) as c:
                s = self.stream(c)
                return (s.codec_context.width or 0, s.codec_context.height or 0) if s is not None else (0, 0)
        except Exception:
            return 0, 0

    def stream(self, container):
        """The video stream read in `container` (the one chosen on the first open), or None."""
        if self.stream_index is None or self.stream_index >= len(container.streams):
            return None
        s = container.streams[self.stream_index]
        return s if s.type == "video" else None

    def _not_single_file(self, what: str | None) -> str:
        return (f"{self.path}: {what or 'not a single-file video'}: paravt reads a video from one file "
                "(MP4, MKV, AVI, MPEG-TS, ...), never a playlist, concat list or image sequence, whose "
                "demuxers open other files by name; join it into one file first (ffmpeg -i LIST -c copy out.mp4)")

    # ---------- each operation on a URL has a budget ----------
    @contextlib.contextmanager
    def operation(self):
        """One operation (the probe, an overview, a crop) on this thread: on a URL, its packets are
        bounded in bytes and it in time (paravt.video.net.Budget); nested operations share the outer one."""
        if not self.remote or getattr(self._ops, "budget", None) is not None:
            yield
            return
        self._ops.budget = Budget.start(str(self.path), self.timeout_s)
        try:
            yield
        finally:
            self._ops.budget = None

    def packets(self, c, *streams):
        """c.demux(*streams), every demux loop's one source of packets: each packet first checks the
        caller's stop flag (PyAV's interrupt callback cannot be raised from outside, so a probe, a
        decode or a URL's download ends within one packet of the flag, its thread free), and on a URL
        is spent from the operation's budget."""
        budget = None
        if self.remote:
            budget = getattr(self._ops, "budget", None) or Budget.start(str(self.path), self.timeout_s)
        for packet in c.demux(*streams):
            if self.stop is not None and self.stop.is_set():
                raise Stopped(f"{self.path}: reading stopped (the caller's deadline passed)")
            if budget is not None:
                budget.spend(packet.size or 0)
            yield packet

    def network_failure(self, e: BaseException) -> bool:
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

    def failed_network(self, e: BaseException) -> VideoError | None:
        """For a URL, the VideoError of a network failure behind the read error `e`, else None
        (bad data: skipped as damage, as in a file). Demuxers report a connection lost mid-read
        as bad data (MP4: InvalidDataError), so such an error is checked by opening the URL again."""
        if isinstance(e, VideoError):  # stopped, a budget spent (paravt.video.net), or a reopen refused
            return e
        if not self.remote:
            return None
        if self.network_failure(e):
            return self.network_error(e)
        try:
            self.open().close()
        except VideoError as v:  # refused, timed out, an HTTP error, or no longer a video
            return v
        return None

    def network_error(self, e: BaseException) -> VideoError:
        """One line naming the URL and the cause ("Connection refused", "Server returned 404 Not
        Found", "no data within 5 s")."""
        import av

        if isinstance(e, (av.error.ExitError, TimeoutError)):
            cause = f"no data within {self.timeout_s:g} s"
        else:
            cause = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return VideoError(f"{self.path}: cannot read ({cause})")


class Stopped(VideoError):
    """Reading stopped: the caller gave up (its deadline passed)."""
