"""The episode loop in every mode, driven by scripted main turns over a real small video."""

import asyncio
import json
import os
import re
import time

import pytest

from paravt import protocol as P
from paravt.agent import Episode, EpisodeConfig, ordered_calls, run_episode_sync
from paravt.backends.base import BackendError
from paravt.backends.scripted import ScriptedBackend
from paravt.video import VideoError, VideoReader
from videotools import decode_stripe, make_test_video

THINK = "The overview misses it, I will look closer.</think>\n"  # after the forced "<think>\n"
ANSWER = "The summaries settle it.</think><answer>B</answer>"
QUESTION = "Which shape was red?\nA. square\nB. circle"


def calls(*windows, extra: dict | None = None) -> str:
    out = THINK
    for s, e in windows:
        args = {"start_time": s, "end_time": e, **(extra or {})}
        out += "<tool_call>" + json.dumps({"name": "crop_video", "arguments": args}) + "</tool_call>\n"
    return out


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return make_test_video(tmp_path_factory.mktemp("agent") / "v.mp4", seconds=60, fps=4, gop=20)


def window_of(req):
    m = re.search(r"between ([\d.]+) and ([\d.]+) seconds", req.messages[-1].text())
    return float(m.group(1)), float(m.group(2))


def sub_echo(req):
    s, e = window_of(req)
    return f"<think>checking</think>Window {s:.1f}-{e:.1f}: a red circle."


def run(backend, video, question_type="mcq", **cfg):
    cfg.setdefault("frames", 8)
    return run_episode_sync(backend, video, QUESTION, EpisodeConfig(**cfg), question_type=question_type)


def mains(b):
    return [r for r in b.requests if r.role == "main"]


def subs(b):
    return [r for r in b.requests if r.role == "sub"]


def n_images(req):
    return sum(len(m.images()) for m in req.messages)


# ---------------------------------------------------------------------------------------------- parallel


def test_parallel_calls_run_concurrently_and_return_in_order(video):
    b = ScriptedBackend([calls((40, 50), (0, 10), (20, 30)), ANSWER], sub=sub_echo, latency_s=0.4)
    ep = run(b, video)
    assert ep.answer == "B" and ep.error is None
    assert [t.parsed["problems"] for t in ep.turns] == [[], []]
    turn = ep.turns[0]
    assert [s.status for s in turn.calls] == ["ok"] * 3
    assert [s.start for s in turn.calls] == [40, 0, 20]  # call order, not window order
    # the three sub-agents overlapped in time and were served as one batch of 3
    gens = [s.generation for s in turn.calls]
    assert max(g.started for g in gens) < min(g.finished for g in gens)
    assert 3 in b.batches
    # ... so the whole turn took about one latency, not three
    dispatch = max(s.finished for s in turn.calls) - min(s.started for s in turn.calls)
    assert dispatch < 2 * 0.4
    # responses in call order, one <tool_response> each, think blocks stripped
    resp = turn.tool_response
    assert resp.index("Window 40.0-50.0") < resp.index("Window 0.0-10.0") < resp.index("Window 20.0-30.0")
    assert "checking" not in resp and resp.count(P.TOOL_RESPONSE_OPEN) == 3
    assert ep.n_parsed_calls == 3 and ep.n_executed_calls == 3
    # and they come back to the main agent as one user turn after its own turn
    second = mains(b)[1].messages
    assert [m.role for m in second] == ["system", "user", "assistant", "user"]
    assert second[-1].text().count(P.TOOL_RESPONSE_OPEN) == 3


