"""Oracle trajectories for cold-start SFT.

A teacher that knows the annotations writes what a good agent does: when the overview
frames (the real timestamps, for the K of the episode) already show the evidence, a short
think and the answer; otherwise a think, 1-5 parallel crop_video calls over windows that
cover the evidence (sometimes decoys), one sub-agent conversation per call (the crop's real
frame times -> a factual summary of only what those frames show), and a final think and
answer. Grounding questions crop around the event even when the overview shows it, since one
frame cannot tell when it starts and ends.

Two options make the cold start the paper's (a tool prior, and more than one round):
- `tool_prior` p: when the overview already shows the evidence, the oracle still crops with
  probability p, on windows around that evidence, and its final think says what the crops
  confirmed. At p = 0 (the default) it answers directly, as before.
- the "sweep" crop policy: fixed windows of `sweep_len` seconds from the start of the video
  (0-30, 30-60, ...), five per round, a second round only if the first did not settle the
  question (a count always needs every window). Where to look then depends only on the stated
  duration, which a tiny model can learn, and the windows cover videos of up to
  5 x 2 x 30 = 300 s with frames at most ~2 s apart (16 per window), so every event of 2 s or
  more is seen by some crop.

`to_sft_rows` renders a trajectory with the episode's own message builders
(paravt.agent.build_main_messages / build_subagent_messages), so SFT sees exactly the text
the episode loop produces."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from paravt import protocol as P
from paravt.agent import (EpisodeConfig, build_final_message, build_main_messages, build_subagent_messages,
                          build_tool_response_messages, tool_response_parts)
from paravt.messages import ImagePart, Message
from paravt.synth.questions import Question, article, describe_frames, evidence_visible
from paravt.synth.render import VideoSpec
from paravt.video import Frame

CropTimes = Callable[[float, float], list[float]]  # (start, end) -> timestamps of the frames a crop returns


@dataclass
class OracleCall:
    start: float
    end: float
    frame_times: list[float]
    summary: str
    decoy: bool = False  # the window holds none of the evidence
    round: int = 0  # the main turn (0, 1, ...) that makes this call


@dataclass
class Trajectory:
    question_id: str
    k: int
    overview_times: list[float]
    direct: bool
    think: str
    calls: list[OracleCall] = field(default_factory=list)
    final_think: str = ""
    answer: str = ""  # the text inside <answer>
    round_thinks: list[str] = field(default_factory=list)  # the think of each later round's turn (round 1, ...)
    redundant: bool = False  # calls made although the overview already showed the evidence (the tool prior)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_rounds(self) -> int:
        return 1 + max((c.round for c in self.calls), default=0) if self.calls else 0

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known and k != "calls"},
                   calls=[OracleCall(**c) for c in d["calls"]])


def answer_text(q: Question) -> str:
    """What the agent writes inside <answer>: the letter, 'start - end', or the short text."""
    if q.question_type == "tvg":
        s, e = q.evidence[0]
        return f"{s:g} - {e:g}"
    return q.answer


def _conclusion(q: Question) -> str:
    if q.question_type == "mcq":
        return f"That is option {q.answer}: {q.answer_text}."
    if q.question_type == "tvg":
        s, e = q.evidence[0]
        return f"So it is on screen from {s:g} to {e:g} seconds."
    return f"So the answer is: {q.answer}."  # read back by stated_answer


def stated_answer(text: str) -> str | None:
    """The answer a model trained on these trajectories names at the end of its think ("... So the
    answer is: cyan."), whatever its answer tag says: a probe of perception apart from copying."""
    think = text.split(P.ANSWER_OPEN)[0]
    found = re.findall(r"answer is: (\w+(?: \w+)*)", think)  # the phrase's tail, as a model may drop the "So"
    return found[-1] if found else None


def _seen_in_overview(spec: VideoSpec, q: Question, times: list[float], events: list[int] | None = None) -> str:
    """What the overview frames show that bears on q, as the teacher would say it."""
    if not q.needs_event:
        hits = [t for t in times if spec.scene_at(t).colour == q.answer_text]
        shown = ", ".join(f"{t:.1f}" for t in hits[:6]) + (" and others" if len(hits) > 6 else "")
        return f"the frames at {shown} seconds show {article(q.answer_text)} background"
    parts = []
    for i in q.events if events is None else events:
        e = spec.events[i]
        t = next(t for t in times if e.visible_at(t))
        parts.append(f"the frame at {t:.1f} seconds shows {article(e.name)} at the {e.position}")
    return "; ".join(parts)


def _evidence_window(rng: np.random.Generator, s: float, e: float, duration: float, max_len: int = 16) -> tuple[int, int]:
    """An integer window of at most `max_len` seconds (1 fps, so no frame gap hides an event)
    that contains [s, e) with some random margin on each side."""
    lo, hi = math.floor(s), math.ceil(e)
    length = int(rng.integers(min(max_len, hi - lo + 2), max_len + 1))
    a = int(rng.integers(max(0, hi - length), lo + 1)) if hi - length <= lo else lo
    a = max(0, min(a, int(duration) - length))
    return a, min(int(duration), a + length)


CROP_POLICIES = ("evidence", "tile", "sweep")
SWEEP_LEN = 30  # seconds per window of the sweep policy: 16 frames, at most 2 s apart after snapping to 2 fps


def check_crop_policy(policy: str) -> None:
    if policy not in CROP_POLICIES:
        raise ValueError(f"crop_policy must be one of {', '.join(map(repr, CROP_POLICIES))}, got {policy!r}")


def tile_windows(duration: float, max_parallel: int = 5, max_len: int = 16) -> list[tuple[int, int]] | None:
    """Equal integer windows of at most `max_len` s covering [0, duration], or None when that
    takes more than `max_parallel` calls. A policy that depends only on the stated duration,
    so a small model can learn it (unlike windows placed on evidence it cannot see)."""
    n = max(1, math.ceil(duration / max_len))
    if n > max_parallel:
        return None
    edges = [round(i * duration / n) for i in range(n)] + [math.ceil(duration)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def sweep_edges(duration: float, length: int = SWEEP_LEN, min_tail: int = 2) -> list[tuple[int, int]]:
    """[0, length), [length, 2 length), ... the last window ending at the video's end: fixed
    edges (multiples of `length`), so they depend on nothing but the stated duration. A tail
    shorter than `min_tail` s joins the window before it (a 1-frame window says nothing; the
    joined window is at most length + min_tail - 1 s: 31 s, whose 16 frames are <= 2 s apart)."""
    if length < 1:
        raise ValueError(f"sweep length must be >= 1 s, got {length}")
    end = math.ceil(duration)
    edges = list(range(0, end, length)) + [end]
    if len(edges) > 2 and edges[-1] - edges[-2] < min_tail:
        del edges[-2]
    return list(zip(edges, edges[1:]))


def sweep_windows(duration: float, length: int = SWEEP_LEN, max_parallel: int = 5,
                  max_rounds: int = 2) -> list[list[tuple[int, int]]] | None:
    """The sweep policy's windows (`sweep_edges`) by round, `max_parallel` per round; None when
    that takes more than `max_rounds` rounds."""
    if max_parallel < 1 or max_rounds < 1:
        raise ValueError("need max_parallel and max_rounds >= 1")
    windows = sweep_edges(duration, length)
    rounds = [windows[i:i + max_parallel] for i in range(0, len(windows), max_parallel)]
    return rounds if len(rounds) <= max_rounds else None


def make_trajectory(spec: VideoSpec, q: Question, overview_times: list[float], crop_times: CropTimes,
                    rng: np.random.Generator, max_parallel: int = 5, crop_policy: str = "evidence",
                    tool_prior: float = 0.0, max_rounds: int = 1, sweep_len: int = SWEEP_LEN) -> Trajectory:
    """The oracle's episode for question q when the main agent sees `overview_times`.
    `crop_times(start, end)` gives the timestamps of the frames a crop returns (decoded from
    the real file by the caller), so each summary says only what its frames show.

    When the overview shows the evidence the oracle answers directly, or, with probability
    `tool_prior`, crops around that evidence to confirm it (no random number is drawn at
    tool_prior 0, so the trajectories of that setting are what they always were). `max_rounds`:
    tool rounds the sweep policy may use (the episode's max_turns - 1)."""
    k = len(overview_times)
    check_crop_policy(crop_policy)
    shown = evidence_visible(spec, q, overview_times)
    if shown and q.question_type != "tvg":
        if tool_prior > 0 and rng.random() < tool_prior:
            return _confirming(spec, q, overview_times, crop_times, rng, max_parallel, crop_policy, sweep_len)
        think = (f"In the overview {_seen_in_overview(spec, q, overview_times)}. That settles the question without "
                 f"looking closer. {_reasoned_conclusion(spec, q, _first_seen(spec, q, overview_times))}")
        return Trajectory(q.id, k, list(overview_times), True, think, answer=answer_text(q))
    if crop_policy == "sweep":
        return _sweeping(spec, q, overview_times, crop_times, max_parallel, max_rounds, sweep_len)

    seen = [i for i in q.events if any(spec.events[i].visible_at(t) for t in overview_times)]
    # grounding crops every event (one frame cannot give start and end); otherwise only the unseen ones
    to_crop = q.events if q.question_type == "tvg" else [i for i in q.events if i not in seen]
    tiles = tile_windows(spec.duration, max_parallel) if crop_policy == "tile" else None
    if tiles is not None:
        spans = [(spec.events[i].start, spec.events[i].end) for i in to_crop] or [tuple(q.evidence[0])]
        windows = [(a, b, not any(a < e and s < b for s, e in spans)) for a, b in tiles]
    else:
        windows = [(*_evidence_window(rng, spec.events[i].start, spec.events[i].end, spec.duration), False)
                   for i in to_crop[:max_parallel]]
    if not windows:  # a control the overview misses (K below the one the video was made for)
        a = int(q.evidence[0][0])
        windows = [(a, max(a + 1, int(min(q.evidence[0][1], a + 16))), False)]
    n_decoys = int(rng.choice(3, p=[0.6, 0.25, 0.15])) if tiles is None else 0
    for _ in range(min(n_decoys, max_parallel - len(windows))):
        for _try in range(20):
            length = int(rng.integers(8, 17))
            a = int(rng.integers(0, max(1, int(spec.duration) - length)))
            b = min(int(spec.duration), a + length)
            busy = [(x, y) for x, y, _ in windows] + [(spec.events[i].start, spec.events[i].end) for i in q.events]
            if b > a and all(b <= x or a >= y for x, y in busy):  # a decoy never holds the evidence
                windows.append((a, b, True))
                break
    windows.sort()
    calls = []
    for a, b, decoy in windows:
        times = crop_times(float(a), float(b))
        calls.append(OracleCall(float(a), float(b), times, describe_frames(spec, times), decoy))

    spans = ", ".join(f"{c.start:g}-{c.end:g}" for c in calls)
    gap = spec.duration / k
    if q.question_type == "tvg" and seen:
        think = (f"In the overview {_seen_in_overview(spec, q, overview_times)}, but frames {gap:.1f} seconds apart "
                 f"cannot tell when it starts and ends. I will look closer at {spans} seconds in parallel.")
    elif seen:
        think = (f"In the overview {_seen_in_overview(spec, q, overview_times, seen)}, but the rest of what the "
                 f"question asks about is not in any of the {k} frames ({gap:.1f} seconds apart), so it must fall "
                 f"between them. I will check {spans} seconds in parallel.")
    elif q.needs_event:
        think = (f"The {k} overview frames are {gap:.1f} seconds apart and none of them shows what the question asks "
                 f"about, so it must be a short moment between them. I will check {spans} seconds in parallel.")
    else:
        think = f"The overview frames do not show that part of the video. I will check {spans} seconds."
    relevant = [c for c in calls if not c.decoy] or calls
    report = " ".join(f"The crop of {c.start:g}-{c.end:g} seconds: {c.summary}" for c in relevant)
    others = [c for c in calls if c.decoy]
    if others:
        report += " " + " ".join(f"The crop of {c.start:g}-{c.end:g} seconds does not bear on the question." for c in others)
    if seen and q.question_type != "tvg":
        report = f"In the overview {_seen_in_overview(spec, q, overview_times, seen)}. " + report
    final = f"{report} {_reasoned_conclusion(spec, q, _first_seen(spec, q, overview_times, calls))}"
    return Trajectory(q.id, k, list(overview_times), False, think, calls, final, answer_text(q))


def _first_seen(spec: VideoSpec, q: Question, overview_times: list[float],
                calls: list[OracleCall] | None = None) -> dict[int, float]:
    """Event index -> the earliest frame time (overview or crop) that shows it, for q's events."""
    times = sorted(set(overview_times) | {t for c in calls or [] for t in c.frame_times})
    out = {}
    for i in q.events:
        hit = [t for t in times if spec.events[i].visible_at(t)]
        if hit:
            out[i] = hit[0]
    return out


def _reasoning(spec: VideoSpec, q: Question, when: dict[int, float]) -> str:
    """The step from what was seen to the answer of a multi-event question, said out loud (a tiny
    model copies a stated comparison more easily than it makes one silently); '' for the others."""
    ev = [spec.events[i] for i in q.events]
    if q.kind == "order_oe" and all(i in when for i in q.events):
        (ia, a), (ib, b) = sorted(zip(q.events, ev), key=lambda x: when[x[0]])
        return (f"The {a.shape} shows at {when[ia]:.1f} seconds and the {b.shape} at {when[ib]:.1f} seconds, so the "
                f"{a.shape} came first.")
    if q.kind == "count_oe":
        n = len(ev)
        return f"I count {n} {ev[0].colour} shape{'' if n == 1 else 's'} in all."
    if q.kind == "compare_oe":
        a, b = ev
        verb = "are" if a.colour == b.colour else "are not"
        return f"The {a.shape} is {a.colour} and the {b.shape} is {b.colour}, so they {verb} the same colour."
    return ""


def _reasoned_conclusion(spec: VideoSpec, q: Question, when: dict[int, float]) -> str:
    why = _reasoning(spec, q, when)
    return f"{why} {_conclusion(q)}" if why else _conclusion(q)


def _spans(calls: list[OracleCall]) -> str:
    return ", ".join(f"{c.start:g}-{c.end:g}" for c in calls)


def _call(spec: VideoSpec, q: Question, crop_times: CropTimes, a: float, b: float, round_: int = 0) -> OracleCall:
    """One crop: its real frame times, the summary of exactly those frames, and whether it holds
    none of the evidence (a decoy; for a control, no frame of the scene asked about)."""
    times = crop_times(float(a), float(b))
    if q.needs_event:
        holds = any(spec.events[i].visible_at(t) for i in q.events for t in times)
    else:
        holds = any(s <= t < e for s, e in q.evidence for t in times)
    return OracleCall(float(a), float(b), times, describe_frames(spec, times), not holds, round_)


def _crop_report(calls: list[OracleCall], others: str | None = None) -> str:
    """The summaries of the crops that hold evidence, then one sentence for the rest (`others`,
    or one that names their windows)."""
    relevant = [c for c in calls if not c.decoy]
    parts = [f"The crop of {c.start:g}-{c.end:g} seconds: {c.summary}" for c in relevant]
    rest = [c for c in calls if c.decoy]
    if rest:
        many = len(rest) > 1
        parts.append(others or (f"The crop{'s' if many else ''} of {_spans(rest)} seconds show{'' if many else 's'} "
                                "nothing the question asks about."))
    return " ".join(parts)


def _sweep_confirm_windows(spec: VideoSpec, q: Question, overview_times: list[float], crop_times: CropTimes,
                           sweep_len: int) -> list[tuple[int, int]]:
    """The sweep windows that hold the overview frames showing q's evidence (the first frame
    that shows each event, or the scene asked about): a rule a student can follow from what it
    saw. An event across a window edge that the window's own crop frames miss adds the
    neighbouring window that catches it."""
    edges = sweep_edges(spec.duration, sweep_len)

    def holding(t: float) -> tuple[int, int]:
        return next((w for w in edges if w[0] <= t < w[1]), edges[-1])

    if not q.needs_event:
        t = next((t for t in overview_times if evidence_visible(spec, q, [t])), overview_times[0])
        return [holding(t)]
    out: list[tuple[int, int]] = []
    for i in q.events:
        e = spec.events[i]
        t = next((t for t in overview_times if e.visible_at(t)), e.start)
        w = holding(t)
        out.append(w)
        if not any(e.visible_at(x) for x in crop_times(float(w[0]), float(w[1]))):
            out += [v for v in edges if v != w and v[0] < e.end and e.start < v[1]
                    and any(e.visible_at(x) for x in crop_times(float(v[0]), float(v[1])))][:1]
    return out


def _confirming(spec: VideoSpec, q: Question, overview_times: list[float], crop_times: CropTimes,
                rng: np.random.Generator, max_parallel: int, crop_policy: str, sweep_len: int) -> Trajectory:
    """The tool prior's episode: the overview already shows the evidence, and the oracle crops
    around it anyway (the windows of its crop policy that hold the evidence), then answers with
    what the crops confirmed. The paper's cold start calls tools in most episodes; an oracle that
    only crops when it must gives RL no tool use to lose at large K."""
    k = len(overview_times)
    if q.needs_event:
        spans = [(spec.events[i].start, spec.events[i].end) for i in q.events]
    else:  # the first overview frame that shows the scene asked about
        t = next((t for t in overview_times if evidence_visible(spec, q, [t])), overview_times[0])
        spans = [(t, t + 1e-6)]
    windows: list[tuple[float, float]] = []
    if crop_policy == "sweep":
        windows = _sweep_confirm_windows(spec, q, overview_times, crop_times, sweep_len)
    elif crop_policy == "tile":
        windows = list(tile_windows(spec.duration, max_parallel) or [])
    if not windows:  # the evidence policy, or a video too long to tile
        windows = [_evidence_window(rng, s, e, spec.duration) for s, e in spans]
    calls = [_call(spec, q, crop_times, a, b) for a, b in sorted(set(windows))[:max_parallel]]
    seen = _seen_in_overview(spec, q, overview_times)
    think = (f"In the overview {seen}. That would answer the question, but I will confirm it with a closer look at "
             f"{_spans(calls)} seconds{' in parallel' if len(calls) > 1 else ''}.")
    when = _first_seen(spec, q, overview_times)
    if q.needs_event:
        confirmed = all(any(spec.events[i].visible_at(t) for c in calls for t in c.frame_times) for i in q.events)
    else:
        confirmed = any(not c.decoy for c in calls)
    verdict = ("The crops confirm what the overview showed." if confirmed
               else "The crops add nothing to what the overview showed.")
    final = (f"In the overview {seen}. {_crop_report(calls)} {verdict} {_reasoned_conclusion(spec, q, when)}")
    return Trajectory(q.id, k, list(overview_times), False, think, calls, final, answer_text(q), redundant=True)


def _settled(q: Question, found: set[int]) -> bool:
    """Whether what has been seen answers q: every event it names (a count never is settled
    before the whole video has been seen, since a student cannot know that no other shape of the
    colour is left)."""
    if q.kind in ("count", "count_oe"):
        return False
    if not q.needs_event:
        return True
    return all(i in found for i in q.events)


def _sweeping(spec: VideoSpec, q: Question, overview_times: list[float], crop_times: CropTimes,
              max_parallel: int, max_rounds: int, sweep_len: int) -> Trajectory:
    """The sweep policy when the overview misses (some of) the evidence: round 1 crops the
    first five fixed windows; if that did not settle the question, round 2 crops the rest."""
    k = len(overview_times)
    rounds = sweep_windows(spec.duration, sweep_len, max_parallel, max_rounds)
    if rounds is None:
        raise ValueError(f"a {spec.duration:g} s video needs more than {max_rounds} rounds of {max_parallel} "
                         f"{sweep_len} s windows; shorten the videos or lengthen sweep_len")
    grounding = q.question_type == "tvg"
    seen = [i for i in q.events if any(spec.events[i].visible_at(t) for t in overview_times)]
    found = set() if grounding else set(seen)
    calls: list[OracleCall] = []
    round_thinks: list[str] = []
    for r, windows in enumerate(rounds):
        if r and _settled(q, found):
            break
        new = [_call(spec, q, crop_times, a, b, r) for a, b in windows]
        if r:
            round_thinks.append(_next_round_think(spec, q, [c for c in calls if c.round == r - 1], found, new))
        calls += new
        found |= {i for i in q.events for c in new if any(spec.events[i].visible_at(t) for t in c.frame_times)}

    first = [c for c in calls if c.round == 0]
    gap = spec.duration / k
    counting = q.kind in ("count", "count_oe")
    if seen and (grounding or counting):
        why = ("frames {:.1f} seconds apart cannot tell when it starts and ends" if grounding
               else "frames {:.1f} seconds apart can miss others").format(gap)
        think = f"In the overview {_seen_in_overview(spec, q, overview_times, seen)}, but {why}."
    elif seen:
        think = (f"In the overview {_seen_in_overview(spec, q, overview_times, seen)}, but the rest of what the "
                 f"question asks about is not in any of the {k} frames ({gap:.1f} seconds apart), so it must fall "
                 f"between them.")
    elif q.needs_event:
        think = (f"The {k} overview frames are {gap:.1f} seconds apart and none of them shows what the question asks "
                 f"about, so it must be a short moment between them.")
    else:
        think = "The overview frames do not show that part of the video."
    think += f" I will check the video from the start, {_spans(first)} seconds, in parallel."
    report = _crop_report(calls, "The other crops show nothing the question asks about.")
    if seen and not grounding:
        report = f"In the overview {_seen_in_overview(spec, q, overview_times, seen)}. " + report
    final = f"{report} {_reasoned_conclusion(spec, q, _first_seen(spec, q, overview_times, calls))}"
    return Trajectory(q.id, k, list(overview_times), False, think, calls, final, answer_text(q),
                      round_thinks=round_thinks)


def _next_round_think(spec: VideoSpec, q: Question, last: list[OracleCall], found: set[int],
                      new: list[OracleCall]) -> str:
    """The think of a later sweep round: what the last round's crops showed, what is missing,
    and the next windows."""
    if any(not c.decoy for c in last):
        report = _crop_report(last, "The other crops show nothing the question asks about.")
    else:
        report = "None of these crops shows anything the question asks about."
    if q.kind in ("count", "count_oe"):
        missing = "To count them all I must see the rest of the video too."
    elif found & set(q.events):
        missing = "Part of what the question asks about is still missing."
    else:
        missing = "What the question asks about is not in these windows."
    return f"{report} {missing} I will check {_spans(new)} seconds in parallel."


def _frames(times: list[float]) -> list[Frame]:
    # SFT rows name frame times only; the trainer decodes the pixels from the video at them
    return [Frame(image=None, timestamp=t) for t in times]  # type: ignore[arg-type]


def _row_messages(messages: list[Message]) -> list[dict]:
    out = []
    for m in messages:
        content: list[dict] = []
        for p in m.parts():
            if isinstance(p, ImagePart):
                content.append({"type": "frame", "time": float(p.timestamp)})
            elif content and content[-1]["type"] == "text":
                content[-1]["text"] += p.text
            else:
                content.append({"type": "text", "text": p.text})
        out.append({"role": m.role, "content": content})
    return out


def oracle_messages(traj: Trajectory, q: Question, duration: float,
                    config: EpisodeConfig | None = None) -> tuple[list[Message], list[list[Message]]]:
    """The main conversation and one conversation per sub-agent, as `run_episode` builds them:
    system + user (timestamped overview frames, then the question), assistant turns written
    after the forced think prefix, each round's tool responses in call order in one user turn
    (with the last-round answer instruction where the episode adds it: after the round that
    precedes the episode's last turn)."""
    cfg = config or EpisodeConfig()
    prefix = cfg.prefix
    msgs = build_main_messages(_frames(traj.overview_times), duration, q.question, q.question_type, cfg.mode,
                               cfg.max_parallel, prompts=cfg.prompts)
    body = f"{traj.think}{P.THINK_CLOSE}\n" if prefix else f"{P.THINK_OPEN}{traj.think}{P.THINK_CLOSE}\n"
    final_body = (f"{traj.final_think}{P.THINK_CLOSE}\n" if prefix
                  else f"{P.THINK_OPEN}{traj.final_think}{P.THINK_CLOSE}\n")
    # " magenta" after <answer>, not "magenta": with a space the answer is the same token the think
    # ended on ("So the answer is: magenta."), so a small model only has to copy it. Without, the
    # tiny BPE has a second token per word, and the tiny model copied the word into "answer is:"
    # (25/30 teacher-forced) but not into the tag (2/30). Parsers strip the space.
    answer = f"{P.ANSWER_OPEN} {traj.answer}{P.ANSWER_CLOSE}"
    subs: list[list[Message]] = []
    if traj.direct or not traj.calls:
        msgs.append(Message("assistant", prefix + body + answer))
        return msgs, subs
    rounds = [[c for c in traj.calls if c.round == r] for r in range(traj.n_rounds)]
    if any(not r for r in rounds) or len(traj.round_thinks) != len(rounds) - 1:
        raise ValueError(f"trajectory {traj.question_id}: every round needs calls, and every round after the first "
                         "its think")
    if cfg.max_turns < len(rounds) + 1:
        raise ValueError(f"a trajectory with {len(rounds)} tool round(s) needs max_turns >= {len(rounds) + 1}")
    thinks = [body] + [f"{t}{P.THINK_CLOSE}\n" if prefix else f"{P.THINK_OPEN}{t}{P.THINK_CLOSE}\n"
                       for t in traj.round_thinks]
    for r, calls in enumerate(rounds):
        msgs.append(Message("assistant", prefix + thinks[r] + "\n".join(P.format_tool_call(c.start, c.end)
                                                                        for c in calls)))
        msgs += build_tool_response_messages([tool_response_parts(c.summary) for c in calls], cfg.prompts)
        if r + 1 == cfg.max_turns - 1:  # the episode tells the agent to answer now after the round before its last turn
            msgs.append(build_final_message(q.question_type, cfg.prompts))
    msgs.append(Message("assistant", prefix + final_body + answer))
    for c in traj.calls:
        sub = build_subagent_messages(_frames(c.frame_times), c.start, c.end,
                                      q.question if cfg.subagent_sees_question else None, cfg.prompts)
        sub.append(Message("assistant", c.summary))
        subs.append(sub)
    return msgs, subs


def to_sft_rows(traj: Trajectory, q: Question, video: str, duration: float,
                config: EpisodeConfig | None = None) -> list[dict]:
    """One "main" row and one "sub" row per call: {"id", "kind", "video", "messages" (content
    parts {"type": "text", "text"} | {"type": "frame", "time"}), "question_type", "answer",
    "question_id", "k"}."""
    main, subs = oracle_messages(traj, q, duration, config)
    return conversation_rows(main, subs, traj, q, video)


def conversation_rows(main: list, subs: list[list], traj: Trajectory, q: Question, video: str,
                      layout: str = "") -> list[dict]:
    """The SFT rows of one episode's main conversation and its sub-agents' (ids tagged with `layout`)."""
    tag = f"-{layout}" if layout else ""
    base = {"video": video, "question_type": q.question_type, "answer": q.answer, "question_id": q.id, "k": traj.k}
    rows = [{"id": f"{q.id}-k{traj.k}{tag}-main", "kind": "main", "messages": _row_messages(main), **base}]
    for i, sub in enumerate(subs):
        rows.append({"id": f"{q.id}-k{traj.k}{tag}-sub{i}", "kind": "sub", "messages": _row_messages(sub), **base})
    return rows
