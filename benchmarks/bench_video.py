"""Decode speed of paravt.video against the ffmpeg command line doing the same work.

Generates (once, cached under outputs/bench/, never committed) a 30-minute 640x360 H.264
file with a keyframe every 5 s at 25 fps, then times overview(64), overview(8) and 20
random 10 s crops at 1 fps. The ffmpeg column runs the equivalent CLI (seek + decode +
scale to the same size, raw RGB to a pipe): the practical limit for a decoder driven from
Python. Each op is timed interleaved with its ffmpeg twin so machine load hits both alike;
CPU time (ours: this process incl. decoder threads; ffmpeg: its child process) is
reported too because it does not depend on how busy the machine is.

If torchcodec imports (e.g. PYTHONPATH=/tmp/tc where `pip install --target /tmp/tc
--no-deps torchcodec==0.13.0` put a CPU build), a torchcodec column is added.

    .venv/bin/python benchmarks/bench_video.py [--minutes 30] [--crops 20] [--repeat 2]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from paravt.video import VideoReader, overview_times, sample_times


def make_long_video(path: Path, minutes: float, fps: int = 25, gop_s: float = 5.0) -> Path:
    """The benchmark file, written once: ffmpeg's testsrc2 if the CLI exists, else PyAV."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part.mp4")
    g = str(int(fps * gop_s))
    if shutil.which("ffmpeg"):
        subprocess.run(
            ["ffmpeg", "-y", "-loglevel", "error", "-f", "lavfi", "-i", f"testsrc2=size=640x360:rate={fps}",
             "-t", str(minutes * 60), "-c:v", "libx264", "-preset", "ultrafast", "-g", g, "-keyint_min", g,
             "-sc_threshold", "0", "-pix_fmt", "yuv420p", str(tmp)],
            check=True,
        )
    else:
        import av

        with av.open(str(tmp), "w") as out:
            s = out.add_stream("libx264", rate=fps)
            s.width, s.height, s.pix_fmt = 640, 360, "yuv420p"
            s.options = {"g": g, "keyint_min": g, "preset": "ultrafast", "sc_threshold": "0"}
            img = np.zeros((360, 640, 3), np.uint8)
            for i in range(int(minutes * 60 * fps)):
                img[:] = (i * 3) % 255
                img[:, (i * 4) % 640] = 255
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    out.mux(p)
            for p in s.encode():
                out.mux(p)
    tmp.rename(path)  # a killed run leaves no half file behind under the cached name
    return path


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def measure(fn: Callable[[], object], child: bool = False) -> tuple[float, float]:
    """(wall s, CPU s) of one call; CPU of child processes when `child`."""
    who = resource.RUSAGE_CHILDREN if child else resource.RUSAGE_SELF
    c0, t0 = _cpu(who), time.perf_counter()
    fn()
    return time.perf_counter() - t0, _cpu(who) - c0


def ffmpeg_frame_cmd(path: Path, t: float, size: tuple[int, int]) -> list[str]:
    h, w = size
    return ["ffmpeg", "-loglevel", "error", "-ss", f"{t:.3f}", "-i", str(path), "-frames:v", "1",
            "-vf", f"scale={w}:{h}", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]


def ffmpeg_crop_cmd(path: Path, start: float, end: float, size: tuple[int, int]) -> list[str]:
    h, w = size
    return ["ffmpeg", "-loglevel", "error", "-ss", f"{start:.3f}", "-i", str(path), "-t", f"{end - start:.3f}",
            "-vf", f"fps=1,scale={w}:{h}", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]