def test_each_subagent_sees_its_own_window_at_1_fps_with_timestamps(video):
    b = ScriptedBackend([calls((0, 10), (20, 23.5), (30, 60), extra=None), ANSWER], sub="ok")
    ep = run(b, video)
    got = {s.start: s for s in ep.turns[0].calls}
    assert len(got[0].frame_times) == 10 and len(got[20].frame_times) == 3 and len(got[30].frame_times) == 16
    reader = VideoReader(video)
    for s in ep.turns[0].calls:
        msgs = s.generation.messages
        assert len(msgs) == 1 and msgs[0].role == "user"  # fresh context: no system prompt, no main history
        parts = msgs[0].parts()
        images = msgs[0].images()
        assert [p.timestamp for p in images] == s.frame_times
        assert all(s.start <= t <= s.end for t in s.frame_times)
        for i, img in enumerate(images):  # each frame follows its own timestamp text
            assert parts[2 * i].text == P.timestamp_text(img.timestamp)
            # and it is the frame of that moment of the episode's video (stripe = frame index at 4 fps)
            assert abs(decode_stripe(img.image) / 4 - img.timestamp) <= 0.25
        assert QUESTION.splitlines()[0] in msgs[0].text()  # subagent_sees_question
    reader.close()


def test_num_frames_argument_is_honoured_up_to_16(video):
    b = ScriptedBackend([calls((0, 30), extra={"num_frames": 4}) + calls((0, 30), extra={"num_frames": 40})[len(THINK):],
                         ANSWER], sub="ok")
    ep = run(b, video)
    assert [len(c.frame_times) for c in ep.turns[0].calls] == [4, 16]


def test_main_context_visual_tokens_fixed_by_k(video):
    script = [calls(*[(i * 10, i * 10 + 8) for i in range(5)]), calls((1, 9), (11, 19)), ANSWER]
    b = ScriptedBackend(script, sub="A circle.")
    ep = run(b, video, frames=8)
    assert [n_images(r) for r in mains(b)] == [8, 8, 8]
    assert [t.generation.visual_tokens for t in ep.turns] == [8 * 4] * 3
    assert ep.main_visual_tokens == 8 * 4
    assert [t.generation.image_times for t in ep.turns] == [ep.overview_times] * 3
    # text grew (the summaries), images did not
    assert ep.turns[2].generation.prompt_tokens > ep.turns[0].generation.prompt_tokens


def test_assistant_turns_carry_their_token_ids(video):
    b = ScriptedBackend([calls((0, 10)), ANSWER], sub="ok")
    ep = run(b, video)
    assistant = mains(b)[1].messages[2]
    assert assistant.role == "assistant"
    assert assistant.token_ids == ep.turns[0].generation.assistant_ids
    assert assistant.text() == P.THINK_PREFIX + ep.turns[0].generation.text


# ---------------------------------------------------------------------------------------------- limits and failures


def test_calls_beyond_max_parallel_are_skipped_with_the_limit_named(video):
    b = ScriptedBackend([calls(*[(i, i + 5) for i in range(0, 35, 5)]), ANSWER], sub="ok")
    ep = run(b, video, max_parallel=5)
    assert [c.status for c in ep.turns[0].calls] == ["ok"] * 5 + ["skipped"] * 2
    assert len(subs(b)) == 5
    assert ep.turns[0].tool_response.count("at most 5 calls run per turn") == 2
    assert ep.n_parsed_calls == 7 and ep.n_executed_calls == 5


def test_failures_stay_local_and_keep_call_order(video):
    bad_turn = (THINK
                + P.format_tool_call(0, 10)
                + "<tool_call>{not json}</tool_call>"
                + P.format_tool_call(30, 20)
                + '<tool_call>{"name": "delete_files", "arguments": {}}</tool_call>'
                + P.format_tool_call(500, 600)
                + P.format_tool_call(5, 15))
    b = ScriptedBackend([bad_turn, ANSWER], sub="fine",
                        fail_sub=lambda r: window_of(r) == (5.0, 15.0))
    ep = run(b, video, max_parallel=6)
    c = ep.turns[0].calls
    assert [x.index for x in c] == list(range(6))
    assert c[0].status == "ok" and c[0].response == "fine"
    assert c[1].status == "error" and "not valid JSON" in c[1].response
    assert c[2].status == "error" and "smaller than" in c[2].response
    assert c[3].status == "error" and "unknown tool" in c[3].response
    assert c[4].status == "error" and "outside the video" in c[4].response
    assert c[5].status == "error" and "helper model failed" in c[5].response
    resp = ep.turns[0].tool_response
    assert resp.count(P.TOOL_RESPONSE_OPEN) == 6
    order = [resp.index(x) for x in ("fine", "not valid JSON", "smaller than", "unknown tool", "outside the video",
                                     "helper model failed")]
    assert order == sorted(order)
    assert ep.answer == "B" and ep.n_executed_calls == 1


