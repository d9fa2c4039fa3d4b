"""The demuxer's view of a video: seeking, the probe (packets demuxed, nothing decoded) and the
timeline it measures: start, end, frame rate, the demuxer's keyframe index, and jumps of the
timestamps.

Timestamps come from pts * time_base, never index / fps, so variable-frame-rate files
return the frames nearest the requested times. They are on the file's clock, as players and
ffmpeg's CLI count time: zero is the earliest start of its video and audio streams, so where the
audio starts before the video (an MP4 muxed with -itsoffset) the first frame is at that lead, the
time before it holds no frame (sampled around, flagged when asked for), and subtitles, timed on
that clock, fall on the frames they belong to.

The frame count: a count the container states per frame (MP4's sample table, less what an edit
list discards), else every packet counted when a small local file is demuxed whole (MKV, WebM and
MPEG-TS state none; variable frame rates make duration x fps wrong), else an estimate from the
rate of the last 10 s. A stated duration the packets contradict (a truncated file, an AVI header
cut short) gives way to the measured one, and a stated count to what is there.

Timestamps that jump (a camera clock reset, files joined without re-timing: pts leaping by
hours mid-file) leave spans where nothing was recorded. The nearest frame to a time in such a
span is from elsewhere, hours away, so the probe finds the jumps (steps of the demuxer's index
over JUMP_S and JUMP_FRAMES frame steps, each confirmed on the packets between its two entries:
one GOP demuxed, nothing decoded) and sampling skips them: overview(k) and a crop spread their
frames over the recorded parts only, a crop wholly inside a jump is a VideoError saying so, and
frames_at() flags a frame it returns for a time inside a jump (Frame.substituted). fps and
num_frames then come from the packets (median frame step, the stated or recorded count), not
from duration x fps. Containers without an index (MPEG-TS) are not checked for jumps.

A stream whose packets carry no timestamps at all (a raw H.264 elementary stream: Raspberry Pi
cameras, DVRs) is timeless: frame i is at i x the frame duration its packets state (the parser's,
from the SPS; else the codec's rate), counted from the start, as ffmpeg stamps it. It cannot be
sought by time, so it is read forward from its first byte (StreamIndex.timeless).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from paravt.video.errors import VideoError
from paravt.video.frames import VideoInfo
from paravt.video.sampling import EPS
from paravt.video.sources import Source

REWIND = 1000.0  # s before the first timestamp: a seek there lands on the file's first packet
JUMP_S = 60.0  # s; a step between consecutive frames over this, and over JUMP_FRAMES typical
JUMP_FRAMES = 100  # frame steps, is a jump of the timestamps, not a long still (VFR) frame
COUNT_BYTES = 64 << 20  # a local file this small, stating no frame count, is demuxed whole to count them (~60 ms)


# ---------- seeking: the demuxer's two moves ----------
def ticks(s, t: float) -> int:
    """`t` (s, stream clock) in time-base ticks, rounded down: in a time base as coarse as one
    frame (AVI's), rounding to the nearest would seek half the times to the frame after `t`."""
    return math.floor((t + EPS) / float(s.time_base))


def seek(source: Source, c, s, t: float) -> bool:
    """Backward seek to `t` (stream clock); False where the demuxer refuses (a TS whose
    timestamps it cannot find by bisection), which callers treat as a landing that failed."""
    try:
        c.seek(ticks(s, t), stream=s, backward=True, any_frame=False)
        return True
    except Exception as e:
        if source.network_failure(e):
            raise source.network_error(e) from None
        return False


def rewind(source: Source, c, s) -> None:
    """To the first packet: a seek before the first timestamp (a seek *to* the first
    timestamp in an MPEG-TS can land a few packets in, past the first keyframe); where that is
    refused (AVI), a seek to the first timestamp; else to byte 0 (formats without timestamps,
    raw H.264). Not byte 0 first: AVI's demuxer then keeps counting frames from where it was."""
    if seek(source, c, s, start_time(s) - REWIND) or seek(source, c, s, start_time(s)):
        return
    try:
        c.seek(0, stream=s, unsupported_byte_offset=True)
    except Exception as e:
        if source.network_failure(e):
            raise source.network_error(e) from None
        raise VideoError(f"{source.path}: cannot seek to the start ({type(e).__name__}: {e})") from None


def start_time(s) -> float:
    return float(s.start_time * s.time_base) if s.start_time is not None else 0.0


# ---------- what the probe learns ----------
@dataclass
class StreamIndex:
    """The stream's timeline as the probe measured it (stream clock, seconds), and how to read it:
    whether the demuxer keeps a keyframe index, how it resyncs past damage, whether the file ends
    inside a TS packet, and the recorded spans (None: the timestamps never jump)."""

    indexed: bool  # MP4/MKV keep a keyframe index in memory; MPEG-TS does not
    resync: str | None  # "bytes" (Matroska), "dts" (MPEG-TS/PS) or None: how lost data shows
    cut: bool  # an MPEG-TS that ends inside a TS packet: its last PES is partial
    start: float  # the stream's first timestamp
    last_pts: float  # the latest packet time
    frame_dur: float  # 1 / fps
    spans: list[tuple[float, float]] | None  # file clock: the parts that hold frames (None: all of it)
    timeless: bool = False  # no packet has a time: frames are numbered from the start (raw H.264)
    reordered: bool = False  # packets hold decode-order times only (AVI): frames are timed as they come out
    zero: float = 0.0  # the file's time zero on the stream clock (<= start: its audio may start first)

    def keyframe_before(self, s, target: float) -> float | None:
        """Time (stream clock) of the keyframe a backward seek to `target` lands on, from the
        demuxer's index (MP4/MKV keep one in memory after opening; nothing is read). None
        without an index: what an MPEG-TS demuxer fills in while seeking is guesswork."""
        if not self.indexed:
            return None
        entries = s.index_entries
        if len(entries) == 0:
            return None
        j = entries.search_timestamp(ticks(s, target), backward=True)
        if j < 0:
            return self.start
        return float(entries[j].timestamp * s.time_base)

    def resume_points(self, s, after: float) -> Iterator[float]:
        """Seek times past `after` to resume a stream that stopped early: the index's next
        keyframes, or without an index steps growing from 1 s; none in a timeless stream."""
        tb = float(s.time_base)
        if self.timeless:
            return
        if self.indexed:
            entries = s.index_entries
            ts = math.floor(after / tb) + 1
            while (j := entries.search_timestamp(ts, backward=False)) >= 0:
                e = entries[j]
                yield e.timestamp * tb
                ts = e.timestamp + 1
            return
        step = 1.0
        while after + step <= self.last_pts:
            yield after + step
            step *= 1.5

    def in_jump(self, t: float) -> bool:
        """Whether `t` (file clock) lies where nothing was recorded: a jump of the timestamps, or
        before the video's first frame."""
        return self.spans is not None and not any(a - EPS <= t <= b + EPS for a, b in self.spans)

    def recorded(self, start: float, end: float) -> list[tuple[float, float]]:
        """The parts of [start, end] (file clock) that hold frames."""
        if self.spans is None:
            return [(start, end)]
        return [(max(a, start), min(b, end)) for a, b in self.spans if min(b, end) > max(a, start)]


# ---------- the probe ----------
def probe(source: Source, c, s) -> tuple[StreamIndex, VideoInfo]:
    """Measure the stream from its packets (nothing decoded): the index, and its VideoInfo with the
    coded frame size (the reader turns it upright). A stream without frames is a VideoError."""
    # Before any seek: seeking an MPEG-TS fills its index with guesses (every packet a "keyframe").
    indexed = len(getattr(s, "index_entries", ())) > 0
    fmt = c.format.name or ""
    resync = "bytes" if "matroska" in fmt else "dts" if fmt in ("mpegts", "mpeg") else None
    size = source.size(c)
    cut = fmt == "mpegts" and all(size % n for n in (188, 192, 204))  # ends inside a TS packet
    reordered = fmt == "avi"  # AVI stores decode order and no presentation times (see passes.ForwardPass)
    fps = float(s.average_rate or s.guessed_rate or 0) or 0.0
    duration = None
    if s.duration is not None and s.time_base is not None:
        duration = float(s.duration * s.time_base)
    elif c.duration is not None:
        duration = c.duration / 1_000_000
    start = float(s.start_time * s.time_base) if s.start_time is not None and s.time_base else 0.0
    num_frames = int(s.frames or 0)
    shown = _shown_samples(s, num_frames)  # MP4 (and indexed AVI): one index entry a frame
    # Demux packet timestamps (cheap, no decoding) to check the file holds frames and that its
    # stated duration is real: a truncated file states more than it has (and an AVI header may
    # state less). Only the tail is read when a duration is stated, unless the frames must be counted
    # (no count stated) and the file is small: then it is read whole, and the count is exact.
    whole = shown is None and not source.remote and size <= COUNT_BYTES
    scan, exact = _measure(source, c, s, None if whole else duration, start, reordered)
    timeless = scan.count == 0 and scan.untimed > 0  # the file was scanned whole: no packet has a time
    if timeless:
        fps, start = _untimed_rate(scan, s), 0.0
        scan.count, scan.last, scan.first = scan.untimed, (scan.untimed - 1) / fps, 0.0
    if scan.count == 0:
        raise VideoError(f"{source.path}: video stream holds no frames (truncated or empty)")
    step = _median_step(scan.recent, s.time_base) or (1.0 / fps if fps > 0 else 0.0)
    jumps = _find_jumps(source, c, s, step) if step > 0 and indexed else []
    if jumps:  # a mean rate over the stated span counts the jumps' empty hours: the typical step instead
        fps = 1.0 / step
    frame_dur = 1.0 / fps if fps > 0 else 0.0
    measured = scan.last - start + frame_dur
    changed = duration is None or duration <= 0 or abs(measured - duration) > 2 * frame_dur
    if changed:
        duration = measured
    zero = 0.0 if timeless else _file_start(c, s, start)
    lead = start - zero  # the video's first frame on the file's clock (its audio may start first)
    spans = _recorded_spans(jumps, zero, lead if lead > frame_dur + EPS else 0.0, step, lead + duration)
    recorded = sum(b - a for a, b in spans) if spans else duration
    if exact:
        num_frames = scan.count
    else:
        num_frames = shown if shown is not None else num_frames
        if not num_frames and not jumps and scan.last > scan.first + 1.0:  # the tail's own rate (VFR)
            num_frames = int(round(recorded * (scan.count - 1) / (scan.last - scan.first)))
        if changed and fps > 0 and num_frames:  # a count stated for the whole file: cut to what is there
            num_frames = min(num_frames, int(round(recorded * fps)))
    if fps <= 0:
        fps = 25.0  # unknown rate: timestamps still come from pts, fps only sets the crop gap
    index = StreamIndex(indexed=indexed, resync=resync, cut=cut, start=start, last_pts=scan.last,
                        frame_dur=1.0 / fps, spans=spans, timeless=timeless, reordered=reordered, zero=zero)
    gaps = [(a, b) for (_, a), (b, _) in zip(spans, spans[1:])] if spans else []
    info = VideoInfo(duration=lead + duration, fps=fps, num_frames=num_frames or int(round(recorded * fps)),
                     width=s.codec_context.width, height=s.codec_context.height, gaps=gaps, start=lead)
    return index, info


def _shown_samples(s, stated: int) -> int | None:
    """Frames shown, where the demuxer's index has one entry per frame (MP4's sample table, an AVI's
    idx1): the entries not discarded by an edit list (which the decoder drops). None otherwise."""
    entries = getattr(s, "index_entries", ())
    if not stated or len(entries) != stated:
        return None
    return sum(1 for e in entries if not e.is_discard)


def _file_start(c, s, start: float) -> float:
    """The file's time zero (stream clock): the earliest first timestamp of its video and audio
    streams, as players and ffmpeg's CLI count time. An audio start more than JUMP_S before the
    video's is a broken clock, not a lead-in, and is ignored."""
    zero = start
    for other in c.streams:
        if other.type in ("video", "audio") and other.start_time is not None and other.time_base:
            t = float(other.start_time * other.time_base)
            if start - JUMP_S <= t < zero:
                zero = t
    return zero


def _measure(source: Source, c, s, duration: float | None, start: float, by_dts: bool) -> tuple["_Scan", bool]:
    """The packets' scan: of the last 10 s of a stated duration, else (or if that finds nothing) of
    the whole stream; and whether it was whole (its count is every frame)."""
    moved = False  # a fresh container stands at the start
    for scan_from in ([max(duration - 10.0, 0.0), None] if duration else [None]):
        if scan_from is not None:
            if scan_from <= 0 or not seek(source, c, s, scan_from + start):
                continue
            moved = True
        elif moved:
            rewind(source, c, s)
        scan = _scan_pts(source, c, s, by_dts)
        if scan.count or scan_from is None:
            return scan, scan_from is None
    return _Scan(), True


@dataclass
class _Scan:
    """What demuxing to the end found: the latest and earliest packet time (stream clock), the count
    of packets with a time, the last 512 of their pts; packets without a time and their durations."""

    last: float | None = None
    first: float | None = None
    count: int = 0
    recent: list[int] = field(default_factory=list)
    untimed: int = 0
    durations: list[int] = field(default_factory=list)


def _scan_pts(source: Source, c, s, by_dts: bool = False) -> _Scan:
    """Demux from the current position to the end (packets an edit list discards left out; by_dts:
    AVI's decode-order times, whose made-up pts say nothing). A demux error ends the scan (damaged
    data) but fails only if no packet came before it; a network failure always fails."""
    scan, recent = _Scan(), deque(maxlen=512)
    try:
        for packet in source.packets(c, s):
            ts = packet.dts if by_dts else packet.pts
            if ts is not None and packet.size and not packet.is_discard:
                t = float(ts * s.time_base)
                scan.last = t if scan.last is None else max(scan.last, t)
                scan.first = t if scan.first is None else min(scan.first, t)
                scan.count += 1
                recent.append(ts)
            elif packet.size and ts is None:
                scan.untimed += 1
                if len(scan.durations) < 512 and packet.duration:
                    scan.durations.append(packet.duration)
    except Exception as e:
        if (err := source.failed_network(e)) is not None:
            raise err from None
        if scan.count + scan.untimed == 0:
            raise VideoError(f"{source.path}: corrupt or truncated video ({type(e).__name__}: {e})") from None
    scan.recent = list(recent)
    return scan


def _untimed_rate(scan: _Scan, s) -> float:
    """Frame rate of a timeless stream: its packets' typical duration (the parser's, from the
    stream's own timing info), else the codec's rate, else the demuxer's (raw H.264: 25)."""
    if scan.durations:
        return 1.0 / float(statistics.median_low(scan.durations) * s.time_base)
    rate = s.codec_context.framerate or s.guessed_rate or s.average_rate
    return float(rate) if rate else 25.0


def _median_step(pts: list[int], time_base) -> float:
    """The typical step (s) between consecutive frame timestamps (0 with fewer than two): a frame
    rate that a jump of the timestamps, or a few long VFR frames, does not move. On the integer
    pts, so that 0.1 s steps far into a file stay 0.1, not 0.1 plus float noise."""
    pts = sorted(set(pts))
    steps = [b - a for a, b in zip(pts, pts[1:])]
    return float(statistics.median_low(steps) * time_base) if steps else 0.0


def _find_jumps(source: Source, c, s, step: float) -> list[tuple[float, float]]:
    """(last frame before, first frame after), stream clock, of each jump of the timestamps: a
    step between consecutive frames over JUMP_S and JUMP_FRAMES typical steps. Candidates are
    steps of the demuxer's index (in memory: MP4's every sample, Matroska's cues), each checked
    on the packets between its two entries. Only called with an index (MPEG-TS has none)."""
    tb = float(s.time_base)
    limit = max(JUMP_S, JUMP_FRAMES * step)
    ticks = [e.timestamp for e in s.index_entries]  # FFmpeg keeps them in time order
    over = limit / tb
    jumps: set[tuple[float, float]] = set()
    for a, b in zip(ticks, ticks[1:]):
        if b - a > over:
            jumps.update(_jumps_between(source, c, s, a * tb, b * tb, limit))
    return sorted(jumps)


def _jumps_between(source: Source, c, s, a: float, b: float, limit: float) -> list[tuple[float, float]]:
    """The jumps among the packets from index time `a` to `b` (demuxed, not decoded)."""
    if not seek(source, c, s, a):
        return []
    tb, times = float(s.time_base), []
    try:
        for packet in source.packets(c, s):
            if packet.pts is None:
                continue
            times.append(float(packet.pts * tb))
            if times[-1] >= b - EPS:
                break
    except Exception as e:  # damaged data: what was read is what there is
        if (err := source.failed_network(e)) is not None:
            raise err from None
    times.sort()
    return [(x, y) for x, y in zip(times, times[1:]) if y - x > limit]


def _recorded_spans(jumps: list[tuple[float, float]], zero: float, lead: float, step: float,
                    end: float) -> list[tuple[float, float]] | None:
    """The parts of the file's clock (0..end) that hold frames: from `lead` (the video's first frame,
    when its audio starts well before; else 0), around timestamp jumps given as (last frame before,
    first frame after) on the stream clock; the frame before a jump lasts one typical step. None
    when the whole span holds frames."""
    if not jumps and not lead:
        return None
    spans, lo = [], lead
    for a, b in jumps:
        spans.append((lo, round(a - zero + step, 6)))
        lo = round(b - zero, 6)
    spans.append((lo, end))
    return spans
