import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paravt import protocol as P
from paravt.protocol import ToolCall, ToolCallError, crop_args, extract_answer, parse

VALID = (
    "<think>The overview misses the event, look at two windows.</think>\n"
    '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 10, "end_time": 20}}\n</tool_call>\n'
    '<tool_call>{"name": "crop_video", "arguments": {"start_time": "01:05", "end_time": "1:20"}}</tool_call>'
)
VALID_TURNS = [
    VALID,
    "<think>The red circle is visible at 12 s.</think>\n<answer>B</answer>",
    "<think>x</think><tool_code>crop_video(start_time=5, end_time=9.5)</tool_code>",
    "the frames show it</think>\n<answer>12.5 - 20</answer>",  # after a forced prefix
]


def kinds(turn: P.Turn) -> list[str]:
    return [p.kind for p in turn.problems]


def spans(turn: P.Turn) -> list[tuple[float, float]]:
    return [(crop_args(c).start, crop_args(c).end) for c in turn.calls]


# ---- well-formed turns ------------------------------------------------------------------------


def test_parallel_calls_in_order():
    t = parse(VALID)
    assert t.think == "The overview misses the event, look at two windows." and t.think_closed
    assert [c.arguments["start_time"] for c in t.calls] == [10, "01:05"]
    assert t.answer is None and not t.problems and not t.bad_calls
    assert spans(t) == [(10.0, 20.0), (65.0, 80.0)]


def test_answer_turn():
    t = parse("<think>It is red.</think><answer>B</answer>")
    assert (t.think, t.answer, t.answer_closed, t.calls, t.problems) == ("It is red.", "B", True, [], [])


def test_forced_prefix_counts_as_present():
    t = parse("the circle is red.</think><answer>A</answer>", prefix=P.THINK_PREFIX)
    assert t.think == "the circle is red." and t.think_closed and not t.problems
    assert t.text.startswith(P.THINK_PREFIX)
    bare = parse("the circle is red.</think><answer>A</answer>")
    assert bare.think is None and "unopened_think" in kinds(bare)


def test_model_rewriting_the_forced_think_tag():
    t = parse("<think>the circle is red</think><answer>A</answer>", prefix=P.THINK_PREFIX)
    assert t.think_closed and t.think == "<think>the circle is red" and "repeated_think" in kinds(t)


def test_turn_to_dict_is_json_serializable():
    d = parse(VALID + "<tool_call>{bad}</tool_call>").to_dict()
    assert json.loads(json.dumps(d))["calls"][0]["name"] == "crop_video"


# ---- the two call syntaxes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        ('{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}', [(1, 2)]),
        ('{"name": "crop_video", "arguments": "{\\"start_time\\": 1, \\"end_time\\": 2}"}', [(1, 2)]),  # args as JSON string
        ("{'name': 'crop_video', 'arguments': {'start_time': 1, 'end_time': 2}}", [(1, 2)]),  # Python literal
        ('{"type": "function", "function": {"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}}', [(1, 2)]),
        ('{"name": "crop_video", "start_time": 1, "end_time": 2}', [(1, 2)]),  # arguments beside the name
        ('```json\n{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}\n```', [(1, 2)]),
        ('{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}} I will wait.', [(1, 2)]),  # prose after
        ('{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}\n'
         '{"name": "crop_video", "arguments": {"start_time": 5, "end_time": 6}}', [(1, 2), (5, 6)]),  # two in one block
        ('[{"name": "crop_video", "arguments": {"start": 1, "end": 2}}, '
         '{"name": "crop_video", "arguments": {"start": 5, "end": 6}}]', [(1, 2), (5, 6)]),  # a list of calls
    ],
)
def test_json_call_variants(body, expected):
    t = parse(f"<think>looking</think><tool_call>{body}</tool_call>")
    assert spans(t) == [(float(a), float(b)) for a, b in expected]
    assert not t.bad_calls


