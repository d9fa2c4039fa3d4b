import hashlib
import json
import shutil

import numpy as np
import pytest

from paravt import protocol as P
from paravt.agent import EpisodeConfig, build_main_messages
from paravt.data import load_rl_rows
from paravt.rewards import accuracy_reward
from paravt.synth.dataset import SynthConfig, build_split, load_annotations, load_sft_rows, load_trajectories
from paravt.synth.oracle import Trajectory, oracle_messages
from paravt.synth.questions import Question, describe_frames, make_questions
from paravt.synth.render import BACKGROUNDS, COLOURS, event_mask, make_spec, render_frame, write_video
from paravt.video import VideoReader, overview_times

CFG = dict(n=40, seed=3, min_len=60, max_len=200)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "train"
    summary = build_split(out, SynthConfig(split="train", **CFG))
    return out, summary


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic_bytes(split, tmp_path):
    out, _ = split
    again = tmp_path / "again"
    build_split(again, SynthConfig(split="train", **CFG))
    for name in ("rl.parquet", "sft.parquet", "oracle.jsonl", "annotations.jsonl", "videos/train_00000.mp4"):
        assert sha(out / name) == sha(again / name), name
    other = build_split(tmp_path / "other", SynthConfig(split="train", **{**CFG, "seed": 4}))
    assert other.n_questions == CFG["n"]
    assert sha(out / "rl.parquet") != sha(tmp_path / "other" / "rl.parquet")


def test_resume_keeps_valid_videos_and_rewrites_broken_ones(split, tmp_path):
    out, _ = split
    videos = sorted((out / "videos").glob("*.mp4"))
    kept, broken = videos[0], videos[1]
    mtime = kept.stat().st_mtime_ns
    good = sha(broken)
    broken.write_bytes(broken.read_bytes()[:300])  # a crash mid-copy
    rl = sha(out / "rl.parquet")
    build_split(out, SynthConfig(split="train", **CFG))
    assert kept.stat().st_mtime_ns == mtime
    assert sha(broken) == good and sha(out / "rl.parquet") == rl


def test_resume_rerenders_a_video_whose_spec_changed(split, tmp_path):
    """A stale video of the same length and size (e.g. left by a run with other settings) must
    not survive: its events would contradict the annotations and the oracle rows."""
    out, _ = split
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # the split as built (its bytes are the build's: test_deterministic_bytes)
    path = copy / "videos" / "train_00002.mp4"
    spec = load_annotations(copy / "annotations.jsonl")["train_00002"]
    good = sha(path)
    for e in spec.events:  # same duration and size, events elsewhere in time
        e.start, e.end = (e.start + 10, e.end + 10) if e.end + 10 < spec.duration else (e.start - 10, e.end - 10)
    write_video(spec, path)
    assert sha(path) != good
    build_split(copy, SynthConfig(split="train", **CFG))
    assert sha(path) == good


def test_answers_consistent_with_annotations(split):
    out, _ = split
    specs = load_annotations(out / "annotations.jsonl")
    samples = load_rl_rows(out / "rl.parquet")
    assert len(samples) == CFG["n"]
    kinds = set()
    for s in samples:
        x = s.extra
        spec = specs[x["video_id"]]
        ev = spec.events
        kinds.add(x["kind"])
        opts = {o[0]: o[3:] for o in x["options"]}
        if s.question_type == "mcq":
            assert len(x["options"]) == 4 and [o[0] for o in x["options"]] == list("ABCD")
            assert opts[s.answer] == x["answer_text"] and len(set(opts.values())) == 4
            assert all(o in s.question for o in x["options"])
        named = [ev[i] for i in x["events"]]
        if x["kind"] == "colour":
            shape = s.question.split("the ")[1].split(" that")[0]
            assert [e.colour for e in ev if e.shape == shape] == [opts[s.answer]]
        elif x["kind"] == "colour_oe":
            shape = s.question.split("the ")[1].split("?")[0]
            assert [e.colour for e in ev if e.shape == shape] == [s.answer]
        elif x["kind"] in ("shape", "shape_oe"):
            colour = s.question.split(" in ")[1].split("?")[0]
            got = opts[s.answer] if s.question_type == "mcq" else s.answer
            assert [e.shape for e in ev if e.colour == colour] == [got]
        elif x["kind"] == "count":
            colour = s.question.split("How many ")[1].split(" shapes")[0]
            assert sum(e.colour == colour for e in ev) == int(opts[s.answer]) == len(named)
        elif x["kind"] == "when":
            s0, e0 = json.loads(s.answer)
            assert (named[0].start, named[0].end) == (s0, e0) and named[0].name in s.question
        elif x["kind"] == "name":
            pos = s.question.split("at the ")[1].split(" of")[0]
            assert [e.name for e in ev if e.position == pos] == [s.answer]
        elif x["kind"] == "order":
            chosen = opts[s.answer].removeprefix("the ")
            assert chosen == min(named, key=lambda e: e.start).name
            assert {e.name for e in named} <= {o.removeprefix("the ") for o in opts.values()}
        elif x["kind"] == "background":
            assert opts[s.answer] == spec.scenes[0].colour and not x["needs_event"]
        elif x["kind"] == "background_major":
            total = {c: sum(sc.end - sc.start for sc in spec.scenes if sc.colour == c) for c in BACKGROUNDS}
            assert total[opts[s.answer]] == max(total.values()) and not x["needs_event"]
        else:
            raise AssertionError(x["kind"])
        if x["needs_event"]:
            assert x["evidence"] == [[e.start, e.end] for e in named]
    assert {"background", "when", "count", "order"} <= kinds
    assert {s.question_type for s in samples} == {"mcq", "tvg", "oe"}


