"""Resources a video may take are bounded where the work happens (issue 61, cases 4 and 7): a frame's
pixels, checked when the file is opened (FFmpeg's decoders held to the same bound), and every
operation on a URL, in bytes and in time; a server that streams without end is refused."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from paravt.video import VideoError, VideoReader
from videotools import gray_jpeg, make_test_video, need_ffmpeg, noisy_stripe_frame, serve_files


# ---------- case 4: a pixel bound, checked at the probe ----------
@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    """The report's file: a 1.5 MB MKV of 16000x16000 MJPEG frames (two, 1 s each), muxed by ffmpeg."""
    d = tmp_path_factory.mktemp("huge")
    (d / "huge.jpg").write_bytes(gray_jpeg(16000, 16000))
    r = subprocess.run([need_ffmpeg(), "-v", "error", "-y", "-framerate", "1", "-loop", "1", "-t", "2",
                        "-i", str(d / "huge.jpg"), "-c", "copy", str(d / "huge.mkv")], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return d / "huge.mkv"


# The peak of this process's own memory (VmHWM; ru_maxrss keeps the forking parent's after exec)
PEAK = """
import re, sys
from paravt.video import VideoError, VideoReader
try:
    VideoReader(sys.argv[1]).crop(0, 2)
    print("read")
except VideoError as e:
    print("refused:", e)
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) // 1024)
"""


def test_frames_over_the_pixel_bound_are_refused_without_decoding(huge):
    """One crop of it peaked at 5.1 GB (16000x16000 YUV; 0.8 GB here in greyscale): refused at the probe,
    and the process stays near its size with nothing decoded."""
    r = subprocess.run([sys.executable, "-c", PEAK, str(huge)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    said, peak_mb = r.stdout.strip().splitlines()
    assert said.startswith("refused:") and "16000x16000" in said and "million pixels" in said, said
    assert int(peak_mb) < 300, peak_mb


def test_mcp_and_the_app_refuse_it(huge, tmp_path):
    from fastapi.testclient import TestClient

    from paravt.app import AppSettings, create_app
    from paravt.backends.scripted import ScriptedBackend
    from paravt.integrations.mcp import tools
    from paravt.integrations.mcp.settings import McpSettings, ToolInputError

    with pytest.raises(ToolInputError, match="16000x16000"):
        asyncio.run(tools.run_window(McpSettings(media_root=str(huge.parent)), huge.name, 0, 1, threading.Event()))
    app = create_app(AppSettings(media_root=huge.parent), upload_dir=tmp_path / "uploads",
                     backend_factory=lambda m: ScriptedBackend(lambda r: "<answer>A</answer>"))
    with TestClient(app) as c:
        up = c.put("/api/upload", params={"name": "huge.mkv"}, content=huge.read_bytes())
        assert up.status_code == 400 and "16000x16000" in up.json()["error"], up.text
        r = c.post("/api/ask", json={"video": {"media": huge.name}, "question": "Q?"})
        assert r.status_code == 400 and "16000x16000" in r.json()["error"], r.text


def test_the_bound_is_the_readers_to_set(tmp_path):
    video = make_test_video(tmp_path / "v.mp4", seconds=1, fps=5)
    assert len(VideoReader(video).overview(2)) == 2
    with pytest.raises(VideoError, match=r"its frames are 96x64, over the 0\.0 million pixels"):
        VideoReader(video, max_video_pixels=96 * 64 - 1)


def test_frame_threads_are_cut_for_large_frames(tmp_path, monkeypatch):
    """Each frame thread holds a frame: FFmpeg's automatic count (up to 16) is cut where frames are
    large (8K: 4 threads); a count given is kept."""
    from paravt.video import sources

    video = make_test_video(tmp_path / "v.mp4", seconds=1, fps=5)

    def threads(reader):  # what the decoder is opened with (FFmpeg reports the count it resolved after)
        return reader.source._threads(reader._track().s)

    assert threads(VideoReader(video)) == 0  # small frames: FFmpeg's choice
    monkeypatch.setattr(sources, "THREAD_FRAME_BYTES", 96 * 64 * 3 // 2 * 3)  # room for three such frames
    r = VideoReader(video)
    assert threads(r) == 3 and len(r.overview(5)) == 5
    assert threads(VideoReader(video, decoder_threads=2)) == 2


# ---------- case 7: every read of a URL is bounded ----------
@contextlib.contextmanager
def endless_server(ranges: bool):
    """An HTTP server whose one resource never ends: no Content-Length, data as fast as it is taken
    (an MPEG-TS, repeated), up to 256 MB; with `ranges`, it answers 206 with an unknown length.
    Yields (url, a dict with the bytes it sent)."""
    tmp = Path(__import__("tempfile").mkdtemp())
    chunk = make_test_video(tmp / "seg.ts", seconds=2, fps=10).read_bytes()
    sent = {"bytes": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(206 if ranges and self.headers.get("Range") else 200)
            if ranges and self.headers.get("Range"):
                self.send_header("Content-Range", "bytes 0-0/*")
            self.send_header("Content-Type", "video/mp2t")
            self.end_headers()
            try:
                while sent["bytes"] < 256 << 20:
                    self.wfile.write(chunk)
                    sent["bytes"] += len(chunk)
            except OSError:
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/live.ts", sent
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("ranges", [False, True])
def test_an_endless_url_is_refused_at_once(ranges):
    """It was read to its end by the probe (330 MB in 6 s in the report)."""
    with endless_server(ranges) as (url, sent):
        t = time.perf_counter()
        with pytest.raises(VideoError) as e:
            VideoReader(url, timeout_s=5)
        assert time.perf_counter() - t < 5
        time.sleep(0.2)
        assert sent["bytes"] < 4 << 20, sent  # the first buffers' worth, not the stream
    assert ("ignores Range requests" if not ranges else "states no length") in str(e.value)


def test_one_read_of_a_url_is_bounded_in_bytes(tmp_path, monkeypatch):
    from paravt.video import net

    make_test_video(tmp_path / "v.mp4", seconds=20, fps=10, gop=20, frames=noisy_stripe_frame)
    with serve_files(tmp_path) as (url, _):
        reader = VideoReader(f"{url}/v.mp4", timeout_s=5)
        assert len(reader.crop(2, 4)) == 2
        monkeypatch.setattr(net, "NET_MAX_BYTES", 1 << 16)  # one read may demux 64 KiB of it
        with pytest.raises(VideoError, match=r"cannot read \(one read would take more than 0\.0625 MB of it"):
            reader.overview(20)
        assert len(reader.crop(2, 3)) == 1  # a small one still fits


def test_one_read_of_a_url_is_bounded_in_time(tmp_path, monkeypatch):
    """Data that keeps coming (each packet in time) but a read that would last: it ends at timeout_s."""
    from paravt.video import net

    clock = {"t": 0.0}
    monkeypatch.setattr(net, "clock", lambda: clock["t"])
    make_test_video(tmp_path / "v.mp4", seconds=20, fps=10, gop=20, frames=noisy_stripe_frame)
    with serve_files(tmp_path) as (url, _):
        reader = VideoReader(f"{url}/v.mp4", timeout_s=5)
        real = reader.source.packets

        def slow(c, *streams):  # every packet takes 0.1 s of the clock
            for p in real(c, *streams):
                clock["t"] += 0.1
                yield p

        monkeypatch.setattr(reader.source, "packets", slow)
        assert len(reader.crop(2, 3)) == 1  # a read of a few packets ends in time
        with pytest.raises(VideoError, match=r"cannot read \(one read took more than 5 s\)"):
            reader.overview(100)