def test_on_bad_call_end_reads_a_turn_as_the_release_does(video):
    """on_bad_call="end": one unreadable call among good ones runs none of them and ends the
    episode without an answer (the release's all-or-nothing reading); "respond" runs the good ones."""
    broken = THINK + P.format_tool_call(0, 10) + "<tool_call>{not json}</tool_call>" + P.format_tool_call(20, 30)
    script = [broken, ANSWER]
    ep = run(ScriptedBackend(script, sub="fine"), video)
    assert ep.n_executed_calls == 2 and ep.answer == "B" and ep.stopped_on_bad_call is None
    b = ScriptedBackend(script, sub="fine")
    ep = run(b, video, on_bad_call="end")
    assert len(ep.turns) == 1 and subs(b) == [] and ep.turns[0].calls == [] and ep.turns[0].tool_response is None
    assert ep.n_parsed_calls == 2 and ep.n_executed_calls == 0 and ep.answer is None
    assert "tool call 2 is not one JSON object" in ep.stopped_on_bad_call
    assert Episode.from_dict(json.loads(json.dumps(ep.to_dict()))).stopped_on_bad_call == ep.stopped_on_bad_call
    # a turn the strict reader reads whole runs as before; so does the answer of a broken turn
    ep = run(ScriptedBackend([calls((0, 10), (20, 30)), ANSWER], sub="fine"), video, on_bad_call="end")
    assert ep.n_executed_calls == 2 and ep.answer == "B" and ep.stopped_on_bad_call is None
    ep = run(ScriptedBackend([broken + "<answer>C</answer>"], sub="fine"), video, on_bad_call="end")
    assert ep.answer == "C" and ep.n_executed_calls == 0
    # <tool_code> only: the release reads it leniently, and stops only when none of it is readable
    code = THINK + "<tool_code>crop_video(start_time=0, end_time=10)\nx = 1</tool_code>"
    ep = run(ScriptedBackend([code, ANSWER], sub="fine"), video, on_bad_call="end")
    assert ep.n_executed_calls == 1 and ep.answer == "B"
    ep = run(ScriptedBackend([THINK + "<tool_code>not a call</tool_code>", ANSWER], sub="fine"), video,
             on_bad_call="end")
    assert len(ep.turns) == 1 and ep.stopped_on_bad_call and ep.answer is None
    # an unclosed last call holding a whole object: the release runs it, so the episode does too
    unclosed = THINK + P.format_tool_call(0, 10) + '<tool_call>{"name": "crop_video", "arguments": ' \
        '{"start_time": 20, "end_time": 30}}'
    ep = run(ScriptedBackend([unclosed, ANSWER], sub=sub_echo), video, on_bad_call="end")
    assert [(c.start, c.status) for c in ep.turns[0].calls] == [(0, "ok"), (20, "ok")] and ep.answer == "B"
    ep = run(ScriptedBackend([unclosed, ANSWER], sub=sub_echo), video)  # paravt's reading: unclosed, answered
    assert [c.status for c in ep.turns[0].calls] == ["ok", "error"]
    with pytest.raises(ValueError, match="on_bad_call"):
        EpisodeConfig(on_bad_call="skip")


