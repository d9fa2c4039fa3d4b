"""The frames nearest requested times: where to seek, whether the seek landed early enough, and
which of the frames around a time to return.

Seeking is checked, never trusted. MP4/MKV keep a keyframe index, and a seek lands on the
index keyframe at or before the target. MPEG-TS (and other index-less containers) has none:
FFmpeg seeks it by bisecting byte positions on timestamps and lands on any packet, often after
the target, so the decoder would start at the next keyframe, seconds or a whole GOP late. So
every seek is verified: the first frame decoded after it must not be after the target, else an
earlier seek is tried, down to the file's start (see land). Going back to the start is a
seek far before the first timestamp, which every demuxer answers with the first packet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from paravt.video.errors import VideoError
from paravt.video.frames import Frame
from paravt.video.index import StreamIndex, rewind, seek
from paravt.video.passes import ForwardPass, Losses
from paravt.video.sampling import EPS
from paravt.video.sources import Source

SEEK_COST = 0.5  # s of decoding a seek must skip to be worth it (flush + refill of the decoder)
NO_INDEX_GAP = 2.0  # s; without a demuxer index, re-seek only past this gap

Image = Callable[[Any], np.ndarray]  # a decoded av.VideoFrame -> the returned image (resized, upright)


@dataclass
class Track:
    """One thread's open container and its video stream, with what reading them needs."""

    source: Source
    index: StreamIndex
    c: Any  # av.container.InputContainer
    s: Any  # its video stream
    on_decoded: Callable[[], None]

    def clean_frames(self, losses: Losses, origin: float, key_by: float | None = None) -> Iterator[tuple]:
        """(frame, time) of the frames decodable from the current position, in time order; see ForwardPass."""
        return iter(ForwardPass(self.source, self.index, self.c, self.s, losses, origin, key_by, self.on_decoded))


def decode_nearest(track: Track, wanted: list[float], image: Image) -> list[tuple[np.ndarray, float, bool]]:
    """For sorted target times (stream clock): (image, time, substituted) of the decoded
    frame nearest each.

    One forward pass serves every target it reaches; it breaks off and seeks only when
    the keyframe a seek would land on lies well past the frame just decoded, i.e. when
    seeking skips real work. So sparse targets cost one GOP each, and targets denser
    than keyframes are decoded in one sequential pass, each frame at most once.
    """
    losses = Losses()
    results: list = []
    i, n = 0, len(wanted)
    try:
        while i < n:
            frames, first = land(track, wanted[i], losses)
            if first is None:
                raise VideoError(f"{track.source.path}: no frame decodable near {wanted[i] - track.index.zero:.2f}s")
            pick = _Picker(image, losses)
            prev = None  # (frame, t) of the last frame before the current one
            resolved = False  # a seek is followed by another only after it served a target
            for frame, t in _chain(first, frames):
                while i < n and t >= wanted[i]:  # resolve every target this frame passes
                    results.append(pick(wanted[i], prev, (frame, t)))
                    i += 1
                    resolved = True
                if i >= n:
                    break
                prev = (frame, t)
                if resolved and seek_saves_work(track, t, wanted[i]):
                    break
            else:
                while i < n:  # end of stream: the remaining targets get the last frame
                    results.append(pick(wanted[i], prev, None))
                    i += 1
            frames.close()
    except VideoError:
        raise
    except Exception as e:  # the demuxer or decoder failing beyond what ForwardPass skips
        if (err := track.source.failed_network(e)) is not None:
            raise err from None
        raise VideoError(f"{track.source.path}: decode failed ({type(e).__name__}: {e})") from None
    return results


def every_frame(track: Track, image: Image) -> list[Frame]:
    """Every decodable frame once, in time order: one pass from the start."""
    out = []
    index = track.index
    try:
        rewind(track.source, track.c, track.s)
        for frame, t in track.clean_frames(Losses(), index.start):
            out.append(Frame(image=image(frame), timestamp=round(t - index.zero, 6)))
    except VideoError:
        raise
    except Exception as e:
        if (err := track.source.failed_network(e)) is not None:
            raise err from None
        raise VideoError(f"{track.source.path}: decode failed ({type(e).__name__}: {e})") from None
    if not out:
        raise VideoError(f"{track.source.path}: no frame decodable")
    return out


def land(track: Track, target: float, losses: Losses) -> tuple[Iterator, tuple | None]:
    """Seek for `target` and check where it landed: the first frame decodable from there must
    not be after the target, else an earlier seek is tried, down to the file's start (whose
    first decodable frame is taken as it is). Returns the frames after the first, and the first."""
    for seek_t in seek_points(track, target):
        snap = losses.snapshot()
        if seek_t is None:
            rewind(track.source, track.c, track.s)
            frames = track.clean_frames(losses, track.index.start)
        elif seek(track.source, track.c, track.s, seek_t):
            frames = track.clean_frames(losses, seek_t, key_by=target)
        else:
            continue
        first = next(frames, None)
        if seek_t is None or (first is not None and first[1] <= target + EPS):
            return frames, first
        frames.close()
        losses.restore(snap)  # what this landing missed was not lost: the earlier one decodes it
    raise AssertionError("unreachable: seek_points ends with the rewind")


def seek_points(track: Track, target: float) -> Iterator[float | None]:
    """Seek times for `target`, most promising first, then None: rewind to the start.

    With an index: the target, then ever earlier (a seek lands one keyframe late when a
    keyframe's pts is after its dts, the index's time, or where the keyframe is damaged),
    skipping times whose landing keyframe was tried already. Without one the landing is a
    guess, so: 1, 2, 4, ... s before the target. A timeless stream (raw H.264) is read from the start.
    """
    index = track.index
    tried = set()
    back = 0.0 if index.indexed else 1.0
    while target - back > index.start and not index.timeless:
        t = target - back
        key = index.keyframe_before(track.s, t) if index.indexed else t
        if key not in tried:
            tried.add(key)
            yield t
        back = max(1.0, 2 * back)
    yield None


def seek_saves_work(track: Track, t: float, target: float) -> bool:
    """Whether seeking for `target` skips more than SEEK_COST seconds of decoding from `t`."""
    if target - t <= SEEK_COST or track.index.timeless:  # timeless: no seeking but to the start
        return False
    landing = track.index.keyframe_before(track.s, target)
    if landing is None:  # no demuxer index (e.g. MPEG-TS): assume a keyframe every few seconds
        return target - t > NO_INDEX_GAP
    return landing - t > SEEK_COST


class _Picker:
    """Chooses between the frames around a target and converts the choice once (consecutive
    targets often share a frame)."""

    def __init__(self, image: Image, losses: Losses) -> None:
        self.image, self.losses = image, losses
        self.last = (None, None)

    def __call__(self, target: float, prev: tuple | None, cur: tuple | None) -> tuple[np.ndarray, float, bool]:
        frame, t = cur if prev is None or (cur is not None and abs(cur[1] - target) < abs(prev[1] - target)) else prev
        if self.last[0] is frame:  # a repeat gets its own copy: callers may draw on images
            img = self.last[1].copy()
        else:
            img = self.image(frame)
            self.last = (frame, img)
        return img, t, self.losses.nearer(target, abs(t - target))


def _chain(first, rest):
    yield first
    yield from rest