def test_controls_are_visible_at_every_k_and_answer_from_the_overview(split):
    out, summary = split
    assert all(v == 1.0 for v in summary.control_visible.values())
    specs = load_annotations(out / "annotations.jsonl")
    for s in load_rl_rows(out / "rl.parquet"):
        if s.extra["kind"] == "background":
            reader = VideoReader(s.video)
            first = reader.overview(64)[0]  # decoded pixels of the earliest overview frame (any K shows the scene)
            want = np.array(BACKGROUNDS[specs[s.extra["video_id"]].scenes[0].colour], float)
            assert np.abs(first.image.reshape(-1, 3).mean(0) - want).max() < 20
            assert all(s.extra["overview_visible"].values())


def test_oracle_crop_shows_the_event_in_decoded_frames(split):
    out, _ = split
    specs = load_annotations(out / "annotations.jsonl")
    rows = [r for r in load_sft_rows(out / "sft.parquet") if r["kind"] == "sub"]
    checked = 0
    for r in rows:
        spec = specs[r["video"].split("/")[-1][:-4]]
        summary = r["messages"][-1]["content"][0]["text"]
        times = [c["time"] for c in r["messages"][0]["content"] if c["type"] == "frame"]
        frames = VideoReader(out / r["video"]).frames_at(times)
        assert [f.timestamp for f in frames] == times
        for f in frames:  # each decoded frame is the annotated state at its time
            assert np.abs(f.image.astype(float) - render_frame(spec, f.timestamp)).mean() < 6
        for e in spec.events:
            said = f"{e.name} appears" in summary
            shown = [f for f in frames if e.start <= f.timestamp < e.end]
            assert said == bool(shown), (e, times, summary)  # the summary reports exactly what the frames show
            for f in shown:  # decoded pixels at the event's place carry its colour
                assert np.abs(f.image[event_mask(e, spec.size)].mean(axis=0) - np.array(COLOURS[e.colour])).max() < 40
            checked += said
    assert checked >= 5


def test_oracle_covers_the_evidence_or_answers_from_the_overview(split):
    out, summary = split
    specs = load_annotations(out / "annotations.jsonl")
    qs = {s.id: s for s in load_rl_rows(out / "rl.parquet")}
    trajs = load_trajectories(out / "oracle.jsonl")
    assert len(trajs) == CFG["n"] and 0 < summary.oracle_direct < 1
    assert Trajectory.from_dict(trajs[0]).to_dict() == {k: v for k, v in trajs[0].items() if k != "video"}
    n_calls = set()
    for t in trajs:
        q = qs[t["question_id"]]
        spec = specs[q.extra["video_id"]]
        seen = {i for i in q.extra["events"] if any(spec.events[i].start <= x < spec.events[i].end
                                                     for x in t["overview_times"])}
        # direct only when every event shows in the real overview of that K (controls always)
        assert t["overview_times"] == pytest.approx(overview_times(spec.duration, t["k"]), abs=0.26)
        if t["direct"]:
            assert q.question_type != "tvg" and (seen == set(q.extra["events"]) or not q.extra["needs_event"])
            continue
        n_calls.add(len(t["calls"]))
        assert 1 <= len(t["calls"]) <= 5
        frame_times = [x for c in t["calls"] for x in c["frame_times"]]
        for i in q.extra["events"]:
            if i in seen and q.question_type != "tvg":
                continue
            e = spec.events[i]
            assert any(e.start <= x < e.end for x in frame_times), (e, t["calls"])
        for c in t["calls"]:
            assert c["end"] - c["start"] <= 16 and c["frame_times"] and c["summary"]
    assert max(n_calls) >= 2


def test_sft_rows_are_the_episode_rendering(split):
    out, _ = split
    rows = load_sft_rows(out / "sft.parquet")
    trajs = {t["question_id"]: t for t in load_trajectories(out / "oracle.jsonl")}
    qs = {s.id: s for s in load_rl_rows(out / "rl.parquet")}
    mains = [r for r in rows if r["kind"] == "main"]
    assert len(mains) == CFG["n"]
    crop_rows = [r for r in mains if len(r["messages"]) == 5]
    direct_rows = [r for r in mains if len(r["messages"]) == 3]
    assert crop_rows and direct_rows and len(crop_rows) + len(direct_rows) == len(mains)
    for r in mains:
        t, s = trajs[r["question_id"]], qs[r["question_id"]]
        # the first two messages are exactly what the episode sends (frames as times)
        episode = build_main_messages([type("F", (), {"timestamp": x, "image": None})() for x in t["overview_times"]],
                                      s.extra["duration"], s.question, s.question_type, "parallel", 5)
        for m, em in zip(r["messages"][:2], episode):
            assert m["role"] == em.role
            assert "".join(p.get("text", "") for p in m["content"]) == em.text()
            assert [p["time"] for p in m["content"] if p["type"] == "frame"] == [
                p.timestamp for p in em.parts() if p.type == "image"]
        first = P.parse(r["messages"][2]["content"][0]["text"], prefix="")
        assert r["messages"][2]["content"][0]["text"].startswith(P.THINK_PREFIX)
        final = P.parse(r["messages"][-1]["content"][0]["text"])
        assert final.answer is not None and final.answer_closed and not final.problems
        assert accuracy_reward(final.answer, r["answer"], r["question_type"]) > 0.99
        if len(r["messages"]) == 5:
            assert 1 <= len(first.calls) <= 5 and not first.problems and first.answer is None
            assert [(c.arguments["start_time"], c.arguments["end_time"]) for c in first.calls] == [
                (c["start"], c["end"]) for c in t["calls"]]
            resp = r["messages"][3]["content"][0]["text"]
            # the round's responses in one user turn, as Qwen's template lays out consecutive tool messages
            assert resp == "\n".join(P.format_tool_response(c["summary"]) for c in t["calls"])
            subs = [x for x in rows if x["kind"] == "sub" and x["question_id"] == r["question_id"]]
            assert len(subs) == len(first.calls)


