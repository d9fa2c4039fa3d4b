"""The tool-call protocol: tags, tool schema, prompts, parsing. The only module that spells the tags.

A main-agent turn is `<think>…</think>` followed by either `<answer>…</answer>` or one or more
`<tool_call>{"name": "crop_video", "arguments": {...}}</tool_call>` blocks (Hermes style).
Models with a Qwen prior sometimes leak `<tool_code>crop_video(start_time=…, end_time=…)</tool_code>`;
we accept that too (read with `ast`, never evaluated). `parse` never raises: anything it cannot
read becomes a `Problem`, and a call it cannot read is kept in `Turn.bad_calls` so that the
episode can answer it with an error inside its own `<tool_response>` (SPEC §1.6).
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
from dataclasses import asdict, dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOL_CODE_OPEN, TOOL_CODE_CLOSE = "<tool_code>", "</tool_code>"

ALL_TAGS = (
    THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE, TOOL_CODE_OPEN, TOOL_CODE_CLOSE,
)
TAG_PAIRS = (
    (THINK_OPEN, THINK_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE), (TOOL_CALL_OPEN, TOOL_CALL_CLOSE),
    (TOOL_CODE_OPEN, TOOL_CODE_CLOSE), (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE),
)
# Positions where Exploration Anchoring applies the format signal (SPEC §3): the closures that
# decay under temperature sampling, and the tool-call boundaries.
STRUCTURAL_TAGS = (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

THINK_PREFIX = THINK_OPEN + "\n"
TOOL_NAME = "crop_video"
QUESTION_TYPES = ("mcq", "tvg", "oe")
MODES = ("parallel", "sequential", "inline", "none")  # dispatch modes (SPEC §1)
PROMPT_KINDS = MODES + ("reasoning", "direct")  # system prompts: "reasoning" = "none"; "direct" = no think
MAX_CALL_FRAMES = 16  # a sub-agent sees at most this many frames of its window (SPEC §1.3)

CROP_VIDEO_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Look closely at one time window of the video. A helper watches the window at one frame per "
            f"second (at most {MAX_CALL_FRAMES} frames, spread evenly over longer windows) and replies with "
            "a short factual summary of what appears and when."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "start_time": {"type": "number", "description": "Window start, in seconds from the beginning of the video."},
                "end_time": {"type": "number", "description": "Window end, in seconds; must be after start_time."},
                "num_frames": {
                    "type": "integer",
                    "description": f"Optional number of frames to sample from the window (1-{MAX_CALL_FRAMES}).",
                },
            },
            "required": ["start_time", "end_time"],
        },
    },
}
# Deliberately no `video_path` parameter: the episode's own video is always the one cropped (SPEC §1.7).


@dataclass
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""

    def to_text(self) -> str:
        """The canonical Hermes block, as the chat templates of Qwen-family models write it."""
        body = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


@dataclass
class Problem:
    kind: str
    detail: str = ""


@dataclass
class Turn:
    """One generated turn, read. `think` is the first think block's body (up to the first
    <tool_call>/<answer> when it never closes); `answer` is the last complete answer, else an
    unclosed one; `calls` are the readable calls in order of appearance."""

    text: str
    think: str | None = None
    think_closed: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    answer_closed: bool = False
    problems: list[Problem] = field(default_factory=list)
    # calls that were written but could not be read, in order, as (raw text, what is wrong)
    bad_calls: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class ToolCallError(ValueError):
    """A tool call that cannot be executed; the message is written for the model to read."""


@dataclass
class CropArgs:
    start: float
    end: float
    num_frames: int | None = None


# ----------------------------------------------------------------------------------------------
# tag structure

_TAG_RE = re.compile("|".join(re.escape(t) for t in ALL_TAGS))
_THINK_RE = re.compile(re.escape(THINK_OPEN) + "|" + re.escape(THINK_CLOSE))
_OPENERS = {a: b for a, b in TAG_PAIRS}
_CLOSERS = {b: a for a, b in TAG_PAIRS}


def think_spans(text: str) -> list[tuple[int, int, bool]]:
    """(body start, body end, closed) of each think block, in order; a closed body ends where its
    `</think>` starts, an unclosed one at the end of the text. A `<think>` repeated while one is
    open (e.g. a model re-writing the forced prefix) continues the open block; a stray `</think>`
    with nothing open is ignored."""
    spans: list[tuple[int, int, bool]] = []
    start = -1
    for m in _THINK_RE.finditer(text):
        if m.group() == THINK_OPEN:
            if start < 0:
                start = m.end()
        elif start >= 0:
            spans.append((start, m.start(), True))
            start = -1
    if start >= 0:
        spans.append((start, len(text), False))
    return spans


def think_blocks(text: str) -> list[tuple[str, bool]]:
    """(body, closed) of each think block, in order (see `think_spans`); bodies keep inner tags."""
    return [(text[a:b], closed) for a, b, closed in think_spans(text)]


def think_open_at_end(text: str) -> bool:
    """Whether the text ends inside a think block (a `<think>` that is never closed)."""
    blocks = think_blocks(text)
    return bool(blocks) and not blocks[-1][1]


def tags_balanced(text: str) -> bool:
    """Every tag pair opens and closes in nesting order and nothing is left open."""
    stack: list[str] = []
    for m in _TAG_RE.finditer(text):
        tag = m.group()
        if tag in _OPENERS:
            stack.append(tag)
        elif not stack or stack.pop() != _CLOSERS[tag]:
            return False
    return not stack


def strip_tags(text: str) -> str:
    """The text with every protocol tag removed (their bodies kept)."""
    return _TAG_RE.sub("", text)


# ----------------------------------------------------------------------------------------------
# parsing


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(offset, body) of closed open…close blocks, and of blocks opened but never closed (an open
    tag followed by another open tag before any close counts as never closed)."""
    closed, unclosed = [], []
    pos, j = 0, -1
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            break
        body_start = i + len(open_tag)
        if j < body_start and j != -2:  # the next close, searched once per close (-2: there is none left)
            j = text.find(close_tag, body_start)
            j = -2 if j < 0 else j
        nxt = text.find(open_tag, body_start)
        if j == -2 or 0 <= nxt < j:
            end = len(text) if nxt < 0 else nxt
            unclosed.append((i, text[body_start:end]))
            if nxt < 0:
                break
            pos = nxt
            continue
        closed.append((i, text[body_start:j]))
        pos = j + len(close_tag)
    return closed, unclosed