def test_decode_errors_and_timeouts_stay_local(video, monkeypatch):
    real = VideoReader.acrop

    async def acrop(self, start, end, *a, **k):
        if start == 10:
            raise VideoError(f"{self.path}: corrupt packet")
        if start == 20:
            raise RuntimeError("decoder exploded")
        if start == 30:
            await asyncio.sleep(600)
        return await real(self, start, end, *a, **k)

    monkeypatch.setattr(VideoReader, "acrop", acrop)
    b = ScriptedBackend([calls((0, 5), (10, 15), (20, 25), (30, 35)), ANSWER], sub="fine")
    t = time.perf_counter()
    # the timeout is generous so the real decode of (0, 5) fits in it on a loaded machine; the hung
    # call must still end the episode long before its 600 s sleep would
    ep = run(b, video, call_timeout_s=3.0)
    assert time.perf_counter() - t < 60
    c = ep.turns[0].calls
    assert [x.status for x in c] == ["ok", "error", "error", "error"]
    assert "could not read the video window: corrupt packet" in c[1].response
    assert "RuntimeError" in c[2].response
    assert "longer than 3 seconds" in c[3].response
    assert ep.answer == "B"


def test_subagent_generation_timeout_is_local(video):
    b = ScriptedBackend([calls((0, 5), (10, 15)), ANSWER], sub="late", latency_s=lambda r: 2.0 if r.role == "sub" else 0)
    ep = run(b, video, call_timeout_s=0.3)
    assert [x.status for x in ep.turns[0].calls] == ["error", "error"]
    assert all("took longer than 0.3 seconds" in x.response for x in ep.turns[0].calls)
    assert ep.answer == "B"


def test_model_written_video_path_never_opens_a_file(video, tmp_path, monkeypatch):
    import av

    import paravt.video as V

    secret = tmp_path / "secret.mp4"
    make_test_video(secret, seconds=2, fps=2)
    opened = []
    real_open = av.open

    def spy(path, *a, **k):  # FFmpeg reads the checked descriptor (file:/proc/self/fd/N): the file it is
        name = str(path)
        opened.append(os.readlink(name[len("file:"):]) if name.startswith("file:/proc/self/fd/") else name)
        return real_open(path, *a, **k)

    monkeypatch.setattr(av, "open", spy)
    init = V.VideoReader.__init__

    def spy_init(self, path, *a, **k):
        opened.append(str(path))
        init(self, path, *a, **k)

    monkeypatch.setattr(V.VideoReader, "__init__", spy_init)
    b = ScriptedBackend([calls((0, 10), extra={"video_path": str(secret)}), ANSWER], sub="ok")
    ep = run(b, video)
    assert ep.turns[0].calls[0].status == "ok"
    assert opened and {os.path.realpath(p) for p in opened} == {os.path.realpath(video)}


def test_main_backend_failure_is_raised_not_hidden(video):
    class Dead(ScriptedBackend):
        async def generate(self, requests):
            raise BackendError("server at http://127.0.0.1:1 is unreachable")

    with pytest.raises(BackendError, match="unreachable"):
        run(Dead([]), video)


# ---------------------------------------------------------------------------------------------- rounds and modes