def test_last_round_instruction_matches_the_episode():
    spec = make_spec(5, min_len=60, max_len=60)
    q = Question("v-q0", "v", "when", "tvg", "When does it appear?", "[10, 12]", evidence=[[10.0, 12.0]], events=[0])
    traj = Trajectory("v-q0", 4, [7.5, 22.5, 37.5, 52.5], False, "look", [], "done", "10 - 12")
    from paravt.synth.oracle import OracleCall

    traj.calls = [OracleCall(8, 16, [8.5, 9.5], describe_frames(spec, [8.5, 9.5]))]
    main3, _ = oracle_messages(traj, q, 60.0, EpisodeConfig(max_turns=3))
    main2, subs = oracle_messages(traj, q, 60.0, EpisodeConfig(max_turns=2))
    # the episode's answer-now message of the last round, a user turn of its own
    assert main2[4].role == "user" and main2[4].text() == P.final_answer_instruction("tvg")
    assert [m.role for m in main3] == ["system", "user", "assistant", "user", "assistant"]
    assert len(subs) == 1 and subs[0][-1].content == traj.calls[0].summary
    with pytest.raises(ValueError):
        oracle_messages(traj, q, 60.0, EpisodeConfig(max_turns=1))


def test_summary_reports_only_what_the_frames_show():
    spec = make_spec(7, min_len=100, max_len=100)
    e = spec.events[0]
    assert f"{e.name} appears" in describe_frames(spec, [e.start, e.end - 0.5])
    assert f"{e.name} appears" not in describe_frames(spec, [e.start - 0.5, e.end])  # the event falls between frames


def test_train_and_test_never_share(tmp_path):
    build_split(tmp_path / "tr", SynthConfig(split="train", n=10, seed=0, min_len=60, max_len=120))
    build_split(tmp_path / "te", SynthConfig(split="test", n=10, seed=0, min_len=60, max_len=120))
    sa = {sha(p) for p in (tmp_path / "tr" / "videos").glob("*.mp4")}
    sb = {sha(p) for p in (tmp_path / "te" / "videos").glob("*.mp4")}
    assert sa and sb and not sa & sb
    ta = load_rl_rows(tmp_path / "tr" / "rl.parquet")
    tb = load_rl_rows(tmp_path / "te" / "rl.parquet")
    assert not {s.id for s in ta} & {s.id for s in tb}
    qa = {s.question + s.answer + str(s.extra["evidence"]) for s in ta}
    qb = {s.question + s.answer + str(s.extra["evidence"]) for s in tb}
    assert not qa & qb
    specs_a = load_annotations(tmp_path / "tr" / "annotations.jsonl").values()
    specs_b = load_annotations(tmp_path / "te" / "annotations.jsonl").values()
    assert not {s.seed for s in specs_a} & {s.seed for s in specs_b}


def test_visibility_dial_spans_the_gap(split):
    _, s = split
    vals = [s.visible[k] for k in (4, 8, 16, 32, 64)]
    assert vals[0] < vals[2] < vals[4]  # 40 questions: only wide steps are safe from sampling noise
    assert vals[0] < 0.5 < vals[-1]
    # the measured dial follows the rule of thumb min(1, K d / L)
    assert all(abs(s.visible[k] - s.predicted[k]) < 0.25 for k in s.visible)


def test_visibility_dial_is_monotone_over_many_videos():
    """Without encoding: 400 specs with default settings, the overview's nominal times (what
    VideoReader.overview asks for; the decoded ones are within half a frame, checked above)."""
    from paravt.synth.questions import evidence_visible

    counts, n = dict.fromkeys((4, 8, 16, 32, 64), 0), 0
    for i in range(400):
        spec = make_spec(1000 + i)
        for q in make_questions(spec, "v", np.random.default_rng(i), 5):
            if q.needs_event:
                n += 1
                for k in counts:
                    counts[k] += evidence_visible(spec, q, overview_times(spec.duration, k))
    vals = [counts[k] / n for k in sorted(counts)]
    assert vals == sorted(vals) and vals[0] < 0.15 and vals[-1] > 0.6, vals


def test_spec_determinism_and_layout():
    a, b = make_spec(11), make_spec(11)
    assert a.to_dict() == b.to_dict() and a.to_dict() != make_spec(12).to_dict()
    for x, y in zip(a.events, a.events[1:]):
        assert x.end + 2 <= y.start  # events kept apart
    assert len({(e.colour, e.shape) for e in a.events}) == len(a.events)
    for s in (make_spec(i, min_len=60, max_len=600) for i in range(30)):
        assert s.scenes[0].end >= s.duration / 8  # the control scene is in the K=4 overview's first frame
        assert s.scenes[-1].end == s.duration and all(x.end == y.start for x, y in zip(s.scenes, s.scenes[1:]))
    with pytest.raises(ValueError):
        make_spec(1, size=63)
    with pytest.raises(ValueError):
        SynthConfig(split="holdout")


