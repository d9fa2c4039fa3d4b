"""Oracle trajectories for cold-start SFT: a teacher that knows the annotations writes what a
good agent would: a think, 1-5 parallel crops over the evidence (sometimes a decoy), the
sub-agents' factual summaries, and the answer; or a direct answer when the overview already
shows the evidence. Rendered with the episode's own message builders."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from paravt import protocol as P
from paravt.agent import build_main_messages, build_subagent_messages
from paravt.backends.base import ImagePart, Message
from paravt.synth.questions import Question, describe_window
from paravt.synth.render import VideoSpec
from paravt.video import Frame, sample_times


@dataclass
class OracleCall:
    start: float
    end: float
    frame_times: list[float]
    summary: str


@dataclass
class Trajectory:
    question_id: str
    k: int
    overview_times: list[float]
    direct: bool
    think: str
    calls: list[OracleCall] = field(default_factory=list)
    final_think: str = ""
    answer: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _answer_text(q: Question) -> str:
    if q.question_type == "tvg":
        s, e = q.evidence[0]
        return f"{s:g} - {e:g}"
    return q.answer


def make_trajectory(spec: VideoSpec, q: Question, overview_times: list[float], rng: np.random.Generator,
                    max_parallel: int = 5) -> Trajectory:
    k = len(overview_times)
    shown = all(any(s <= t < e for t in overview_times) for s, e in q.evidence)
    if shown or not q.needs_event:
        where = ", ".join(f"{t:.1f}" for t in overview_times if any(s <= t < e for s, e in q.evidence)) or "the start"
        think = (f"The overview frames at {where} seconds already show what the question asks about, so I can "
                 "answer without looking closer.")
        return Trajectory(q.id, k, overview_times, True, think, answer=_answer_text(q))
    windows = []
    for s, e in q.evidence[: max_parallel]:
        pad_l, pad_r = rng.uniform(2, 10), rng.uniform(2, 10)
        windows.append((max(0.0, round(s - pad_l)), min(spec.duration, round(e + pad_r))))
    if len(windows) < max_parallel and rng.random() < 0.4:  # a decoy window elsewhere
        length = float(rng.uniform(10, 25))
        start = float(rng.uniform(0, max(1.0, spec.duration - length)))
        if all(start + length < a or start > b for a, b in windows):
            windows.insert(int(rng.integers(0, len(windows) + 1)), (round(start), round(min(spec.duration, start + length))))
    gaps = "; ".join(f"{a:.0f}-{b:.0f} s" for a, b in windows)
    think = (f"The {k} overview frames are {spec.duration / k:.1f} seconds apart and none shows what the question "
             f"asks about, so the event must be short. I will check these windows at the same time: {gaps}.")
    calls = []
    for a, b in windows:
        if b <= a:
            b = min(spec.duration, a + 1)
        times = sample_times(a, b, 1.0, 16, duration=spec.duration)
        calls.append(OracleCall(a, b, times, describe_window(spec, a, b)))
    useful = [c for c in calls if "appears" in c.summary]
    final = "The helpers report: " + " ".join(c.summary for c in useful or calls) + " That answers the question."
    return Trajectory(q.id, k, overview_times, False, think, calls, final, _answer_text(q))


def _frames(times: list[float]) -> list[Frame]:
    # placeholders: SFT rows name frame times; the trainer decodes the pixels from the video
    return [Frame(image=None, timestamp=t) for t in times]  # type: ignore[arg-type]


def _row_messages(messages: list[Message]) -> list[dict]:
    out = []
    for m in messages:
        content = []
        for p in m.parts():
            if isinstance(p, ImagePart):
                content.append({"type": "frame", "time": float(p.timestamp)})
            else:
                content.append({"type": "text", "text": p.text})
        out.append({"role": m.role, "content": content})
    return out


def to_sft_rows(traj: Trajectory, q: Question, video: str, duration: float, mode: str = "parallel",
                max_parallel: int = 5) -> list[dict]:
    """One main-agent row and one row per sub-agent, rendered exactly as the episode renders them."""
    msgs = build_main_messages(_frames(traj.overview_times), duration, q.question, q.question_type, mode, max_parallel)
    if traj.direct:
        msgs.append(Message("assistant", f"{P.THINK_PREFIX}{traj.think}{P.THINK_CLOSE}\n"
                                         f"{P.ANSWER_OPEN}{traj.answer}{P.ANSWER_CLOSE}"))
    else:
        calls_text = "\n".join(P.format_tool_call(c.start, c.end) for c in traj.calls)
        msgs.append(Message("assistant", f"{P.THINK_PREFIX}{traj.think}{P.THINK_CLOSE}\n{calls_text}"))
        msgs.append(Message("user", "".join(P.format_tool_response(c.summary) + "\n" for c in traj.calls)))
        msgs.append(Message("assistant", f"{P.THINK_PREFIX}{traj.final_think}{P.THINK_CLOSE}\n"
                                         f"{P.ANSWER_OPEN}{traj.answer}{P.ANSWER_CLOSE}"))
    base = {"video": video, "question_type": q.question_type, "answer": q.answer, "question_id": q.id}
    rows = [{"id": f"{q.id}-main", "kind": "main", "messages": _row_messages(msgs), **base}]
    for i, c in enumerate(traj.calls):
        sub = build_subagent_messages(_frames(c.frame_times), c.start, c.end, q.question)
        sub.append(Message("assistant", c.summary))
        rows.append({"id": f"{q.id}-sub{i}", "kind": "sub", "messages": _row_messages(sub), **base})
    return rows
