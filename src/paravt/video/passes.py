"""One forward read of a container: the clean frames from where it stands, in time order.

Damaged data is skipped, not fatal: after a demux or decode error, a corrupt packet or frame,
or data a demuxer skipped silently (Matroska: a jump in byte positions; MPEG-TS: in dts),
nothing is decoded until the next keyframe, because frames built on missing references come
out of H.264's error concealment showing older pictures, mostly unflagged; B-frames are held
until their backward references came out clean (see ForwardPass). Frames that could not be
delivered are recorded (Losses), so a request whose nearer frames could not be decoded gets the
nearest decodable frame, with its own true time and Frame.substituted set. A demuxer that stops
at garbage (Matroska) is resumed past it. The MP4 index (moov) itself is not recovered: without
it the file is refused.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterator

from paravt.video.index import StreamIndex, seek
from paravt.video.sampling import EPS
from paravt.video.sources import Source

GAP_STEP = 1.5  # MPEG-TS/PS: a dts step of more packet durations than this is lost data
GAP_FRAMES = 4  # ... of more frame durations, for packets without a duration
LOST_BYTES = 1024  # Matroska: bytes skipped between packets (headers take < 32) that mean a resync
MAX_RESUMES = 256  # forward seeks to get past data a demuxer stopped at, per pass


class Losses:
    """Stream times where a pass could not deliver frames: `points`, frames seen (their packets)
    but not decodable; `spans`, open intervals where data was lost unseen (frames may be anywhere)."""

    def __init__(self) -> None:
        self.points: list[float] = []
        self.spans: list[tuple[float, float]] = []

    def add(self, t: float | None) -> None:
        if t is not None:
            bisect.insort(self.points, t)

    def add_span(self, a: float, b: float) -> None:
        if b > a:
            self.spans.append((a, b))

    def snapshot(self) -> tuple[list[float], int]:
        return list(self.points), len(self.spans)

    def restore(self, snap: tuple[list[float], int]) -> None:
        """Forgets what was recorded since `snap`: a pass abandoned (a seek that landed too late)
        lost nothing; what it could not decode, only because it started past a keyframe, the next
        try decodes."""
        self.points[:] = snap[0]
        del self.spans[snap[1]:]

    def nearer(self, target: float, d: float) -> bool:
        """Whether a frame that was lost may lie nearer to `target` than `d` seconds."""
        d -= EPS
        if d <= 0:
            return False
        j = bisect.bisect_right(self.points, target - d)
        if j < len(self.points) and self.points[j] < target + d:
            return True
        return any(a < target + d and b > target - d for a, b in self.spans)


class ForwardPass:
    """One forward read from the container's position: (frame, time) of clean frames, in time order.

    Decoders conceal damage with older pictures and flag only some of it (under frame threads,
    not even reliably), so frames are trusted by rule, not by flag:
    - after the seek, and after damage (a demux or decode error, a corrupt packet or frame, or
      data the demuxer skipped silently, see _skipped) the decoder is flushed and fed nothing
      before the next keyframe, so no frame is built on missing references;
    - a frame is held until the frames it may predict from backwards (B-frames: fed earlier,
      later time) came out clean, and dropped if one did not;
    - in MPEG-TS/PS a frame is held until the next packet is read: the packet before a resync,
      and the last one of a file cut inside a TS packet, hold bytes of other frames.
    Frames due but not delivered go to `losses`. A stream that ends before the probed end (a
    Matroska demuxer stops at garbage) is resumed by seeking forward past the damage.
    A timeless stream (raw H.264; only read from its start) has no packet times: each frame the
    decoder puts out, or that is lost on the way, takes the next frame time from `origin`.
    A reordered stream (AVI: packets in decode order, timed by it, and no presentation times, so
    the pts FFmpeg makes up for B-frames are wrong) is timed by output order: packets are known by
    their decode times, and each frame the decoder puts out (in display order) takes the earliest
    of those not yet taken; from a keyframe on, a closed GOP's frames fill exactly its packets' slots.
    (An open GOP, whose leading B-frames the decoder drops after a seek, is then timed that many
    frames early for the rest of the read: x264 and XviD write closed GOPs by default, FFmpeg's own
    MPEG-4 encoder open ones unless -flags +cgop; ffmpeg's CLI is a frame late on those too.)
    origin: the time sought (stream clock). key_by: end at once if packets pass this time
    before any keyframe: the seek landed too late (see decode.land).
    on_decoded: called for each frame the decoder puts out (the reader's frames_decoded counter).
    """

    def __init__(self, source: Source, index: StreamIndex, c, s, losses: Losses, origin: float, key_by: float | None,
                 on_decoded: Callable[[], None]) -> None:
        self.source, self.idx, self.on_decoded = source, index, on_decoded
        self.c, self.s, self.losses, self.origin, self.key_by = c, s, losses, origin, key_by
        self.tb, self.index = float(s.time_base), s.index
        self.need_key = True  # after a seek or damage: feed nothing before a keyframe
        self.drop = (-math.inf, -math.inf)  # frames timed inside are spoiled (open-GOP leaders after a loss)
        self.fed_key: float | None = None  # latest keyframe fed (decoders output a few frames late)
        self.pending: list[float] = []  # times of packets fed whose frames have not come out, in feed order
        self.held: list[tuple] = []  # (frame, time, references not yet out): clean frames not yet trusted
        self.last_out = -math.inf
        self.frontier: float | None = None  # latest packet time read
        self.span_open: float | None = None  # start of data lost unseen, closed by the next packet after it
        self.last_dts: int | None = None
        self.prev_dur = 0.0
        self.byte_end: int | None = None  # end of the last packet read, any stream
        self.bytes_skipped = False  # the demuxer skipped bytes since our last packet
        self.last_pkt: float | None = None  # time of our last packet read
        self.bad: set[float] = set()  # frames not to deliver when they come out
        self.lookahead = index.resync == "dts"  # a TS packet is trusted once the next one is read
        self.recent: deque[float] = deque(maxlen=32)  # times of the last packets read
        self.numbered = 0  # timeless stream: frames given a time so far
        self.unnumbered = 0  # timeless stream: packets in the decoder whose frames have not come out

    def __iter__(self) -> Iterator[tuple]:
        resumes, tries = None, 0
        while True:
            before = self.frontier
            self.last_dts = self.byte_end = None
            for packet in _demux(self.source, self.c):
                # packet.stream, not stream_index: PyAV's end-of-stream packets all say stream 0
                if packet is not None and packet.stream.index != self.index:
                    self._follow_bytes(packet)
                    continue
                previous = self.last_pkt
                frames = self._feed(packet)
                if frames is None:  # landed too late
                    return
                if self.lookahead and previous is not None and self.last_pkt != previous:
                    yield from self._release(("next", previous))  # the packet before this one is sound
                yield from self._accept(frames)
            # the stream ended: at the probed end, or early, stopped by damage
            if self.lookahead and self.last_pkt is not None:
                if self.idx.cut:  # the last PES is partial
                    self._distrust(self.last_pkt)
                yield from self._release(("next", self.last_pkt))
            self._lose_pending()
            reach = self.frontier if self.frontier is not None else self.origin
            if reach >= self.idx.last_pts - self.idx.frame_dur / 2:
                if self.span_open is not None:
                    self.losses.add_span(self.span_open, math.inf)
                return
            if resumes is None or self.frontier != before:  # fresh seek points after progress
                resumes = self.idx.resume_points(self.s, reach)
            t, tries = next(resumes, None), tries + 1
            if t is None or tries > MAX_RESUMES:
                self.losses.add_span(self.span_open if self.span_open is not None else reach, math.inf)
                return
            self._lost_from(min(reach, self._loss_start()))
            self._damage()
            seek(self.source, self.c, self.s, t)  # a refused seek reads on from EOF: the next point is tried

    def _feed(self, packet) -> list | None:
        """Checks a packet and decodes it: its frames ([] when skipped), None to stop the pass."""
        if packet is None:  # the demuxer failed: bytes lost here
            self._lost_from(self._loss_start())
            self._damage()
            return []
        if packet.size == 0:  # end-of-stream packet: drain the decoder
            self._end_holes()  # before the last frames come out and resolve requests
            return [] if self.need_key else (_decode(packet) or [])
        ts = packet.dts if self.idx.reordered else packet.pts
        t = ts * self.tb if ts is not None else None
        self._track(packet, t)
        self.last_pkt = t if t is not None else self.last_pkt
        if self.need_key:
            if not packet.is_keyframe:
                if self.key_by is not None and self.last_out == -math.inf and t is not None and t > self.key_by:
                    return None  # no keyframe at or before key_by follows
                self.losses.add(t)
                self._unfed()
                return []
            self.need_key, self.drop = False, (-math.inf, t if t is not None else -math.inf)
        if packet.is_keyframe:
            self.fed_key = t
        if packet.is_corrupt:
            self.losses.add(t)
            self._damage()
            self._unfed()
            return []
        if t is not None:
            if not packet.is_discard:  # an edit list's: decoded as a reference, its frame never comes out
                self.pending.append(t)
        elif self.idx.timeless:
            self.unnumbered += 1
        frames = _decode(packet)
        if frames is None:  # the decoder rejected the packet
            self._damage()
            return []
        return frames

    def _track(self, packet, t: float | None) -> None:
        """Follows packet times: data lost unseen between packets, the frontier of what was read."""
        self._follow_bytes(packet)
        if self._skipped(packet):
            start = self._loss_start()
            self.losses.add_span(start, t or 0.0)
            if self.lookahead and self.last_pkt is not None:
                self._distrust(self.last_pkt)  # a TS demuxer appends bytes after a resync to the PES in hand
            if packet.is_keyframe:  # the decoder can go on from here
                self.drop = (start, t if t is not None else -math.inf)
            else:
                self._damage()
        if packet.dts is not None:
            self.last_dts, self.prev_dur = packet.dts, (packet.duration or 0) * self.tb
        if t is not None:
            self.recent.append(t)
            if self.span_open is not None and t > self.span_open:
                self.losses.add_span(self.span_open, t)
                self.span_open = None
            if self.frontier is None or t > self.frontier:
                self.frontier = t

    def _follow_bytes(self, packet) -> None:
        if packet.pos is None or packet.pos < 0 or not packet.size:
            return
        if self.byte_end is not None and packet.pos - self.byte_end > LOST_BYTES:
            self.bytes_skipped = True
        self.byte_end = max(self.byte_end or 0, packet.pos + packet.size)

    def _skipped(self, packet) -> bool:
        """Whether the demuxer dropped data before this packet without an error, as Matroska and
        MPEG-TS demuxers resync past garbage. Matroska: it skipped bytes (between packets there
        are only headers; its dts are made up by FFmpeg, so they cannot tell). MPEG-TS/PS: the dts
        steps back, or over more than the previous packet's duration (the parser's, pulldown
        included: there the step equals it; null packets make byte gaps normal there).
        Variable-frame-rate gaps skip no bytes; MP4 is read by its sample table and skips nothing."""
        if self.idx.resync == "bytes":
            skipped, self.bytes_skipped = self.bytes_skipped, False
            return skipped
        if self.idx.resync == "dts" and self.last_dts is not None and packet.dts is not None:
            step = (packet.dts - self.last_dts) * self.tb
            limit = GAP_STEP * self.prev_dur if self.prev_dur > 0 else GAP_FRAMES * self.idx.frame_dur
            return step < 0 or step > limit + EPS
        return False

    def _accept(self, frames: list) -> Iterator[tuple]:
        """The clean ones of the decoder's output, in time order."""
        for f in frames:
            if self.idx.reordered:  # the earliest slot not yet filled (a closed GOP fills its own slots)
                if not self.pending:
                    continue
                t = min(self.pending)
            elif f.pts is not None:
                t = f.pts * self.tb
            elif self.idx.timeless:
                t, self.unnumbered = self._number(), max(0, self.unnumbered - 1)
            else:
                continue
            self.on_decoded()
            if f.is_corrupt:
                self.losses.add(t)
                self._spoiled(t)
                if self.fed_key is not None and self.fed_key > t + EPS:
                    self.drop = (t, self.fed_key)  # a later keyframe is in the decoder already: keep it
                    continue
                self._damage()
                return
            if t <= self.last_out + EPS:  # delivered already (a resume re-read it)
                continue
            if t in self.bad:
                self._spoiled(t)
                continue
            if self.drop[0] < t < self.drop[1] - EPS:
                self.losses.add(t)
                continue
            self.last_out = t
            refs = self._references(t)  # may drop held frames: before the append
            self.held.append((f, t, refs))
            yield from self._release(t)

    def _references(self, t: float) -> set[float]:
        """Times of the frames this one may predict from that have not come out: packets fed
        before its own with a later time (a B-frame's backward references). Takes the frame's
        own packet, and packets due before it that never came out, off `pending`."""
        pending = self.pending
        if pending and abs(pending[0] - t) <= EPS:  # out in feed order: waits on nothing
            pending.pop(0)
            refs: set = set()
        else:
            i = next((j for j, p in enumerate(pending) if abs(p - t) <= EPS), len(pending))
            refs = {p for p in pending[:i] if p > t + EPS}
            for p in pending:
                if p < t - EPS:  # due before this frame, never came out
                    self.losses.add(p)
                    self._spoiled(p)
            self.pending = [p for p in pending if p > t + EPS]
        if self.lookahead and self.last_pkt is not None and abs(t - self.last_pkt) <= EPS:
            refs.add(("next", self.last_pkt))  # its packet is the last read: wait for the next
        return refs

    def _release(self, t: float) -> Iterator[tuple]:
        """Frames whose references all came out clean, in time order: a damaged reference is
        flagged only on the frame itself, never on the B-frames built on it (output earlier)."""
        for _, _, refs in self.held:
            refs.discard(t)
        while self.held and not self.held[0][2]:
            f, u, _ = self.held.pop(0)
            yield f, u

    def _spoiled(self, t: float) -> None:
        """Drops the held frames that may predict from the corrupt frame at `t`."""
        for _, u, refs in self.held:
            if t in refs:
                self.losses.add(u)
        self.held[:] = [h for h in self.held if t not in h[2]]

    def _damage(self) -> None:
        """Drop what the decoder holds and wait for a keyframe."""
        self.s.codec_context.flush_buffers()
        self._lose_pending()
        self.need_key = True

    def _lose_pending(self) -> None:
        """What the decoder held is gone: frames fed and not out, frames waiting on those."""
        for p in self.pending:
            self.losses.add(p)
        for _, u, _ in self.held:
            self.losses.add(u)
        self.pending.clear()
        self.held.clear()
        for _ in range(self.unnumbered):
            self.losses.add(self._number())
        self.unnumbered = 0

    def _number(self) -> float:
        """Timeless stream: the time of the next frame in display order, which is now read."""
        t = self.origin + self.numbered * self.idx.frame_dur
        self.numbered += 1
        self.frontier = t
        return t

    def _unfed(self) -> None:
        """Timeless stream: a packet skipped (not decoded) still holds a frame, which takes its time."""
        if self.idx.timeless:
            self.losses.add(self._number())

    def _lost_from(self, t: float) -> None:
        if self.span_open is None:
            self.span_open = t

    def _loss_start(self) -> float:
        """Where frames lost unseen may start: after our last packet's dts (frames decoded after
        it have later dts, and pts >= dts), which B-frames put before the latest pts read."""
        start = self.frontier if self.frontier is not None else self.origin
        return min(start, self.last_dts * self.tb) if self.last_dts is not None else start

    def _end_holes(self) -> None:
        """A stream cut off (truncated, or garbage to the end) misses the frames that would follow
        its last packet in decode order: a complete one has a packet for every frame between
        that packet's dts and the latest pts read, so holes there are losses."""
        if self.last_dts is None or self.frontier is None:
            return
        d0 = self.last_dts * self.tb
        step = GAP_STEP * (self.prev_dur or self.idx.frame_dur)
        prev = max((t for t in self.recent if t <= d0 + EPS), default=d0)
        for t in sorted(t for t in self.recent if t > d0 + EPS) + [self.frontier]:
            if t - prev > step + EPS:
                self.losses.add_span(prev, t)
            prev = max(prev, t)

    def _distrust(self, t: float) -> None:
        """The frame of the packet at `t` may be built from damaged bytes: not delivered."""
        self.losses.add(t)
        self.bad.add(t)
        self._spoiled(("next", t))
        self._spoiled(t)


def _demux(source: Source, c) -> Iterator:
    """Packets of every stream (their byte positions show what a demuxer skipped); None marks a
    demux error (bytes lost there), after which demuxing goes on (a few times: a demuxer that
    keeps failing has nothing left to give). Where the error is the network failing (or a URL's
    read budget spent), not the data, that is raised instead."""
    for _ in range(16):
        try:
            yield from source.packets(c)
            return
        except Exception as e:
            if (err := source.failed_network(e)) is not None:
                raise err from None
            yield None


def _decode(packet) -> list | None:
    """The packet's frames, or None when the decoder rejects it (damaged data)."""
    try:
        return packet.decode()
    except Exception:
        return None