@pytest.mark.parametrize(
    "body, expected",
    [
        ("crop_video(start_time=5, end_time=9.5)", [(5, 9.5)]),
        ("crop_video(3, 7)", [(3, 7)]),
        ("crop_video(3, end_time='00:10', num_frames=4)", [(3, 10)]),
        ("crop_video(1, 2)\ncrop_video(start_time='1:00', end_time='1:30')", [(1, 2), (60, 90)]),
        ("```python\ncrop_video(start_time=1, end_time=2)\n```", [(1, 2)]),
        ("result = tools.crop_video(start=1, end=2)", [(1, 2)]),
    ],
)
def test_leaked_tool_code(body, expected):
    t = parse(f"<think>x</think><tool_code>{body}</tool_code>")
    assert spans(t) == [(float(a), float(b)) for a, b in expected] and not t.bad_calls


def test_tool_code_is_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    t = parse(f"<tool_code>crop_video(start_time=__import__('os').system('touch {marker}'), end_time=2)</tool_code>")
    assert not t.calls and kinds(t) == ["bad_arguments"] and not marker.exists()
    t = parse(f"<tool_code>import os; os.system('touch {marker}')</tool_code>")  # read, not run: an unknown tool
    assert [c.name for c in t.calls] == ["system"] and {"bad_call", "unknown_tool"} <= set(kinds(t))
    assert not marker.exists()


def test_calls_of_both_syntaxes_keep_their_order():
    text = (P.format_tool_call(1, 2) + "<tool_code>crop_video(3, 4)</tool_code>" + P.format_tool_call(5, 6))
    assert spans(parse(text)) == [(1, 2), (3, 4), (5, 6)]


# ---- problems ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, n_bad",
    [
        ("<think>abc", "unclosed_think", 0),
        ("abc</think>", "unopened_think", 0),
        ("<think>a</think><tool_call>{not json}</tool_call>", "bad_json", 1),
        ("<think>a</think><tool_call></tool_call>", "bad_json", 1),
        ("<think>a</think><tool_code>crop_video(1,</tool_code>", "bad_json", 1),
        ('<think>a</think><tool_call>{"name": "zoom", "arguments": {}}</tool_call>', "unknown_tool", 0),
        ('<tool_call>{"name": "crop_video", "arguments": {"start_time": 1', "unclosed_tool_call", 1),
        ('<tool_call>{"name": "crop_video", "arguments": "start 1"}</tool_call>', "bad_arguments", 1),
        ('<tool_call>{"name": "crop_video", "arguments": [1, 2]}</tool_call>', "bad_arguments", 1),
        ("<tool_call>[1, 2]</tool_call>", "bad_call", 2),
        ('<tool_call>{"arguments": {}}</tool_call>', "bad_call", 1),
        ("<think>a</think><answer>B", "unclosed_answer", 0),
        ("<think>a</think>B</answer>", "unopened_answer", 0),
        ("<think>a</think><answer>A</answer><answer>B</answer>", "multiple_answers", 0),
        ("<tool_call><tool_call>" + P.format_tool_call(1, 2)[len("<tool_call>"):] + "</tool_call>", "unclosed_tool_call", 1),
        ("<tool_call>" + P.format_tool_call(1, 2) + "</tool_call>", "unclosed_tool_call", 1),
        ("<tool_call><tool_code>crop_video(1, 2)</tool_code></tool_call>", "nested_tags", 1),
        ("<think>call " + P.format_tool_call(1, 2) + " now</think>", "nested_tags", 0),
        ("<think>maybe <answer>B</answer></think>", "nested_tags", 0),
    ],
)
def test_problems(text, kind, n_bad):
    t = parse(text)
    assert kind in kinds(t)
    assert len(t.bad_calls) == n_bad


def test_unknown_tool_is_a_call_that_crop_args_refuses():
    t = parse('<tool_call>{"name": "zoom", "arguments": {"start_time": 1, "end_time": 2}}</tool_call>')
    assert [c.name for c in t.calls] == ["zoom"]
    with pytest.raises(ToolCallError, match="unknown tool 'zoom'"):
        crop_args(t.calls[0])


