"""The media root holds for what FFmpeg opens, not only for the name checked (issue 61, cases 1
and 2): a playlist or concat list inside the root whose entries name files outside it opens
nothing (in `paravt mcp`, `paravt app` and its thumbnails, and any VideoReader), and a link swapped
in after the check is never followed (the file is opened once and checked as opened; the decoders
read that descriptor)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from paravt.integrations.mcp import tools
from paravt.integrations.mcp.settings import McpSettings, ToolInputError
from paravt.video import VideoError, VideoReader
from paravt.video.media import MediaRootError, open_video_file, resolve_media
from videotools import decode_stripe, make_test_video, stripe_frame

SECRET = 1000  # the outside video's frames show stripes 1000, 1001, ...


@pytest.fixture
def media(tmp_path) -> dict[str, Path]:
    """A media root with a video (stripes 0..) in a folder, and outside it a secret video (stripes
    1000..) in MP4 and MPEG-TS (the segment format HLS uses)."""
    root, outside = tmp_path / "media", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    make_test_video(root / "sub" / "v.mp4", seconds=4, fps=5)
    for name in ("secret.mp4", "secret.ts"):
        make_test_video(outside / name, seconds=4, fps=5, frames=lambda i: stripe_frame(SECRET + i))
    return {"root": root, "outside": outside, "video": root / "sub" / "v.mp4"}


def playlists(outside: Path) -> dict[str, str]:
    """Files that name other files: HLS playlists (a relative, an absolute and a file:// segment) and
    an FFmpeg concat list, each as a user's tools write them."""
    def hls(segment: str) -> str:
        return ("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:0\n"
                f"#EXTINF:4.0,\n{segment}\n#EXT-X-ENDLIST\n")
    return {
        "rel.m3u8": hls("../outside/secret.ts"),
        "abs.m3u8": hls(str(outside / "secret.ts")),
        "url.m3u8": hls((outside / "secret.ts").as_uri()),
        "list.ffconcat": f"ffconcat version 1.0\nfile '{outside / 'secret.mp4'}'\n",
    }


def stripes(frames) -> list[int]:
    return [decode_stripe(f.image) for f in frames]


# ---------- case 1: a file that names other files opens none of them ----------
@pytest.mark.parametrize("name", ["rel.m3u8", "abs.m3u8", "url.m3u8", "list.ffconcat"])
def test_a_playlist_opens_nothing_it_names(media, name):
    """VideoReader (ask, eval, the app, MCP) refuses it before FFmpeg reads a segment; it once returned
    the outside video's frames."""
    root = media["root"]
    (root / name).write_text(playlists(media["outside"])[name])
    for kwargs in ({}, {"media_root": root}):
        with pytest.raises(VideoError, match="never a playlist, concat list or image sequence") as e:
            VideoReader(root / name, **kwargs)
        assert "\n" not in str(e.value)
    if name.endswith(".m3u8"):
        assert "an HLS playlist" in str(e.value)


def test_mcp_and_app_refuse_a_playlist_in_the_root(media, tmp_path):
    from paravt.app import AppSettings, create_app, overview_thumbnails
    from paravt.backends.scripted import ScriptedBackend

    root = media["root"]
    for name, text in playlists(media["outside"]).items():
        (root / name).write_text(text)
    settings = McpSettings(media_root=str(root))
    for name in playlists(media["outside"]):
        with pytest.raises(ToolInputError, match="never a playlist"):
            asyncio.run(tools.run_window(settings, name, 0, 2, threading.Event()))
    with pytest.raises(VideoError, match="never a playlist"):  # the app's thumbnails
        overview_thumbnails(root / "rel.m3u8", [0.5, 1.5], root=root)
    app = create_app(AppSettings(media_root=root), upload_dir=tmp_path / "uploads",
                     backend_factory=lambda m: ScriptedBackend(lambda r: "<answer>A</answer>"))
    with TestClient(app) as c:
        r = c.post("/api/ask", json={"video": {"media": "rel.m3u8"}, "question": "Q?"})
        assert r.status_code == 400 and "an HLS playlist" in r.json()["error"], r.text
        up = c.put("/api/upload", params={"name": "clip.m3u8"}, content=(root / "abs.m3u8").read_bytes())
        assert up.status_code == 400 and "never a playlist" in up.json()["error"], up.text


def test_the_one_file_formats_still_open(tmp_path):
    """The single-file rule keeps what users have: MP4, MKV, MPEG-TS, MPEG-PS, AVI, raw H.264."""
    for suffix in (".mp4", ".mkv", ".ts", ".mpg", ".avi", ".h264"):
        make_test_video(tmp_path / f"v{suffix}", seconds=1, fps=5, codec="mpeg2video" if suffix == ".mpg" else
                        "libx264")
        with VideoReader(tmp_path / f"v{suffix}", media_root=tmp_path) as r:
            assert stripes(r.overview(5)) == [0, 1, 2, 3, 4], suffix


# ---------- case 2: a link swapped in after the check ----------
def swap_in_link(path: Path, target: Path) -> None:
    """Replace `path` (a file or a folder) by a link to `target`, atomically (rename over it)."""
    tmp = path.with_name(path.name + ".swap")
    tmp.symlink_to(target)
    if path.is_dir():
        shutil.rmtree(path)
    os.replace(tmp, path)


@pytest.mark.parametrize("swapped", ["file", "folder"])
def test_a_link_swapped_in_after_the_name_check(media, monkeypatch, swapped):
    """crop_video's name check passes, then the file (or its folder) becomes a link out of the root
    before the video is opened: refused, never the outside frames."""
    settings = McpSettings(media_root=str(media["root"]))
    real = tools.resolve_video

    def check_then_swap(s, name):
        path = real(s, name)
        if swapped == "file":
            swap_in_link(media["video"], media["outside"] / "secret.mp4")
        else:
            shutil.copy(media["outside"] / "secret.mp4", media["outside"] / "v.mp4")
            swap_in_link(media["root"] / "sub", media["outside"])
        return path

    monkeypatch.setattr(tools, "resolve_video", check_then_swap)
    with pytest.raises(ToolInputError, match="outside the media root"):
        asyncio.run(tools.run_window(settings, "sub/v.mp4", 0, 3, threading.Event()))


def test_a_link_swapped_in_while_the_video_is_open(media, monkeypatch):
    """The reader is open (probed on one thread) when the file becomes a link out; the crop then decodes
    on the pool's threads, which open their own decoders: from the checked descriptor, so the frames
    are the video's own (they were the outside video's, 12 of 300 calls in the report)."""
    settings = McpSettings(media_root=str(media["root"]))
    real = tools.open_video

    async def open_then_swap(s, name, stop):
        reader = await real(s, name, stop)
        swap_in_link(media["video"], media["outside"] / "secret.mp4")
        return reader

    monkeypatch.setattr(tools, "open_video", open_then_swap)
    window = asyncio.run(tools.run_window(settings, "sub/v.mp4", 0, 3, threading.Event()))
    shown = [decode_stripe(p.image) for p in window.parts if hasattr(p, "image")]
    assert shown and all(i < SECRET for i in shown), shown


def test_the_app_opens_what_it_checked(media, monkeypatch, tmp_path):
    """/api/ask checks the name, then the link is swapped in: the episode refuses (400), it does not run
    on the outside video."""
    from paravt.app import AppSettings, create_app, routes
    from paravt.backends.scripted import ScriptedBackend

    real = routes.parse_ask

    def parse_then_swap(*args):
        req = real(*args)
        swap_in_link(media["video"], media["outside"] / "secret.mp4")
        return req

    monkeypatch.setattr(routes, "parse_ask", parse_then_swap)
    app = create_app(AppSettings(media_root=media["root"]), upload_dir=tmp_path / "uploads",
                     backend_factory=lambda m: ScriptedBackend(lambda r: "<answer>A</answer>"))
    with TestClient(app) as c:
        r = c.post("/api/ask", json={"video": {"media": "sub/v.mp4"}, "question": "Q?", "frames": 2})
    assert r.status_code == 400 and "outside the media root" in r.json()["error"], r.text[:300]


def test_what_was_opened_is_checked(media):
    """open_video_file reads the real path back from the descriptor; FIFOs and devices are refused
    without blocking; a reopened reader must find the same file."""
    root = media["root"]
    opened = open_video_file(media["video"], root)
    assert opened.real == media["video"].resolve()
    opened.close()
    (root / "out.mp4").symlink_to(media["outside"] / "secret.mp4")
    with pytest.raises(MediaRootError, match="outside the media root"):
        open_video_file(root / "out.mp4", root)
    os.mkfifo(root / "fifo.mp4")
    with pytest.raises(VideoError, match="not a regular file"):
        VideoReader(root / "fifo.mp4")
    reader = VideoReader(media["video"], media_root=root)
    reader.close()  # closes its descriptor; using it again reopens and checks the file again
    shutil.copy(media["video"], root / "copy.mp4")
    os.replace(root / "copy.mp4", media["video"])  # another file (a new inode) under the same name
    with pytest.raises(VideoError, match="another file than the one opened before"):
        reader.crop(0, 1)


def test_resolve_media_is_one_rule(media):
    """The naming rule app and MCP share (and `paravt eval --media-root`)."""
    root = media["root"]
    assert resolve_media(root, "sub/v.mp4") == media["video"].resolve()
    assert resolve_media(root, str(media["video"]), absolute=True) == media["video"].resolve()
    for bad in ("../outside/secret.mp4", str(media["outside"] / "secret.mp4"), "sub/../../outside/secret.mp4"):
        with pytest.raises(MediaRootError) as e:
            resolve_media(root, bad, absolute=True)
        assert e.value.outside, bad
    with pytest.raises(MediaRootError, match="outside the media root"):
        resolve_media(root, str(media["video"]))  # absolute names only when asked for
    with pytest.raises(MediaRootError) as e:
        resolve_media(root, "sub/none.mp4")
    assert not e.value.outside
    assert json.dumps(str(e.value))  # one plain line


def test_without_proc_the_descriptor_is_read_through_a_file_object(media, monkeypatch):
    """Where /proc/self/fd is missing (macOS), FFmpeg reads the checked descriptor through a file object
    of its own position, and the real path is confirmed by (device, inode)."""
    from paravt.video import media as M

    monkeypatch.setattr(M, "PROC_FD", media["root"] / "no-proc")
    with VideoReader(media["video"], media_root=media["root"]) as r:
        assert isinstance(r.source.acquire().for_ffmpeg(), M.PositionalReader)
        assert stripes(r.overview(4)) == [2, 7, 12, 17] and stripes(r.crop(1, 3)) == [7, 12]
    swap_in_link(media["video"], media["outside"] / "secret.mp4")
    with pytest.raises(MediaRootError, match="outside the media root"):
        VideoReader(media["video"], media_root=media["root"])
