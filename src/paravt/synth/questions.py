"""SynthVT questions: every answer follows from the annotations, every question names the
events (and time spans) that answer it, and says whether it needs an event at all.

Event questions (needs_event=True) depend on short events that uniform overview frames
mostly miss at small K. Controls (needs_event=False) ask about the background, which any
overview shows; they measure the tool-necessity contrast."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from paravt.synth.render import BACKGROUNDS, COLOURS, SHAPES, Event, VideoSpec

LETTERS = "ABCD"
TYPE_WEIGHTS = {"mcq": 0.5, "tvg": 0.25, "oe": 0.25}  # mix of the event questions of a video
# kind_weights draws: the share of count_oe questions about a colour shown more than once, and of
# compare_oe questions about a same-colour pair, where the video has both sides (else "1" and "no"
# would be most answers)
RARER_ANSWER_SHARE = 0.75


@dataclass
class Question:
    id: str
    video_id: str
    kind: str  # one of EVENT_KINDS, or background | background_major (the controls)
    question_type: str  # mcq | tvg | oe
    question: str  # options included for mcq
    answer: str  # mcq: the letter; tvg: "[start, end]"; oe: short text
    answer_text: str = ""  # mcq: the correct option's text; otherwise the answer
    options: list[str] = field(default_factory=list)  # "A. red", ...
    events: list[int] = field(default_factory=list)  # indices into spec.events this answer depends on
    evidence: list[list[float]] = field(default_factory=list)  # [start, end] spans that answer it
    needs_event: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _options(rng: np.random.Generator, correct: str, pool: list[str]) -> tuple[list[str], str]:
    """Four options (the correct one and three others from the pool), shuffled by the rng."""
    distractors = [p for p in pool if p != correct]
    opts = [str(p) for p in rng.choice(distractors, size=3, replace=False)] + [correct]
    rng.shuffle(opts)
    return [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], LETTERS[opts.index(correct)]


def majority_background(spec: VideoSpec) -> str:
    """The background colour shown for the longest total time."""
    total: Counter = Counter()
    for s in spec.scenes:
        total[s.colour] += s.end - s.start
    return max(sorted(total), key=lambda c: total[c])


def _plurality(colours: list[str]) -> str | None:
    counts = Counter(colours).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


DEFAULT_KINDS = ("colour", "shape", "count", "order", "when", "name", "colour_oe", "shape_oe")
# Open-ended questions about two or more events, answered with one word (a shape, a number, yes or
# no): the hard preset's multi-window questions. Asked only when named in `kinds`, so the default
# mix (and every split written before they existed) stays as it was.
MULTI_KINDS = ("order_oe", "count_oe", "compare_oe")
EVENT_KINDS = DEFAULT_KINDS + MULTI_KINDS


def check_kinds(kinds: tuple[str, ...]) -> None:
    unknown = set(kinds) - set(EVENT_KINDS)
    if unknown:
        raise ValueError(f"unknown question kinds {sorted(unknown)}; known: {', '.join(EVENT_KINDS)}")


CONTROL_TYPES = ("mcq", "oe")


def check_control(control: str) -> None:
    if control not in CONTROL_TYPES:
        raise ValueError(f"control question type must be one of {list(CONTROL_TYPES)}, got {control!r}")


def check_kind_weights(weights: dict[str, float], kinds: tuple[str, ...]) -> None:
    """Weights name only kinds that are asked (`kinds`, or the default ones when empty)."""
    check_kinds(tuple(weights))
    if any(w < 0 for w in weights.values()) or (weights and not sum(weights.values()) > 0):
        raise ValueError(f"kind weights must be >= 0 with a positive sum, got {weights}")
    unasked = set(weights) - set(kinds or DEFAULT_KINDS)
    if unasked:
        raise ValueError(f"kind weights name kinds that are not asked: {sorted(unasked)}")


def make_questions(spec: VideoSpec, video_id: str, rng: np.random.Generator, per_video: int = 5,
                   overview_times: dict[int, list[float]] | None = None,
                   kinds: tuple[str, ...] = (), control: str = "mcq",
                   kind_weights: dict[str, float] | None = None, pair_gap: float = 0.0) -> list[Question]:
    """`per_video - 1` event questions (mcq / tvg / oe by TYPE_WEIGHTS) and one control, multiple
    choice or (`control="oe"`) open-ended: a tiny model reads a colour off frames long before it
    learns to look the colour up in an option list.

    `kind_weights` (kind -> weight) draws each question's kind first, then one of its candidates:
    without it a kind with many candidates (pairs of events) would crowd out the single-event
    ones. `pair_gap`: the two events of an order_oe / compare_oe question start at least this many
    seconds apart (the hard preset: more than a crop window, so the question needs two windows).

    `overview_times` (K -> real overview timestamps) lets the "most common background" control
    be asked only when every overview's frame majority shows it; otherwise the control asks
    for the background at the start, which the first overview frame shows at every K the
    video was made for (render.CONTROL_MIN_K). The draws from `rng` come in a fixed order (the
    pick, then its options, question by question, then the control), which fixed seeds depend on."""
    if per_video < 1:
        raise ValueError(f"per_video must be >= 1, got {per_video}")
    check_kinds(kinds)
    check_control(control)
    ev = spec.events
    cands = _candidates(ev, kinds, pair_gap)
    qs: list[Question] = []

    def add(kind, qtype, text, answer, *, options=(), answer_text="", idx=(), evidence=None, needs_event=True):
        idx = list(idx)
        spans = evidence if evidence is not None else [[ev[i].start, ev[i].end] for i in idx]
        qs.append(Question(id=f"{video_id}-q{len(qs)}", video_id=video_id, kind=kind, question_type=qtype,
                           question=text + ("\n" + "\n".join(options) if options else ""), answer=answer,
                           answer_text=answer_text or answer, options=list(options), events=idx,
                           evidence=[list(map(float, s)) for s in spans], needs_event=needs_event))

    for _ in range(per_video - 1):
        picked = _pick(rng, cands, kind_weights, ev) if kind_weights else _pick_by_type(rng, cands)
        if picked is None:
            break
        kind, idx = picked
        qtype, text, answer, extra = _event_question(rng, kind, [ev[i] for i in idx])
        add(kind, qtype, text, answer, idx=idx, **extra)
    kind, qtype, text, answer, extra = _control_question(spec, rng, overview_times, control)
    add(kind, qtype, text, answer, needs_event=False, **extra)
    return qs


def _candidates(ev: list[Event], kinds: tuple[str, ...], pair_gap: float) -> dict[str, list[tuple[str, tuple]]]:
    """Each question type's (kind, event indices) a video can be asked, restricted to `kinds`
    (default: DEFAULT_KINDS): a colour question only for a shape shown once, and so on."""

    def unique(attr: str, i: int) -> bool:
        return sum(getattr(x, attr) == getattr(ev[i], attr) for x in ev) == 1

    cands: dict[str, list[tuple[str, tuple]]] = {"mcq": [], "tvg": [], "oe": []}
    for i in range(len(ev)):
        if unique("shape", i):
            cands["mcq"].append(("colour", (i,)))
            cands["oe"].append(("colour_oe", (i,)))
        if unique("colour", i):
            cands["mcq"].append(("shape", (i,)))
            cands["oe"].append(("shape_oe", (i,)))
        if unique("position", i):
            cands["oe"].append(("name", (i,)))
        cands["tvg"].append(("when", (i,)))
    for colour in sorted({e.colour for e in ev}):
        cands["mcq"].append(("count", tuple(i for i, e in enumerate(ev) if e.colour == colour)))
    for i in range(len(ev)):
        for j in range(i + 1, len(ev)):
            cands["mcq"].append(("order", (i, j)))
    if set(kinds) & set(MULTI_KINDS):
        cands["oe"] += _multi_candidates(ev, kinds, pair_gap)
    allowed = kinds or DEFAULT_KINDS  # a smaller task: only these event-question kinds (the control is always asked)
    return {t: [c for c in cs if c[0] in allowed] for t, cs in cands.items()}


def _event_question(rng: np.random.Generator, kind: str, es: list[Event]) -> tuple[str, str, str, dict]:
    """(question type, text, answer, options/answer_text) of one question of `kind` about events `es`."""
    e = es[0]
    if kind == "colour":
        opts, ans = _options(rng, e.colour, list(COLOURS))
        return "mcq", f"What colour was the {e.shape} that appeared in the video?", ans, \
            {"options": opts, "answer_text": e.colour}
    if kind == "shape":
        opts, ans = _options(rng, e.shape, list(SHAPES))
        return "mcq", f"Which shape appeared in {e.colour}?", ans, {"options": opts, "answer_text": e.shape}
    if kind == "count":
        n = len(es)
        pool = [str(k) for k in range(1, 5)] if n <= 4 else [str(k) for k in range(n - 3, n + 1)]
        opts, ans = _options(rng, str(n), pool)
        return "mcq", f"How many {e.colour} shapes appeared in the video?", ans, {"options": opts, "answer_text": str(n)}
    if kind == "order":
        a, b = es
        pair = [f"the {a.name}", f"the {b.name}"]
        if rng.random() < 0.5:
            pair.reverse()
        first = f"the {min((a, b), key=lambda x: x.start).name}"
        opts, ans = _options(rng, first, [pair[0], pair[1], "both at the same time", "neither appeared"])
        return "mcq", f"Which appeared first, {pair[0]} or {pair[1]}?", ans, {"options": opts, "answer_text": first}
    if kind == "when":
        return "tvg", f"When does the {e.name} appear?", f"[{e.start:g}, {e.end:g}]", {}
    if kind == "name":
        return "oe", (f"What coloured shape appeared at the {e.position} of the frame? Answer with its colour "
                      "and shape."), e.name, {}
    if kind == "colour_oe":
        return "oe", f"What colour was the {e.shape}? Answer with one word.", e.colour, {}
    if kind == "shape_oe":
        return "oe", f"What shape appeared in {e.colour}? Answer with one word.", e.shape, {}
    if kind == "order_oe":
        shapes = [x.shape for x in es]
        if rng.random() < 0.5:
            shapes.reverse()
        first = min(es, key=lambda x: x.start).shape
        return "oe", f"Which shape appeared first, the {shapes[0]} or the {shapes[1]}? Answer with one word.", first, {}
    if kind == "count_oe":
        return "oe", f"How many {e.colour} shapes appeared in the video? Answer with a number.", str(len(es)), {}
    if kind == "compare_oe":
        a, b = es
        pair = [a.shape, b.shape]
        if rng.random() < 0.5:
            pair.reverse()
        return "oe", f"Were the {pair[0]} and the {pair[1]} the same colour? Answer yes or no.", \
            "yes" if a.colour == b.colour else "no", {}
    raise ValueError(f"unknown question kind {kind!r}")


def _control_question(spec: VideoSpec, rng: np.random.Generator, overview_times: dict[int, list[float]] | None,
                      control: str) -> tuple[str, str, str, str, dict]:
    """The control question (make_questions' docstring): (kind, type, text, answer, evidence/options)."""
    major = majority_background(spec)
    major_ok = overview_times is not None and len({s.colour for s in spec.scenes}) > 1 and all(
        _plurality([spec.scene_at(t).colour for t in times]) == major for times in overview_times.values())
    if major_ok and rng.random() < 0.5:
        kind, colour, text = "background_major", major, "Which background colour is shown for most of the video?"
        spans = [[s.start, s.end] for s in spec.scenes if s.colour == major]
    else:
        first = spec.scenes[0]
        kind, colour, text = "background", first.colour, "What is the background colour at the very start of the video?"
        spans = [[first.start, first.end]]
    if control == "oe":
        return kind, "oe", text + " Answer with the colour's name.", colour, {"evidence": spans}
    opts, ans = _options(rng, colour, list(BACKGROUNDS))
    return kind, "mcq", text, ans, {"options": opts, "answer_text": colour, "evidence": spans}


def _multi_candidates(ev: list[Event], kinds: tuple[str, ...], pair_gap: float) -> list[tuple[str, tuple]]:
    """Candidates of the multi-event kinds: pairs of events whose shapes are unique in the video
    (so "the circle" names one event) and that start `pair_gap` s apart; colours, for counting."""
    unique = [i for i in range(len(ev)) if sum(x.shape == ev[i].shape for x in ev) == 1]
    pairs = [(i, j) for i in unique for j in unique if i < j and ev[j].start - ev[i].start >= pair_gap]
    out: list[tuple[str, tuple]] = []
    if "order_oe" in kinds:
        out += [("order_oe", p) for p in pairs]
    if "compare_oe" in kinds:
        out += [("compare_oe", p) for p in pairs]
    if "count_oe" in kinds:
        for colour in sorted({e.colour for e in ev}):
            out.append(("count_oe", tuple(i for i, e in enumerate(ev) if e.colour == colour)))
    return out


def _pick_by_type(rng: np.random.Generator, cands: dict[str, list]) -> tuple[str, tuple] | None:
    """The legacy draw: a question type by TYPE_WEIGHTS, then any candidate of that type."""
    types = [t for t in TYPE_WEIGHTS if cands[t]]
    if not types:
        return None
    w = np.array([TYPE_WEIGHTS[t] for t in types])
    qtype = types[int(rng.choice(len(types), p=w / w.sum()))]
    return cands[qtype].pop(int(rng.integers(len(cands[qtype]))))


def _pick(rng: np.random.Generator, cands: dict[str, list], weights: dict[str, float],
          ev: list[Event]) -> tuple[str, tuple] | None:
    """A kind by `weights` among the kinds with candidates left, then one of its candidates (for
    count_oe and compare_oe, from the rarer answer side with probability RARER_ANSWER_SHARE)."""
    pool = [c for cs in cands.values() for c in cs]
    kinds = [k for k in weights if weights[k] > 0 and any(c[0] == k for c in pool)]
    if not kinds:
        return None
    w = np.array([weights[k] for k in kinds], float)
    kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
    mine = [c for c in pool if c[0] == kind]
    if kind in ("count_oe", "compare_oe"):
        special = [c for c in mine if _rarer_answer(c, ev)]
        if special and len(special) < len(mine):
            prefer = rng.random() < RARER_ANSWER_SHARE
            mine = [c for c in mine if (c in special) == prefer]
    choice = mine[int(rng.integers(len(mine)))]
    for cs in cands.values():
        if choice in cs:
            cs.remove(choice)
            break
    return choice


def _rarer_answer(cand: tuple[str, tuple], ev: list[Event]) -> bool:
    """The candidate is on the rarer answer side: several events (count_oe), or the same colour
    (compare_oe)."""
    kind, idx = cand
    if kind == "count_oe":
        return len(idx) > 1
    return ev[idx[0]].colour == ev[idx[1]].colour


def evidence_visible(spec: VideoSpec, q: Question, times: list[float]) -> bool:
    """The frames at `times` show what answers q: every event it depends on appears in at
    least one of them (controls: one frame of each evidence span, i.e. of the scene asked about;
    for the majority background, the frames' own majority)."""
    if q.kind == "background_major":
        return _plurality([spec.scene_at(t).colour for t in times]) == q.answer_text
    if q.needs_event:
        return all(any(spec.events[i].visible_at(t) for t in times) for i in q.events)
    return all(any(s <= t < e for t in times) for s, e in q.evidence)


def predicted_visibility(spec: VideoSpec, q: Question, k: int) -> float:
    """The dial's rule of thumb: an event of duration d is in K uniform frames of an L-second
    video with probability about min(1, K d / L); all of a question's events, their product."""
    p = 1.0
    for i in q.events:
        e = spec.events[i]
        p *= min(1.0, k * (e.end - e.start) / spec.duration)
    return p


def visible_events(spec: VideoSpec, times: list[float]) -> list[Event]:
    """Events shown by at least one of the frames at `times`."""
    return [e for e in spec.events if any(e.visible_at(t) for t in times)]


def article(phrase: str) -> str:
    """'a red circle', 'an orange star'."""
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def _span(times: list[float]) -> str:
    a, b = min(times), max(times)
    return f"{a:.1f} seconds" if a == b else f"{a:.1f}-{b:.1f} seconds"


def describe_frames(spec: VideoSpec, times: list[float]) -> str:
    """The factual summary a perfect sub-agent gives of frames at `times`: only what those
    frames show (an event between two sampled frames is not reported), with the times of the
    frames it is seen in, and the background colours in order."""
    times = sorted(times)
    parts = []
    for e in spec.events:
        seen = [t for t in times if e.visible_at(t)]
        if seen:
            parts.append(f"At {_span(seen)} {article(e.name)} appears at the {e.position}.")
    if not parts:
        parts.append(f"No shapes appear in the frames from {times[0]:.1f} to {times[-1]:.1f} seconds.")
    bgs: list[tuple[str, float]] = []
    for t in times:
        c = spec.scene_at(t).colour
        if not bgs or bgs[-1][0] != c:
            bgs.append((c, t))
    bg = bgs[0][0] + "".join(f", then {c} from {t:.1f} seconds" for c, t in bgs[1:])
    return " ".join(parts) + f" Background: {bg}."