def test_bad_json_problem_carries_offending_text():
    t = parse("<tool_call>{start_time: 5}</tool_call>")
    assert "{start_time: 5}" in t.problems[0].detail
    assert t.bad_calls == [("{start_time: 5}", t.problems[0].detail)]


def test_truncated_second_object_is_reported_not_dropped():
    t = parse('<tool_call>{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}\n'
              '{"name": "crop_video", "argu</tool_call>')
    assert spans(t) == [(1.0, 2.0)] and kinds(t) == ["bad_json"] and "argu" in t.bad_calls[0][1]


# Turns the paradox testbed's cold start wrote at τ = 0.7 (rollouts of runs/paradox_gap_oncold), cut
# to their calls: paravt reads their good calls; the release's all-or-nothing reader reads none.
SAMPLED_KEY_TYPO = ('llel.</think>\n<tool_call>\n{"name": "crop_video", "crop_time": {"start_time": 14, "end_time": 14}}'
                    '\n</tool_call>\n<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 0, "end_time": 30}}'
                    '\n</tool_call>')
SAMPLED_LOST_OPEN = ('in par\n<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 14, "end_time": 16}}\n'
                     '</tool_call>\n{"name": "crop_video", "arguments": {"start_time": 15, "end_time": 40}}\n</tool_call>\n'
                     '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 21., "end_time": 47}}\n</tool_call>')


@pytest.mark.parametrize("text, problem", [
    ("no calls here <answer>B</answer>", None),
    (P.format_tool_call(1, 2) + P.format_tool_call(3, 4), None),
    ('<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 1, "end_time": 2}}\n</tool_call>', None),
    (P.format_tool_call(1, 2) + "<tool_call>{not json}</tool_call>", "tool call 2 is not one JSON object"),
    # unclosed: the release's regex reads it to the end of the text, where the trailing prose spoils it
    (P.format_tool_call(1, 2) + '<tool_call>{"name": "crop_video", "arguments": {"start_time": 3}} then',
     "tool call 2 is not one JSON object"),
    ('<tool_call>{"name": "crop_video", "arguments": {"start_time": 3, "end_time": 5}}', None),  # unclosed, whole
    ('<tool_call>{"name": "crop_video", "start_time": 1, "end_time": 2}</tool_call>', 'lacks "name" or "arguments"'),
    (P.format_tool_call(1, 2) + "<tool_call>[1, 2]</tool_call>", 'tool call 2 lacks "name" or "arguments"'),
    # lenient forms parse reads and the release does not: two objects in a block, a Python-literal dict
    ('<tool_call>{"name": "crop_video", "arguments": {}} {"name": "crop_video", "arguments": {}}</tool_call>',
     "not one JSON object"),
    ("<tool_call>{'name': 'crop_video', 'arguments': {}}</tool_call>", "not one JSON object"),
    (SAMPLED_KEY_TYPO, 'tool call 1 lacks "name" or "arguments"'),
    (SAMPLED_LOST_OPEN, "tool call 2 is not one JSON object"),  # `21.`; the block without its open tag is prose
])
def test_strict_calls_read_a_turn_all_or_nothing(text, problem):
    calls, why = P.strict_calls(text)
    if problem is None:
        assert why is None and (calls is None) == (P.TOOL_CALL_OPEN not in text)
        if text.count(P.TOOL_CALL_OPEN) == text.count(P.TOOL_CALL_CLOSE):  # else: the next test
            assert [(c.name, c.arguments) for c in calls or []] == [(c.name, c.arguments) for c in P.parse(text).calls]
    else:
        assert calls is None and problem in why
        assert P.parse(text).calls, "parse still reads the turn's good calls"