def _short(s: str, n: int = 200) -> str:
    s = s.strip()
    return repr(s if len(s) <= n else s[:n] + "…")


_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def _call_from_obj(obj, raw: str) -> tuple[ToolCall | None, Problem | None]:
    """A ToolCall from one decoded object: {"name", "arguments"} (arguments may be a JSON string),
    OpenAI's {"function": {...}} wrapper, or the arguments written beside the name."""
    if not isinstance(obj, dict):
        return None, Problem("bad_call", f"a tool call must be a JSON object with name and arguments: {_short(raw)}")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name", obj.get("function"))
    if "arguments" in obj or "parameters" in obj:
        args = obj.get("arguments", obj.get("parameters"))
    else:
        args = {k: v for k, v in obj.items() if k not in ("name", "function", "type", "id")}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None, Problem("bad_arguments", f"the arguments are not valid JSON: {_short(args)}")
    if args is None:
        args = {}
    if not isinstance(name, str) or not name.strip():
        return None, Problem("bad_call", f"the tool call has no function name: {_short(raw)}")
    if not isinstance(args, dict):
        return None, Problem("bad_arguments", f"the arguments must be a JSON object: {_short(raw)}")
    return ToolCall(name=name.strip(), arguments=args, raw=raw), None


def _decode_objects(s: str) -> tuple[list, str]:
    """Consecutive JSON values in `s` (separated by whitespace or commas) and the unread rest.
    Models sometimes put several calls in one block, or prose after the object."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(s) and (s[i].isspace() or s[i] == ","):
            i += 1
        if i >= len(s) or s[i] not in "{[":
            return out, s[i:]
        try:
            obj, i = dec.raw_decode(s, i)
        except (ValueError, RecursionError):
            return out, s[i:]
        out.append(obj)


def _read_json_calls(body: str) -> tuple[list[ToolCall], list[Problem]]:
    s = _FENCE_RE.sub("", body.strip())
    if not s:
        return [], [Problem("bad_json", "the tool call is empty")]
    objs, rest = _decode_objects(s)
    if not objs and s[:1] in "{[":
        # a Python-literal dict (single quotes, True/None), read safely with literal_eval
        try:
            objs, rest = [ast.literal_eval(s)], ""
        except Exception:  # literal_eval raises many types (SyntaxError, ValueError, RecursionError, ...)
            objs = []
    if not objs:
        return [], [Problem("bad_json", f"the tool call is not valid JSON: {_short(body)}")]
    flat = [o for obj in objs for o in (obj if isinstance(obj, list) else [obj])]
    calls, problems = [], []
    for obj in flat:
        call, problem = _call_from_obj(obj, body)
        if call is not None:
            calls.append(call)
        if problem is not None:
            problems.append(problem)
    if "{" in rest:  # an unreadable object after readable ones (e.g. a second, truncated call)
        problems.append(Problem("bad_json", f"part of the tool call is not valid JSON: {_short(rest)}"))
    return calls, problems


def _read_code_calls(body: str) -> tuple[list[ToolCall], list[Problem]]:
    """`crop_video(start_time=1, end_time=2)` (one per line) read with ast; never evaluated."""
    s = _FENCE_RE.sub("", body.strip())
    if s.startswith("python\n"):
        s = s[len("python\n"):]
    try:
        tree = ast.parse(s, mode="exec")
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return [], [Problem("bad_json", f"the tool code is not a function call: {_short(body)}")]
    calls, problems = [], []
    for stmt in tree.body:
        node = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if not isinstance(node, ast.Call):
            problems.append(Problem("bad_call", f"the tool code is not a function call: {_short(body)}"))
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
        if not name:
            problems.append(Problem("bad_call", f"the tool code calls no named function: {_short(body)}"))
            continue
        try:
            positional = [ast.literal_eval(a) for a in node.args]
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        except Exception:
            problems.append(Problem("bad_arguments", f"the tool code arguments must be literal values: {_short(body)}"))
            continue
        for key, value in zip(("start_time", "end_time", "num_frames"), positional):
            args.setdefault(key, value)
        calls.append(ToolCall(name=name, arguments=args, raw=body))
    if not tree.body:
        problems.append(Problem("bad_json", "the tool code is empty"))
    return calls, problems


def parse(text: str, prefix: str = "") -> Turn:
    """Read one generated turn. `prefix` is a forced start (e.g. THINK_PREFIX) that the model
    did not generate but that is part of its turn: it counts as present (SPEC §6.2)."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    full = (prefix or "") + text
    turn = Turn(text=full)
    try:
        _fill(turn, full)
    except Exception as e:  # defensive: parse must never raise
        turn.problems.append(Problem("parser_error", f"{type(e).__name__}: {e}"))
    return turn


