import asyncio
import json
import re

import pytest

from paravt import protocol as P
from paravt.agent import Episode, EpisodeConfig, run_episode, run_episode_sync
from paravt.backends.base import ImagePart
from paravt.backends.scripted import ScriptedBackend
from videotools import make_test_video

THINK = "<think>The overview misses it, I will look closer.</think>\n"


def calls(*windows, extra: dict | None = None) -> str:
    out = THINK
    for s, e in windows:
        args = {"start_time": s, "end_time": e, **(extra or {})}
        out += "<tool_call>" + json.dumps({"name": "crop_video", "arguments": args}) + "</tool_call>\n"
    return out


ANSWER = "<think>The summaries settle it.</think><answer>B</answer>"


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return make_test_video(tmp_path_factory.mktemp("agent") / "v.mp4", seconds=60, fps=4, gop=20)


def sub_echo(req):
    text = req.messages[-1].text()
    m = re.search(r"between ([\d.]+) and ([\d.]+) seconds", text)
    return f"<think>checking</think>Window {m.group(1)}-{m.group(2)}: a red circle."


def run(backend, video, **cfg):
    qtype = cfg.pop("question_type", "mcq")
    return run_episode_sync(backend, video, "Which shape was red?\nA. square\nB. circle", EpisodeConfig(frames=8, **cfg),
                            question_type=qtype)


def test_parallel_calls_run_concurrently_and_return_in_order(video):
    b = ScriptedBackend([calls((0, 10), (20, 30), (40, 50)), ANSWER], sub=sub_echo, latency_s=0.3)
    ep = run(b, video)
    assert ep.answer == "B"
    subs = ep.turns[0].calls
    assert [s.status for s in subs] == ["ok"] * 3
    assert [s.start for s in subs] == [0, 20, 40]
    # sub-agents overlapped in time and were served as one batch
    assert max(s.started for s in subs) < min(s.finished for s in subs)
    assert 3 in b.batches
    # responses in call order, think stripped from the summaries
    resp = ep.turns[0].tool_response
    assert resp.index("Window 0.0-10.0") < resp.index("Window 20.0-30.0") < resp.index("Window 40.0-50.0")
    assert "checking" not in resp and resp.count(P.TOOL_RESPONSE_OPEN) == 3
    assert ep.n_parsed_calls == 3 and ep.n_executed_calls == 3
    # each sub-agent saw its own window at 1 fps, with timestamps
    for s in subs:
        assert len(s.frame_times) == 10 and all(s.start <= t <= s.end for t in s.frame_times)
        texts = [p.text for p in s.generation.messages[0].parts() if hasattr(p, "text")]
        assert texts[0] == P.timestamp_text(s.frame_times[0])


def test_main_context_visual_tokens_fixed_by_k(video):
    b = ScriptedBackend([calls(*[(i * 10, i * 10 + 8) for i in range(5)]), ANSWER], sub="A circle.")
    ep = run(b, video)
    mains = [r for r in b.requests if r.role == "main"]
    assert [sum(len(m.images()) for m in r.messages) for r in mains] == [8, 8]


def test_inline_mode_puts_crop_frames_in_main_context(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER])
    ep = run(b, video, mode="inline")
    mains = [r for r in b.requests if r.role == "main"]
    assert [sum(len(m.images()) for m in r.messages) for r in mains] == [8, 8 + 20]
    assert not [r for r in b.requests if r.role == "sub"]
    assert all(s.generation is None and s.status == "ok" for s in ep.turns[0].calls)


def test_sequential_runs_one_call_per_turn(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), calls((20, 30)), ANSWER], sub="ok")
    ep = run(b, video, mode="sequential")
    assert [c.status for c in ep.turns[0].calls] == ["ok", "skipped"]
    assert "one call per turn" in ep.turns[0].calls[1].response
    assert ep.n_executed_calls == 2


def test_none_mode_has_no_tool_prompt_and_runs_no_tools(video):
    b = ScriptedBackend([calls((0, 10))], sub="never")
    ep = run(b, video, mode="none")
    assert "crop_video" not in b.requests[0].messages[0].text()
    assert len(ep.turns) == 1 and ep.n_executed_calls == 0
    assert not [r for r in b.requests if r.role == "sub"]


def test_calls_beyond_max_parallel_are_skipped(video):
    b = ScriptedBackend([calls(*[(i, i + 5) for i in range(0, 35, 5)]), ANSWER], sub="ok")
    ep = run(b, video, max_parallel=5)
    statuses = [c.status for c in ep.turns[0].calls]
    assert statuses == ["ok"] * 5 + ["skipped"] * 2
    assert "at most 5 calls" in ep.turns[0].tool_response


