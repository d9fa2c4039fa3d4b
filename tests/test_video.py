import asyncio
import threading
import time

import numpy as np
import pytest

from paravt.video import VideoError, VideoReader, overview_times, resize_to_budget, sample_times
from videotools import decode_stripe, make_audio_only, make_test_video

FPS = 10


@pytest.fixture(scope="module",
                params=[("libx264", 1, 0), ("libx264", 50, 0), ("libx264", 50, 3), ("mpeg4", 1, 0), ("mpeg4", 40, 0)],
                ids=["h264-allkey", "h264-longgop", "h264-longgop-bframes", "mpeg4-allkey", "mpeg4-longgop"])
def striped(request, tmp_path_factory):
    codec, gop, bframes = request.param
    path = tmp_path_factory.mktemp("v") / f"{codec}_{gop}_{bframes}.mp4"
    return make_test_video(path, seconds=20, fps=FPS, gop=gop, codec=codec, bframes=bframes)


def nearest_index(t: float) -> int:
    return int(round(t * FPS))


def test_probe(striped):
    info = VideoReader(striped).probe()
    assert info.duration == pytest.approx(20.0, abs=0.11)
    assert info.fps == pytest.approx(FPS)
    assert info.num_frames == 200
    assert (info.width, info.height) == (96, 64)


def test_overview_returns_nearest_frames(striped):
    r = VideoReader(striped)
    for k in (1, 4, 8, 64):
        frames = r.overview(k)
        assert len(frames) == k
        for want, f in zip(overview_times(r.duration, k), frames):
            idx = decode_stripe(f.image)
            assert abs(idx - want * FPS) <= 0.5 + 1e-6, (want, idx)
            assert f.timestamp == pytest.approx(idx / FPS, abs=1e-3)


def test_overview_is_middle_of_segment_sampling():
    assert overview_times(20.0, 4) == [2.5, 7.5, 12.5, 17.5]


def test_crop_frames_and_timestamps(striped):
    r = VideoReader(striped)
    frames = r.crop(3.2, 7.9)
    assert len(frames) == 4  # floor(4.7 s * 1 fps)
    for want, f in zip(sample_times(3.2, 7.9), frames):
        assert decode_stripe(f.image) == nearest_index(want) or abs(decode_stripe(f.image) - want * FPS) <= 0.5
        assert 3.2 <= f.timestamp <= 7.9


def test_random_access_order_is_kept(striped):
    r = VideoReader(striped)
    times = [15.0, 1.0, 19.9, 7.3, 7.4, 0.0]
    frames = r.frames_at(times)
    assert [decode_stripe(f.image) for f in frames] == [nearest_index(t) for t in times]


def test_crop_policy():
    assert len(sample_times(0, 0.4)) == 1  # at least one frame
    assert len(sample_times(0, 100)) == 16  # at most max_frames
    assert len(sample_times(0, 100, num_frames=5)) == 5
    assert len(sample_times(0, 100, num_frames=40)) == 16  # num_frames above the cap is capped
    assert sample_times(10, 30, duration=20.0)[-1] < 20.0  # end clamped to the duration
    for bad in [(5, 5), (6, 5), (-1, 3)]:
        with pytest.raises(ValueError):
            sample_times(*bad)
    with pytest.raises(ValueError):
        sample_times(25, 30, duration=20.0)


def test_crop_errors(striped):
    r = VideoReader(striped)
    with pytest.raises(VideoError, match="before end"):
        r.crop(5, 5)
    with pytest.raises(VideoError, match="after the end"):
        r.crop(25, 30)
    assert len(r.crop(18, 1000)) == 2  # clamped to 20 s


