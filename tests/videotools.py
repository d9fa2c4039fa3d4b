"""Small real videos for tests: each frame carries its own index as a binary stripe."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

BITS = 12  # up to 4095 frames


def stripe_frame(index: int, height: int = 64, width: int = 96) -> np.ndarray:
    """A frame whose top band encodes `index` in BITS black/white cells (robust to compression)."""
    img = np.full((height, width, 3), 64, np.uint8)
    cell = width // BITS
    for b in range(BITS):
        if (index >> b) & 1:
            img[: height // 2, b * cell : (b + 1) * cell] = 255
        else:
            img[: height // 2, b * cell : (b + 1) * cell] = 0
    return img


def noisy_stripe_frame(index: int, height: int = 64, width: int = 96) -> np.ndarray:
    """A stripe frame whose lower part is noise: about 3 KB per frame even in H.264, so a
    test file is large enough to damage a few hundred KiB in its middle."""
    img = stripe_frame(index, height, width)
    top = height * 5 // 8
    img[top:] = np.random.default_rng(index).integers(0, 256, (height - top, width, 3), np.uint8)
    return img


def decode_stripe(img: np.ndarray) -> int:
    """Read the index back from a (possibly resized) stripe frame."""
    h, w = img.shape[:2]
    cell = w / BITS
    row = img[h // 4, :, :].mean(axis=-1)
    value = 0
    for b in range(BITS):
        x = int((b + 0.5) * cell)
        if row[x] > 128:
            value |= 1 << b
    return value


def make_test_video(
    path: str | Path,
    seconds: float = 10.0,
    fps: int = 10,
    size: tuple[int, int] = (64, 96),
    gop: int = 1,
    codec: str = "libx264",
    stripe: bool = True,
    bframes: int = 0,
    frames=None,
    times: list[float] | None = None,
    options: dict | None = None,
    rotation: int | None = None,
    sar: Fraction | None = None,
) -> Path:
    """Write a video whose frame i shows stripe i (or a plain moving pattern with stripe=False);
    the container follows the suffix (.mp4, .mkv, .ts: MPEG-TS, .avi, .mpg, .h264: a raw
    elementary stream, no timestamps). codec "mjpeg" is written full-range (yuvj420p), as
    webcams do; "mpeg4" is XviD's format.

    gop=1: all keyframes; larger: long GOP. bframes > 0 (H.264 only) reorders frames so pts
    and dts differ. `times` (seconds, increasing) gives each frame its own pts: a
    variable-frame-rate file with len(times) frames; `seconds`/`fps` then only set the codec rate.
    options: muxer options, e.g. {"max_delay": "700000"} for MPEG-TS timestamps that start at
    1.4 s as ffmpeg's CLI writes them. rotation: a display matrix turning the picture this many
    degrees counter-clockwise for display (a phone's portrait clip), as FFmpeg's
    av_display_rotation_get reads it back; needs PyAV's VideoStream.set_display_rotation.
    sar: the sample aspect ratio (anamorphic video: a pixel sar times as wide as tall on display).
    """
    import av

    path = Path(path)
    h, w = size
    n = len(times) if times is not None else int(round(seconds * fps))
    with av.open(str(path), mode="w", options=options or {}) as out:
        stream = out.add_stream(codec, rate=Fraction(fps, 1) if isinstance(fps, int) else fps)
        stream.width, stream.height = w, h
        if sar is not None:
            stream.codec_context.sample_aspect_ratio = sar
        if rotation is not None:
            stream.set_display_rotation(rotation)
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        stream.gop_size = gop
        if times is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        if codec == "libx264":
            stream.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "preset": "ultrafast",
                              "crf": "18", "bf": str(bframes)}
        else:
            stream.bit_rate = 800_000
        for i in range(n):
            if frames is not None:
                img = frames(i)
            elif stripe:
                img = stripe_frame(i, h, w)
            else:
                img = np.zeros((h, w, 3), np.uint8)
                img[:, (i * 3) % w] = 255
                img[..., 1] = (i * 7) % 256
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            if times is not None:
                frame.pts = int(round(times[i] * 1000))
                frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def make_jump_video(path: str | Path, n: int = 100, fps: int = 10, jump_at: int = 50, jump_s: float = 36000.0,
                    gop: int = 1) -> Path:
    """A stripe video (frame i shows stripe i) whose timestamps jump forward by `jump_s` seconds
    at frame `jump_at`, as after a camera clock reset or files joined without re-timing: encoded
    at a steady `fps`, then muxed with every packet from that frame on shifted (pts and dts).
    The container follows the suffix (.mp4, .mkv)."""
    import av

    path = Path(path)
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "preset": "ultrafast",
                          "crf": "18", "bf": "0"}
        packets = []
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(stripe_frame(i), format="rgb24")
            frame.pts = i
            packets += stream.encode(frame)
        packets += stream.encode()
        for packet in packets:
            tb = packet.time_base
            if packet.pts is not None and packet.pts * tb >= Fraction(jump_at, fps):
                shift = round(Fraction(jump_s) / tb)
                packet.pts += shift
                packet.dts += shift
            out.mux(packet)
    return path


def make_audio_only(path: str | Path, seconds: float = 1.0, cover: str | None = None) -> Path:
    """An audio file (AAC; MP3 for a .mp3). cover: "mjpeg" or "png" adds a 64x48 picture as an
    attached picture (a music file's cover art: a video stream with disposition attached_pic)."""
    import av

    path = Path(path)
    mp3 = path.suffix == ".mp3"
    # .m4a: FFmpeg's "ipod" muxer (the suffix's) takes no picture codec in PyAV; an .m4a is an MP4
    with av.open(str(path), mode="w", format="mp4" if path.suffix == ".m4a" else None) as out:
        stream = out.add_stream("libmp3lame" if mp3 else "aac", rate=16000)
        if cover is not None:
            _add_cover(out, cover)
        samples = int(16000 * seconds)
        t = np.arange(samples) / 16000
        data = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
        chunk = 1024
        for s in range(0, samples, chunk):
            frame = av.AudioFrame.from_ndarray(data[:, s : s + chunk], format="fltp", layout="mono")
            frame.sample_rate = 16000
            for p in stream.encode(frame):
                out.mux(p)
        for p in stream.encode():
            out.mux(p)
    return path


def _add_cover(out, codec: str) -> None:
    """Mux one picture as an attached picture (cover art) into `out`."""
    import av

    pic = out.add_stream(codec, rate=1)
    pic.width, pic.height = 64, 48
    pic.pix_fmt = "yuvj420p" if codec == "mjpeg" else "rgb24"
    pic.disposition = _flag(av.stream.Disposition.attached_pic)
    img = np.zeros((48, 64, 3), np.uint8)
    img[:, :32] = 255
    for packet in pic.encode(av.VideoFrame.from_ndarray(img, format="rgb24")) + pic.encode():
        out.mux(packet)


def make_multi_stream(path: str | Path, sizes: list[tuple[int, int]], seconds: float = 2.0, fps: int = 10,
                      default: int | None = None) -> Path:
    """A file with one H.264 stream per (height, width) of `sizes`, in that order; stream j's frame
    i shows stripe 1000 * j + i. default: the stream flagged default (disposition); None leaves it to
    the muxer (Matroska's flags none, MP4's the first)."""
    import av

    path = Path(path)
    n = int(round(seconds * fps))
    with av.open(str(path), mode="w") as out:
        streams = []
        for j, (h, w) in enumerate(sizes):
            s = out.add_stream("libx264", rate=Fraction(fps, 1))
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.options = {"preset": "ultrafast", "crf": "18", "bf": "0"}
            s.disposition = _flag(av.stream.Disposition.default if j == default else av.stream.Disposition(0))
            streams.append(s)
        for i in range(n):
            for j, s in enumerate(streams):
                frame = av.VideoFrame.from_ndarray(stripe_frame(1000 * j + i, s.height, s.width), format="rgb24")
                for packet in s.encode(frame):
                    out.mux(packet)
        for s in streams:
            for packet in s.encode():
                out.mux(packet)
    return path


def serve_files(root: str | Path, stall: float = 0.0):
    """A loopback HTTP server for the files under `root`, with byte ranges (`Range: bytes=a-b`,
    `a-`, `-n`; 206 and Content-Range), as object stores and CDNs answer: FFmpeg's http protocol
    seeks with them (Python's SimpleHTTPRequestHandler ignores Range). A context manager yielding
    (base URL, the request log as (method, path, Range header) tuples). Paths starting with
    /stall/ accept the connection and answer nothing for `stall` seconds (a hung server)."""
    import contextlib
    import http.server
    import threading
    import time
    from urllib.parse import unquote

    root = Path(root)
    log: list[tuple[str, str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _range(self, size: int) -> tuple[int, int] | None:
            spec = self.headers.get("Range", "")
            if not spec.startswith("bytes=") or "," in spec:
                return None
            a, _, b = spec[6:].strip().partition("-")
            if not a:  # the last n bytes
                n = int(b)
                return max(0, size - n), size - 1
            lo, hi = int(a), int(b) if b else size - 1
            return lo, min(hi, size - 1)

        def _answer(self, body: bool) -> None:
            log.append((self.command, self.path, self.headers.get("Range")))
            path = unquote(self.path.split("?", 1)[0])
            if path.startswith("/stall/"):
                time.sleep(stall)
                return
            f = root / path.lstrip("/")
            if not f.is_file():
                self.send_error(404, "Not Found")
                return
            data = f.read_bytes()
            size = len(data)
            rng = self._range(size)
            if rng is not None and rng[0] >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            lo, hi = rng if rng is not None else (0, size - 1)
            self.send_response(206 if rng is not None else 200)
            if rng is not None:
                self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(hi - lo + 1))
            self.end_headers()
            if body:
                try:
                    self.wfile.write(data[lo:hi + 1])
                except (BrokenPipeError, ConnectionResetError):  # the reader seeked elsewhere
                    pass

        def do_GET(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

    @contextlib.contextmanager
    def running():
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", log
        finally:
            server.shutdown()
            server.server_close()

    return running()


def _flag(flag):
    """A Disposition as the PyAV here sets it: PyAV 15's is a plain enum.Flag, set as its int."""
    return flag if hasattr(flag, "__int__") else flag.value


def quadrant_frame(i: int, height: int = 64, width: int = 96) -> np.ndarray:
    """White top-left quadrant, grey top-right, black bottom: tells the four turns apart."""
    img = np.zeros((height, width, 3), np.uint8)
    img[: height // 2, : width // 2] = 255
    img[: height // 2, width // 2 :] = 128
    return img


def quadrant_means(img: np.ndarray) -> list[int]:
    h, w = img.shape[0] // 2, img.shape[1] // 2
    return [int(round(q.mean() / 32)) for q in (img[:h, :w], img[:h, w:], img[h:, :w], img[h:, w:])]


FFMPEG = "/usr/bin/ffmpeg"


def need_ffmpeg() -> str:
    """Debian's ffmpeg, which makes test files the way users' tools make them; the test is skipped
    (with the reason) where it is not installed."""
    import os
    import shutil

    import pytest

    path = FFMPEG if os.access(FFMPEG, os.X_OK) else shutil.which("ffmpeg")
    if not path:
        pytest.skip("Debian's ffmpeg is not installed (apt-get install ffmpeg): it makes this test's video")
    return path


def ffmpeg_video(path: str | Path, args: list[str], n: int = 50, fps: int = 25, size: tuple[int, int] = (64, 96),
                 frames=None, inputs: list[str] | None = None) -> Path:
    """A video written by ffmpeg's CLI from n stripe frames piped in as raw RGB at `fps` (frame i shows
    stripe i, or frames(i)): `ffmpeg -f rawvideo ... -i - [INPUTS] ARGS PATH`; the stripes are input 0,
    `inputs` more of them (e.g. ["-f", "lavfi", "-i", "sine=d=4"])."""
    import subprocess

    path = Path(path)
    h, w = size
    data = b"".join((frames(i) if frames else stripe_frame(i, h, w)).tobytes() for i in range(n))
    cmd = [need_ffmpeg(), "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
           "-r", str(fps), "-i", "-", *(inputs or []), *args, str(path)]
    r = subprocess.run(cmd, input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return path


def gray_jpeg(width: int, height: int) -> bytes:
    """A baseline greyscale JPEG of mid-grey pixels, written out directly (each 8x8 block: DC
    difference 0, then end-of-block: 3 bits), so a 16000x16000 frame is 1.5 MB made in milliseconds,
    with no encoder holding the picture."""
    import struct

    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    dqt = segment(0xDB, b"\x00" + bytes([1] * 64))
    sof = segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    dc = b"\x00" + bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]) + bytes(range(12))  # the standard DC table
    ac = b"\x10" + bytes([1] + [0] * 15) + b"\x00"  # one AC code: '0', end-of-block
    sos = segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    data = b"\x00\x00\x00" * (blocks // 8) + (b"\x00" if blocks % 8 else b"")  # DC '00' + EOB '0', 8 in 3 bytes
    return b"\xff\xd8" + dqt + sof + segment(0xC4, dc + ac) + sos + data + b"\xff\xd9"