def test_failures_stay_local(video):
    bad_turn = (calls((0, 10), (30, 20), (500, 600), (5, 15))
                + "<tool_call>{not json}</tool_call>"
                + '<tool_call>{"name": "delete_files", "arguments": {}}</tool_call>')
    b = ScriptedBackend([bad_turn, ANSWER], sub="fine", fail_sub=lambda r: "5.0 and 15.0" in r.messages[-1].text())
    ep = run(b, video, max_parallel=6)
    by = {c.index: c for c in ep.turns[0].calls}
    assert by[0].status == "ok"
    assert by[1].status == "error" and "smaller than" in by[1].response
    assert by[2].status == "error" and "outside the video" in by[2].response
    assert by[3].status == "error" and "helper model failed" in by[3].response
    assert by[4].status == "error" and "unknown tool" in by[4].response
    assert by[5].status == "error" and "not valid JSON" in by[5].response
    assert ep.answer == "B"


def test_model_written_video_path_is_ignored(video, tmp_path, monkeypatch):
    secret = tmp_path / "secret.mp4"
    make_test_video(secret, seconds=5, fps=2)
    opened = []
    import paravt.video as V

    real_init = V.VideoReader.__init__

    def spy(self, path, *a, **k):
        opened.append(str(path))
        real_init(self, path, *a, **k)

    monkeypatch.setattr(V.VideoReader, "__init__", spy)
    b = ScriptedBackend([calls((0, 10), extra={"video_path": str(secret)}), ANSWER], sub="ok")
    ep = run(b, video)
    assert ep.turns[0].calls[0].status == "ok"
    assert str(secret) not in opened


def test_forced_answer_on_last_round(video):
    b = ScriptedBackend([calls((0, 10)), calls((10, 20)), "<think>ok</think><answer>A</answer>"], sub="ok")
    ep = run(b, video, max_turns=3)
    mains = [r for r in b.requests if r.role == "main"]
    assert len(mains) == 3 and ep.turns[-1].forced_answer
    assert P.final_answer_instruction("mcq") in mains[-1].messages[-1].text()
    assert mains[-1].max_new_tokens == 64 and mains[0].max_new_tokens == 2048
    assert ep.answer == "A"
    tvg = ScriptedBackend([calls((0, 10)), "<answer>1 - 2</answer>"], sub="ok")
    run(tvg, video, max_turns=2, question_type="tvg")
    assert [r for r in tvg.requests if r.role == "main"][-1].max_new_tokens == 128


def test_think_prefix_is_forced_and_counted(video):
    b = ScriptedBackend(["it is the circle.</think><answer>B</answer>"])
    ep = run(b, video)
    assert b.requests[0].prefix == P.THINK_PREFIX
    assert ep.turns[0].parsed["think_closed"] and ep.answer == "B"


def test_episode_round_trips_through_json(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER], sub=sub_echo)
    ep = run(b, video)
    d = json.loads(json.dumps(ep.to_dict()))
    back = Episode.from_dict(d)
    assert back.to_dict() == ep.to_dict()
    assert back.turns[0].calls[1].generation.text == ep.turns[0].calls[1].generation.text


def test_missing_video_is_a_clear_error(tmp_path):
    from paravt.video import VideoError

    with pytest.raises(VideoError, match="no such file"):
        run(ScriptedBackend([ANSWER]), tmp_path / "nope.mp4")


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        EpisodeConfig(mode="telepathy")
    with pytest.raises(ValueError, match="unknown episode config"):
        EpisodeConfig.from_dict({"framez": 3})


def test_events_stream(video):
    seen = []
    b = ScriptedBackend([calls((0, 10)), ANSWER], sub="ok")
    run_episode_sync(b, video, "Q?", EpisodeConfig(frames=4), on_event=lambda n, p: seen.append(n))
    assert seen[0] == "overview" and "calls_dispatched" in seen and "subcall_finished" in seen and seen[-1] == "answer"


def test_real_tiny_model_runs_an_episode(video):
    """The untrained tiny Qwen3-VL through the hf backend: noise, but the loop holds end to end."""
    from paravt.backends.hf import HFBackend
    from paravt.models.tiny import build_tiny

    model, processor = build_tiny(seed=0)
    backend = HFBackend(model, processor)
    ep = run_episode_sync(backend, video, "Which shape was red?", EpisodeConfig(frames=4, max_new_tokens=24, max_turns=2))
    assert ep.turns and ep.turns[0].generation.token_ids
    g = ep.turns[0].generation
    assert g.prompt_ids[-len(processor.tokenizer.encode(P.THINK_PREFIX, add_special_tokens=False)):] == \
        processor.tokenizer.encode(P.THINK_PREFIX, add_special_tokens=False)
    assert g.visual_tokens == 4 * 6  # four 64x96 frames: (64/16)*(96/16)/4 = 6 merged tokens each