@pytest.mark.parametrize("hw,want", [
    ((360, 640), (160, 288)),  # over budget: beta = sqrt(640*360/50176) = 2.14, floor to 32s
    ((1080, 1920), (160, 288)),
    ((480, 640), (192, 256)),
    ((224, 224), (224, 224)),  # exactly the budget
    ((64, 96), (64, 96)),  # inside the budget: only rounded to 32s
    ((10, 10), (32, 32)),  # under min_pixels: scaled up
    ((2000, 50), (1408, 32)),  # extreme aspect: the short side stays at one patch
])
def test_resize_matches_qwen_smart_resize(hw, want):
    """Hand-computed with Qwen's smart_resize formula (factor 32, 784..50176 pixels)."""
    assert resize_to_budget(*hw) == want


def test_resize_budget():
    for h, w in [(360, 640), (1080, 1920), (64, 64), (10, 10), (2000, 50), (224, 224)]:
        h2, w2 = resize_to_budget(h, w)
        assert h2 % 32 == 0 and w2 % 32 == 0
        assert h2 * w2 <= 50176
        assert h2 * w2 >= 784
    h2, w2 = resize_to_budget(360, 640)
    assert abs(w2 / h2 - 640 / 360) < 0.2


def test_frames_resized(tmp_path):
    p = make_test_video(tmp_path / "big.mp4", seconds=1, fps=5, size=(360, 640))
    f = VideoReader(p).overview(1)[0]
    assert f.image.dtype == np.uint8 and f.image.shape[2] == 3
    assert f.image.shape[0] * f.image.shape[1] <= 50176
    assert f.image.shape[0] % 32 == 0 and f.image.shape[1] % 32 == 0


def test_short_crop_does_not_decode_whole_file(tmp_path, monkeypatch):
    p = make_test_video(tmp_path / "long.mp4", seconds=120, fps=5, gop=25)
    r = VideoReader(p)
    import av.container

    decoded = []
    real_decode = av.container.InputContainer.decode

    def counting(self, *a, **k):
        for f in real_decode(self, *a, **k):
            decoded.append(f)
            yield f

    monkeypatch.setattr(av.container.InputContainer, "decode", counting)
    frames = r.crop(100, 103)
    for want, f in zip(sample_times(100, 103), frames):
        assert abs(decode_stripe(f.image) - want * 5) <= 0.5
    assert len(decoded) < 60  # a GOP or two, not 600 frames


def test_thread_safe(striped):
    r = VideoReader(striped)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(5):
            t = float(rng.uniform(0, 19.9))
            f = r.frames_at([t])[0]
            if decode_stripe(f.image) != nearest_index(t) and abs(decode_stripe(f.image) - t * FPS) > 0.5:
                errors.append((t, decode_stripe(f.image)))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    r.close()


def test_async_does_not_block_loop(striped):
    r = VideoReader(striped)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(*[r.acrop(s, s + 3) for s in range(0, 15, 3)], r.aoverview(16))
        task.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert [len(x) for x in results] == [3, 3, 3, 3, 3, 16]
    assert ticks >= 1


@pytest.mark.parametrize("kind", ["missing", "empty", "text", "truncated", "audio", "directory"])
def test_bad_inputs_raise_video_error(tmp_path, kind):
    p = tmp_path / f"{kind}.mp4"
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "text":
        p.write_text("this is not a video\n" * 20)
    elif kind == "truncated":
        good = make_test_video(tmp_path / "good.mp4", seconds=3, fps=10)
        data = good.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    elif kind == "audio":
        p = make_audio_only(tmp_path / "audio.m4a")
    elif kind == "directory":
        p.mkdir()
    start = time.time()
    with pytest.raises(VideoError) as e:
        r = VideoReader(p)
        r.overview(4)
    assert str(p) in str(e.value)
    assert time.time() - start < 10


