"""What a video URL's server must do before FFmpeg reads it, and the bound on each read.

FFmpeg's http protocol seeks with range requests. A server that ignores them (Python's
`http.server`, some CDNs) answers every seek with the whole file from byte 0, which FFmpeg reads
as a stream that cannot go back: seeks fail, frames come from the wrong place, or a read ends in
"Input/output error". A server that states no length (a live stream, chunked transfer) has no end
to read to. So before FFmpeg opens a URL, one request (`Range: bytes=0-0`) asks for its first byte:
a 206 with the total length is a file paravt can seek; a 200 (ranges ignored) or no length is a
VideoError that says so. Errors read as FFmpeg's own ("Server returned 404 Not Found").

Each operation on a URL (the probe, one overview or crop) then has a budget (`Budget`): the
packets demuxed, counted in bytes, and its time, both bounded (NET_MAX_BYTES, the reader's
timeout_s), so a read that would go on without end stops with a VideoError.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from paravt.video.errors import VideoError

NET_MAX_BYTES = 2 << 30  # bytes one operation on a URL may demux (a 10 s crop of 4K at 100 Mbit/s is ~125 MB)
clock = time.monotonic  # the budgets' clock (a test's to replace)
_TOTAL = re.compile(r"^\s*bytes\s+\d+-\d+/(\d+)\s*$", re.I)
_FFMPEG_4XX = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


def http_cause(code: int, reason: str = "") -> str:
    """An HTTP error as FFmpeg words it (its AVERROR_HTTP_* messages)."""
    if code in _FFMPEG_4XX:
        return f"Server returned {code} {_FFMPEG_4XX[code]}"
    if 400 <= code < 500:
        return "Server returned 4XX Client Error, but not one of 40{0,1,3,4}"
    if code >= 500:
        return "Server returned 5XX Server Error reply"
    return f"Server returned {code} {reason}".strip()


def check_ranges(url: str, timeout_s: float) -> int:
    """The URL's length in bytes, from a one-byte range request; a VideoError naming the URL when the
    server fails, ignores ranges or states no length. TLS is not verified, as FFmpeg's http does not."""
    req = urllib.request.Request(url, headers={"Range": "bytes=0-0", "User-Agent": "paravt",
                                               "Accept-Encoding": "identity"})
    context = ssl._create_unverified_context() if url.lower().startswith("https") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as r:
            status, total = r.status, _TOTAL.match(r.headers.get("Content-Range") or "")
    except urllib.error.HTTPError as e:
        if e.code == 416:  # nothing at byte 0: an empty resource
            raise VideoError(f"{url}: cannot read (the server holds no bytes there: 416 Range Not Satisfiable)") \
                from None
        raise VideoError(f"{url}: cannot read ({http_cause(e.code, e.reason)})") from None
    except (urllib.error.URLError, OSError) as e:
        raise VideoError(f"{url}: cannot read ({_net_cause(e, timeout_s)})") from None
    if status == 200:
        raise VideoError(f"{url}: the server ignores Range requests (it answered a request for one byte with "
                         "the whole file), so the video cannot be sought; download it, or serve it with range "
                         "support (nginx, a CDN, an object store)")
    if status != 206 or total is None:
        raise VideoError(f"{url}: the server states no length for it (a live stream or chunked transfer?): "
                         "only a file of known length is read")
    return int(total.group(1))


def _net_cause(e: BaseException, timeout_s: float) -> str:
    reason = getattr(e, "reason", e)
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"no data within {timeout_s:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


@dataclass
class Budget:
    """One operation's bound on a URL: bytes of packets it may demux, and the time by which it ends."""

    url: str
    max_bytes: int
    seconds: float
    spent: int = 0
    deadline: float = 0.0  # on `clock`

    @classmethod
    def start(cls, url: str, seconds: float, max_bytes: int | None = None) -> "Budget":
        return cls(url, NET_MAX_BYTES if max_bytes is None else max_bytes, seconds, 0, clock() + seconds)

    def spend(self, n: int) -> None:
        self.spent += n
        if self.spent > self.max_bytes:
            raise VideoError(f"{self.url}: cannot read (one read would take more than "
                             f"{self.max_bytes / 2**20:g} MB of it; download the file)")
        if clock() > self.deadline:
            raise VideoError(f"{self.url}: cannot read (one read took more than {self.seconds:g} s)")