def run_cmds(cmds: list[list[str]]) -> None:
    for cmd in cmds:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def torchcodec_ops(path: Path, size: tuple[int, int]):
    """(overview fn, crop fn) on torchcodec with the same resize, or None if it does not import."""
    try:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.transforms import Resize
    except Exception:
        return None

    def open_():
        return VideoDecoder(str(path), seek_mode="approximate", dimension_order="NHWC", transforms=[Resize(size)])

    shared = open_()
    return (lambda times: open_().get_frames_played_at(times),
            lambda start, end: shared.get_frames_played_at(sample_times(start, end)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--crops", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each overview (median)")
    ap.add_argument("--out", default="outputs/bench")
    args = ap.parse_args()
    console = Console(width=max(Console().width, 150))
    path = make_long_video(Path(args.out) / f"long_{args.minutes:g}min.mp4", args.minutes)
    reader = VideoReader(path)
    size = reader.frame_size
    info = reader.probe()
    have_ffmpeg = shutil.which("ffmpeg") is not None
    tc = torchcodec_ops(path, size)
    rng = np.random.default_rng(0)
    starts = [float(s) for s in rng.uniform(0, reader.duration - 10, size=args.crops)]
    nan = (float("nan"), float("nan"))

    rows = []  # (op, ours (wall, cpu), ffmpeg (wall, cpu), torchcodec (wall, cpu), frames decoded/op, cmd)
    # fixed cost per process / per reader: what a separate ffmpeg call pays on top of decoding
    probe_cmd = ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=duration,nb_frames",
                 str(path)]
    ours, ff = [], []
    for _ in range(5):
        ours.append(measure(lambda: VideoReader(path).probe()))
        if shutil.which("ffprobe"):
            ff.append(measure(lambda: subprocess.run(probe_cmd, check=True, stdout=subprocess.DEVNULL), child=True))
    rows.append(("open + probe", ours, ff, [], 0, "ffprobe -select_streams v:0 -show_entries stream=duration,nb_frames f"))
    for k in (64, 8):
        times = overview_times(reader.duration, k)
        ours, ff, tcs, dec = [], [], [], []
        for _ in range(args.repeat):
            held: list[VideoReader] = []  # open + probe + decode, as a fresh episode does
            ours.append(measure(lambda: held.append(VideoReader(path)) or held[0].overview(k)))
            dec.append(held[0].frames_decoded)
            if have_ffmpeg:
                ff.append(measure(lambda: run_cmds([ffmpeg_frame_cmd(path, t, size) for t in times]), child=True))
            if tc:
                tcs.append(measure(lambda: tc[0](times)))
        rows.append((f"overview({k})", ours, ff, tcs, statistics.median(dec),
                     f"{k} x ffmpeg -ss T -i f -frames:v 1 -vf scale=W:H -f rawvideo -"))
    ours, ff, tcs, dec = [], [], [], []
    for s in starts:
        before = reader.frames_decoded
        ours.append(measure(lambda: reader.crop(s, s + 10)))
        dec.append(reader.frames_decoded - before)
        if have_ffmpeg:
            ff.append(measure(lambda: run_cmds([ffmpeg_crop_cmd(path, s, s + 10, size)]), child=True))
        if tc:
            tcs.append(measure(lambda: tc[1](s, s + 10)))
    rows.append((f"crop 10 s @1 fps ({len(sample_times(0, 10))} frames)", ours, ff, tcs, statistics.median(dec),
                 "ffmpeg -ss S -i f -t 10 -vf fps=1,scale=W:H -f rawvideo -"))

    def med(xs, j):
        return statistics.median(x[j] for x in xs) * 1000 if xs else float("nan")

    def ms(v: float) -> str:
        return f"{v:.0f}" if v == v else "-"

    table = Table(title=f"paravt.video (PyAV) vs ffmpeg CLI: {args.minutes:g} min {info.width}x{info.height} H.264 "
                        f"@{info.fps:g} fps, keyframe every 5 s, frames resized to {size[1]}x{size[0]}; "
                        f"median ms per op")
    cols = ["operation", "paravt ms", "ffmpeg ms", "ratio", "paravt CPU ms", "ffmpeg CPU ms", "frames decoded"]
    if tc:
        cols += ["torchcodec ms", "torchcodec CPU ms"]
    for col in cols + ["ffmpeg twin"]:
        table.add_column(col, justify="left" if col in ("operation", "ffmpeg twin") else "right")
    verdict = None
    for j, (name, o, f, t, d, cmd) in enumerate(rows):
        ratio = med(o, 0) / med(f, 0) if f else float("nan")
        cells = [name, ms(med(o, 0)), ms(med(f, 0)), f"{ratio:.2f}x" if ratio == ratio else "-", ms(med(o, 1)),
                 ms(med(f, 1)), f"{d:.0f}" if d else "-"]
        if tc:
            cells += [ms(med(t, 0)), ms(med(t, 1))]
        table.add_row(*cells, f"[{j + 1}]")
        if name.startswith("crop"):
            verdict = ratio
    console.print(table)
    for j, row in enumerate(rows):
        console.print(f"[{j + 1}] {row[-1]}", highlight=False)
    if verdict is not None and verdict == verdict:
        ok = "[green]met[/]" if verdict <= 1.5 else "[red]missed[/]"
        console.print(f"target (10 s crop <= 1.5x ffmpeg wall): {ok} at {verdict:.2f}x")
    if not tc:
        console.print("torchcodec: not importable here, column omitted")


if __name__ == "__main__":
    main()