def test_truncated_faststart_file_reads_what_is_there(tmp_path):
    """A file cut short after its index: frames past the cut are not invented, times stay valid."""
    import av

    src = make_test_video(tmp_path / "src.mp4", seconds=10, fps=10, gop=10)
    fast = tmp_path / "fast.mp4"
    with av.open(str(src)) as i, av.open(str(fast), "w", options={"movflags": "faststart"}) as o:
        s_in = i.streams.video[0]
        s_out = o.add_stream_from_template(s_in)
        for pkt in i.demux(s_in):
            if pkt.dts is None:
                continue
            pkt.stream = s_out
            o.mux(pkt)
    data = fast.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    try:
        r = VideoReader(cut)
    except VideoError:
        return  # refusing the file with a clear error is acceptable too
    frames = r.overview(4)
    assert len(frames) == 4
    assert all(0 <= f.timestamp <= r.duration + 0.2 for f in frames)


def test_variable_frame_rate_uses_pts(tmp_path):
    """Frame i is at times[i] (irregular gaps): index/fps would pick the wrong frames."""
    times = [0.0, 0.15, 0.3, 0.7, 0.75, 2.0, 2.1, 5.0, 9.0, 9.05]
    p = make_test_video(tmp_path / "vfr.mp4", fps=10, gop=4, times=times)
    r = VideoReader(p)
    assert r.duration == pytest.approx(9.05, abs=0.2)
    asked = [0.1, 0.45, 0.72, 1.5, 3.0, 4.0, 8.0, 9.04]  # no ties
    frames = r.frames_at(asked)
    for t, f in zip(asked, frames):
        want = min(range(len(times)), key=lambda i: (abs(times[i] - t), i))
        assert decode_stripe(f.image) == want, (t, decode_stripe(f.image))
        assert f.timestamp == pytest.approx(times[want], abs=1e-3)


def test_dense_targets_decode_each_frame_once(tmp_path):
    """Targets closer than the keyframe spacing (3.75 s vs 10 s GOP): one sequential pass,
    not a re-seek (and a re-decode of the same GOP) per target."""
    p = make_test_video(tmp_path / "gop10s.mp4", seconds=60, fps=10, gop=100)
    r = VideoReader(p)
    frames = r.overview(16)
    assert [decode_stripe(f.image) for f in frames] == [round(t * 10) for t in overview_times(60.0, 16)]
    assert r.frames_decoded <= 600


def test_sparse_targets_seek_per_target(tmp_path):
    """Targets farther apart than keyframes: one seek each, at most a GOP of decoding per target."""
    p = make_test_video(tmp_path / "gop2s.mp4", seconds=60, fps=10, gop=20)
    r = VideoReader(p)
    frames = r.overview(4)
    assert [decode_stripe(f.image) for f in frames] == [round(t * 10) for t in overview_times(60.0, 4)]
    assert r.frames_decoded <= 4 * (20 + 1)


def test_all_keyframe_crop_decodes_only_near_targets(tmp_path):
    p = make_test_video(tmp_path / "intra.mp4", seconds=60, fps=10, gop=1)
    r = VideoReader(p)
    frames = r.crop(30, 40)
    assert [decode_stripe(f.image) for f in frames] == [round(t * 10) for t in sample_times(30, 40)]
    assert r.frames_decoded <= 2 * len(frames) + 2


@pytest.mark.parametrize("call", [
    lambda r: r.crop(-1, 3),
    lambda r: r.crop(float("nan"), 3),
    lambda r: r.frames_at([-0.5]),
    lambda r: r.frames_at([1.0, float("nan")]),
    lambda r: r.frames_at([r.duration + 5]),
], ids=["crop-negative", "crop-nan", "frames-negative", "frames-nan", "frames-past-end"])
def test_bad_times_raise_video_error(tmp_path, call):
    p = make_test_video(tmp_path / "v.mp4", seconds=2, fps=10)
    with pytest.raises(VideoError) as e:
        call(VideoReader(p))
    assert str(p) in str(e.value)


def test_context_manager_closes(tmp_path):
    p = make_test_video(tmp_path / "v.mp4", seconds=2, fps=10)
    with VideoReader(p) as r:
        assert len(r.crop(0, 2)) == 2
    assert r._containers == []
    assert len(r.overview(2)) == 2  # reopens lazily after close