def test_strict_calls_read_an_unclosed_last_call_as_the_release_does():
    """The release's regex runs an unclosed last block to the end of the text, so a complete object there
    is a call it runs (3 of 24,780 sampled turns of the paradox runs); parse calls it unclosed."""
    text = P.format_tool_call(0, 10) + '\n<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 5, "end_time": 9}}\n'
    calls, why = P.strict_calls(text)
    assert why is None and [c.arguments["start_time"] for c in calls] == [0, 5]
    assert [c.arguments["start_time"] for c in P.parse(text).calls] == [0]


def test_calls_inside_think_are_kept_but_flagged():
    t = parse("<think>I check " + P.format_tool_call(1, 2) + "</think>")
    assert spans(t) == [(1.0, 2.0)] and "nested_tags" in kinds(t) and not t.bad_calls


def test_unclosed_think_ends_at_the_first_call_or_answer():
    t = parse("<think>look closer " + P.format_tool_call(1, 2))
    assert t.think == "look closer" and not t.think_closed and spans(t) == [(1.0, 2.0)]
    t = parse("<think>it is red<answer>B</answer>")
    assert t.think == "it is red" and t.answer == "B"


def test_last_complete_answer_wins_over_an_unclosed_one():
    t = parse("<answer>A</answer><answer>C")
    assert t.answer == "A" and t.answer_closed


# ---- tag structure helpers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, blocks, open_at_end, balanced",
    [
        ("<think>a</think><answer>B</answer>", [("a", True)], False, True),
        ("<think>a", [("a", False)], True, False),
        ("<think>a</think>x<think>b", [("a", True), ("b", False)], True, False),
        ("<think><think>a</think>", [("<think>a", True)], False, False),  # repeated open continues the block
        ("</think><think>a</think>", [("a", True)], False, False),  # stray close ignored, but unbalanced
        ("<think>a</think></think>", [("a", True)], False, False),
        ("<answer><think>x</answer></think>", [("x</answer>", True)], False, False),  # crossed pairs
        ("<think>a<tool_call>{}</tool_call></think>", [("a<tool_call>{}</tool_call>", True)], False, True),
        ("no tags", [], False, True),
    ],
)
def test_tag_structure(text, blocks, open_at_end, balanced):
    assert P.think_blocks(text) == blocks
    assert P.think_open_at_end(text) is open_at_end
    assert P.tags_balanced(text) is balanced


# ---- tool arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [(12, 12.0), (12.5, 12.5), ("12.5", 12.5), (" 7 ", 7.0), ("01:30", 90.0), ("1:02:03", 3723.0),
     ("1:30.5", 90.5), ("75s", 75.0), ("75 seconds", 75.0), ("75 sec", 75.0), ("1m30s", 90.0),
     ("2 min", 120.0), ("1h", 3600.0), ("1e2", 100.0)],
)
def test_parse_seconds(value, seconds):
    assert P.parse_seconds(value) == seconds


@pytest.mark.parametrize("value", ["abc", "", "12,5", "1:2:3:4", None, [1], {"t": 1}, True, float("inf"), "nan"])
def test_parse_seconds_rejects(value):
    with pytest.raises(ToolCallError):
        P.parse_seconds(value)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"start_time": 5, "end_time": 5}, "smaller than"),
        ({"start_time": 9, "end_time": 5}, "smaller than"),
        ({"start_time": -1, "end_time": 5}, "negative"),
        ({"start_time": 120, "end_time": 130}, "outside the video, which lasts 120.0 seconds"),
        ({"start_time": "abc", "end_time": 5}, "cannot read 'abc'"),
        ({"end_time": 5}, "needs start_time and end_time"),
        ({}, "needs start_time and end_time"),
        ({"start_time": 1, "end_time": 5, "num_frames": 0}, "at least 1"),
        ({"start_time": 1, "end_time": 5, "num_frames": 2.5}, "whole number"),
        ({"start_time": 1, "end_time": 5, "num_frames": "many"}, "whole number"),
        ({"start_time": True, "end_time": 5}, "number of seconds"),
        ({"start_time": float("nan"), "end_time": 5}, "finite"),
    ],
)
def test_crop_args_errors(args, message):
    with pytest.raises(ToolCallError, match=message):
        crop_args(ToolCall("crop_video", args), duration=120.0)


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"start_time": 100, "end_time": 500}, (100.0, 120.0, None)),  # end clamped to the duration
        ({"start": "1:00", "end": "1:10", "num_frames": "4"}, (60.0, 70.0, 4)),
        ({"start_time": "10s", "end_time": 20, "num_frames": 8.0}, (10.0, 20.0, 8)),
        ({"start_time": 0, "end_time": 0.5}, (0.0, 0.5, None)),
    ],
)
def test_crop_args(args, expected):
    a = crop_args(ToolCall("crop_video", args), 120.0)
    assert (a.start, a.end, a.num_frames) == expected


