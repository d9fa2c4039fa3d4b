"""Which of a file's video streams is the video.

The largest picture wins; the default flag only breaks ties. ffmpeg's CLI does otherwise: its
automatic mapping scores a stream by its pixels plus a large bonus for the default flag, so it
mostly takes the flagged one. Muxers set that flag on the first track whatever it holds (MP4's
always), so here it says less than the size.

Not the video, whatever their size: an attached picture (an audio file's cover art, flagged
attached_pic) and a still beside a moving stream. FFmpeg's Matroska muxer writes cover art as a
plain one-frame video track (the flag is lost), often the largest; so with several candidates,
the packets at the start of the file are counted, and a stream with at most one among them, while
another has more, is a still.
"""

from __future__ import annotations

DEFAULT, ATTACHED_PIC = 0x1, 0x400  # FFmpeg's AV_DISPOSITION_DEFAULT, AV_DISPOSITION_ATTACHED_PIC
COUNT_PACKETS = 512  # packets read from the start to tell a still from a moving stream


def _flags(s) -> int:
    d = getattr(s, "disposition", 0) or 0
    return int(getattr(d, "value", d))  # PyAV 15's Disposition is an enum.Flag, which int() refuses


def candidates(container) -> list:
    """The video streams that are not attached pictures."""
    return [s for s in container.streams.video if not _flags(s) & ATTACHED_PIC]


def choose_stream(container, count: bool = True):
    """The stream to read (see the module's docstring), None without one. count: with several
    candidates, demux the first packets to find stills (moves the container: reopen it after)."""
    streams = candidates(container)
    if len(streams) > 1 and count:
        stills = _stills(container, streams)
        streams = [s for s in streams if s.index not in stills] or streams
    best, key = None, None
    for s in streams:
        k = ((s.codec_context.width or 0) * (s.codec_context.height or 0), bool(_flags(s) & DEFAULT))
        if key is None or k > key:  # ties: the first
            best, key = s, k
    return best


def _stills(container, streams) -> set[int]:
    """Indices of the candidates with at most one packet among the file's first packets, when another
    has more; a stream stating one frame is a still outright."""
    stills = {s.index for s in streams if (s.frames or 0) == 1}
    seen = {s.index: 0 for s in streams}
    try:
        for i, packet in enumerate(container.demux(*streams)):
            if packet.size:
                seen[packet.stream.index] += 1
            if i >= COUNT_PACKETS or min(seen.values()) >= 2:
                break
    except Exception:  # damaged data: what was read decides
        pass
    if max(seen.values()) >= 2:
        stills |= {i for i, n in seen.items() if n <= 1}
    return stills