def _fill(turn: Turn, full: str) -> None:
    # think: the first block
    spans = think_spans(full)
    if spans:
        a, b, closed = spans[0]
        body = full[a:b]
        if not closed:
            ends = [k for k in (body.find(TOOL_CALL_OPEN), body.find(ANSWER_OPEN), body.find(TOOL_CODE_OPEN)) if k >= 0]
            body = body[: min(ends)] if ends else body
            turn.problems.append(Problem("unclosed_think", "<think> is never closed"))
        turn.think, turn.think_closed = body.strip(), closed
        if full.count(THINK_OPEN) > 1:
            turn.problems.append(Problem("repeated_think", f"{full.count(THINK_OPEN)} <think> tags"))
    first_open, first_close = full.find(THINK_OPEN), full.find(THINK_CLOSE)
    if first_close >= 0 and (first_open < 0 or first_close < first_open):
        turn.problems.append(Problem("unopened_think", "</think> without <think>"))
    inside_think = [(a, b) for a, b, closed in spans if closed]
    think_starts = [a for a, _ in inside_think]

    def in_think(pos: int) -> bool:  # closed think bodies are sorted and disjoint: binary search
        k = bisect.bisect_right(think_starts, pos) - 1
        return k >= 0 and pos < inside_think[k][1]

    # tool calls (Hermes JSON, then leaked tool_code), in order of appearance
    found: list[tuple[int, list[ToolCall], list[Problem], str]] = []
    for open_tag, close_tag, reader in (
        (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, _read_json_calls),
        (TOOL_CODE_OPEN, TOOL_CODE_CLOSE, _read_code_calls),
    ):
        closed_blocks, unclosed_blocks = _blocks(full, open_tag, close_tag)
        for pos, body in closed_blocks:
            calls, problems = reader(body)
            if TOOL_CALL_OPEN in body or TOOL_CODE_OPEN in body:
                problems.append(Problem("nested_tags", f"a tool call inside a tool call: {_short(body)}"))
            found.append((pos, calls, problems, body))
        for pos, body in unclosed_blocks:
            problem = Problem("unclosed_tool_call", f"{open_tag} is never closed with {close_tag}: {_short(body, 120)}")
            found.append((pos, [], [problem], body))
    found.sort(key=lambda x: x[0])
    for pos, calls, problems, body in found:
        if in_think(pos):
            turn.problems.append(Problem("nested_tags", "a tool call inside <think>"))
        for call in calls:
            if call.name != TOOL_NAME:
                turn.problems.append(Problem("unknown_tool", f"unknown tool {call.name!r}"))
            turn.calls.append(call)
        for problem in problems:
            turn.problems.append(problem)
            if problem.kind != "nested_tags":
                turn.bad_calls.append((body, problem.detail))

    # answer: the last complete one wins
    closed_answers, unclosed_answers = _blocks(full, ANSWER_OPEN, ANSWER_CLOSE)
    if closed_answers:
        turn.answer = closed_answers[-1][1].strip()
        turn.answer_closed = True
        if len(closed_answers) > 1:
            turn.problems.append(Problem("multiple_answers", f"{len(closed_answers)} answers; the last is used"))
    elif unclosed_answers:
        turn.answer = unclosed_answers[-1][1].strip()
        turn.problems.append(Problem("unclosed_answer", "<answer> is never closed"))
    elif ANSWER_CLOSE in full:
        turn.problems.append(Problem("unopened_answer", "</answer> without <answer>"))
    for pos, _ in closed_answers + unclosed_answers:
        if in_think(pos):
            turn.problems.append(Problem("nested_tags", "<answer> inside <think>"))
            break