def test_questions_are_seeded():
    spec = make_spec(3, min_len=200, max_len=300)
    a = make_questions(spec, "v", np.random.default_rng(1), 5)
    b = make_questions(spec, "v", np.random.default_rng(1), 5)
    assert [q.to_dict() for q in a] == [q.to_dict() for q in b] and len(a) == 5


def test_long_video_encodes_fast_and_decodes(tmp_path):
    import time

    spec = make_spec(2, min_len=600, max_len=600)
    t0 = time.perf_counter()
    path = write_video(spec, tmp_path / "long.mp4")
    assert time.perf_counter() - t0 < 5.0  # ~0.5 s alone; generous for a loaded 2-core box
    r = VideoReader(path)
    assert abs(r.duration - 600) < 0.6 and r.probe().width == 64


def test_cli_writes_a_split_and_prints_the_dial(tmp_path):
    from typer.testing import CliRunner

    from paravt.cli import app

    r = CliRunner().invoke(app, ["synth", "--out", str(tmp_path / "s"), "--n", "6", "--seed", "9", "--split", "test",
                                 "--min-len", "40", "--max-len", "80", "--k-for-oracle", "4,8"])
    assert r.exit_code == 0, r.output
    assert "event Qs visible" in r.output and "controls visible" in r.output
    vis = json.loads((tmp_path / "s" / "visibility.json").read_text())
    assert vis["split"] == "test" and vis["n_questions"] == 6 and set(vis["visible"]) == {"4", "8", "16", "32", "64"}
    assert {t["k"] for t in load_trajectories(tmp_path / "s" / "oracle.jsonl")} <= {4, 8}
    assert len(load_rl_rows(tmp_path / "s" / "rl.parquet")) == 6
    bad = CliRunner().invoke(app, ["synth", "--out", str(tmp_path / "b"), "--k-for-oracle", "0"])
    assert bad.exit_code == 2 and "k-for-oracle" in bad.output


def test_tile_windows_cover_short_videos_only():
    from paravt.synth.oracle import tile_windows

    for duration in (20.0, 33.0, 63.5, 64.0, 79.5, 80.0):
        w = tile_windows(duration, max_parallel=5)
        assert w[0][0] == 0 and w[-1][1] >= duration
        assert all(b - a <= 16 and b > a for a, b in w)
        assert all(w[i][1] == w[i + 1][0] for i in range(len(w) - 1))  # no gap between windows
    assert tile_windows(81.0, max_parallel=5) is None


def test_mini_task_asks_only_chosen_kinds_and_tiles_its_crops(tmp_path):
    """The shrunk task the shipped tiny model learns: one-word questions, windows that tile."""
    cfg = SynthConfig(split="train", n=30, seed=5, min_len=60, max_len=80, event_min=1, event_max=4, n_events=(1, 2),
                      kinds=("colour_oe", "shape_oe"), crop_policy="tile")
    build_split(tmp_path, cfg)
    import pyarrow.parquet as pq

    kinds = {json.loads(r["extra_info"])["kind"] for r in pq.read_table(tmp_path / "rl.parquet").to_pylist()}
    assert kinds & {"colour_oe", "shape_oe"}
    assert kinds <= {"colour_oe", "shape_oe", "background", "background_major"}
    tiled = [Trajectory.from_dict(t) for t in load_trajectories(tmp_path / "oracle.jsonl") if not t["direct"]]
    assert tiled, "some questions need a crop at small K"
    for t in tiled:
        calls = [(c.start, c.end) for c in t.calls]
        assert calls[0][0] == 0 and all(b - a <= 16 for a, b in calls)
        assert sum(not c.decoy for c in t.calls) >= 1  # the window holding the evidence is marked relevant
    with pytest.raises(ValueError, match="unknown question kinds"):
        SynthConfig(kinds=("colour_oe", "texture"))
    with pytest.raises(ValueError, match="crop_policy"):
        SynthConfig(crop_policy="grid")


def test_caption_rows_describe_exactly_their_frames(split):
    """Warm-up captions use the sub-agent wording and are true of the frames they name."""
    from paravt.synth.captions import CAPTION_PROMPT, write_captions
    import pyarrow.parquet as pq

    out, _ = split
    rows = pq.read_table(write_captions(out, per_video=6, seed=1)).to_pylist()
    specs = load_annotations(out / "annotations.jsonl")  # video_id -> VideoSpec
    assert len(rows) == 6 * len(specs) and {r["kind"] for r in rows} == {"caption"}
    with_shape = 0
    for r in rows:
        user, assistant = json.loads(r["messages"])
        times = [p["time"] for p in user["content"] if p["type"] == "frame"]
        assert 1 <= len(times) <= 3 and user["content"][-1]["text"].strip() == CAPTION_PROMPT
        caption = assistant["content"][0]["text"]
        assert caption == describe_frames(specs[r["id"].rsplit("-c", 1)[0]], times)
        with_shape += not caption.startswith("No shapes")
    assert with_shape >= len(rows) // 3  # half the rows are drawn inside events


