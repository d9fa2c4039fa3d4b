"""Videos behind HTTP(S): read through FFmpeg's http protocol (seeks are range requests) from a
loopback server, with the model calls' deadline, and one-line errors that name the URL and the cause."""

import time

import pytest

from paravt.agent import EpisodeConfig, run_episode_sync
from paravt.backends.scripted import ScriptedBackend
from paravt.procs import free_port
from paravt.video import VideoError, VideoReader
from videotools import decode_stripe, make_test_video, noisy_stripe_frame, serve_files


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A 60 s MP4 of about 1.7 MB with its index (moov) at the end, as encoders write it: reading it
    over HTTP needs range requests. Served with the request log."""
    root = tmp_path_factory.mktemp("site")
    make_test_video(root / "v.mp4", seconds=60, fps=10, gop=20, frames=noisy_stripe_frame)
    with serve_files(root, stall=30) as (url, log):
        yield root, url, log


def test_a_url_reads_as_the_file_does(site):
    root, url, log = site
    log.clear()
    remote, local = VideoReader(f"{url}/v.mp4"), VideoReader(root / "v.mp4")
    assert remote.path == f"{url}/v.mp4" and remote.probe() == local.probe()
    for call in (lambda r: r.overview(8), lambda r: r.crop(30, 34), lambda r: r.frames_at([59.9, 0.0, 31.3])):
        got, want = call(remote), call(local)
        assert [(f.timestamp, decode_stripe(f.image)) for f in got] == \
               [(f.timestamp, decode_stripe(f.image)) for f in want]
    ranges = [rng for _, path, rng in log if path == "/v.mp4"]
    assert any(rng and rng != "bytes=0-" for rng in ranges), ranges  # it seeked with range requests


@pytest.mark.parametrize("case", ["missing", "refused", "stalled", "object-store"])
def test_a_bad_url_is_one_clear_line(site, case):
    _, url, _ = site
    video, cause = {
        "missing": (f"{url}/nope.mp4", "cannot read (Server returned 404 Not Found)"),
        "refused": (f"http://127.0.0.1:{free_port()}/v.mp4", "cannot read (Connection refused)"),
        "stalled": (f"{url}/stall/v.mp4", "cannot read (no data within 1 s)"),
        "object-store": ("s3://bucket/v.mp4", "only http:// and https:// URLs are read"),
    }[case]
    t = time.perf_counter()
    with pytest.raises(VideoError) as e:
        VideoReader(video, timeout_s=1.0)
    assert time.perf_counter() - t < 10
    assert str(e.value).startswith(f"{video}: {cause}") and "\n" not in str(e.value), str(e.value)


def test_a_server_gone_after_the_probe_is_not_taken_for_damage(tmp_path):
    make_test_video(tmp_path / "v.mp4", seconds=60, fps=10, gop=20, frames=noisy_stripe_frame)
    with serve_files(tmp_path) as (url, _):
        reader = VideoReader(f"{url}/v.mp4", timeout_s=5.0)
    for call in (lambda: reader.crop(30, 34), lambda: reader.overview(1000)):
        with pytest.raises(VideoError, match=r": cannot read \(Connection refused\)$"):
            call()


def script(req):
    """The model crops once, naming another video (which must never be fetched), then answers."""
    if len(req.messages) == 2:
        return ('<think>Look closer.</think><tool_call>{"name": "crop_video", "arguments": '
                '{"video_path": "' + SECRET + '", "start_time": 30, "end_time": 34}}</tool_call>')
    return "<think>Seen.</think><answer>A</answer>"


SECRET = "/other.mp4"


def test_ask_on_a_url(site):
    """`paravt ask http://…/v.mp4`: the episode runs on the URL; the crop is of the episode's own
    video, whatever path the model writes."""
    from rich.console import Console

    from paravt.ask import ask

    root, url, log = site
    make_test_video(root / "other.mp4", seconds=2, fps=10)
    log.clear()
    backend = ScriptedBackend(script, sub="A stripe.")
    ep = ask(f"{url}/v.mp4", "Which?\nA. one\nB. two", model=None, config=EpisodeConfig(frames=4, max_turns=2),
             backend=backend, console=Console(quiet=True))
    assert ep.video == f"{url}/v.mp4" and ep.answer == "A" and ep.n_executed_calls == 1
    assert ep.overview_times == [7.5, 22.5, 37.5, 52.5]
    sub = ep.turns[0].calls[0]
    assert sub.status == "ok" and sub.frame_times == [30.5, 31.5, 32.5, 33.5]
    crop = next(r for r in backend.requests if r.role == "sub")
    assert [decode_stripe(p.image) for m in crop.messages for p in m.images()] == [305, 315, 325, 335]
    assert {path for _, path, _ in log} == {"/v.mp4"}  # the model-written path was never fetched


def test_the_episode_gives_a_url_the_model_deadline(site):
    _, url, _ = site
    t = time.perf_counter()
    with pytest.raises(VideoError, match=r"stall/v\.mp4: cannot read \(no data within 1 s\)"):
        run_episode_sync(ScriptedBackend(script), f"{url}/stall/v.mp4", "Which?",
                         EpisodeConfig(frames=4, model_timeout_s=1.0))
    assert time.perf_counter() - t < 10


def test_ask_command_on_a_dead_url_is_one_line():
    from typer.testing import CliRunner

    from paravt.cli import app

    video = f"http://127.0.0.1:{free_port()}/v.mp4"
    r = CliRunner().invoke(app, ["ask", video, "What happens?"])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == [f"error: {video}: cannot read (Connection refused)"], r.output


def test_ask_gives_a_url_its_timeout(site):
    """`ask --timeout` bounds the video's reads as it bounds model calls (it once opened the URL
    with the reader's 600 s default)."""
    from typer.testing import CliRunner

    from paravt.cli import app

    _, url, _ = site
    t = time.perf_counter()
    r = CliRunner().invoke(app, ["ask", f"{url}/stall/v.mp4", "What happens?", "--timeout", "1"])
    assert r.exit_code == 2 and "cannot read (no data within 1 s)" in r.output, r.output
    assert time.perf_counter() - t < 20


def test_a_server_without_ranges_is_refused_plainly(tmp_path):
    """Python's own `http.server` ignores Range: seeking back is impossible there. A tiny MKV gave 7 of
    8 overview frames as the last frame, unflagged; a larger file failed with "Input/output error".
    Now the URL is refused when opened, saying why."""
    import subprocess
    import sys
    import urllib.request

    make_test_video(tmp_path / "tiny.mkv", seconds=4, fps=10, gop=10)
    make_test_video(tmp_path / "big.mp4", seconds=60, fps=10, gop=20, frames=noisy_stripe_frame)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # until it listens
            try:
                urllib.request.urlopen(f"{url}/tiny.mkv", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for name in ("tiny.mkv", "big.mp4"):
            with pytest.raises(VideoError) as e:
                VideoReader(f"{url}/{name}", timeout_s=5)
            assert str(e.value).startswith(f"{url}/{name}: the server ignores Range requests"), str(e.value)
    finally:
        server.terminate()
        server.wait(10)
