"""Which times to decode and at what size: overview(K) times, a crop's times, spreading them over
the recorded parts of a video whose timestamps jump, a frame's shown shape (non-square pixels)
and its pixel budget. Pure arithmetic, no decoding.

Counts are bounded: overview(k) returns at most the video's frames (every frame once when
k >= num_frames), a crop at most the frames in its window, and no call more than MAX_FRAMES.
"""

from __future__ import annotations

import math
from fractions import Fraction

MAX_PIXELS = 50176  # 224 * 224
MIN_PIXELS = 784  # 28 * 28
FACTOR = 32  # Qwen3-VL: patch 16 x spatial merge 2
MAX_FRAMES = 10000  # frames one call may return: ~1.5 GB at the default pixel budget
EPS = 1e-6  # s; timestamps closer than this are the same


def resize_to_budget(
    height: int, width: int, max_pixels: int = MAX_PIXELS, min_pixels: int = MIN_PIXELS, factor: int = FACTOR
) -> tuple[int, int]:
    """Sides that are multiples of `factor`, keep the aspect ratio and fit the pixel budget.

    Qwen-VL's smart_resize rule. Written out rather than imported: transformers' copy lives
    in its image-processor modules (seconds to import, torchvision for the fast one) and
    rounds a side under factor/2 to 0; here a side is at least one `factor`.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"bad frame size {width}x{height}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def display_size(width: int, height: int, sar: Fraction | float | None) -> tuple[int, int]:
    """(width, height) of a frame as shown: pixels `sar` (the sample aspect ratio, width:height of
    one pixel) times as wide as tall, as in anamorphic DVD and broadcast video (720x576 stored,
    16:9 shown). The side that grows is stretched, so no detail is lost before the resize; an
    unknown or invalid SAR (None, 0, 0/1) is square pixels."""
    try:
        sar = float(sar) if sar else 1.0
    except (TypeError, ValueError, ZeroDivisionError):
        sar = 1.0
    if not math.isfinite(sar) or sar <= 0 or abs(sar - 1.0) < 1e-3:
        return width, height
    if sar > 1:
        return max(1, round(width * sar)), height
    return width, max(1, round(height / sar))


def overview_times(duration: float, k: int) -> list[float]:
    """Middle of each of k equal segments: uniform cover without the first/last-frame bias."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [(i + 0.5) * duration / k for i in range(k)]


def sample_times(
    start: float,
    end: float,
    fps: float = 1.0,
    max_frames: int = 16,
    num_frames: int | None = None,
    duration: float | None = None,
    source_fps: float | None = None,
) -> list[float]:
    """Timestamps of a crop: `fps` frames per second of the window, at least 1 frame,
    at most `max_frames` (or `num_frames` when given and not larger), and at most the frames
    the window holds at the video's mean rate `source_fps` (more would repeat frames)."""
    if math.isnan(start) or math.isnan(end) or math.isinf(start):
        raise ValueError(f"times must be numbers, got start={start}, end={end}")
    if math.isinf(end) and duration is None:
        raise ValueError("an open-ended crop needs the video's duration")
    if duration is not None:
        if start >= duration:
            raise ValueError(f"start {start:.2f}s is at or after the end of the video ({duration:.2f}s)")
        end = min(end, duration)
    if start < 0:
        raise ValueError(f"start {start:.2f}s is negative")
    if start >= end:
        raise ValueError(f"start {start:.2f}s must be before end {end:.2f}s")
    if num_frames is not None and num_frames >= 1:
        n = min(int(num_frames), max_frames)
    else:
        n = int(math.floor((end - start) * fps))
        n = max(1, min(n, max_frames))
    if source_fps:
        n = max(1, min(n, math.floor((end - start) * source_fps + EPS)))
    step = (end - start) / n
    return [start + (i + 0.5) * step for i in range(n)]


def share(pieces: list[tuple[float, float]], n: int) -> list[float]:
    """The middles of n equal shares of the pieces' total time, placed on the pieces: uniform
    sampling of the recorded time, as if the jumps between the pieces were not there."""
    total = sum(b - a for a, b in pieces)
    out, j, before = [], 0, 0.0  # before: recorded time in pieces[:j]
    for i in range(n):
        u = (i + 0.5) * total / n
        while j < len(pieces) - 1 and u > before + (pieces[j][1] - pieces[j][0]):
            before += pieces[j][1] - pieces[j][0]
            j += 1
        out.append(min(pieces[j][0] + (u - before), pieces[j][1]))
    return out