def test_stated_answer_reads_back_the_oracle_conclusion():
    from paravt.synth.oracle import _conclusion, stated_answer

    q = Question(id="q", video_id="v", kind="colour_oe", question_type="oe", question="What colour was the star?",
                 answer="cyan", answer_text="cyan", options=[], events=[0], evidence=[[1.0, 2.0]], needs_event=True)
    text = f"The crop shows a cyan star. {_conclusion(q)}{P.THINK_CLOSE}\n{P.ANSWER_OPEN}white{P.ANSWER_CLOSE}"
    assert stated_answer(text) == "cyan"  # the think's answer, not the tag's
    assert stated_answer("no conclusion here") is None
    assert stated_answer("The first frame is dark grey. So the answer is: dark grey.") == "dark grey"


def test_open_ended_control_names_the_background(tmp_path):
    """SynthVT-mini's controls ask for the background colour by name, answered from any overview."""
    cfg = SynthConfig(split="train", n=12, seed=3, min_len=60, max_len=80, event_min=1, event_max=4, n_events=(1, 1),
                      kinds=("colour_oe",), crop_policy="tile", control="oe")
    build_split(tmp_path, cfg)
    import pyarrow.parquet as pq

    rows = [json.loads(r["extra_info"]) for r in pq.read_table(tmp_path / "rl.parquet").to_pylist()]
    controls = [r for r in rows if not r["needs_event"]]
    assert controls and all(r["question_type"] == "oe" and not r["options"] for r in controls)
    assert all(r["answer"] == r["answer_text"] and r["answer"] in BACKGROUNDS for r in controls)
    direct = [t for t in load_trajectories(tmp_path / "oracle.jsonl") if t["question_id"] in {r["id"] for r in controls}]
    assert direct and all(t["direct"] for t in direct)  # the overview answers it: no crops
    with pytest.raises(ValueError, match="control question type"):
        SynthConfig(control="tvg")


# ---------------------------------------------------------------------------------------------
# SynthVT-hard: long videos, several events, multi-window questions, the sweep policy, the tool prior

from paravt.synth.dataset import HARD_TASK, K_VALUES  # noqa: E402
from paravt.synth.oracle import make_trajectory, sweep_edges, sweep_windows  # noqa: E402
from paravt.synth.questions import MULTI_KINDS, evidence_visible  # noqa: E402
from paravt.video import sample_times  # noqa: E402

HARD = dict(n=24, seed=7, **HARD_TASK)
HARD_KINDS = {"colour_oe", "order_oe", "count_oe", "compare_oe"}


@pytest.fixture(scope="module")
def hard_split(tmp_path_factory):
    out = tmp_path_factory.mktemp("hard") / "train"
    return out, build_split(out, SynthConfig(split="train", **HARD))


def nominal_crop_times(duration: float, fps: int = 2):
    """What a crop returns, without decoding: the episode's sample times snapped to the nearest
    frame of a `fps` video (the decoded test below checks the real frames)."""
    last = (round(duration * fps) - 1) / fps

    def crop(a: float, b: float) -> list[float]:
        ts = sample_times(a, b, 1.0, 16, duration=duration, source_fps=fps)
        return [min(last, max(0.0, round(t * fps) / fps)) for t in ts]
    return crop


def hard_specs(n: int, start: int = 2000):
    cfg = SynthConfig(**HARD_TASK)
    for i in range(n):
        spec = make_spec(start + i, min_len=cfg.min_len, max_len=cfg.max_len, n_events=cfg.n_events,
                         event_len=(cfg.event_min, cfg.event_max), colour_repeat=cfg.colour_repeat)
        qs = make_questions(spec, f"v{i}", np.random.default_rng(i), cfg.per_video, None, cfg.kinds, cfg.control,
                            cfg.kind_weights, cfg.pair_gap)
        yield spec, qs


def test_hard_preset_is_deterministic(hard_split, tmp_path):
    out, summary = hard_split
    again = build_split(tmp_path / "again", SynthConfig(split="train", **HARD))
    for name in ("rl.parquet", "sft.parquet", "oracle.jsonl", "annotations.jsonl", "videos/train_00000.mp4"):
        assert sha(out / name) == sha(tmp_path / "again" / name), name
    assert again.to_dict() == summary.to_dict()
    assert load_trajectories(tmp_path / "again" / "oracle.jsonl") == load_trajectories(out / "oracle.jsonl")


def test_hard_answers_are_true_of_the_annotations(hard_split):
    out, summary = hard_split
    specs = load_annotations(out / "annotations.jsonl")
    samples = load_rl_rows(out / "rl.parquet")
    assert len(samples) == HARD["n"] and {s.question_type for s in samples} == {"oe"}
    assert HARD_KINDS <= {s.extra["kind"] for s in samples} <= HARD_KINDS | {"background", "background_major"}
    assert sum(summary.question_kinds.values()) == HARD["n"]
    for s in samples:
        x, spec = s.extra, specs[s.extra["video_id"]]
        ev, named = spec.events, [spec.events[i] for i in s.extra["events"]]
        assert 210 <= spec.duration <= 300 and 3 <= len(ev) <= 5
        assert all(2.0 <= e.end - e.start <= 2.5 for e in ev)
        shapes = [w for w in s.question.replace(",", "").replace("?", "").split() if w in SHAPES_SET]
        for shape in shapes:  # every shape a question names is one event's
            assert sum(e.shape == shape for e in ev) == 1, (shape, s.question)
        if x["kind"] == "colour_oe":
            assert [e.colour for e in ev if e.shape == shapes[0]] == [s.answer]
        elif x["kind"] == "order_oe":
            assert len(named) == 2 and {e.shape for e in named} == set(shapes)
            assert s.answer == min(named, key=lambda e: e.start).shape
        elif x["kind"] == "count_oe":
            colour = s.question.split("How many ")[1].split(" shapes")[0]
            assert int(s.answer) == sum(e.colour == colour for e in ev) == len(named) >= 1
            assert all(e.colour == colour for e in named)
        elif x["kind"] == "compare_oe":
            a, b = named
            assert {a.shape, b.shape} == set(shapes) and s.answer == ("yes" if a.colour == b.colour else "no")
        elif x["kind"] == "background":
            assert s.answer == spec.scenes[0].colour and not x["needs_event"]
        else:
            assert x["kind"] == "background_major" and not x["needs_event"]
        if x["needs_event"]:
            assert x["evidence"] == [[e.start, e.end] for e in named]


