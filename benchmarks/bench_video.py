"""Decode speed of paravt.video against the ffmpeg command line doing the same work.

Generates (once, cached under outputs/) a 30-minute 640x360 H.264 file with a keyframe every
5 s, then times overview(64), overview(8) and 20 random 10 s crops at 1 fps. The ffmpeg
column runs the equivalent CLI (seek + decode + scale to the same size, raw RGB to a pipe),
the practical limit for a decoder driven from Python.

    .venv/bin/python benchmarks/bench_video.py [--minutes 30] [--crops 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from paravt.video import VideoReader, overview_times, sample_times


def make_long_video(path: Path, minutes: float, fps: int = 25, gop_s: float = 5.0) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("ffmpeg"):
        subprocess.run(
            ["ffmpeg", "-y", "-loglevel", "error", "-f", "lavfi", "-i", f"testsrc2=size=640x360:rate={fps}",
             "-t", str(minutes * 60), "-c:v", "libx264", "-preset", "ultrafast", "-g", str(int(fps * gop_s)),
             "-keyint_min", str(int(fps * gop_s)), "-sc_threshold", "0", "-pix_fmt", "yuv420p", str(path)],
            check=True,
        )
        return path
    import av  # no ffmpeg CLI: slower, pure PyAV

    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = 640, 360, "yuv420p"
        s.options = {"g": str(int(fps * gop_s)), "preset": "ultrafast", "sc_threshold": "0"}
        base = np.zeros((360, 640, 3), np.uint8)
        for i in range(int(minutes * 60 * fps)):
            base[:] = (i * 3) % 255
            for p in s.encode(av.VideoFrame.from_ndarray(base, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return path


def ffmpeg_frames(path: Path, times: list[float], size: tuple[int, int]) -> float:
    """Time the ffmpeg CLI extracting the frames at `times` (one seek per time), scaled to size."""
    h, w = size
    t0 = time.perf_counter()
    for t in times:
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-ss", f"{t:.3f}", "-i", str(path), "-frames:v", "1",
             "-vf", f"scale={w}:{h}", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
            check=True, stdout=subprocess.DEVNULL,
        )
    return time.perf_counter() - t0


def ffmpeg_crop(path: Path, start: float, end: float, size: tuple[int, int]) -> float:
    """One ffmpeg process: seek, decode the window, 1 fps, scale."""
    h, w = size
    t0 = time.perf_counter()
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-ss", f"{start:.3f}", "-i", str(path), "-t", f"{end - start:.3f}",
         "-vf", f"fps=1,scale={w}:{h}", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True, stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--crops", type=int, default=20)
    ap.add_argument("--out", default="outputs/bench")
    args = ap.parse_args()
    path = make_long_video(Path(args.out) / f"long_{int(args.minutes)}min.mp4", args.minutes)
    console = Console()
    reader = VideoReader(path)
    size = reader.frame_size
    rng = np.random.default_rng(0)
    starts = [float(s) for s in rng.uniform(0, reader.duration - 10, size=args.crops)]
    have_ffmpeg = shutil.which("ffmpeg") is not None

    def timed(fn, repeat=3):
        vals = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            vals.append(time.perf_counter() - t0)
        return statistics.median(vals)

    rows = []
    for k in (64, 8):
        ours = timed(lambda: VideoReader(path).overview(k), repeat=2)
        ff = ffmpeg_frames(path, overview_times(reader.duration, k), size) if have_ffmpeg else float("nan")
        rows.append((f"overview({k})", ours * 1000, ff * 1000, f"ffmpeg -ss T -i f -frames:v 1 (x{k})"))
    ours_crops = [timed(lambda s=s: reader.crop(s, s + 10), repeat=1) for s in starts]
    ff_crops = [ffmpeg_crop(path, s, s + 10, size) for s in starts] if have_ffmpeg else [float("nan")]
    rows.append(("crop 10 s @1 fps (median of %d)" % args.crops, statistics.median(ours_crops) * 1000,
                 statistics.median(ff_crops) * 1000, "ffmpeg -ss S -i f -t 10 -vf fps=1,scale"))

    table = Table(title=f"paravt.video (PyAV) vs ffmpeg CLI — {args.minutes:g} min 640x360 H.264, GOP 5 s, frames {size[1]}x{size[0]}")
    for col in ("operation", "paravt ms", "ffmpeg ms", "ratio", "ffmpeg command"):
        table.add_column(col)
    for name, ours, ff, cmd in rows:
        table.add_row(name, f"{ours:.1f}", f"{ff:.1f}", f"{ours / ff:.2f}x" if ff == ff else "-", cmd)
    console.print(table)
    console.print(f"crop frames per call: {len(sample_times(0, 10))}")


if __name__ == "__main__":
    main()