# ----------------------------------------------------------------------------------------------
# tool arguments

_CLOCK_RE = re.compile(r"^(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_UNITS_RE = re.compile(
    r"^(?:(\d+(?:\.\d+)?)\s*h(?:ours?|rs?)?)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in(?:utes?)?)?)?\s*"
    r"(?:(\d+(?:\.\d+)?)\s*s(?:ec(?:ond)?s?)?)?$"
)


def parse_seconds(value) -> float:
    """Seconds from a number, a numeric string, 'MM:SS', 'HH:MM:SS', '75s', '1m30s' or '2 min'."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ToolCallError(f"a time must be a number of seconds, got {value!r}")
    if isinstance(value, str):
        s = value.strip().lower()
        m = _CLOCK_RE.match(s)
        u = _UNITS_RE.match(s) if s and not m else None
        if m:
            h, mnt, sec = m.groups()
            v = int(h or 0) * 3600 + int(mnt) * 60 + float(sec)
        elif u and any(u.groups()):
            h, mnt, sec = (float(x) if x else 0.0 for x in u.groups())
            v = h * 3600 + mnt * 60 + sec
        else:
            try:
                v = float(s)
            except ValueError:
                raise ToolCallError(f"cannot read {value!r} as a time in seconds") from None
    else:
        v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ToolCallError(f"a time must be a finite number of seconds, got {value!r}")
    return v


def crop_args(call: ToolCall, duration: float | None = None) -> CropArgs:
    """Validated arguments of a crop_video call; the end is clamped to the video's duration.

    Any `video_path` argument is ignored: the episode's own video is always the one cropped
    (a model must never choose a file on the host, SPEC §1.7)."""
    if call.name != TOOL_NAME:
        raise ToolCallError(f"unknown tool {call.name!r}; the only tool is {TOOL_NAME}")
    a = call.arguments if isinstance(call.arguments, dict) else {}
    start_v = a.get("start_time", a.get("start"))
    end_v = a.get("end_time", a.get("end"))
    if start_v is None or end_v is None:
        raise ToolCallError(f"{TOOL_NAME} needs start_time and end_time, in seconds")
    start, end = parse_seconds(start_v), parse_seconds(end_v)
    if start < 0:
        raise ToolCallError(f"start_time {start:g} is negative; times count from 0 seconds")
    if start >= end:
        raise ToolCallError(f"start_time {start:g} must be smaller than end_time {end:g}")
    if duration is not None:
        if start >= duration:
            raise ToolCallError(f"start_time {start:g} is outside the video, which lasts {duration:.1f} seconds")
        end = min(end, duration)
    n = a.get("num_frames")
    num_frames = None
    if n is not None:
        if isinstance(n, bool):
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}")
        try:
            f = float(n)
        except (TypeError, ValueError):
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}") from None
        if not f.is_integer():
            raise ToolCallError(f"num_frames must be a whole number, got {n!r}")
        num_frames = int(f)
        if num_frames < 1:
            raise ToolCallError(f"num_frames must be at least 1, got {num_frames}")
    return CropArgs(start=start, end=end, num_frames=num_frames)


# ----------------------------------------------------------------------------------------------
# formatting


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def format_tool_call(start: float, end: float, num_frames: int | None = None) -> str:
    args: dict = {"start_time": _num(start), "end_time": _num(end)}
    if num_frames is not None:
        args["num_frames"] = int(num_frames)
    return ToolCall(TOOL_NAME, args).to_text()


def format_tool_response(text: str) -> str:
    return f"{TOOL_RESPONSE_OPEN}\n{text.strip()}\n{TOOL_RESPONSE_CLOSE}"


def format_tool_responses(texts: list[str]) -> str:
    """All responses of one turn, in call order, as the content of one user turn."""
    return "\n".join(format_tool_response(t) for t in texts)


def format_error(message: str) -> str:
    """The text a failed call returns (inside its own tool_response): the model reads it."""
    return f"Error: {message.strip()}"


def timestamp_text(t: float) -> str:
    return f"<{t:.1f} seconds>"


# ----------------------------------------------------------------------------------------------
# prompts
#
# Two prompt profiles, one episode loop (EpisodeConfig.prompts):
# - "paravt": our own instructions; the tool is declared through Qwen's native tool block (what a
#   Qwen3-VL-Instruct checkpoint's chat template renders for `tools=`), all tool responses of a turn
#   in one user message, laid out as that template lays out consecutive `tool` messages.
# - "official": the layout ParaVT-8B was RL-trained with (the public release's RL workflow): the
#   native tool block appended to the row's own system prompt, a `crop_video` schema with
#   `video_path`, one user message per tool response, and the release's sub-agent prompt (frames
#   without timestamps, the window as MM:SS, no question). Where the public EVALUATION prompt
#   differs from training (SPEC §6.7: no timestamps on the overview, answer instructions swapped),
#   this profile follows training.

PROMPT_PROFILES = ("paravt", "official")

# Qwen's native tool declaration, exactly as the Qwen2.5 / Qwen3 / Qwen3-VL chat templates render it
# for `tools=`. Kept character-for-character: it is the text those checkpoints learned to read, and a
# system message that carries it renders to the same tokens as the template given `tools=`
# (tests/test_chat_template.py checks that against the template itself).
_NATIVE_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_NATIVE_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)


def native_tools_block(tools: list[dict]) -> str:
    """The native tool block for `tools` (one JSON object per line, as the template's `tojson`)."""
    return _NATIVE_TOOLS_HEAD + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _NATIVE_TOOLS_TAIL


def with_tools(system: str | None, tools: list[dict]) -> str:
    """A system text with the native tool block after it, as the chat template joins them; a text
    that already declares tools (`<tools>`, e.g. a training row's own prompt) is kept as it is."""
    if system and "<tools>" in system:
        return system
    block = native_tools_block(tools)
    return f"{system}\n\n{block}" if system else block


def tool_schema(mode: str = "parallel") -> dict:
    """The crop_video schema as a mode presents it: in `inline` mode the call returns the window's
    frames to the main agent itself, in the others a helper's summary (CROP_VIDEO_TOOL)."""
    if mode != "inline":
        return CROP_VIDEO_TOOL
    schema = json.loads(json.dumps(CROP_VIDEO_TOOL))
    schema["function"]["description"] = (
        f"Look closely at one time window of the video: its frames, one per second (at most {MAX_CALL_FRAMES}, "
        "spread evenly over longer windows), each labelled with its time, are shown to you."
    )
    return schema


_INTRO = (
    "You are a video analyst answering questions about a long video. You first see frames sampled evenly "
    "over the whole video, each labelled with its time in seconds, like <12.5 seconds>. Short events can "
    "fall between those frames, and small details are hard to read in them."
)

_TURN_SHAPE = (
    "Every reply starts with your reasoning inside <think> </think>. After </think> write either tool calls "
    "or the final answer, never both:\n"
    "<think>\nwhat the frames show, what is still uncertain, which moments to check\n</think>\n"
    "{calls}\n"
    "or\n"
    "<think>\nwhy the evidence settles the question\n</think>\n"
    "<answer>your answer</answer>\n"
    "Close every tag you open."
)


def system_prompt(mode: str, max_parallel: int = 5) -> str:
    """Our instructions to the main agent (profile "paravt"), without the tool declaration, which
    `main_system` appends as the native block. `mode` is a dispatch mode (parallel, sequential,
    inline, none) or "reasoning" (= none: think, then answer, no tool) or "direct" (answer only)."""
    if mode not in PROMPT_KINDS:
        raise ValueError(f"unknown prompt mode {mode!r}; choose one of {', '.join(PROMPT_KINDS)}")
    if mode in ("none", "reasoning"):
        return (
            "You are a video analyst answering questions about a video. You see frames sampled evenly over the "
            "whole video, each labelled with its time in seconds, like <12.5 seconds>. No tools are available: "
            "answer from these frames alone.\n\n"
            "First reason step by step inside <think> </think>: what each relevant frame shows and when. Then "
            "give the final answer inside <answer> </answer>, in the format the question asks for:\n"
            "<think>\nyour reasoning\n</think>\n<answer>your answer</answer>"
        )
    if mode == "direct":
        return (
            "You are a video analyst answering questions about a video. You see frames sampled evenly over the "
            "whole video, each labelled with its time in seconds, like <12.5 seconds>. Answer from these frames "
            "alone, at once and without explanation, inside <answer> </answer>, in the format the question "
            "asks for."
        )
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, got {max_parallel}")
    one_call = format_tool_call(30, 45)
    if mode == "sequential":
        calls = one_call
        how_many = (
            "Call the tool once per reply. Its result comes back in the next message; then decide whether to "
            "look at another window or to answer."
        )
    else:
        calls = one_call + "\n" + format_tool_call(120, 135)
        how_many = (
            f"You may call the tool several times in one reply, up to {max_parallel} calls, one "
            "<tool_call> </tool_call> block per window. All windows of a reply are examined at the same time and "
            "their results come back together, in the order of your calls, so when several moments could "
            "matter (the candidate moments of different options, or the parts of a long stretch) check them "
            f"in one reply. Calls beyond the first {max_parallel} are not run."
        )
    if mode == "inline":
        result = (
            f"The result of a call is the frames of its window (one per second, at most {MAX_CALL_FRAMES}, "
            "spread evenly over longer windows), each labelled with its time, inside <tool_response> </tool_response>."
        )
    else:
        result = (
            f"A helper watches each window at one frame per second (at most {MAX_CALL_FRAMES} frames, spread "
            "evenly over longer windows, so windows of up to about 16 seconds are seen in full detail) and "
            "replies with a short factual summary inside <tool_response> </tool_response>."
        )
    return (
        f"{_INTRO} When the frames do not settle the question, look closer with the {TOOL_NAME} tool, declared "
        f"below. Times are seconds from the start of the video. {result} {how_many} A call that cannot run "
        "returns an error message instead; the other calls are not affected.\n\n"
        + _TURN_SHAPE.format(calls=calls)
        + "\nAnswer without calling the tool when the frames you have already settle the question."
    )


def _check_profile(profile: str) -> None:
    if profile not in PROMPT_PROFILES:
        raise ValueError(f"unknown prompt profile {profile!r}; choose one of {', '.join(PROMPT_PROFILES)}")


def main_system(mode: str, max_parallel: int = 5, profile: str = "paravt", system: str | None = None) -> str | None:
    """The main agent's whole system text: the instructions (a data row's own system prompt when it
    has one, else the profile's), then the native tool block in the modes that have the tool.
    None when the profile has no system message (official, no tool, no row prompt)."""
    _check_profile(profile)
    tools = mode not in ("none", "reasoning", "direct")
    if profile == "official":
        return with_tools(system, [OFFICIAL_CROP_VIDEO_TOOL]) if tools else (system or None)
    text = system or system_prompt(mode, max_parallel)
    return with_tools(text, [tool_schema(mode)]) if tools else text


def answer_instruction(question_type: str) -> str:
    """How to write the answer for a question type; the same whether tools are used or not (SPEC §6.7)."""
    if question_type == "mcq":
        return "Answer with the letter of the correct option only, inside <answer> </answer>, e.g. <answer>B</answer>."
    if question_type == "tvg":
        return (
            "Answer with the start and end time of the moment in seconds, as 'start - end', inside "
            "<answer> </answer>, e.g. <answer>12.5 - 20.0</answer>."
        )
    if question_type == "oe":
        return "Answer with a short phrase inside <answer> </answer>, e.g. <answer>a red circle</answer>."
    raise ValueError(f"unknown question_type {question_type!r}; expected one of {', '.join(QUESTION_TYPES)}")


def user_prompt_text(question: str, duration: float, question_type: str, subtitles: str | None = None,
                     profile: str = "paravt") -> str:
    """The text that follows the overview frames in the first user turn."""
    _check_profile(profile)
    answer_instruction(question_type)  # validates the type in both profiles
    if profile == "official":
        parts = [("This video's subtitles are listed below:\n" + subtitles.strip())] if subtitles and subtitles.strip() else []
        parts.append(question.strip() + "\n" + _OFFICIAL_ANSWER[question_type])
        return "\n".join(parts)
    parts = [f"The video lasts {duration:.1f} seconds. The frames above are sampled evenly over it."]
    if subtitles and subtitles.strip():
        parts.append("Subtitles of the video:\n" + subtitles.strip())
    parts.append("Question: " + question.strip())
    parts.append(answer_instruction(question_type))
    return "\n\n".join(parts)


def subagent_prompt(start: float, end: float, task: str | None = None, profile: str = "paravt") -> str:
    """Instruction of a sub-agent that watches one window of the video (the official profile's
    sub-agent never sees the question)."""
    _check_profile(profile)
    if profile == "official":
        return _official_subagent_prompt(start, end)
    text = (
        f"These frames come from a video between {start:.1f} and {end:.1f} seconds; each is labelled with its "
        "time. Describe briefly and factually what appears in them and when: people and objects, their colours, "
        "shapes and positions, actions, scene changes, any visible text. Give times in seconds. Report only what "
        "the frames show; if nothing changes, say so. Write a few plain sentences, without tags."
    )
    if task and task.strip():
        text += (
            "\n\nThe description will help answer this question: " + task.strip()
            + "\nMention first what is relevant to it, and say plainly when nothing relevant appears."
        )
    return text


def final_answer_instruction(question_type: str, profile: str = "paravt") -> str:
    """The nudge of the last round, sent as its own user message: no more calls, answer now."""
    _check_profile(profile)
    if profile == "official":
        return _OFFICIAL_FINAL[question_type if question_type in _OFFICIAL_FINAL else "oe"]
    return (
        "You cannot call the tool any more. Answer the question now from what you have seen. "
        + answer_instruction(question_type)
    )


# ----------------------------------------------------------------------------------------------
# the "official" profile: the public release's strings, reproduced verbatim because ParaVT-8B was
# trained on these exact tokens (a paraphrase would be a different prompt to that checkpoint).

# The release's crop_video declaration (paravt/rl/subagents/crop_video): its `parameters` holds the
# properties directly (no "type": "object" wrapper), and `video_path` is required. The model's
# `video_path` is never used (SPEC §1.7): the episode's own video is cropped.
OFFICIAL_CROP_VIDEO_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Analyze a cropped video segment by sampling fixed number of frames and providing a summary of the "
            "content. Use this when you need to understand what happens in a specific time range of a video."
        ),
        "parameters": {
            "video_path": {"type": "string", "description": "Path to the video file"},
            "start_time": {"type": "number", "description": "Start time in seconds"},
            "end_time": {"type": "number", "description": "End time in seconds"},
        },
    },
}

