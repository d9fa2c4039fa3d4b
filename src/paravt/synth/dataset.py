"""Writing a SynthVT split: MP4 videos, ParaVT-Parquet RL rows, oracle SFT rows, structured
oracle trajectories, annotations, and the visibility table (the tool-necessity dial).

Layout of a split directory:
  videos/<split>_<index>.mp4   H.264 videos
  rl.parquet                   ParaVT-Parquet RL rows (paravt.data.load_rl_rows reads them)
  sft.parquet                  oracle rows, "main" and "sub" (messages as a JSON string)
  oracle.jsonl                 the trajectories as structured data (oracle.Trajectory)
  annotations.jsonl            one video per line: scenes, events, visible events per K
  visibility.json              the dial, as printed by `paravt synth`
  captions.parquet             with --captions N: N short frame-description rows per video (synth.captions)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from paravt.synth.oracle import SWEEP_LEN, check_crop_policy, make_trajectory, sweep_windows, to_sft_rows
from paravt.synth.prior import to_prior_rows
from paravt.synth.questions import (check_control, check_kind_weights, check_kinds, evidence_visible, make_questions,
                                    predicted_visibility, visible_events)
from paravt.synth.render import VideoSpec, check_frame, make_spec, spec_fingerprint, video_fingerprint, write_video

SPLITS = {"train": 1, "test": 2, "val": 3}  # each split draws from its own seed stream
K_VALUES = (4, 8, 16, 32, 64)  # the overview budgets of nFrames gating
# SynthVT-mini: the shrunk task the shipped tiny model learns on 2 CPU cores. Videos short
# enough that five 16 s crops tile them (so where to look is learnable from the stated
# duration), 1-4 s events (K=4 sees ~15% of them, K=64 nearly all), one event and one question
# kind. (A first version with 1-2 events and colour+shape questions did not learn to see: see
# docs/tiny_model.md.)
MINI_TASK = dict(min_len=60.0, max_len=80.0, event_min=1.0, event_max=4.0, n_events=(1, 1),
                 kinds=("colour_oe",), crop_policy="tile", control="oe")
# SynthVT-hard: a task on which RL has room to act and the Tool Prior Paradox can show.
# - 210-300 s videos with 2-2.5 s events: at K=64 the overview frames are 3.3-4.7 s apart and show
#   a single event about 60 % of the time, all the events of a two-event question about 35 %
#   (K=4: 1-3 %), so tools pay off at every K.
# - 3-5 events a video; each question names one or a few of them, the rest are distractors that
#   the crops report too. Colours repeat half the time, so counts above one and same-colour pairs
#   are common.
# - Questions answered with one word (a colour, a shape, a number, yes or no): the colour of one
#   shape, and three kinds that need two or more windows: which of two shapes came first, how many
#   shapes of a colour, whether two shapes had the same colour (the two named events start >= 32 s
#   apart, more than a sweep window, so no crop of the sweep shows both). Open-ended controls, as
#   in mini.
# - The "sweep" crop policy: windows 0-30, 30-60, ... five per round, a second round when the
#   first did not settle the question; 16 frames per 30 s window are at most 2 s apart, so every
#   event is seen by a crop, and where to look depends only on the stated duration.
# - tool_prior 0.85: when the overview already shows the evidence, the oracle still crops (around
#   it) 85 % of the time, so the cold start calls tools in most episodes at every K.
HARD_TASK = dict(min_len=210.0, max_len=300.0, event_min=2.0, event_max=2.5, n_events=(3, 5), colour_repeat=0.5,
                 kinds=("colour_oe", "order_oe", "count_oe", "compare_oe"),
                 kind_weights={"colour_oe": 0.35, "order_oe": 0.25, "count_oe": 0.15, "compare_oe": 0.25},
                 pair_gap=32.0, crop_policy="sweep", sweep_len=SWEEP_LEN, control="oe", tool_prior=0.85)
# SynthVT-paradox: the mini task with the two preconditions of the Tool Prior Paradox (docs/paradox.md).
# - Where the tools pay: K = 64 shows the 1-4 s event in nearly every video, K = 4 in few, so the
#   largest K answers most questions without a crop and small K needs them.
# - tool_prior 0.9: the cold start's oracle crops (all five tiles) even where the overview shows the
#   event, as the paper's cold start calls tools at every K (κ 2.50).
# - prior.parquet: the same episodes in another tool layout (synth.prior: no think, one call a turn,
#   untagged answers), to pretrain the base model whose tool habit competes with the cold start's.
PARADOX_TASK = dict(MINI_TASK, tool_prior=0.9, prior_rows=True)
# SynthVT-paradox-skip: the paradox task whose oracle answers directly (think, then <answer>, no call) in
# 30 % of the episodes whose overview shows the event (tool prior 0.7 at K = 16, 32, 64, where the event
# shows often): the second cold start of docs/paradox.md. At 0.9 a direct answer at K = 64 is a path
# the cold start sees in ~2 % of its rows, and its skips come out badly formed; the Tool Necessity Gap
# needs a skip as well trained as a call. Still 2-3 calls an episode at K = 64 (kappa >= 1.5 before RL).
# No prior.parquet: the base model is the paradox preset's.
PARADOX_SKIP_TASK = dict(MINI_TASK, tool_prior=0.9, tool_prior_at_k={16: 0.7, 32: 0.7, 64: 0.7})
PRESETS = {"mini": MINI_TASK, "hard": HARD_TASK, "paradox": PARADOX_TASK, "paradox-skip": PARADOX_SKIP_TASK}


@dataclass
class SynthConfig:
    n: int = 500  # questions
    seed: int = 0
    split: str = "train"
    min_len: float = 60.0
    max_len: float = 600.0
    fps: int = 2
    size: int = 64
    per_video: int = 5  # questions per video (one of them a control)
    event_min: float = 1.0
    event_max: float = 8.0
    n_events: tuple[int, int] = (2, 5)  # events per video, inclusive range
    textures: bool = True
    oracle_k: tuple[int, ...] = K_VALUES  # overview budgets the oracle trajectories are written for (one drawn per question)
    kinds: tuple[str, ...] = ()  # event-question kinds to ask (questions.EVENT_KINDS); empty: all
    crop_policy: str = "evidence"  # oracle crop windows: on the evidence (+ decoys), "tile" short videos, or "sweep"
    control: str = "mcq"  # the background control: multiple choice, or open-ended ("oe")
    tool_prior: float = 0.0  # chance the oracle crops (to confirm) when the overview already shows the evidence
    # the same chance for the episodes written for one K, overriding tool_prior there ({64: 0.6}): the
    # share of direct answers where the overview suffices, 1 - p, set where it matters
    tool_prior_at_k: dict[int, float] = field(default_factory=dict)
    kind_weights: dict[str, float] = field(default_factory=dict)  # draw each question's kind by these; empty: by type
    pair_gap: float = 0.0  # seconds between the starts of the two events of an order_oe / compare_oe question
    colour_repeat: float = 0.3  # chance an event takes an earlier event's colour (counts above one)
    sweep_len: int = SWEEP_LEN  # window length of the sweep crop policy
    prior_rows: bool = False  # also write prior.parquet: the oracle's episodes in the tool-prior layout (synth.prior)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0 < self.min_len <= self.max_len:
            raise ValueError(f"need 0 < min_len <= max_len, got {self.min_len}, {self.max_len}")
        if not 0 < self.event_min <= self.event_max:
            raise ValueError(f"need 0 < event_min <= event_max, got {self.event_min}, {self.event_max}")
        if self.max_len < self.event_max + 4:
            raise ValueError("videos must be longer than the longest event plus 4 s")
        if self.per_video < 1:
            raise ValueError(f"per_video must be >= 1, got {self.per_video}")
        check_frame(self.size, self.fps)
        if not 1 <= self.n_events[0] <= self.n_events[1]:
            raise ValueError(f"need 1 <= n_events[0] <= n_events[1], got {self.n_events}")
        self.oracle_k = tuple(int(k) for k in self.oracle_k)
        self.kinds = tuple(self.kinds)
        check_kinds(self.kinds)
        check_crop_policy(self.crop_policy)
        check_control(self.control)
        self.kind_weights = {str(k): float(v) for k, v in dict(self.kind_weights).items()}
        check_kind_weights(self.kind_weights, self.kinds)
        if not 0 <= self.tool_prior <= 1:
            raise ValueError(f"tool_prior must be in [0, 1], got {self.tool_prior}")
        self.tool_prior_at_k = {int(k): float(v) for k, v in dict(self.tool_prior_at_k).items()}
        for k, v in self.tool_prior_at_k.items():
            if k < 1 or not 0 <= v <= 1:
                raise ValueError(f"tool_prior_at_k needs K >= 1 and a chance in [0, 1], got {k}: {v}")
        if not 0 <= self.colour_repeat <= 1:
            raise ValueError(f"colour_repeat must be in [0, 1], got {self.colour_repeat}")
        if self.crop_policy == "sweep":
            from paravt.agent import EpisodeConfig

            ep = EpisodeConfig()
            if sweep_windows(self.max_len, self.sweep_len, ep.max_parallel, ep.max_turns - 1) is None:
                raise ValueError(f"the sweep policy covers at most {ep.max_parallel * (ep.max_turns - 1)} windows of "
                                 f"{self.sweep_len} s; max_len {self.max_len:g} s is longer")
        if not self.oracle_k or min(self.oracle_k) < 1:
            raise ValueError(f"oracle_k must be a non-empty list of positive frame counts, got {self.oracle_k}")


@dataclass
class SplitSummary:
    """What `build_split` measured. Fractions are over questions, by K."""

    n_videos: int
    n_questions: int
    n_event_questions: int
    visible: dict[int, float]  # event questions whose answer-bearing events all show in the real overview
    predicted: dict[int, float]  # mean of the rule of thumb min(1, K d / L)
    control_visible: dict[int, float]  # controls whose evidence shows in the real overview
    question_types: dict[str, int] = field(default_factory=dict)
    question_kinds: dict[str, int] = field(default_factory=dict)
    oracle_direct: float = 0.0  # share of oracle episodes that answer from the overview
    oracle_mean_calls: float = 0.0  # crop calls per oracle episode that calls tools
    sft_rows: dict[str, int] = field(default_factory=dict)
    # by the K each oracle episode was written for: share answered from the overview, and crop
    # calls per episode (all episodes: the cold start's kappa), and how many episodes had that K
    oracle_direct_at_k: dict[int, float] = field(default_factory=dict)
    oracle_calls_at_k: dict[int, float] = field(default_factory=dict)
    oracle_episodes_at_k: dict[int, int] = field(default_factory=dict)
    oracle_redundant: float = 0.0  # share of episodes that crop although the overview showed the evidence
    oracle_two_rounds: float = 0.0  # share of episodes with two or more tool rounds

    def to_dict(self) -> dict:
        return asdict(self)


def video_seed(seed: int, split: str, index: int) -> int:
    """Independent streams per (seed, split, index): train and test never share a video."""
    return int(np.random.SeedSequence([seed, SPLITS[split], index]).generate_state(1)[0])


def _streams(vseed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Question and oracle generators, independent of the spec's stream and of each other."""
    q, o = np.random.SeedSequence(vseed).spawn(2)
    return np.random.default_rng(q), np.random.default_rng(o)


