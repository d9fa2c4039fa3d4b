"""The tool-call protocol: tags, tool schema, prompts, parsing. The only module that spells the tags.

A main-agent turn is `<think>…</think>` followed by either `<answer>…</answer>` or one or more
`<tool_call>{"name": "crop_video", "arguments": {...}}</tool_call>` blocks (Hermes style).
Models with a Qwen prior sometimes leak `<tool_code>crop_video(start_time=…, end_time=…)</tool_code>`;
we accept that too. `parse` never raises: anything it cannot read becomes a `Problem`.
"""

from __future__ import annotations

import ast
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
# Positions where Exploration Anchoring applies the format signal (SPEC §3): the closures that
# decay under temperature sampling, and the tool-call boundaries.
STRUCTURAL_TAGS = (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

THINK_PREFIX = THINK_OPEN + "\n"
TOOL_NAME = "crop_video"
QUESTION_TYPES = ("mcq", "tvg", "oe")
MODES = ("parallel", "sequential", "inline", "none")

CROP_VIDEO_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Look closely at one time window of the video. A helper watches the window at about one frame "
            "per second and replies with a short factual summary of what appears and when."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "start_time": {"type": "number", "description": "Window start, in seconds from the beginning of the video."},
                "end_time": {"type": "number", "description": "Window end, in seconds; must be after start_time."},
                "num_frames": {"type": "integer", "description": "Optional number of frames to sample (1-16)."},
            },
            "required": ["start_time", "end_time"],
        },
    },
}


@dataclass
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""

    def to_text(self) -> str:
        return TOOL_CALL_OPEN + "\n" + json.dumps({"name": self.name, "arguments": self.arguments}) + "\n" + TOOL_CALL_CLOSE


@dataclass
class Problem:
    kind: str
    detail: str = ""


@dataclass
class Turn:
    text: str
    think: str | None = None
    think_closed: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    answer_closed: bool = False
    problems: list[Problem] = field(default_factory=list)
    # calls that were written but could not be read, in order, as (raw text, problem)
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
# parsing

_TAG_RE = re.compile("|".join(re.escape(t) for t in ALL_TAGS))


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], list[str]]:
    """Bodies of closed open…close blocks, and the tails of blocks opened but never closed."""
    closed, unclosed = [], []
    pos = 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            break
        j = text.find(close_tag, i + len(open_tag))
        nxt = text.find(open_tag, i + len(open_tag))
        if j < 0:
            unclosed.append(text[i + len(open_tag):] if nxt < 0 else text[i + len(open_tag):nxt])
            pos = i + len(open_tag) if nxt >= 0 else len(text)
            if nxt < 0:
                break
            continue
        if 0 <= nxt < j:  # a second open before the close: the first one was never closed
            unclosed.append(text[i + len(open_tag):nxt])
            pos = nxt
            continue
        closed.append(text[i + len(open_tag):j])
        pos = j + len(close_tag)
    return closed, unclosed


def _parse_json_call(body: str) -> tuple[ToolCall | None, str | None]:
    s = body.strip()
    if not s:
        return None, "empty tool call"
    # tolerate a trailing comma or code fence around the JSON
    s = re.sub(r"^```(?:json)?\s*|\s*```$", "", s)
    try:
        obj = json.loads(s)
    except (json.JSONDecodeError, ValueError, RecursionError):
        # a model sometimes adds prose after the object: read the first JSON object only
        try:
            obj, _ = json.JSONDecoder().raw_decode(s[s.index("{"):]) if "{" in s else (None, 0)
        except (json.JSONDecodeError, ValueError, RecursionError):
            obj = None
        if obj is None:
            return None, f"tool call is not valid JSON: {body.strip()[:200]!r}"
    if not isinstance(obj, dict):
        return None, f"tool call must be a JSON object with name and arguments: {body.strip()[:200]!r}"
    name = obj.get("name", obj.get("function"))
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, ValueError, RecursionError):
            return None, f"tool call arguments are not valid JSON: {args[:200]!r}"
    if not isinstance(name, str) or not name:
        return None, f"tool call has no function name: {body.strip()[:200]!r}"
    if not isinstance(args, dict):
        return None, f"tool call arguments must be an object: {body.strip()[:200]!r}"
    return ToolCall(name=name, arguments=args, raw=body), None