def test_crop_args_ignores_video_path():
    a = crop_args(ToolCall("crop_video", {"start_time": 1, "end_time": 2, "video_path": "/etc/passwd"}), 120.0)
    assert (a.start, a.end) == (1.0, 2.0) and not hasattr(a, "video_path")
    assert "video_path" not in P.CROP_VIDEO_TOOL["function"]["parameters"]["properties"]


# ---- formatting ----------------------------------------------------------------------------------


def test_format_round_trip():
    text = "<think>look</think>" + P.format_tool_call(12.5, 30) + P.format_tool_call(40, 50, num_frames=4)
    t = parse(text)
    assert [(crop_args(c).start, crop_args(c).end, crop_args(c).num_frames) for c in t.calls] == [
        (12.5, 30.0, None), (40.0, 50.0, 4)]
    assert P.format_tool_call(1 / 3, 2) == '<tool_call>\n{"name": "crop_video", "arguments": {"start_time": 0.33, "end_time": 2}}\n</tool_call>'
    assert t.calls[0].to_text() == P.format_tool_call(12.5, 30)


def test_response_and_timestamp_formats():
    assert P.format_tool_response("  a red circle \n") == "<tool_response>\na red circle\n</tool_response>"
    assert P.format_tool_responses(["a", "b"]) == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    assert P.format_error(" start_time 5 must be smaller than end_time 5 ") == "Error: start_time 5 must be smaller than end_time 5"
    assert (P.timestamp_text(12.54), P.timestamp_text(0), P.timestamp_text(3599.96)) == (
        "<12.5 seconds>", "<0.0 seconds>", "<3600.0 seconds>")


# ---- prompts -------------------------------------------------------------------------------------


