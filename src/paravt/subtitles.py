"""Subtitles as timed cues, and which of them a model sees with which frames.

Each benchmark's protocol decides that, and they differ:

* "at_frames" (Video-MME with subtitles, as lmms-eval runs it: lmms_eval/tasks/videomme/utils.py,
  `videomme_doc_to_text_subtitle`): only the cues shown at one of the sampled frames are kept, in
  file order, one line each, as a block before the question. lmms-eval tests
  `int(start*fps) <= frame_index < int(end*fps)`; here the same test is made in seconds,
  `start <= t < end`, which differs only by the rounding of times to frames.
* "interleaved" (LongVideoBench: longvideobench/longvideobench_dataset.py,
  `insert_subtitles_into_frames`, the same code in lmms-eval's longvideobench task): each cue is
  placed after the last frame at or before its midpoint, and kept only if some frame lies
  strictly inside it, a cue shorter than 1 s being widened to its midpoint ± 0.5 s first. No
  block before the question.

Subtitle files are hand-parsed: SubRip (Video-MME) is a trivial format and no SRT library is among
our dependencies; LongVideoBench's are JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PROTOCOLS = ("at_frames", "interleaved")

_TIME = re.compile(r"(\d+):(\d{1,2}):(\d{1,2}(?:[.,]\d+)?)")
# Video-MME's .srt files (YouTube captions) wrap every cue in <font color="white" size=".72c">;
# lmms-eval keeps the text of the first such element of a cue and drops cues without one. Here any
# <font> is read that way and a cue without one is kept, markup stripped, so plain .srt files work.
_FONT = re.compile(r"<font[^>]*>(.*?)</font>", flags=re.S | re.I)
_MARKUP = re.compile(r"<[^>]+>|\{[^}]*\}")


@dataclass
class Cue:
    start: float  # seconds from the start of the video
    end: float
    text: str


@dataclass
class Subtitles:
    cues: list[Cue]
    protocol: str  # "at_frames" (Video-MME, lmms-eval) | "interleaved" (LongVideoBench)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown subtitle protocol {self.protocol!r}; expected one of {PROTOCOLS}")

    @classmethod
    def from_dict(cls, d: dict) -> "Subtitles":
        """Back from `dataclasses.asdict` (how samples are written to JSON)."""
        return cls([Cue(float(c["start"]), float(c["end"]), str(c["text"])) for c in d["cues"]], d["protocol"])


def _seconds(stamp: str) -> float:
    m = _TIME.fullmatch(stamp.strip())
    if not m:
        raise ValueError(f"not a time code: {stamp!r}")
    h, mi, s = m.groups()
    return int(h) * 3600 + int(mi) * 60 + float(s.replace(",", "."))


def _cue_text(lines: list[str]) -> str:
    """The cue's lines joined by spaces (as lmms-eval does), then the first <font> element's text
    if there is one, else the text without markup (<i>, {\\an8})."""
    joined = " ".join(s.strip() for s in lines if s.strip())
    m = _FONT.search(joined)
    text = m.group(1) if m else joined
    return " ".join(_MARKUP.sub("", text).split())


def parse_srt(text: str) -> list[Cue]:
    """The cues of a SubRip file, in file order (BOM, CRLF and missing cue numbers tolerated).

    Cues with the same (start, end) are one cue whose text is the last one's, at the first one's
    place: lmms-eval reads the file into a dict keyed by (start, end). Empty cues are dropped."""
    cues: dict[tuple[float, float], str] = {}
    blocks = re.split(r"\n\s*\n", text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n"))
    for block in blocks:
        lines = block.strip("\n").split("\n")
        at = next((i for i, s in enumerate(lines[:2]) if "-->" in s), None)
        if at is None:
            continue
        start, _, end = lines[at].partition("-->")
        try:
            span = (_seconds(start), _seconds(end.split()[0] if end.split() else end))
        except ValueError:
            continue
        body = _cue_text(lines[at + 1:])
        if body:
            cues[span] = body
    return [Cue(s, e, t) for (s, e), t in cues.items()]


def load_srt(path: Path) -> Subtitles | None:
    """Video-MME's subtitle/{videoID}.srt as "at_frames" subtitles; None when the file is absent
    (not every Video-MME video has subtitles)."""
    if not path.is_file():
        return None
    return Subtitles(parse_srt(path.read_text(encoding="utf-8-sig", errors="replace")), "at_frames")


def parse_lvb_subtitles(entries: list, offset: float, duration: float) -> list[Cue]:
    """LongVideoBench's subtitles/{id}_en.json entries as cues on the video's own time axis.

    Two shapes occur: {"start": "HH:MM:SS.mmm", "end": ..., "line": text} (YouTube videos) and
    {"timestamp": [start, end], "text": text} (Whisper output, TikTok videos), whose end may be
    null. Times are on the source video's timeline: `offset` (the row's
    starting_timestamp_for_subtitles) is subtracted, as the official loader does, because a clip
    cut from a longer video ships the whole source's track. A missing end becomes the clip's
    `duration` (the official loader uses `duration - offset`, which only differs for a clip with
    an offset, and any non-float end, 15 as well as null). File order is kept: placement depends
    on it."""
    cues = []
    for i, e in enumerate(entries):
        try:
            if "timestamp" in e:
                start, end = e["timestamp"]
                start, end = float(start) - offset, duration if end is None else float(end) - offset
                text = e["text"]
            else:
                start, end, text = _seconds(e["start"]) - offset, _seconds(e["end"]) - offset, e["line"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"subtitle entry {i} is neither {{start, end, line}} nor {{timestamp, text}}: "
                             f"{type(err).__name__}: {err}") from None
        cues.append(Cue(start, end, " ".join(str(text).split())))
    return cues


def load_lvb_subtitles(path: Path, offset: float, duration: float) -> Subtitles | None:
    """A LongVideoBench subtitle file as "interleaved" subtitles; None when it is absent."""
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, list):
            raise ValueError("expected a list of subtitle entries")
        cues = parse_lvb_subtitles(entries, offset, duration)
    except (json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return Subtitles(cues, "interleaved")


def _at_frames(cues: list[Cue], frame_times: list[float]) -> str:
    return "\n".join(c.text for c in cues if any(c.start <= t < c.end for t in frame_times))


def _interleaved(cues: list[Cue], frame_times: list[float]) -> list[str]:
    """LongVideoBench's placement. Text the official code would put before the first frame (a cue
    covering it whose midpoint is earlier) goes after the first frame: there is no slot before it."""
    after: list[list[str]] = [[] for _ in frame_times]
    shown = 0  # frames already placed
    for c in cues:
        mid = (c.start + c.end) / 2
        while shown < len(frame_times) and frame_times[shown] <= mid:
            shown += 1
        start, end = (mid - 0.5, mid + 0.5) if c.end - c.start < 1 else (c.start, c.end)
        if c.text and any(start < t < end for t in frame_times):
            after[max(shown - 1, 0)].append(c.text)
    return ["\n".join(texts) for texts in after]


def for_frames(subs: Subtitles, frame_times: list[float]) -> tuple[list[str], str]:
    """(text to insert right AFTER each frame — same length as frame_times, "" where none —,
    text block to put before the question — "" for none). at_frames: no per-frame text, a block
    of the cue lines that the protocol keeps for these frame times; interleaved: each cue's text
    placed by time among the frames, no block.

    frame_times: seconds from the start of the video, in the order the frames are shown
    (ascending)."""
    times = [float(t) for t in frame_times]
    if subs.protocol == "interleaved":
        return _interleaved(subs.cues, times), ""
    return [""] * len(times), _at_frames(subs.cues, times)
