"""Oracle trajectories for cold-start SFT.

A teacher that knows the annotations writes what a good agent does: when the overview
frames (the real timestamps, for the K of the episode) already show the evidence, a short
think and the answer; otherwise a think, 1-5 parallel crop_video calls over windows that
cover the evidence (sometimes decoys), one sub-agent conversation per call (the crop's real
frame times -> a factual summary of only what those frames show), and a final think and
answer. Grounding questions crop around the event even when the overview shows it, since one
frame cannot tell when it starts and ends.

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
from paravt.backends.base import ImagePart, Message, TextPart
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
    decoy: bool = False


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

    def to_dict(self) -> dict:
        return asdict(self)

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


CROP_POLICIES = ("evidence", "tile")


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


def make_trajectory(spec: VideoSpec, q: Question, overview_times: list[float], crop_times: CropTimes,
                    rng: np.random.Generator, max_parallel: int = 5, crop_policy: str = "evidence") -> Trajectory:
    """The oracle's episode for question q when the main agent sees `overview_times`.
    `crop_times(start, end)` gives the timestamps of the frames a crop returns (decoded from
    the real file by the caller), so each summary says only what its frames show."""
    k = len(overview_times)
    shown = evidence_visible(spec, q, overview_times)
    if shown and q.question_type != "tvg":
        think = (f"In the overview {_seen_in_overview(spec, q, overview_times)}. That settles the question without "
                 f"looking closer. {_conclusion(q)}")
        return Trajectory(q.id, k, list(overview_times), True, think, answer=answer_text(q))

    seen = [i for i in q.events if any(spec.events[i].visible_at(t) for t in overview_times)]
    # grounding crops every event (one frame cannot give start and end); otherwise only the unseen ones
    to_crop = q.events if q.question_type == "tvg" else [i for i in q.events if i not in seen]
    check_crop_policy(crop_policy)
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
    final = f"{report} {_conclusion(q)}"
    return Trajectory(q.id, k, list(overview_times), False, think, calls, final, answer_text(q))


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
    after the forced think prefix, tool responses in call order in one user turn (with the
    last-round answer instruction where the episode adds it)."""
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
    if cfg.max_turns < 2:
        raise ValueError("a trajectory with tool calls needs max_turns >= 2")
    msgs.append(Message("assistant", prefix + body + "\n".join(P.format_tool_call(c.start, c.end) for c in traj.calls)))
    msgs += build_tool_response_messages([tool_response_parts(c.summary) for c in traj.calls], cfg.prompts)
    if cfg.max_turns == 2:  # the episode tells the agent to answer now after the round before its last turn
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
    base = {"video": video, "question_type": q.question_type, "answer": q.answer, "question_id": q.id, "k": traj.k}
    rows = [{"id": f"{q.id}-k{traj.k}-main", "kind": "main", "messages": _row_messages(main), **base}]
    for i, sub in enumerate(subs):
        rows.append({"id": f"{q.id}-k{traj.k}-sub{i}", "kind": "sub", "messages": _row_messages(sub), **base})
    return rows