def test_system_prompts_per_mode():
    prompts = {m: P.system_prompt(m, 5) for m in P.PROMPT_KINDS}
    assert len(set(prompts.values())) == len(P.PROMPT_KINDS) - 1  # "reasoning" is "none"
    assert prompts["reasoning"] == prompts["none"]
    for m in ("parallel", "sequential", "inline"):
        p = prompts[m]
        full = P.main_system(m, 5)
        assert full.startswith(p + "\n\n# Tools\n\nYou may call one or more functions")  # Qwen's native block
        schema = json.loads(full.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
        assert schema == P.tool_schema(m) and "<tools>" not in p
        assert all(tag in p for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>"))
        assert parse(p.split("or\n", 1)[0].rsplit("</think>\n", 1)[1]).calls  # the example call parses
    assert "up to 5 calls" in prompts["parallel"] and "up to 3 calls" in P.system_prompt("parallel", 3)
    assert "once per reply" in prompts["sequential"] and "several times" not in prompts["sequential"]
    assert "frames of its window" in prompts["inline"] and "helper" not in prompts["inline"]
    assert "helper" in prompts["parallel"]
    for m in ("none", "direct"):
        assert P.main_system(m) == prompts[m]
        assert "crop_video" not in prompts[m] and "<tool_call>" not in prompts[m] and "<answer>" in prompts[m]
    assert "<think>" in prompts["none"] and "<think>" not in prompts["direct"]
    with pytest.raises(ValueError, match="unknown prompt mode"):
        P.system_prompt("bogus")
    with pytest.raises(ValueError, match="max_parallel"):
        P.system_prompt("parallel", 0)


@pytest.mark.parametrize("qtype, needle", [("mcq", "letter"), ("tvg", "'start - end'"), ("oe", "short phrase")])
def test_user_prompt_and_answer_instructions(qtype, needle):
    text = P.user_prompt_text(" Which colour? ", 312.54, qtype)
    assert text.startswith("The video lasts 312.5 seconds.") and "Question: Which colour?" in text
    assert text.endswith(P.answer_instruction(qtype)) and needle in text
    # the answer instruction is the same whatever the mode (the release's eval swapped those of its tool
    # and no-tool prompts), and the final nudge repeats it
    assert P.final_answer_instruction(qtype).endswith(P.answer_instruction(qtype))
    assert "cannot call the tool" in P.final_answer_instruction(qtype)


def test_user_prompt_subtitles_come_before_the_question():
    text = P.user_prompt_text("Q?", 60, "mcq", subtitles="hello there")
    assert text.index("Subtitles of the video:\nhello there") < text.index("Question: Q?")
    assert "Subtitles" not in P.user_prompt_text("Q?", 60, "mcq", subtitles="  ")
    with pytest.raises(ValueError, match="question_type"):
        P.user_prompt_text("Q?", 60, "essay")


def test_subagent_prompt():
    p = P.subagent_prompt(12, 20.25, "Which colour?")
    assert "between 12.0 and 20.2 seconds" in p and "Which colour?" in p and "when" in p
    assert "question" not in P.subagent_prompt(12, 20, None)


# ---- extract_answer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("<think>x</think><answer> C </answer>", "C"),
        ("<think>x</think>\nThe answer is B", "The answer is B"),
        ("<think>x</think>\nB\n\nbecause it is red", "B because it is red"),
        ("<think>still thinking", None),
        ("<answer>A</answer> then <answer>D</answer>", "D"),
        ("<think>x</think><answer>12.5 - 20", "12.5 - 20"),
        ("<think>x</think>" + P.format_tool_call(1, 2), None),  # a call is not an answer
        ("<think>x</think><answer></answer>", None),
        ("", None),
        ("just B", "just B"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


# ---- parse never raises -------------------------------------------------------------------

pieces = st.sampled_from(list(P.ALL_TAGS) + ["{", "}", "[", "]", '"', ":", ",", "crop_video(", ")", "\n", "'",
                                             '{"name": "crop_video"', '"arguments": ', '{"start_time": 1', "\\",
                                             "\x00", "é", "```", "python"])
fragments = st.lists(st.one_of(pieces, st.text(max_size=8)), max_size=40).map("".join)


def _check(text: str, prefix: str = "") -> P.Turn:
    t = parse(text, prefix=prefix)
    assert isinstance(t, P.Turn) and isinstance(t.problems, list)
    assert all(isinstance(c.arguments, dict) and isinstance(c.name, str) for c in t.calls)
    for c in t.calls:
        try:
            crop_args(c, 100.0)
        except ToolCallError:
            pass
    extract_answer(text)
    P.tags_balanced(text), P.think_blocks(text)
    return t


@settings(max_examples=250, deadline=None, derandomize=True)
@given(fragments, st.sampled_from(["", P.THINK_PREFIX]))
def test_parse_never_raises_on_random_text(text, prefix):
    _check(text, prefix)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["name", "arguments", "function", "start_time", "end_time", "num_frames", "start", "end"]), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_parse_never_raises_on_random_json_calls(value):
    body = json.dumps(value)
    _check(f"<think>x</think><tool_call>{body}</tool_call>")
    _check(f'<tool_call>{{"name": "crop_video", "arguments": {body}}}</tool_call>')
    _check(f"<tool_code>crop_video({body[:40]})</tool_code>")


def test_parse_never_raises_on_every_truncation():
    for turn in VALID_TURNS:
        for n in range(len(turn) + 1):
            t = _check(turn[:n], P.THINK_PREFIX)
            assert len(t.calls) <= 2
        assert len(parse(turn).calls) == turn.count("crop_video")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 8), st.integers(1, 4), st.sampled_from(list(P.ALL_TAGS)))