# The release's answer instruction for the tool-using prompt (its evaluation code gave this one to
# the no-tool prompt and vice versa: SPEC §6.7); grounding and open-ended follow our wording.
_OFFICIAL_ANSWER = {
    "mcq": "Think step by step, use crop_video if needed, then provide your answer in <answer>X</answer> tags "
           "where X is the option letter.",
    "tvg": "Think step by step, use crop_video if needed, then provide the start and end time of the moment in "
           "seconds as <answer>start - end</answer>.",
    "oe": "Think step by step, use crop_video if needed, then provide your answer in <answer></answer> tags.",
}
_OFFICIAL_FINAL = {
    "mcq": "Based on the video and cropped segments above, answer with ONLY the letter.",
    "tvg": "Based on the video and any cropped segments, provide your final answer about when the event happens. "
           "Use the format: 'The event happens in the X.X - Y.Y seconds.'",
    "oe": "Based on the video and cropped segments above, give your final answer inside <answer></answer> tags.",
}


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _official_subagent_prompt(start: float, end: float) -> str:
    return (
        f"You are analyzing a video segment from {_mmss(start)} to {_mmss(end)} (duration: {end - start:.1f} "
        "seconds).\n\nThe images shown are frames sampled from this video segment. Carefully examine each frame "
        "in sequence to understand the temporal progression of events.\n\nYour task: Provide a concise summary "
        "of what happens in this video segment.\n\nGuidelines:\n- Describe the key actions, events, or changes "
        "that occur across the frames\n- Note any important objects, people, or elements visible in the scene\n"
        "- Capture the temporal flow (what happens first, then, finally)\n- Focus on factual observations rather "
        "than interpretations\n\nSummary:"
    )