def test_forced_answer_on_last_round(video):
    b = ScriptedBackend([calls((0, 10)), calls((10, 20)), "ok</think><answer>A</answer>"], sub="ok")
    ep = run(b, video, max_turns=3)
    m = mains(b)
    assert len(m) == 3 and [t.forced_answer for t in ep.turns] == [False, False, True]
    # the answer-now instruction is a user message of its own, after the round's tool responses
    assert m[2].messages[-1].role == "user" and m[2].messages[-1].text() == P.final_answer_instruction("mcq")
    assert m[2].messages[-2].text().startswith(P.TOOL_RESPONSE_OPEN)
    assert P.final_answer_instruction("mcq") not in m[1].messages[-1].text()
    # the forced turn keeps the think prefix and the whole budget: a real model reasons, then answers
    assert [r.max_new_tokens for r in m] == [2048, 2048, 2048] and m[2].prefix == P.THINK_PREFIX
    assert ep.answer == "A"
    # final_turn_think=False: the public evaluation's direct answer turn (no think, 64 tokens for MCQ)
    b = ScriptedBackend([calls((0, 10)), calls((10, 20)), "<answer>A</answer>"], sub="ok")
    ep = run(b, video, max_turns=3, final_turn_think=False)
    assert [r.max_new_tokens for r in mains(b)] == [2048, 2048, 64] and mains(b)[2].prefix == ""
    assert ep.answer == "A" and ep.turns[2].generation.prefix == ""
    # tools requested on the forced round are not run
    b = ScriptedBackend([calls((0, 10)), calls((10, 20))], sub="ok")
    ep = run(b, video, max_turns=2)
    assert len(ep.turns) == 2 and ep.turns[1].calls == [] and len(subs(b)) == 1 and ep.answer is None
    tvg = ScriptedBackend([calls((0, 10)), "<answer>1 - 2</answer>"], sub="ok")
    run(tvg, video, max_turns=2, question_type="tvg")
    assert mains(tvg)[-1].max_new_tokens == 2048
    assert P.final_answer_instruction("tvg") == mains(tvg)[-1].messages[-1].text()
    tvg = ScriptedBackend([calls((0, 10)), "<answer>1 - 2</answer>"], sub="ok")
    run(tvg, video, max_turns=2, question_type="tvg", final_turn_think=False)
    assert mains(tvg)[-1].max_new_tokens == 128


def test_sequential_runs_one_call_per_turn(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), calls((20, 30)), ANSWER], sub="ok", latency_s=0.2)
    ep = run(b, video, mode="sequential")
    assert [c.status for c in ep.turns[0].calls] == ["ok", "skipped"]
    assert "one call per turn" in ep.turns[0].calls[1].response
    assert [c.status for c in ep.turns[1].calls] == ["ok"]
    assert ep.n_executed_calls == 2 and len(subs(b)) == 2
    assert mains(b)[0].messages[0].text() == P.main_system("sequential", 5) != P.main_system("parallel", 5)
    assert mains(b)[0].messages[0].text().startswith(P.system_prompt("sequential", 5) + "\n\n# Tools\n")


def test_sequential_takes_longer_than_parallel_for_the_same_windows(video):
    windows = [(0, 10), (20, 30), (40, 50)]
    # only the sub-agents are slow: parallel waits one round of 1 s, sequential three; the margin
    # (1 s of the 2 s difference) leaves room for a loaded machine's decoding
    slow_subs = lambda r: 1.0 if r.role == "sub" else 0.0  # noqa: E731
    par = ScriptedBackend([calls(*windows), ANSWER], sub="ok", latency_s=slow_subs)
    seq = ScriptedBackend([calls(w) for w in windows] + [ANSWER], sub="ok", latency_s=slow_subs)
    ep_par = run(par, video)
    ep_seq = run(seq, video, mode="sequential", max_turns=4)
    assert ep_par.n_executed_calls == ep_seq.n_executed_calls == 3
    assert ep_seq.wall_time > ep_par.wall_time + 1.0


def test_inline_mode_puts_crop_frames_in_main_context(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER])
    ep = run(b, video, mode="inline")
    m = mains(b)
    assert [n_images(r) for r in m] == [8, 8 + 20]
    assert not subs(b)
    assert all(s.generation is None and s.status == "ok" for s in ep.turns[0].calls)
    crop_times = [t for s in ep.turns[0].calls for t in s.frame_times]
    assert m[1].messages[-1].images() and [p.timestamp for p in m[1].messages[-1].images()] == crop_times
    user = m[1].messages[-1].parts()
    for i, p in enumerate(user):  # every inline frame follows its timestamp text
        if getattr(p, "type", "") == "image":
            assert user[i - 1].text.endswith(P.timestamp_text(p.timestamp))
    assert ep.turns[1].generation.visual_tokens > ep.turns[0].generation.visual_tokens