# ~100 lines: one pass over the videos fills every table and counter of the split; split into helpers,
# the dozen counters would travel between them.
@dataclass
class _Tables:
    """What a split's questions add up to, as they are made: the rows of its tables and the counts
    its visibility table is computed from."""

    rl_rows: list = field(default_factory=list)
    sft_rows: list = field(default_factory=list)
    prior_rows: list = field(default_factory=list)
    trajectories: list = field(default_factory=list)
    annotations: list = field(default_factory=list)
    n_q: int = 0
    n_event: int = 0
    vis: dict = field(default_factory=lambda: {k: 0 for k in K_VALUES})  # event questions the overview shows
    pred: dict = field(default_factory=lambda: {k: 0.0 for k in K_VALUES})
    ctrl: dict = field(default_factory=lambda: {k: [0, 0] for k in K_VALUES})  # controls: shown, all
    types: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)


def build_split(out: str | Path, cfg: SynthConfig, progress=None) -> SplitSummary:
    """Write (or finish writing) a split under `out`. Resumable: a video already on disk that
    opens and matches its spec is kept; every table is rewritten (it is deterministic)."""
    from paravt.video import VideoReader

    out = Path(out)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    t = _Tables()
    task = progress.add_task(f"SynthVT {cfg.split}", total=cfg.n) if progress is not None else None
    i = 0
    while t.n_q < cfg.n:
        vseed = video_seed(cfg.seed, cfg.split, i)
        vid = f"{cfg.split}_{i:05d}"
        spec = make_spec(vseed, min_len=cfg.min_len, max_len=cfg.max_len, fps=cfg.fps, size=cfg.size,
                         n_events=cfg.n_events, event_len=(cfg.event_min, cfg.event_max), textures=cfg.textures,
                         colour_repeat=cfg.colour_repeat)
        rel = f"videos/{vid}.mp4"
        reader = _valid(out / rel, spec)
        if reader is None:  # missing, broken, or made with other settings: (re)write it
            write_video(spec, out / rel)
            reader = VideoReader(out / rel)
        try:
            _add_video(t, cfg, spec, vid, rel, reader, vseed)
        finally:
            reader.close()
        if progress is not None:
            progress.update(task, completed=t.n_q)
        i += 1
    _write_tables(out, t, cfg.prior_rows)
    summary = _summary(t, n_videos=i, prior_rows=cfg.prior_rows)
    (out / "visibility.json").write_text(json.dumps({"split": cfg.split, **summary.to_dict()}, indent=1) + "\n")
    return summary