def _drop_blocks(text: str, open_tag: str, close_tag: str) -> str:
    closed, unclosed = _blocks(text, open_tag, close_tag)
    spans = sorted([(i, i + len(open_tag) + len(b) + len(close_tag)) for i, b in closed]
                   + [(i, i + len(open_tag) + len(b)) for i, b in unclosed])
    out, pos = [], 0
    for a, b in spans:
        if a >= pos:
            out.append(text[pos:a])
            pos = b
    out.append(text[pos:])
    return "".join(out)


def extract_answer(text: str) -> str | None:
    """The final answer of a generated text: the body of the last complete <answer>, else of an
    unclosed one. A forced answer written without tags falls back to the text after the think,
    without tool calls and tags (None when the text is still inside its think)."""
    if not isinstance(text, str) or not text:
        return None
    turn = parse(text)
    if turn.answer:
        return turn.answer
    if think_open_at_end(text):
        return None
    tail = text.rsplit(THINK_CLOSE, 1)[1] if THINK_CLOSE in text else text
    for open_tag, close_tag in ((TOOL_CALL_OPEN, TOOL_CALL_CLOSE), (TOOL_CODE_OPEN, TOOL_CODE_CLOSE),
                                (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)):
        tail = _drop_blocks(tail, open_tag, close_tag)
    tail = " ".join(strip_tags(tail).split())
    return tail or None