def test_none_mode_has_no_tool_prompt_and_runs_no_tools(video):
    b = ScriptedBackend([calls((0, 10))], sub="never")
    ep = run(b, video, mode="none")
    system, user = b.requests[0].messages[0].text(), b.requests[0].messages[1].text()
    assert "crop_video" not in system and P.TOOL_CALL_OPEN not in system
    assert P.answer_instruction("mcq") in user
    assert len(ep.turns) == 1 and ep.n_executed_calls == 0 and not subs(b)


def test_think_prefix_is_forced_and_counted(video):
    b = ScriptedBackend(["it is the circle.</think><answer>B</answer>"])
    ep = run(b, video)
    assert b.requests[0].prefix == P.THINK_PREFIX
    assert ep.turns[0].parsed["think_closed"] and ep.answer == "B"
    b = ScriptedBackend(["<think>circle</think><answer>B</answer>"])
    run(b, video, think_prefix=False)
    assert b.requests[0].prefix == ""


def test_ordered_calls_interleaves_readable_and_unreadable():
    text = THINK + P.format_tool_call(1, 2) + "<tool_call>oops</tool_call>" + P.format_tool_call(1, 2) + "<tool_call>"
    turn = P.parse(text)
    kinds = ["ok" if c is not None else "bad" for c, _, _ in ordered_calls(turn)]
    assert kinds == ["ok", "bad", "ok", "bad"]


# ---------------------------------------------------------------------------------------------- records


def test_episode_round_trips_through_json(video):
    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER], sub=sub_echo)
    ep = run(b, video, seed=3)
    d = json.loads(json.dumps(ep.to_dict()))
    assert "messages" not in json.dumps(d)
    back = Episode.from_dict(d)
    assert back.to_dict() == ep.to_dict()
    assert back.config == ep.config
    assert back.turns[0].calls[1].generation.text == ep.turns[0].calls[1].generation.text
    assert back.main_texts() == ep.main_texts() == [calls((0, 10), (20, 30)), ANSWER]
    assert back.turns[0].generation.messages is None and ep.turns[0].generation.messages is not None


def test_a_synchronous_run_hands_the_episode_back_unprinted(video, monkeypatch):
    """asyncio.run on the main thread ends by formatting its task's repr, result included (paravt.aio):
    an episode's every frame through numpy's printer, twice, for nothing. run_episode_sync (and the
    trainer's rollouts, `paravt ask`, the demo) hand it back without a repr."""
    printed = []
    monkeypatch.setattr(Episode, "__repr__", lambda self: printed.append(1) or "Episode(...)")
    ep = run(ScriptedBackend([calls((0, 10)), ANSWER], sub=sub_echo), video)
    assert ep.answer == "B" and len(ep.turns[0].calls) == 1
    assert printed == []


def test_eval_rows_load_back(video, tmp_path):
    """An eval row (token ids dropped) and a whole results.jsonl line load back as an Episode,
    with the prompt text of every model call; before, from_dict raised TypeError (missing ids)."""
    from paravt.eval.benchmarks import Sample
    from paravt.eval.runner import sample_row
    from paravt.rewards import RewardConfig

    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER], sub=sub_echo)
    ep = run(b, video)
    s = Sample(id="s1", bench="synthvt", video_path=str(video), question=QUESTION, answer="B", question_type="mcq",
               options=["A. square", "B. circle"])
    row = json.loads(json.dumps(sample_row(s, ep, None, 1.0, RewardConfig())))
    assert "token_ids" not in json.dumps(row["episode"])  # the eval drops them
    for d in (row["episode"], row):
        back = Episode.from_dict(d)
        assert back.answer == "B" and back.config == ep.config and back.main_texts() == ep.main_texts()
        assert [(c.start, c.end, c.response) for c in back.subcalls()] == [(c.start, c.end, c.response)
                                                                           for c in ep.subcalls()]
        assert back.turns[0].generation.token_ids is None and back.turns[0].generation.messages is None
    g = back.turns[1].generation
    assert [m["role"] for m in g.prompt] == ["system", "user", "assistant", "user"]  # the whole second-turn input
    assert "[image " in g.prompt[1]["content"] and "Which shape was red?" in g.prompt[1]["content"]
    sub = back.turns[0].calls[0].generation.prompt[0]["content"]
    assert sub.count("[image ") == len(back.turns[0].calls[0].frame_times)
    assert f"[image {back.turns[0].calls[0].frame_times[0]:.1f} s]" in sub
    assert back.to_dict(tokens=False) == json.loads(json.dumps(ep.to_dict(tokens=False)))
    with pytest.raises(ValueError, match="no episode trace"):
        Episode.from_dict({"id": "s2", "episode": None, "error": "VideoError: gone"})


