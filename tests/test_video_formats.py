"""Containers and streams beyond MP4/MKV/TS (issue #52, cases 6-10): AVI, audio files with cover
art, files with several video streams, raw H.264 elementary streams, anamorphic (non-square
pixel) video. Every file is made here with PyAV's encoders, a few seconds at a small size."""

from fractions import Fraction

import numpy as np
import pytest

from paravt.video import VideoError, VideoReader, overview_times
from videotools import decode_stripe, make_audio_only, make_multi_stream, make_test_video, quadrant_frame, quadrant_means

import av  # noqa: E402


def stripes(frames) -> list[int]:
    return [decode_stripe(f.image) for f in frames]


# ---------- 6. AVI: MJPEG (webcams, cameras) and MPEG-4 Part 2 (XviD: MSVD, UCF101, HMDB51) ----------

@pytest.fixture(scope="module", params=[("mjpeg", 1), ("mpeg4", 12)], ids=["mjpeg", "xvid-mpeg4"])
def avi(request, tmp_path_factory):
    codec, gop = request.param
    return make_test_video(tmp_path_factory.mktemp("avi") / f"{codec}.avi", seconds=4, fps=25, gop=gop, codec=codec)


def test_avi_frames_and_times_are_exact(avi):
    """The AVI demuxer refuses a seek before the start; the byte seek to 0 that followed kept its
    frame counter from the probe's scan to the end: every frame was frame 0 stamped past the end."""
    r = VideoReader(avi)
    info = r.probe()
    assert (info.duration, info.fps, info.num_frames) == (4.0, 25.0, 100)
    frames = r.frames_at([0, 1.0, 2.52, 3.9])
    assert stripes(frames) == [0, 25, 63, 97]
    assert [f.timestamp for f in frames] == [i / 25 for i in stripes(frames)]
    every = r.overview(10000)
    assert stripes(every) == list(range(100))
    assert [f.timestamp for f in every] == [i / 25 for i in range(100)]
    crop = r.crop(1, 2, fps=4)
    assert [f.timestamp for f in crop] == [i / 25 for i in stripes(crop)]
    assert all(abs(f.timestamp - f.requested) <= 0.02 + 1e-9 for f in crop)


@pytest.mark.skipif(not hasattr(av.video.stream.VideoStream, "index_entries"),
                    reason=f"PyAV {av.__version__} has no Stream.index_entries (PyAV >= 17): seeks decode more")
def test_avi_seek_lands_on_the_frame(tmp_path):
    """AVI's time base is one frame: a seek rounded to the nearest tick lands a frame late half the
    time, and the landing check then seeks again from a second earlier (25 frames decoded more)."""
    p = make_test_video(tmp_path / "intra.avi", seconds=8, fps=25, gop=1, codec="mjpeg")
    r = VideoReader(p)
    frames = r.overview(6)
    assert stripes(frames) == [round(t * 25) for t in overview_times(8, 6)]
    assert r.frames_decoded <= 2 * 6  # each target: its frame and the one before (the nearer of the two)


# ---------- 7. audio files with cover art ----------

@pytest.mark.parametrize("name,cover", [("song.mp3", "mjpeg"), ("song.m4a", "png"), ("song2.m4a", "mjpeg")])
def test_audio_with_cover_art_has_no_video(tmp_path, name, cover):
    """A cover is a video stream of one picture (disposition attached_pic), never the video: an
    .mp3 was read as 90 kHz 'video' of negative duration, an .m4a failed to seek."""
    p = make_audio_only(tmp_path / name, seconds=1.0, cover=cover)
    with av.open(str(p)) as c:  # the file is what the test means: audio and an attached picture
        assert [s.type for s in c.streams] == ["audio", "video"]
        assert c.streams.video[0].disposition & av.stream.Disposition.attached_pic
    with pytest.raises(VideoError, match="no video stream"):
        VideoReader(p)


# ---------- 8. several video streams: the largest (ffmpeg's CLI takes the flagged default) ----------

@pytest.mark.parametrize("ext,default", [("mkv", None), ("mp4", 1), ("mkv", 1)])
def test_the_largest_video_stream_is_read(tmp_path, ext, default):
    p = make_multi_stream(tmp_path / f"two.{ext}", [(90, 160), (180, 320)], seconds=2, fps=10, default=default)
    r = VideoReader(p)
    assert (r.probe().width, r.probe().height) == (320, 180)
    assert stripes(r.frames_at([0.0, 1.0, 1.9])) == [1000, 1010, 1019]  # stream 1 shows 1000 + i
    assert stripes(r.overview(10000)) == [1000 + i for i in range(20)]