def _parse_code_call(body: str) -> tuple[ToolCall | None, str | None]:
    """`crop_video(start_time=1, end_time=2)` read with ast (never eval)."""
    s = body.strip().strip("`").strip()
    if s.startswith("python"):
        s = s[len("python"):].strip()
    try:
        node = ast.parse(s, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, f"tool code is not a function call: {body.strip()[:200]!r}"
    if not isinstance(node, ast.Call):
        return None, f"tool code is not a function call: {body.strip()[:200]!r}"
    fn = node.func
    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
    if not name:
        return None, f"tool code calls no named function: {body.strip()[:200]!r}"
    args: dict = {}
    try:
        positional = [ast.literal_eval(a) for a in node.args]
        for kw in node.keywords:
            if kw.arg is not None:
                args[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None, f"tool code arguments must be literals: {body.strip()[:200]!r}"
    for key, value in zip(("start_time", "end_time", "num_frames"), positional):
        args.setdefault(key, value)
    return ToolCall(name=name, arguments=args, raw=body), None


def parse(text: str, prefix: str = "") -> Turn:
    """Read one generated turn. `prefix` is a forced start (e.g. THINK_PREFIX) that the model
    did not generate but that is part of its turn: it counts as present."""
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
    # think
    i = full.find(THINK_OPEN)
    if i >= 0:
        j = full.find(THINK_CLOSE, i + len(THINK_OPEN))
        if j >= 0:
            turn.think = full[i + len(THINK_OPEN):j].strip()
            turn.think_closed = True
        else:
            end = len(full)
            for tag in (TOOL_CALL_OPEN, ANSWER_OPEN, TOOL_CODE_OPEN):
                k = full.find(tag, i)
                if k >= 0:
                    end = min(end, k)
            turn.think = full[i + len(THINK_OPEN):end].strip()
            turn.problems.append(Problem("unclosed_think", "<think> is never closed"))
        if full.count(THINK_OPEN) > 1:
            turn.problems.append(Problem("repeated_think", f"{full.count(THINK_OPEN)} <think> tags"))
    elif THINK_CLOSE in full:
        turn.problems.append(Problem("unopened_think", "</think> without <think>"))

    # tool calls (Hermes JSON, then leaked tool_code), in order of appearance
    found: list[tuple[int, ToolCall | None, str | None, str]] = []
    for open_tag, close_tag, reader in (
        (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, _parse_json_call),
        (TOOL_CODE_OPEN, TOOL_CODE_CLOSE, _parse_code_call),
    ):
        closed, unclosed = _blocks(full, open_tag, close_tag)
        search_from = 0
        for body in closed:
            pos = full.find(open_tag + body + close_tag, search_from)
            search_from = max(pos, 0) + 1
            call, err = reader(body)
            found.append((pos, call, err, body))
        for body in unclosed:
            turn.problems.append(Problem("unclosed_tool_call", f"{open_tag} is never closed: {body.strip()[:120]!r}"))
            turn.bad_calls.append((body, f"{open_tag} is never closed"))
    found.sort(key=lambda x: x[0])
    for _, call, err, body in found:
        if call is None:
            turn.problems.append(Problem("bad_call", err or "unreadable tool call"))
            turn.bad_calls.append((body, err or "unreadable tool call"))
            continue
        if call.name != TOOL_NAME:
            turn.problems.append(Problem("unknown_tool", f"unknown tool {call.name!r}"))
        if TOOL_CALL_OPEN in body or TOOL_CODE_OPEN in body:
            turn.problems.append(Problem("nested_tags", "a tool call inside a tool call"))
        turn.calls.append(call)

    # answer: the last complete one wins
    closed, unclosed = _blocks(full, ANSWER_OPEN, ANSWER_CLOSE)
    if closed:
        turn.answer = closed[-1].strip()
        turn.answer_closed = True
        if len(closed) > 1:
            turn.problems.append(Problem("multiple_answers", f"{len(closed)} answers; the last is used"))
    elif unclosed:
        turn.answer = unclosed[-1].strip()
        turn.problems.append(Problem("unclosed_answer", "<answer> is never closed"))
    elif ANSWER_CLOSE in full:
        turn.problems.append(Problem("unopened_answer", "</answer> without <answer>"))


# ----------------------------------------------------------------------------------------------
# tool arguments

_TIME_RE = re.compile(r"^\s*(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)\s*$")


def parse_seconds(value) -> float:
    """Seconds from a number, a numeric string, 'MM:SS', 'HH:MM:SS' or '75s'."""
    if isinstance(value, bool):
        raise ToolCallError(f"time must be a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        s = value.strip().lower()
        m = _TIME_RE.match(s)
        if m:
            h, mnt, sec = m.groups()
            v = int(h or 0) * 3600 + int(mnt) * 60 + float(sec)
        else:
            s = re.sub(r"\s*(seconds?|secs?|s)$", "", s)
            try:
                v = float(s)
            except ValueError:
                raise ToolCallError(f"cannot read {value!r} as a time in seconds") from None
    else:
        raise ToolCallError(f"time must be a number of seconds, got {value!r}")
    if math.isnan(v) or math.isinf(v):
        raise ToolCallError(f"time must be a finite number of seconds, got {value!r}")
    return v


def crop_args(call: ToolCall, duration: float | None = None) -> CropArgs:
    """Validated arguments of a crop_video call. Any `video_path` argument is ignored: the
    episode's own video is always the one cropped (a model must never choose a host file)."""
    if call.name != TOOL_NAME:
        raise ToolCallError(f"unknown tool {call.name!r}; the only tool is {TOOL_NAME}")
    a = call.arguments
    start_v = a.get("start_time", a.get("start"))
    end_v = a.get("end_time", a.get("end"))
    if start_v is None or end_v is None:
        raise ToolCallError("crop_video needs start_time and end_time (seconds)")
    start, end = parse_seconds(start_v), parse_seconds(end_v)
    if start < 0:
        raise ToolCallError(f"start_time {start:g} is negative")
    if start >= end:
        raise ToolCallError(f"start_time {start:g} must be smaller than end_time {end:g}")
    if duration is not None:
        if start >= duration:
            raise ToolCallError(f"start_time {start:g} is outside the video, which lasts {duration:.1f} seconds")
        end = min(end, duration)
    n = a.get("num_frames")
    num_frames = None
    if n is not None:
        try:
            num_frames = int(float(n))
        except (TypeError, ValueError):
            raise ToolCallError(f"num_frames must be an integer, got {n!r}") from None
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
    return "\n".join(format_tool_response(t) for t in texts)


def format_error(message: str) -> str:
    return f"Error: {message.strip()}"


def timestamp_text(t: float) -> str:
    return f"<{t:.1f} seconds>"


# ----------------------------------------------------------------------------------------------
# prompts

_FORMAT_RULES = (
    "Always think first inside <think> </think>. Then either call tools or answer. "
    "Give the final answer inside <answer> </answer>."
)


def tools_block() -> str:
    return "<tools>\n" + json.dumps(CROP_VIDEO_TOOL) + "\n</tools>"


def system_prompt(mode: str, max_parallel: int = 5) -> str:
    """System prompt of the main agent for a dispatch mode."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "none":
        return (
            "You are a careful video analyst. You see frames sampled from a video, each labelled with its "
            "time in seconds. Reason step by step inside <think> </think>, then give the final answer "
            "inside <answer> </answer>."
        )
    call_example = format_tool_call(30, 45)
    if mode == "sequential":
        how_many = "Call the tool once per turn; you will get its result before deciding on the next window."
    else:
        how_many = (
            f"You may call the tool several times in one turn (up to {max_parallel} calls), one "
            "<tool_call></tool_call> block per window; all windows are examined at the same time and the "
            "results come back together, in the order of your calls."
        )
    return (
        "You are a video analyst answering questions about a long video. You first see a few frames sampled "
        "evenly over the whole video, each labelled with its time in seconds. Short events can fall between "
        "those frames: when the frames do not settle the question, look closer with the crop_video tool.\n\n"
        "You have one tool. Its signature, as JSON schema:\n"
        f"{tools_block()}\n\n"
        "To call it, write a JSON object with the tool name and arguments between <tool_call> and </tool_call>, "
        f"for example:\n{call_example}\n"
        f"{how_many} Each result arrives inside <tool_response> </tool_response>.\n\n"
        f"{_FORMAT_RULES} Answer directly, without calling the tool, when the frames you have already settle "
        "the question."
    )


def answer_instruction(question_type: str) -> str:
    if question_type == "mcq":
        return "Answer with the letter of the correct option only, inside <answer> </answer>, e.g. <answer>B</answer>."
    if question_type == "tvg":
        return (
            "Answer with the start and end time of the moment in seconds, as 'start - end', inside "
            "<answer> </answer>, e.g. <answer>12.5 - 20.0</answer>."
        )
    return "Answer with a short phrase inside <answer> </answer>."


def user_prompt_text(question: str, duration: float, question_type: str, subtitles: str | None = None) -> str:
    """The text that follows the overview frames in the first user turn."""
    parts = [f"The video lasts {duration:.1f} seconds. The frames above are sampled evenly over it."]
    if subtitles:
        parts.append("Subtitles of the video:\n" + subtitles.strip())
    parts.append("Question: " + question.strip())
    parts.append(answer_instruction(question_type))
    return "\n\n".join(parts)


def subagent_prompt(start: float, end: float, task: str | None = None) -> str:
    """Instruction of a sub-agent that watches one window."""
    text = (
        f"These frames come from the video between {start:.1f} and {end:.1f} seconds; each is labelled with "
        "its time. Describe briefly and factually what appears in them and when: objects, their colours, "
        "shapes and positions, actions, scene changes, any visible text. Give times in seconds. Do not guess "
        "beyond what the frames show."
    )
    if task:
        text += f"\n\nThe description will help answer this question: {task.strip()}"
    return text


def final_answer_instruction(question_type: str) -> str:
    return "You cannot call the tool any more. Answer the question now. " + answer_instruction(question_type)


def extract_answer(text: str) -> str | None:
    """The final answer of a generated text: the last complete <answer>, else an unclosed one,
    else (for forced answers written without tags) the last non-empty line after any think."""
    if not text:
        return None
    turn = parse(text)
    if turn.answer is not None and turn.answer != "":
        return turn.answer
    tail = text
    if THINK_CLOSE in tail:
        tail = tail.rsplit(THINK_CLOSE, 1)[1]
    elif THINK_OPEN in tail:
        return None  # still thinking: no answer given
    tail = _TAG_RE.sub("", tail).strip()
    if not tail:
        return None
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    return lines[-1] if lines else None