def test_ask_json_no_tokens(video, tmp_path, monkeypatch):
    """`ask --json --no-tokens`: the trace without token ids or logprobs, prompt text kept,
    and it loads back; without the flag the ids are there."""
    from typer.testing import CliRunner

    import paravt.ask as ask_mod
    from paravt.cli import app

    monkeypatch.setattr(ask_mod, "make_backend",
                        lambda *a, **k: ScriptedBackend([calls((0, 10)), ANSWER], sub=sub_echo))
    for flag, has_ids in (["--no-tokens"], False), ([], True):
        trace = tmp_path / f"t{has_ids}.json"
        r = CliRunner().invoke(app, ["ask", str(video), QUESTION, "--frames", "4", "--json", str(trace), *flag])
        assert r.exit_code == 0, r.output
        text = trace.read_text()
        for key in ("prompt_ids", "token_ids", "logprobs", "assistant_ids"):
            assert (f'"{key}"' in text) == has_ids, key
        d = json.loads(text)
        assert d["turns"][0]["generation"]["prompt"][1]["content"].count("[image ") == 4
        ep = Episode.from_dict(d)
        assert ep.answer == "B" and ep.turns[0].calls[0].start == 0 and ep.turns[0].calls[0].end == 10


def test_missing_video_is_a_clear_error(tmp_path):
    with pytest.raises(VideoError, match="no such file"):
        run(ScriptedBackend([ANSWER]), tmp_path / "nope.mp4")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all" * 100)
    with pytest.raises(VideoError, match="not a readable video"):
        run(ScriptedBackend([ANSWER]), bad)


