"""Reading a generated turn: `parse(text) -> Turn` (think, calls, answer, problems) and
`extract_answer`. Never raises: anything it cannot read becomes a `Problem`, and a call it cannot
read is kept in `Turn.bad_calls`."""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import asdict, dataclass, field

from paravt.protocol.tags import (ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN,
                                  TOOL_CODE_CLOSE, TOOL_CODE_OPEN, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, blocks,
                                  drop_blocks, strip_tags, think_open_at_end, think_spans)
from paravt.protocol.tools import TOOL_NAME, ToolCall

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
    did not generate but that is part of its turn: it counts as present (docs/rewards.md; the public
    release left it out)."""
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
        closed_blocks, unclosed_blocks = blocks(full, open_tag, close_tag)
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
    closed_answers, unclosed_answers = blocks(full, ANSWER_OPEN, ANSWER_CLOSE)
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


_HERMES_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE) + "|"
                        + re.escape(TOOL_CALL_OPEN) + r"(.*)", re.DOTALL)


def strict_calls(text: str) -> tuple[list[ToolCall] | None, str | None]:
    """A turn's calls as a strict Hermes reader reads them: (calls, None) when it reads every one,
    (None, why) when it reads none, (None, None) when the turn writes no `<tool_call>`. The public
    release's rollout loop reads calls this way (its parser is a copy of vLLM's `hermes` tool
    parser): every `<tool_call>` block, the last one to the end of the text when it is never closed,
    must be one JSON object with "name" and "arguments", or the turn has no calls at all and the
    episode ends there (docs/rl.md, departures). `parse` is lenient where this is not: it reads the
    good calls of a turn and answers each unreadable one in its own response."""
    if not isinstance(text, str) or TOOL_CALL_OPEN not in text:
        return None, None
    calls = []
    for n, (closed, unclosed) in enumerate(_HERMES_RE.findall(text), 1):
        body = closed or unclosed
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None, f"tool call {n} is not one JSON object: {_short(body, 120)}"
        if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
            return None, f'tool call {n} lacks "name" or "arguments": {_short(body, 120)}'
        calls.append(ToolCall(name=str(obj["name"]), arguments=obj["arguments"], raw=body))
    return calls, None


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
        tail = drop_blocks(tail, open_tag, close_tag)
    tail = " ".join(strip_tags(tail).split())
    return tail or None
