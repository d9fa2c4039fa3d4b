import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt import protocol as P
from paravt.protocol import ToolCall, ToolCallError, crop_args, extract_answer, parse

VALID = (
    "<think>The overview misses the event, look at two windows.</think>\n"
    '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 10, "end_time": 20}}\n</tool_call>\n'
    '<tool_call>{"name": "crop_video", "arguments": {"start_time": "01:05", "end_time": "1:20"}}</tool_call>'
)


def test_parallel_calls_in_order():
    t = parse(VALID)
    assert t.think.startswith("The overview") and t.think_closed
    assert [c.arguments["start_time"] for c in t.calls] == [10, "01:05"]
    assert t.answer is None and not t.problems
    assert crop_args(t.calls[1]).start == 65.0 and crop_args(t.calls[1]).end == 80.0


def test_answer_turn():
    t = parse("<think>It is red.</think><answer>B</answer>")
    assert t.answer == "B" and t.answer_closed and not t.calls and not t.problems


def test_forced_prefix_counts_as_present():
    t = parse("the circle is red.</think><answer>A</answer>", prefix=P.THINK_PREFIX)
    assert t.think == "the circle is red." and t.think_closed
    assert not t.problems
    bare = parse("the circle is red.</think><answer>A</answer>")
    assert any(p.kind == "unopened_think" for p in bare.problems)


def test_leaked_tool_code():
    t = parse("<think>x</think><tool_code>crop_video(start_time=5, end_time=9.5)</tool_code>")
    assert len(t.calls) == 1 and t.calls[0].name == "crop_video"
    assert crop_args(t.calls[0]).end == 9.5
    t = parse("<tool_code>crop_video(3, 7)</tool_code>")
    assert crop_args(t.calls[0]).start == 3


def test_tool_code_is_never_evaluated():
    t = parse("<tool_code>crop_video(start_time=__import__('os').system('echo hi'), end_time=2)</tool_code>")
    assert not t.calls and t.problems and t.problems[0].kind == "bad_call"


@pytest.mark.parametrize(
    "text, kind",
    [
        ("<think>abc", "unclosed_think"),
        ("<think>a</think><tool_call>{not json}</tool_call>", "bad_call"),
        ('<think>a</think><tool_call>{"name": "zoom", "arguments": {}}</tool_call>', "unknown_tool"),
        ('<think>a</think><tool_call>{"name": "crop_video", "arguments": {"start_time": 1', "unclosed_tool_call"),
        ("<think>a</think><answer>B", "unclosed_answer"),
        ("<think>a</think><answer>A</answer><answer>B</answer>", "multiple_answers"),
        ("<think>a</think><tool_call>[1, 2]</tool_call>", "bad_call"),
        ('<tool_call>{"arguments": {}}</tool_call>', "bad_call"),
    ],
)
def test_problems(text, kind):
    assert kind in [p.kind for p in parse(text).problems]


def test_bad_json_problem_carries_offending_text():
    t = parse("<tool_call>{start_time: 5}</tool_call>")
    assert "{start_time: 5}" in t.problems[0].detail
    assert t.bad_calls and "{start_time: 5}" in t.bad_calls[0][0]


def test_arguments_as_json_string_and_aliases():
    t = parse('<tool_call>{"name": "crop_video", "arguments": "{\\"start\\": 3, \\"end\\": \\"9s\\"}"}</tool_call>')
    a = crop_args(t.calls[0])
    assert (a.start, a.end) == (3.0, 9.0)


@pytest.mark.parametrize(
    "value, seconds",
    [(12, 12.0), (12.5, 12.5), ("12.5", 12.5), ("01:30", 90.0), ("1:02:03", 3723.0), ("75s", 75.0), ("75 seconds", 75.0)],
)
def test_parse_seconds(value, seconds):
    assert P.parse_seconds(value) == seconds