def test_largest_stream_wins_over_the_flagged_default(tmp_path):
    """MP4's muxer flags the first track default whatever it holds: resolution decides, the flag
    only breaks ties."""
    p = make_multi_stream(tmp_path / "two.mp4", [(90, 160), (180, 320)], seconds=1, fps=10)
    with av.open(str(p)) as c:
        assert c.streams.video[0].disposition & av.stream.Disposition.default
    assert stripes(VideoReader(p).frames_at([0.5])) == [1005]
    q = make_multi_stream(tmp_path / "same.mkv", [(90, 160), (90, 160)], seconds=1, fps=10, default=1)
    assert stripes(VideoReader(q).frames_at([0.5])) == [1005]


# ---------- 9. raw H.264 elementary streams (no container timestamps) ----------

@pytest.mark.parametrize("gop,bframes", [(10, 0), (10, 2)], ids=["ip", "bframes"])
def test_raw_h264_is_timed_by_its_frame_rate(tmp_path, gop, bframes):
    """A .h264 file has no timestamps and no duration: frame i is at i / fps (the rate its packets'
    durations state, 10 fps here, not the demuxer's default of 25), as ffmpeg stamps them."""
    p = make_test_video(tmp_path / "cam.h264", seconds=3, fps=10, gop=gop, bframes=bframes)
    with av.open(str(p)) as c:
        assert c.format.name == "h264"
    r = VideoReader(p)
    info = r.probe()
    assert (info.duration, info.fps, info.num_frames) == (3.0, 10.0, 30)
    frames = r.frames_at([2.5, 0.0, 1.0, 2.9])
    assert stripes(frames) == [25, 0, 10, 29]
    assert [f.timestamp for f in frames] == [2.5, 0.0, 1.0, 2.9]
    every = r.overview(10000)
    assert stripes(every) == list(range(30))
    assert [f.timestamp for f in every] == [round(i / 10, 6) for i in range(30)]
    assert stripes(r.overview(3)) == [5, 15, 25]
    assert stripes(r.crop(1.0, 2.0, fps=4)) == [11, 14, 16, 19]


# ---------- 10. anamorphic video: the sample aspect ratio ----------

def test_anamorphic_frames_have_the_display_aspect(tmp_path):
    """A 16:9 DVD/broadcast frame is stored 720x576 (5:4) with pixels 64:45 as wide as tall:
    returned frames are 16:9, not squashed to the stored shape."""
    p = make_test_video(tmp_path / "pal169.mpg", seconds=1, fps=25, gop=5, codec="mpeg2video", size=(128, 160),
                        sar=Fraction(64, 45))
    r = VideoReader(p, factor=4)
    info = r.probe()
    assert (info.width, info.height) == (228, 128)  # 160 * 64/45 = 227.6
    assert r.frame_size == (128, 228)
    for f in r.overview(3):
        assert f.image.shape == (128, 228, 3)
    assert stripes(r.frames_at([0.4])) == [10]


def test_display_size_stretches_the_short_side():
    from paravt.video.sampling import display_size

    assert display_size(720, 576, Fraction(64, 45)) == (1024, 576)  # PAL 16:9
    assert display_size(720, 480, Fraction(8, 9)) == (720, 540)  # NTSC 4:3: taller, never narrower
    assert display_size(720, 576, None) == display_size(720, 576, Fraction(0, 1)) == (720, 576)  # unknown: square


def test_anamorphic_and_rotated(tmp_path):
    """The aspect applies to the stored frame, before the display matrix turns it upright."""
    if not hasattr(av.video.stream.VideoStream, "set_display_rotation"):
        pytest.skip("this PyAV cannot write a display matrix")
    p = make_test_video(tmp_path / "rot.mp4", seconds=1, fps=10, frames=quadrant_frame, rotation=90, sar=Fraction(2))
    r = VideoReader(p)
    info = r.probe()
    assert (info.width, info.height) == (64, 192)  # 96x64 stored, 192x64 displayed, then turned
    upright = np.rot90(quadrant_frame(0), 1)  # the quadrants' shades survive the stretch
    for f in r.overview(2):
        assert f.image.shape == (192, 64, 3)
        assert quadrant_means(f.image) == quadrant_means(upright)