def test_nested_and_repeated_tags(depth, reps, tag):
    inner = VALID
    for _ in range(depth):
        inner = tag + inner + tag
    t = _check(inner * reps + "<think>" * depth + "<tool_call>" * depth)
    assert "unclosed_tool_call" in kinds(t)


def test_deeply_nested_json_does_not_crash():
    _check("<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>")
    _check("<tool_call>" + "{'a': " * 3000 + "1" + "}" * 3000 + "</tool_call>")
    _check("<tool_code>crop_video(" + "(" * 3000 + "1" + ")" * 3000 + ")</tool_code>")


def test_adversarial_inputs_stay_fast():
    import time

    from paravt.rewards import score_episode

    texts = ["<tool_call>" * 5000, "<think>a</think>" * 2500 + "<tool_call>{}</tool_call>" * 800,
             "<think>a<answer>b</answer></think>" * 1200, "<answer>" * 5000 + "</answer>",
             "<tool_code>crop_video(1,2)</tool_code>" * 500]
    started = time.perf_counter()
    for text in texts:
        _check(text)
        score_episode([text], "B", "B", "mcq", 0, 0)
    assert time.perf_counter() - started < 20  # a guard against hangs: well under 1 s on an idle core


# ---- prompt profiles ------------------------------------------------------------------------------


def test_native_tool_block_joins_a_system_text_as_the_chat_template_does():
    block = P.native_tools_block([P.CROP_VIDEO_TOOL])
    assert block.startswith("# Tools\n\nYou may call one or more functions to assist with the user query.")
    assert block.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    assert P.with_tools("Be brief.", [P.CROP_VIDEO_TOOL]) == "Be brief.\n\n" + block
    assert P.with_tools(None, [P.CROP_VIDEO_TOOL]) == block
    # a row prompt that already declares its tools is kept as it is (no second block)
    assert P.with_tools("x\n<tools>\n{}\n</tools>", [P.CROP_VIDEO_TOOL]) == "x\n<tools>\n{}\n</tools>"


def test_a_rows_own_system_prompt_replaces_the_profile_instructions():
    s = P.main_system("parallel", 5, "paravt", system="You are a careful video agent.")
    assert s.startswith("You are a careful video agent.\n\n# Tools") and P.system_prompt("parallel") not in s
    assert P.main_system("none", 5, "paravt", system="Row prompt.") == "Row prompt."


def test_official_profile_reproduces_the_release_layout():
    s = P.main_system("parallel", 5, "official")
    assert s.startswith("# Tools\n")  # no system text of ours: only the release's tool block
    tool = json.loads(s.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
    assert tool == P.OFFICIAL_CROP_VIDEO_TOOL and set(tool["function"]["parameters"]) == {"video_path", "start_time",
                                                                                           "end_time"}
    assert P.main_system("parallel", 5, "official", system="Row.").startswith("Row.\n\n# Tools")
    assert P.main_system("none", 5, "official") is None
    sub = P.subagent_prompt(65, 80.5, "Which colour?", profile="official")
    assert sub.startswith("You are analyzing a video segment from 01:05 to 01:20 (duration: 15.5 seconds).")
    assert sub.endswith("Summary:") and "Which colour?" not in sub
    # the tool prompt's answer instruction (the public eval gave it to the no-tool prompt)
    u = P.user_prompt_text("Q?\nA. x\nB. y", 60, "mcq", profile="official")
    assert u.startswith("Q?\nA. x") and "use crop_video if needed" in u and "<answer>X</answer>" in u
    assert P.final_answer_instruction("mcq", "official") == "Based on the video and cropped segments above, answer with ONLY the letter."
    with pytest.raises(ValueError, match="prompt profile"):
        P.main_system("parallel", 5, "bogus")
