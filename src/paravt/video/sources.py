"""Where a video's bytes come from: a local file, or an http(s) URL read through FFmpeg's network
protocols, which seek with range requests (an MP4's index at the end costs one request, a crop a
few). Every network operation has a deadline (timeout_s: connect and each read, as a model
call's); a refused connection, an HTTP error or a deadline is a VideoError naming the URL and the
cause, never taken for damaged data."""

from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from paravt.video.errors import VideoError

NET_TIMEOUT_S = 600.0  # s; deadline of one network operation on a URL (EpisodeConfig.model_timeout_s's default)
URL_SCHEMES = ("http://", "https://")
NET_ERRNOS = {errno.EIO, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ECONNABORTED,
              errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE}  # FFmpeg's network failures
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
DEFAULT, ATTACHED_PIC = 0x1, 0x400  # FFmpeg's AV_DISPOSITION_DEFAULT, AV_DISPOSITION_ATTACHED_PIC


def is_url(source: object) -> bool:
    """Whether `source` is a video URL paravt reads over the network (http or https)."""
    return isinstance(source, str) and source.lower().startswith(URL_SCHEMES)


def video_stream(container):
    """The stream to read, chosen as ffmpeg's CLI maps one: the largest frame, never an attached
    picture (an audio file's cover art is a video stream of one image), None without another.
    Unlike ffmpeg, the default flag only breaks ties: muxers set it on the first track whatever it
    holds (MP4's always), so it says less about the best picture than the size does."""
    best, key = None, None
    for s in container.streams.video:
        d = getattr(s, "disposition", 0) or 0
        flags = int(getattr(d, "value", d))  # PyAV 15's Disposition is an enum.Flag, which int() refuses
        if flags & ATTACHED_PIC:
            continue
        k = ((s.codec_context.width or 0) * (s.codec_context.height or 0), bool(flags & DEFAULT))
        if key is None or k > key:  # ties: the first
            best, key = s, k
    return best


@dataclass
class Source:
    """A video file or URL, and how to open it: one PyAV container per call of `open`. Tells the
    network failing (never skipped as damage) from bad data."""

    path: Path | str  # a Path for a file; a URL stays the str it is
    remote: bool
    timeout_s: float
    decoder_threads: int = 0
    stop: threading.Event | None = None  # set by a caller that gave up: every read ends at its next packet

    @classmethod
    def of(cls, path: str | os.PathLike, timeout_s: float = NET_TIMEOUT_S, decoder_threads: int = 0,
           stop: threading.Event | None = None) -> "Source":
        """The source `path` names, checked: a URL scheme other than http(s), a bad deadline, or a
        missing, empty or directory file is a VideoError now."""
        remote = is_url(path)
        if not remote and isinstance(path, str) and _SCHEME.match(path):
            raise VideoError(f"{path}: only http:// and https:// URLs are read (for an object store, use its "
                             "https URL, e.g. a presigned one)")
        if not timeout_s > 0:
            raise VideoError(f"{path}: timeout_s must be positive, got {timeout_s!r}")
        src = cls(path if remote else Path(path), remote, float(timeout_s), decoder_threads, stop)
        src.check()
        return src

    def check(self) -> None:
        """A local file must exist, be a file and hold bytes (a URL's server answers for it when opened)."""
        if self.remote:
            return
        if not self.path.exists():
            raise VideoError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise VideoError(f"{self.path}: is a directory, not a video file")
        if self.path.stat().st_size == 0:
            raise VideoError(f"{self.path}: file is empty (0 bytes)")

    def size(self, container) -> int:
        """Bytes of the file (of the URL's resource, as its server stated)."""
        return (container.size or 0) if self.remote else self.path.stat().st_size

    def open(self):
        """A PyAV container with a video stream, its decoder threads set; else a VideoError."""
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
            if self.network_failure(e):
                raise self.network_error(e) from None
            raise VideoError(f"{self.path}: not a readable video ({type(e).__name__}: {e})") from None
        stream = video_stream(container)
        if stream is None:
            container.close()
            raise VideoError(f"{self.path}: has no video stream (audio-only, audio with cover art, or data file)")
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = self.decoder_threads
        return container if self.stop is None else _Stoppable(container, self.stop, self.path)

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
        if isinstance(e, Stopped):
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


class _Stoppable:
    """A container whose every packet read first checks the caller's stop flag (PyAV's interrupt
    callback cannot be raised from outside): a probe, a decode or a URL's download ends within one
    packet of the flag, its thread free. Every other attribute is the container's."""

    def __init__(self, container, stop: threading.Event, path) -> None:
        self._c, self._stop, self._path = container, stop, path

    def __getattr__(self, name: str):
        return getattr(self._c, name)

    def demux(self, *streams):
        for packet in self._c.demux(*streams):
            if self._stop.is_set():
                raise Stopped(f"{self._path}: reading stopped (the caller's deadline passed)")
            yield packet