SHAPES_SET = {"circle", "square", "triangle", "cross", "star", "diamond"}


def test_multi_window_questions_need_two_windows():
    """Order and compare questions name two events more than a sweep window apart (no window's
    crop can show both); counts name every event of their colour; over many videos the answers
    are not all one word."""
    answers: dict[str, set] = {k: set() for k in MULTI_KINDS}
    for spec, qs in hard_specs(80):
        for q in qs:
            if q.kind not in MULTI_KINDS:
                continue
            answers[q.kind].add(q.answer)
            spans = [(spec.events[i].start, spec.events[i].end) for i in q.events]
            assert q.evidence == [list(s) for s in spans]
            if q.kind in ("order_oe", "compare_oe"):
                assert len(spans) == 2 and spans[1][0] - spans[0][0] >= HARD_TASK["pair_gap"]
                crop = nominal_crop_times(spec.duration)
                for a, b in sweep_edges(spec.duration):
                    times = crop(a, b)
                    assert not all(any(s <= t < e for t in times) for s, e in spans), (a, b, spans)
            else:
                colour = spec.events[q.events[0]].colour
                assert q.events == [i for i, e in enumerate(spec.events) if e.colour == colour]
    assert answers["compare_oe"] == {"yes", "no"} and len(answers["order_oe"]) >= 4
    assert {"1", "2"} <= answers["count_oe"]


def test_sweep_windows_tile_the_video_and_catch_every_event():
    """Fixed 30 s windows (a tail under 2 s joins the last one), at most two rounds of five up to
    300 s; their 16 frames are at most 2 s apart, so any 2 s event between 1 s and the last
    second is in some crop's frames."""
    for duration in range(210, 301):
        edges = sweep_edges(float(duration))
        assert edges[0][0] == 0 and edges[-1][1] == duration
        assert all(x[1] == y[0] for x, y in zip(edges, edges[1:]))
        assert all(a % 30 == 0 and 2 <= b - a <= 31 for a, b in edges)
        rounds = sweep_windows(float(duration), max_parallel=5, max_rounds=2)
        assert rounds is not None and [w for r in rounds for w in r] == edges and all(len(r) <= 5 for r in rounds)
        crop = nominal_crop_times(float(duration))
        frames = sorted(t for a, b in edges for t in crop(a, b))
        for s in np.arange(1.0, duration - 3.0 + 0.25, 0.5):
            assert any(s <= t < s + 2.0 for t in frames), (duration, s)
    assert sweep_windows(331.0, max_parallel=5, max_rounds=2) is None
    with pytest.raises(ValueError, match="sweep"):
        SynthConfig(**{**HARD_TASK, "max_len": 400.0})


def test_tool_prior_one_calls_tools_at_every_k_and_zero_is_the_old_oracle():
    n_direct_old = 0
    for spec, qs in list(hard_specs(12, start=3000)):
        crop = nominal_crop_times(spec.duration)
        for q in qs:
            for k in K_VALUES:
                times = overview_times(spec.duration, k)
                always = make_trajectory(spec, q, times, crop, np.random.default_rng(k), 5, "sweep", 1.0, 2)
                assert not always.direct and always.calls, (q.kind, k)
                shown = evidence_visible(spec, q, times)
                assert always.redundant == shown
                if shown:  # confirming crops hold the evidence, and the think says they confirmed it
                    assert always.n_rounds == 1 and all(c.end - c.start <= 31 for c in always.calls)
                    assert "The crops confirm what the overview showed." in always.final_think
                never = make_trajectory(spec, q, times, crop, np.random.default_rng(k), 5, "sweep", 0.0, 2)
                assert never.direct == shown and not never.redundant
                n_direct_old += never.direct
                assert always.answer == never.answer
    assert n_direct_old > 0
    # tool_prior 0 draws nothing: the evidence policy's trajectories are the ones written without the option
    spec = make_spec(5, min_len=60, max_len=120)
    crop = nominal_crop_times(spec.duration)
    for q in make_questions(spec, "v", np.random.default_rng(0), 5):
        for k in (4, 64):
            a = make_trajectory(spec, q, overview_times(spec.duration, k), crop, np.random.default_rng(1))
            b = make_trajectory(spec, q, overview_times(spec.duration, k), crop, np.random.default_rng(1), 5,
                                "evidence", 0.0)
            assert a.to_dict() == b.to_dict()
    with pytest.raises(ValueError, match="tool_prior"):
        SynthConfig(tool_prior=1.5)