def _add_video(t: _Tables, cfg: SynthConfig, spec: VideoSpec, vid: str, rel: str, reader, vseed: int) -> None:
    """One video's questions (as many as the split still needs), their rows and trajectories, into `t`."""
    from paravt.agent import EpisodeConfig

    ep = EpisodeConfig()  # the sub-agents' frame sampling, as the episode crops
    q_rng, o_rng = _streams(vseed)
    ks = sorted(set(K_VALUES) | set(cfg.oracle_k))
    overviews = {k: [f.timestamp for f in fs] for k, fs in reader.overviews(ks).items()}  # real decoded timestamps
    qs = make_questions(spec, vid, q_rng, cfg.per_video, {k: overviews[k] for k in K_VALUES}, cfg.kinds,
                        cfg.control, cfg.kind_weights or None, cfg.pair_gap)
    qs = qs[: cfg.n - t.n_q]

    def crop_times(a: float, b: float) -> list[float]:
        return [f.timestamp for f in reader.crop(a, b, fps=ep.sub_fps, max_frames=ep.sub_max_frames)]

    for q in qs:
        seen = {k: evidence_visible(spec, q, overviews[k]) for k in K_VALUES}
        if q.needs_event:
            t.n_event += 1
            for k in K_VALUES:
                t.vis[k] += seen[k]
                t.pred[k] += predicted_visibility(spec, q, k)
        else:
            for k in K_VALUES:
                t.ctrl[k][0] += seen[k]
                t.ctrl[k][1] += 1
        t.types[q.question_type] = t.types.get(q.question_type, 0) + 1
        t.kinds[q.kind] = t.kinds.get(q.kind, 0) + 1
        extra = {"id": q.id, "answer": q.answer, "question_type": q.question_type, "kind": q.kind,
                 "answer_text": q.answer_text, "options": q.options, "events": q.events,
                 "evidence": q.evidence, "needs_event": q.needs_event, "video_id": vid,
                 "duration": spec.duration, "split": cfg.split,
                 "overview_visible": {str(k): bool(v) for k, v in seen.items()}}
        t.rl_rows.append({"id": q.id, "prompt": [{"role": "user", "content": "<video>\n" + q.question}],
                          "videos": [{"video": rel}], "extra_info": json.dumps(extra, sort_keys=True)})
        k = int(cfg.oracle_k[int(o_rng.integers(len(cfg.oracle_k)))])
        traj = make_trajectory(spec, q, overviews[k], crop_times, o_rng, ep.max_parallel, cfg.crop_policy,
                               cfg.tool_prior_at_k.get(k, cfg.tool_prior), ep.max_turns - 1, cfg.sweep_len)
        t.trajectories.append({"video": rel, **traj.to_dict()})
        t.sft_rows += to_sft_rows(traj, q, rel, spec.duration, ep)
        if cfg.prior_rows:
            t.prior_rows += to_prior_rows(traj, q, rel, spec.duration, ep)
    t.n_q += len(qs)
    t.annotations.append({"video_id": vid, "video": rel, **spec.to_dict(),
                          "visible_at_k": {str(k): [e.name for e in visible_events(spec, overviews[k])]
                                           for k in K_VALUES}})