@pytest.mark.parametrize(
    "args, message",
    [
        ({"start_time": 5, "end_time": 5}, "smaller than"),
        ({"start_time": 9, "end_time": 5}, "smaller than"),
        ({"start_time": -1, "end_time": 5}, "negative"),
        ({"start_time": 500, "end_time": 600}, "outside the video"),
        ({"start_time": "abc", "end_time": 5}, "cannot read"),
        ({"end_time": 5}, "needs start_time"),
        ({"start_time": 1, "end_time": 5, "num_frames": 0}, "at least 1"),
        ({"start_time": True, "end_time": 5}, "number of seconds"),
        ({"start_time": float("nan"), "end_time": 5}, "finite"),
    ],
)
def test_crop_args_errors(args, message):
    with pytest.raises(ToolCallError, match=message):
        crop_args(ToolCall("crop_video", args), duration=120.0)


def test_crop_args_clamps_end_and_ignores_video_path():
    a = crop_args(ToolCall("crop_video", {"start_time": 100, "end_time": 500, "video_path": "/etc/passwd"}), 120.0)
    assert (a.start, a.end) == (100.0, 120.0)
    assert not hasattr(a, "video_path")


def test_unknown_tool_error():
    with pytest.raises(ToolCallError, match="unknown tool"):
        crop_args(ToolCall("rm", {"start_time": 1, "end_time": 2}))


def test_format_round_trip():
    text = "<think>look</think>" + P.format_tool_call(12.5, 30) + P.format_tool_call(40, 50, num_frames=4)
    t = parse(text)
    assert [(crop_args(c).start, crop_args(c).end, crop_args(c).num_frames) for c in t.calls] == [
        (12.5, 30.0, None), (40.0, 50.0, 4)]
    assert P.format_tool_responses(["a", "b"]) == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    assert P.timestamp_text(12.54) == "<12.5 seconds>"


def test_prompts_per_mode():
    assert "<tool_call>" in P.system_prompt("parallel", 5) and "5 calls" in P.system_prompt("parallel", 5)
    assert "once per turn" in P.system_prompt("sequential")
    assert "crop_video" not in P.system_prompt("none")
    with pytest.raises(ValueError):
        P.system_prompt("bogus")
    assert "letter" in P.user_prompt_text("Q?", 60, "mcq")
    assert "start - end" in P.user_prompt_text("Q?", 60, "tvg")
    assert "Subtitles" in P.user_prompt_text("Q?", 60, "mcq", subtitles="hello")
    assert "12.0 and 20.0" in P.subagent_prompt(12, 20, "Which colour?") and "Which colour?" in P.subagent_prompt(12, 20, "Which colour?")
    schema = json.loads(P.tools_block().splitlines()[1])
    assert "video_path" not in schema["function"]["parameters"]["properties"]


@pytest.mark.parametrize(
    "text, answer",
    [
        ("<think>x</think><answer> C </answer>", "C"),
        ("<think>x</think>\nThe answer is B", "The answer is B"),
        ("<think>still thinking", None),
        ("<answer>A</answer> then <answer>D</answer>", "D"),
        ("", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


# ---- parse never raises -------------------------------------------------------------------

tag = st.sampled_from(list(P.ALL_TAGS) + ["{", "}", '"', ":", "crop_video(", ")", "\n", '{"name": "crop_video"'])
fragments = st.lists(st.one_of(tag, st.text(max_size=8)), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(fragments, st.sampled_from(["", P.THINK_PREFIX]))
def test_parse_never_raises_on_random_text(text, prefix):
    t = parse(text, prefix=prefix)
    assert isinstance(t.problems, list)
    for c in t.calls:
        try:
            crop_args(c, 100.0)
        except ToolCallError:
            pass
    extract_answer(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID)))
def test_parse_never_raises_on_truncations(n):
    t = parse(VALID[:n])
    assert len(t.calls) <= 2


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4))
def test_nested_and_repeated_tags(depth, reps):
    inner = VALID
    for _ in range(depth):
        inner = "<tool_call>" + inner + "</tool_call>"
    t = parse(inner * reps + "<think>" * depth)
    assert isinstance(t, P.Turn)
