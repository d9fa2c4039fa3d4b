"""SynthVT questions: each answer follows from the annotations, each names its evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from paravt.synth.render import BACKGROUNDS, COLOURS, SHAPES, Event, VideoSpec

LETTERS = "ABCD"


@dataclass
class Question:
    id: str
    video_id: str
    kind: str  # colour | shape | count | order | when | name | background
    question_type: str  # mcq | tvg | oe
    question: str  # options included for mcq
    answer: str
    options: list[str] = field(default_factory=list)
    evidence: list[list[float]] = field(default_factory=list)  # [start, end] of what answers it
    needs_event: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _mcq(rng, correct: str, pool: list[str]) -> tuple[list[str], str]:
    distractors = [p for p in pool if p != correct]
    picks = list(rng.choice(distractors, size=3, replace=False))
    opts = picks + [correct]
    rng.shuffle(opts)
    return [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], LETTERS[opts.index(correct)]


def _with_options(q: str, options: list[str]) -> str:
    return q + "\n" + "\n".join(options)


def make_questions(spec: VideoSpec, video_id: str, rng: np.random.Generator, per_video: int = 5) -> list[Question]:
    """A mix of event questions (mcq / tvg / oe) and one overview-answerable control."""
    qs: list[Question] = []
    events = spec.events

    def add(kind, qtype, text, answer, options=(), evidence=(), needs_event=True):
        qs.append(Question(id=f"{video_id}-q{len(qs)}", video_id=video_id, kind=kind, question_type=qtype,
                           question=_with_options(text, list(options)) if options else text, answer=answer,
                           options=list(options), evidence=[list(e) for e in evidence], needs_event=needs_event))

    shapes_once = [e for e in events if sum(x.shape == e.shape for x in events) == 1]
    colours_once = [e for e in events if sum(x.colour == e.colour for x in events) == 1]
    candidates = []
    for e in shapes_once:
        candidates.append(("colour", e))
    for e in colours_once:
        candidates.append(("shape", e))
    for e in events:
        candidates.append(("when", e))
        if sum(x.position == e.position for x in events) == 1:
            candidates.append(("name", e))
    if len(events) >= 2:
        candidates.append(("order", None))
    candidates.append(("count", None))
    order = rng.permutation(len(candidates))
    for i in order[: max(1, per_video - 1)]:
        kind, e = candidates[int(i)]
        if kind == "colour":
            opts, ans = _mcq(rng, e.colour, list(COLOURS))
            add(kind, "mcq", f"What colour was the {e.shape} that appeared in the video?", ans, opts, [(e.start, e.end)])
        elif kind == "shape":
            opts, ans = _mcq(rng, e.shape, list(SHAPES))
            add(kind, "mcq", f"Which shape appeared in {e.colour}?", ans, opts, [(e.start, e.end)])
        elif kind == "when":
            add(kind, "tvg", f"When does the {e.colour} {e.shape} appear?", f"[{e.start:g}, {e.end:g}]",
                evidence=[(e.start, e.end)])
        elif kind == "name":
            add(kind, "oe", f"What coloured shape appeared at the {e.position} of the frame? Answer with its colour "
                "and shape.", f"{e.colour} {e.shape}", evidence=[(e.start, e.end)])
        elif kind == "order":
            a, b = (events[j] for j in sorted(rng.choice(len(events), size=2, replace=False)))
            first, second = (a, b) if a.start < b.start else (b, a)
            names = [f"the {a.colour} {a.shape}", f"the {b.colour} {b.shape}"]
            if rng.random() < 0.5:
                names.reverse()
            opts = [f"A. {names[0]}", f"B. {names[1]}"]
            ans = "A" if names[0] == f"the {first.colour} {first.shape}" else "B"
            add(kind, "mcq", "Which appeared first?", ans, opts, [(a.start, a.end), (b.start, b.end)])
        elif kind == "count":
            colour = str(rng.choice(sorted({e.colour for e in events}) if rng.random() < 0.8 else list(COLOURS)))
            n = sum(e.colour == colour for e in events)
            pool = ["0", "1", "2", "3"]
            opts = [f"{LETTERS[i]}. {p}" for i, p in enumerate(pool)]
            add(kind, "mcq", f"How many {colour} shapes appeared in the video?", LETTERS[min(n, 3)], opts,
                [(e.start, e.end) for e in events if e.colour == colour] or [(0.0, spec.duration)])
    first = spec.scenes[0]
    opts, ans = _mcq(rng, first.colour, list(BACKGROUNDS))
    add("background", "mcq", "What is the background colour at the very start of the video?", ans, opts,
        [(first.start, first.end)], needs_event=False)
    return qs


def describe_window(spec: VideoSpec, start: float, end: float) -> str:
    """The factual summary a perfect sub-agent gives of [start, end] (oracle teacher text)."""
    seen = [e for e in spec.events if e.start < end and start < e.end]
    scenes = [s.colour for s in spec.scenes if s.start < end and start < s.end]
    bg = " then ".join(dict.fromkeys(scenes)) or spec.scene_at(start).colour
    if not seen:
        return f"No shapes appear between {start:.1f} and {end:.1f} seconds. Background: {bg}."
    parts = [f"At {max(e.start, start):.1f}-{min(e.end, end):.1f} seconds a {e.colour} {e.shape} appears at the "
             f"{e.position}." for e in seen]
    return " ".join(parts) + f" Background: {bg}."


def visible_events(spec: VideoSpec, times: list[float]) -> list[Event]:
    return [e for e in spec.events if any(e.start <= t < e.end for t in times)]