def _write_tables(out: Path, t: _Tables, prior_rows: bool) -> None:
    _write_parquet(out / "rl.parquet", t.rl_rows)
    _write_parquet(out / "sft.parquet", [{**r, "messages": json.dumps(r["messages"])} for r in t.sft_rows])
    if prior_rows:
        _write_parquet(out / "prior.parquet", [{**r, "messages": json.dumps(r["messages"])} for r in t.prior_rows])
    _write_jsonl(out / "oracle.jsonl", t.trajectories)
    _write_jsonl(out / "annotations.jsonl", t.annotations)


def _summary(t: _Tables, n_videos: int, prior_rows: bool) -> SplitSummary:
    trajectories, n_event = t.trajectories, t.n_event
    tool_eps = [x for x in trajectories if not x["direct"]]
    by_k = {k: [x for x in trajectories if x["k"] == k] for k in sorted({x["k"] for x in trajectories})}
    kind = [r["kind"] for r in t.sft_rows]
    prior_kind = [r["kind"] for r in t.prior_rows]
    return SplitSummary(
        n_videos=n_videos, n_questions=t.n_q, n_event_questions=n_event,
        visible={k: t.vis[k] / n_event if n_event else 0.0 for k in K_VALUES},
        predicted={k: t.pred[k] / n_event if n_event else 0.0 for k in K_VALUES},
        control_visible={k: c[0] / c[1] if c[1] else 0.0 for k, c in t.ctrl.items()},
        question_types=dict(sorted(t.types.items())),
        question_kinds=dict(sorted(t.kinds.items())),
        oracle_direct=1 - len(tool_eps) / len(trajectories),
        oracle_mean_calls=float(np.mean([len(x["calls"]) for x in tool_eps])) if tool_eps else 0.0,
        sft_rows={"main": kind.count("main"), "sub": kind.count("sub"),
                  **({"prior_main": prior_kind.count("main"), "prior_sub": prior_kind.count("sub")}
                     if prior_rows else {})},
        oracle_direct_at_k={k: float(np.mean([x["direct"] for x in ts])) for k, ts in by_k.items()},
        oracle_calls_at_k={k: float(np.mean([len(x["calls"]) for x in ts])) for k, ts in by_k.items()},
        oracle_episodes_at_k={k: len(ts) for k, ts in by_k.items()},
        oracle_redundant=float(np.mean([x.get("redundant", False) for x in trajectories])),
        oracle_two_rounds=float(np.mean([len({c.get("round", 0) for c in x["calls"]}) > 1 for x in trajectories])),
    )