def test_config_validation_and_yaml(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        EpisodeConfig(mode="telepathy")
    with pytest.raises(ValueError, match="unknown episode config"):
        EpisodeConfig.from_dict({"framez": 3})
    with pytest.raises(ValueError, match="max_parallel"):
        EpisodeConfig(max_parallel=0)
    y = tmp_path / "ep.yaml"
    y.write_text("mode: sequential\nframes: 16\ntemperature: 0.7\n")
    cfg = EpisodeConfig.from_yaml(y)
    assert (cfg.mode, cfg.frames, cfg.temperature, cfg.max_turns) == ("sequential", 16, 0.7, 3)
    with pytest.raises(ValueError, match="question_type"):
        run_episode_sync(ScriptedBackend([ANSWER]), tmp_path / "x.mp4", "Q", question_type="essay")


def test_events_stream(video):
    seen = []
    b = ScriptedBackend([calls((0, 10), (20, 30)), ANSWER], sub="ok")
    run_episode_sync(b, video, "Q?", EpisodeConfig(frames=4), on_event=lambda n, p: seen.append((n, p)))
    names = [n for n, _ in seen]
    assert names[0] == "overview" and names[-1] == "answer"
    assert names.count("turn_started") == 2 and names.count("think") == 2
    assert names.count("subcall_finished") == 2
    assert names.index("calls_dispatched") < names.index("subcall_finished") < names.index("tool_response")
    dispatched = dict(seen)["calls_dispatched"]["calls"]
    assert [c["arguments"]["start_time"] for c in dispatched] == [0, 20]


# ---------------------------------------------------------------------------------------------- the real tiny model


@pytest.fixture(scope="module")
def tiny():
    from paravt.models.tiny import build_tiny

    return build_tiny(seed=0)


def test_real_tiny_model_runs_an_episode(video, tiny):
    """The untrained tiny Qwen3-VL through the hf backend: noise, but the loop holds end to end."""
    from paravt.backends.hf import HFBackend

    model, processor = tiny
    ep = run_episode_sync(HFBackend(model, processor), video, "Which shape was red?",
                          EpisodeConfig(frames=4, max_new_tokens=24, max_turns=2))
    g = ep.turns[0].generation
    assert g.token_ids and 0 < g.completion_tokens <= 24 and len(g.logprobs) == len(g.token_ids)
    prefix_ids = processor.tokenizer.encode(P.THINK_PREFIX, add_special_tokens=False)
    assert g.prompt_ids[-len(prefix_ids):] == prefix_ids
    assert g.assistant_ids[:len(prefix_ids)] == prefix_ids
    assert g.visual_tokens == 4 * 6  # four 64x96 frames: (64/16)*(96/16)/4 = 6 merged tokens each


def test_real_tiny_subagents_are_batched_into_one_generate(video, tiny):
    """Main turns scripted, sub-agents the real model: the three crops of a turn reach the hf
    backend together and run as one batch."""
    from paravt.backends.hf import HFBackend

    hf = HFBackend(*tiny)
    b = ScriptedBackend([calls((0, 4), (20, 24), (40, 44)), ANSWER], sub=hf)
    ep = run(b, video, frames=4, sub_max_new_tokens=6)
    assert 3 in hf.batch_sizes
    for c in ep.turns[0].calls:
        assert c.status == "ok" and c.generation.token_ids and c.generation.completion_tokens <= 6
        assert c.generation.visual_tokens == 4 * 6  # 4 frames (1 fps over 4 s), 6 tokens each
    assert ep.turns[1].generation.visual_tokens == ep.turns[0].generation.visual_tokens


def test_a_damaged_video_is_answered_and_the_record_says_which_frames_were_replaced(tmp_path):
    """256 KiB of garbage in the middle of the file: the episode still runs; the overview frames and
    crop frames the damage took are replaced by their nearest decodable neighbours, listed in the record."""
    import numpy as np

    from tests.videotools import make_test_video, noisy_stripe_frame

    p = make_test_video(tmp_path / "v.mp4", seconds=30, fps=10, gop=20, frames=noisy_stripe_frame)
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    data[mid: mid + 256 * 1024] = np.random.default_rng(7).integers(0, 256, 256 * 1024, np.uint8).tobytes()
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(bytes(data))
    b = ScriptedBackend([calls((16, 22)), ANSWER], sub="ok")
    ep = run(b, bad, frames=8)
    assert ep.answer == "B" and ep.n_executed_calls == 1
    where = {s["where"] for s in ep.substituted_frames}
    assert where == {"overview", "call 0.0"}
    assert all(s["requested"] != s["got"] for s in ep.substituted_frames)
    assert ep.to_dict()["substituted_frames"] == ep.substituted_frames


def test_closing_a_reader_while_a_crop_decodes_is_safe(tmp_path):
    """An episode cancelled mid-decode closes its reader: the running decode keeps its container
    and the reader closes after it (closing under a running FFmpeg decode crashed the process)."""
    import threading

    from tests.videotools import make_test_video

    r = VideoReader(make_test_video(tmp_path / "v.mp4", seconds=20, fps=25, gop=250))
    out = {}
    t = threading.Thread(target=lambda: out.update(frames=r.frames_at([float(x) for x in range(19)])))
    t.start()
    r.close()
    t.join()
    assert len(out["frames"]) == 19 and r._containers == []  # closed by the decode, once it ended
    assert len(r.overview(2)) == 2  # and reopens when used again