def test_default_split_has_no_tool_prior(split):
    out, summary = split
    assert summary.oracle_redundant == 0 and summary.oracle_two_rounds == 0
    for t in load_trajectories(out / "oracle.jsonl"):
        assert not t["redundant"] and not t["round_thinks"] and {c["round"] for c in t["calls"]} <= {0}
    assert set(summary.oracle_direct_at_k) <= set(K_VALUES)


def test_hard_oracle_crops_show_the_evidence_in_decoded_frames(hard_split):
    """Every tool-using hard trajectory saw each event it answers about, in the overview or in
    the decoded frames of its crops (a count: in its crops, and every window was cropped); its
    sub-agent summaries are true of the decoded pixels; confirming crops show the evidence."""
    out, summary = hard_split
    specs = load_annotations(out / "annotations.jsonl")
    qs = {s.id: s for s in load_rl_rows(out / "rl.parquet")}
    reader_cache: dict[str, VideoReader] = {}
    n_checked = 0
    for t in load_trajectories(out / "oracle.jsonl"):
        q = qs[t["question_id"]]
        spec = specs[q.extra["video_id"]]
        if t["direct"]:
            assert evidence_visible(spec, _question(q), t["overview_times"])
            continue
        if q.extra["video_id"] not in reader_cache:
            reader_cache[q.extra["video_id"]] = VideoReader(q.video)
        reader = reader_cache[q.extra["video_id"]]
        crop_frames = []
        for c in t["calls"]:
            frames = reader.crop(c["start"], c["end"], fps=1.0, max_frames=16)
            assert [f.timestamp for f in frames] == c["frame_times"]
            for f in frames:
                assert np.abs(f.image.astype(float) - render_frame(spec, f.timestamp)).mean() < 6
            assert c["summary"] == describe_frames(spec, c["frame_times"])
            crop_frames += c["frame_times"]
        for i in q.extra["events"]:
            e = spec.events[i]
            in_crops = any(e.start <= x < e.end for x in crop_frames)
            in_overview = any(e.start <= x < e.end for x in t["overview_times"])
            assert in_crops or in_overview, (q.question, e)
            if t["redundant"] or q.extra["kind"] == "count_oe":
                assert in_crops, (q.question, e)
                n_checked += 1
        if q.extra["kind"] == "count_oe" and not t["redundant"]:
            assert [(c["start"], c["end"]) for c in t["calls"]] == [tuple(map(float, w))
                                                                   for w in sweep_edges(spec.duration)]
    for r in reader_cache.values():
        r.close()
    assert n_checked >= 5 and summary.oracle_redundant > 0


def _question(s) -> Question:
    x = s.extra
    return Question(id=s.id, video_id=x["video_id"], kind=x["kind"], question_type=s.question_type,
                    question=s.question, answer=s.answer, answer_text=x["answer_text"], options=x["options"],
                    events=x["events"], evidence=x["evidence"], needs_event=x["needs_event"])


def test_hard_sft_rows_render_two_rounds_as_the_episode_does(hard_split):
    """A two-round trajectory is system, user, [assistant calls, user responses] x 2, the
    answer-now message after the second round (max_turns 3), and the final answer; sub-agent rows
    for every call of both rounds."""
    out, _ = hard_split
    rows = load_sft_rows(out / "sft.parquet")
    trajs = {t["question_id"]: t for t in load_trajectories(out / "oracle.jsonl")}
    mains = [r for r in rows if r["kind"] == "main"]
    two = [r for r in mains if len({c["round"] for c in trajs[r["question_id"]]["calls"]}) == 2]
    assert two and len(two) < len(mains)
    for r in mains:
        t = trajs[r["question_id"]]
        texts = ["".join(p.get("text", "") for p in m["content"]) for m in r["messages"]]
        roles = [m["role"] for m in r["messages"]]
        final = P.parse(texts[-1])
        assert final.answer is not None and not final.problems
        assert accuracy_reward(final.answer, r["answer"], "oe") > 0.99
        n_rounds = len({c["round"] for c in t["calls"]})
        if n_rounds == 2:
            assert roles == ["system", "user", "assistant", "user", "assistant", "user", "user", "assistant"]
            assert texts[6] == P.final_answer_instruction("oe")
            for j, rnd in ((2, 0), (4, 1)):
                calls = [c for c in t["calls"] if c["round"] == rnd]
                turn = P.parse(texts[j], prefix="")
                assert [(c.arguments["start_time"], c.arguments["end_time"]) for c in turn.calls] == [
                    (c["start"], c["end"]) for c in calls] and turn.answer is None
                assert texts[j + 1] == "\n".join(P.format_tool_response(c["summary"]) for c in calls)
            assert t["round_thinks"][0] in texts[4]
        elif n_rounds == 1:
            assert roles == ["system", "user", "assistant", "user", "assistant"]
        subs = [x for x in rows if x["kind"] == "sub" and x["question_id"] == r["question_id"]]
        assert len(subs) == len(t["calls"])
        assert f"So the answer is: {r['answer']}." in texts[-1]


def test_hard_visibility_dial_leaves_tools_useful_at_every_k(hard_split):
    """The dial over 120 videos (nominal overview times, no encoding): K=64 shows all of an event
    question's evidence well under 60 % of the time, K=4 under 15 %; the written split agrees
    within its noise, and its oracle calls tools in most episodes at every K."""
    counts, n = dict.fromkeys(K_VALUES, 0), 0
    for spec, qs in hard_specs(120, start=4000):
        for q in qs:
            if q.needs_event:
                n += 1
                for k in counts:
                    counts[k] += evidence_visible(spec, q, overview_times(spec.duration, k))
    vals = [counts[k] / n for k in K_VALUES]
    assert vals == sorted(vals) and vals[0] < 0.05 and 0.3 < vals[-1] < 0.55, vals
    _, s = hard_split
    assert s.visible[4] < 0.15 and s.visible[64] < 0.75
    assert all(s.oracle_direct_at_k[k] < 0.35 for k in s.oracle_direct_at_k)
    assert all(s.oracle_calls_at_k[k] >= 1 for k in s.oracle_calls_at_k)