def _valid(path: Path, spec: VideoSpec):
    """A reader for an existing video rendered from exactly this spec, else None. (Duration and size
    alone are not enough: a spec whose events moved keeps both, and a stale video would silently
    contradict its annotations.)"""
    from paravt.video import VideoError, VideoReader

    if not path.exists() or video_fingerprint(path) != spec_fingerprint(spec):
        return None
    try:
        reader = VideoReader(path)
    except VideoError:
        return None
    info = reader.probe()
    if abs(info.duration - spec.duration) > 1.0 / spec.fps or (info.width, info.height) != (spec.size, spec.size):
        reader.close()
        return None
    return reader


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".part")
    pq.write_table(pa.Table.from_pylist(rows), tmp, compression="zstd")
    tmp.replace(path)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    tmp.replace(path)


def load_sft_rows(path: str | Path) -> list[dict]:
    """Oracle SFT rows with `messages` parsed back into lists."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    if rows and "messages" not in rows[0]:
        raise KeyError(f"no 'messages' column (it has {', '.join(sorted(rows[0]))})")
    for i, r in enumerate(rows):
        if isinstance(r["messages"], str):
            try:
                r["messages"] = json.loads(r["messages"])
            except ValueError as e:
                raise ValueError(f"row {i}: messages is not JSON ({e})") from None
    return rows


def load_annotations(path: str | Path) -> dict[str, VideoSpec]:
    """video_id -> VideoSpec, from annotations.jsonl."""
    out = {}
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        out[d["video_id"]] = VideoSpec.from_dict(d)
    return out


def load_trajectories(path: str | Path) -> list[dict]:
    """oracle.jsonl rows: {"video", **Trajectory.to_dict()}."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
