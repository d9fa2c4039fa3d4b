"""The media root: which local files a server (`paravt app`, `paravt mcp`, `paravt eval --media-root`)
may open, and what FFmpeg may open from them.

Two checks, both needed, and one rule for every caller:

* `resolve_media(root, name)`: the file a name (relative to the root, or absolute inside it) stands
  for, its links resolved; refused when it climbs with `..` or lands outside the root.
* `open_video_file(path, root)`: the file opened once (a descriptor), then checked on what was
  opened: a regular file whose real path, read back from the descriptor (/proc/self/fd), lies under
  the root. FFmpeg then reads that descriptor, never the name again, so a link swapped in after the
  check changes nothing (the VideoReader's decoders on other threads open the same descriptor).

And what FFmpeg opens from a file: only single-file containers (SINGLE_FILE_FORMATS: no HLS
playlist, concat list or image sequence, whose demuxers open other files by name, local or
file://), and, for a file, no protocol but `file`. That holds for every local video paravt reads,
under a media root or not: a video is one file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from paravt.video.errors import VideoError

# FFmpeg demuxers that read one file and open nothing else (FFmpeg's `format_whitelist`): video
# containers, elementary streams, and the audio files whose refusal should say "no video stream".
SINGLE_FILE_FORMATS = (
    "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi", "mpegts", "mpeg", "mpegvideo", "m4v", "h264", "hevc",
    "vvc", "evc", "av1", "obu", "ivf", "flv", "live_flv", "asf", "ogg", "nut", "mxf", "gxf", "dv", "rm", "wtv",
    "yuv4mpegpipe", "mjpeg", "mjpeg_2000", "mpjpeg", "smjpeg", "cavsvideo", "avs2", "avs3", "dirac", "dnxhd",
    "vc1", "h261", "h263", "gif", "apng", "nsv", "nuv", "bink", "smk", "flic", "thp", "mtv", "ipu", "mp3", "aac",
    "wav", "flac", "w64",
)
FORMAT_WHITELIST = ",".join(SINGLE_FILE_FORMATS)
FILE_PROTOCOLS = "file"
URL_PROTOCOLS = "http,https,tcp,tls,httpproxy"  # httpproxy: https through $https_proxy
PROC_FD = Path("/proc/self/fd")


class MediaRootError(VideoError):
    """A name outside the media root (`outside`), or no video file under it."""

    def __init__(self, message: str, outside: bool) -> None:
        super().__init__(message)
        self.outside = outside


def resolve_media(root: str | os.PathLike, name: str, *, absolute: bool = False) -> Path:
    """The file `name` stands for under `root`, links resolved. Refused (MediaRootError, outside=True)
    when it climbs with `..`, resolves outside the root (a link out), or is absolute (allowed with
    `absolute=True` when it names a place under the root, as given or with the root's links resolved:
    lmms-eval hands out absolute paths); outside=False when there is no such file."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise MediaRootError("no media path given", outside=False)
    root = Path(root)
    base = root.resolve()
    rel = name
    if Path(name).is_absolute() or name.startswith(("/", "\\")):
        rel = _below(Path(name), root, base) if absolute else None
        if rel is None:
            raise MediaRootError(f"{name!r} is outside the media root", outside=True)
    if ".." in Path(rel.replace("\\", "/")).parts:
        raise MediaRootError(f"{name!r} is outside the media root", outside=True)
    path = (base / rel).resolve()
    if not path.is_relative_to(base):
        raise MediaRootError(f"{name!r} is outside the media root", outside=True)
    if not path.is_file():
        raise MediaRootError(f"no video file {name!r} under the media root", outside=False)
    return path


def _below(path: Path, root: Path, base: Path) -> str | None:
    for top in (root, base):
        try:
            rel = path.relative_to(top)
        except ValueError:
            continue
        if rel.parts:
            return rel.as_posix()
    return None


@dataclass(frozen=True)
class OpenedFile:
    """A video file held open: the descriptor FFmpeg reads, what it is (st_dev, st_ino) and where it
    really is."""

    fd: int
    identity: tuple[int, int]
    real: Path
    size: int

    def for_ffmpeg(self):
        """What av.open reads: the descriptor's /proc name (FFmpeg's own file protocol opens a new
        description of the same file, with its own offset, so decoders on several threads share
        none), else (no /proc) a file object reading the descriptor at its own offset."""
        if PROC_FD.is_dir():
            return f"file:{PROC_FD / str(self.fd)}"
        return PositionalReader(self.fd)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def open_video_file(path: Path, root: Path | None = None) -> OpenedFile:
    """Open `path` for reading and check what was opened: a regular file holding bytes, under `root`
    (its real path from the descriptor) when one is given. A VideoError otherwise; nothing is left open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise VideoError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise VideoError(f"{path}: is a directory, not a video file") from None
    except OSError as e:
        raise VideoError(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise VideoError(f"{path}: is a directory, not a video file")
        if not stat.S_ISREG(st.st_mode):
            raise VideoError(f"{path}: not a regular file (a device, FIFO or socket is not a video file)")
        if st.st_size == 0:
            raise VideoError(f"{path}: file is empty (0 bytes)")
        real = _real_path(fd, path)
        if root is not None and not real.is_relative_to(Path(root).resolve()):
            raise MediaRootError(f"{path}: is outside the media root ({root}): it opened {real}", outside=True)
        return OpenedFile(fd, (st.st_dev, st.st_ino), real, st.st_size)
    except BaseException:
        os.close(fd)
        raise


def _real_path(fd: int, path: Path) -> Path:
    """Where the open file really is: read back from the descriptor (Linux), else resolved from the
    name and confirmed to be the same file."""
    link = PROC_FD / str(fd)
    try:
        return Path(os.readlink(link))
    except OSError:
        pass
    real = Path(os.path.realpath(path))
    try:
        same = os.stat(real)
        st = os.fstat(fd)
    except OSError:
        raise VideoError(f"{path}: changed while it was opened") from None
    if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):
        raise VideoError(f"{path}: changed while it was opened")
    return real


class PositionalReader:
    """A read-only file object over a descriptor with a position of its own (os.pread): one per
    container, so several never move each other's offset."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(0, os.fstat(self.fd).st_size - self.pos)
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: os.fstat(self.fd).st_size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def sniff(fd: int) -> str | None:
    """What a file FFmpeg refused as not single-file is, from its first bytes, for the message."""
    try:
        head = os.pread(fd, 64, 0).lstrip(b"\xef\xbb\xbf").lstrip()
    except OSError:
        return None
    if head.startswith(b"#EXTM3U"):
        return "an HLS playlist"
    if head.startswith(b"ffconcat"):
        return "an FFmpeg concat list"
    return None