def test_cli_hard_preset_and_tool_prior(tmp_path):
    from typer.testing import CliRunner

    from paravt.cli import app

    r = CliRunner().invoke(app, ["synth", "--preset", "hard", "--tool-prior", "0", "--out", str(tmp_path / "h"),
                                 "--n", "4", "--seed", "2", "--k-for-oracle", "64"])
    assert r.exit_code == 0, r.output
    assert "answer directly" in r.output and "calls / episode" in r.output
    vis = json.loads((tmp_path / "h" / "visibility.json").read_text())
    assert vis["oracle_redundant"] == 0 and set(vis["oracle_direct_at_k"]) == {"64"}
    assert set(vis["question_kinds"]) <= HARD_KINDS | {"background", "background_major"}
    bad = CliRunner().invoke(app, ["synth", "--preset", "huge", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--preset" in bad.output


def test_the_tool_prior_layout_competes_with_paravts_format():
    """The paradox preset's prior.parquet (synth.prior): the same episodes as the cold start's rows in
    another habit — no think, one call a turn, only where the overview misses the evidence, the answer
    as a sentence. paravt parses its calls and its answer, and its format reward is far below the
    oracle's own rows (the base's fτ before the cold start)."""
    from paravt.rewards import RewardConfig, format_reward
    from paravt.synth.dataset import PARADOX_TASK
    from paravt.synth.oracle import answer_text, to_sft_rows
    from paravt.synth.prior import to_prior_rows

    assert PARADOX_TASK["tool_prior"] == 0.9 and PARADOX_TASK["prior_rows"]
    ep, seen = EpisodeConfig(), {"direct": 0, "calls": 0}
    for seed in range(6):
        spec = make_spec(seed, min_len=60, max_len=80)
        crop = nominal_crop_times(spec.duration)
        for q in make_questions(spec, "v", np.random.default_rng(seed), 2):
            for k in (4, 64):
                traj = make_trajectory(spec, q, overview_times(spec.duration, k), crop, np.random.default_rng(k), 5,
                                       "evidence", 1.0)
                prior = [r for r in to_prior_rows(traj, q, "v.mp4", spec.duration, ep) if r["kind"] == "main"]
                own = [r for r in to_sft_rows(traj, q, "v.mp4", spec.duration, ep) if r["kind"] == "main"]
                assert prior[0]["id"].endswith("-prior-main") and own[0]["id"].endswith(f"-k{k}-main")
                said = [m["content"][0]["text"] for m in prior[0]["messages"] if m["role"] == "assistant"]
                turns = [P.parse(t) for t in said]
                assert all(t.think is None and "<think>" not in t.text for t in turns)
                assert all(len(t.calls) == 1 for t in turns[:-1]) and not turns[-1].calls
                # no answer tags: paravt reads the whole sentence as the answer (F1 counts its extra words)
                assert said[-1] == f"The answer is {answer_text(q)}." and P.extract_answer(said[-1]) == said[-1]
                # the oracle crops at every K (tool prior 1); the prior only where the overview misses the event
                assert traj.calls and (len(turns) == 1) == (traj.redundant or traj.direct)
                seen["direct"] += len(turns) == 1
                seen["calls"] += len(turns) > 1
                mine = [m["content"][0]["text"] for m in own[0]["messages"] if m["role"] == "assistant"]
                assert format_reward(said, RewardConfig()) < 0.5 <= format_reward(mine, RewardConfig(), prefix="")
    assert seen["direct"] and seen["calls"]


def test_tool_prior_at_k_overrides_the_tool_prior_for_its_k(tmp_path):
    """--tool-prior-at-k: the oracle's chance to crop where the overview shows the evidence, for one K (the
    paradox-skip preset's dial: direct answers at K = 64 as a trained path of the cold start)."""
    from typer.testing import CliRunner

    from paravt.cli import app
    from paravt.synth.dataset import PARADOX_SKIP_TASK, PRESETS

    assert PRESETS["paradox-skip"] is PARADOX_SKIP_TASK and not PARADOX_SKIP_TASK.get("prior_rows")
    assert PARADOX_SKIP_TASK["tool_prior_at_k"] == {16: 0.7, 32: 0.7, 64: 0.7}
    common = ["synth", "--preset", "paradox", "--n", "6", "--seed", "1", "--k-for-oracle", "4,64"]
    r = CliRunner().invoke(app, [*common, "--tool-prior-at-k", "64:0", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    trajs = load_trajectories(tmp_path / "a" / "oracle.jsonl")
    at64 = [t for t in trajs if t["k"] == 64]
    assert at64 and not any(t["redundant"] for t in at64) and any(t["direct"] for t in at64)  # never crops what it sees
    bad = CliRunner().invoke(app, [*common, "--tool-prior-at-k", "64=0", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--tool-prior-at-k" in bad.output
    with pytest.raises(ValueError, match="tool_prior_at_k"):
        SynthConfig(tool_prior_at_k={64: 1.5})
