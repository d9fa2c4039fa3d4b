"""What a reader returns: the video's measured facts (VideoInfo) and its decoded frames (Frame)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class VideoInfo:
    duration: float
    fps: float  # mean rate of the recorded parts
    num_frames: int
    width: int  # as displayed (after the sample aspect ratio and the rotation of a display matrix)
    height: int
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (from, to) s: timestamp jumps, nothing recorded
    start: float = 0.0  # s; the first frame's time: times are the file's clock, which its audio may start


@dataclass
class Frame:
    """One returned frame.

    image: H x W x 3, uint8, RGB, upright, already resized.
    timestamp: seconds from the video's start of the frame decoded (not the time asked for).
    requested: the time asked for, or None where none was (overview returning every frame).
    substituted: True when this frame is not what the video shows at `requested`: the nearer
        ones could not be decoded (damaged data), or `requested` lies in a jump of the timestamps
        where nothing was recorded. It is then the nearest decodable frame, and `timestamp` is
        still its own true time, so the caller can tell how far off it is.
    """

    image: np.ndarray
    timestamp: float
    requested: float | None = None
    substituted: bool = False
