"""OpenAI tool calling in `paravt serve`, as vLLM serves a Qwen model with `--enable-auto-tool-choice
--tool-call-parser hermes` (the facts below are vLLM 0.32's, read from its hermes parser and chat renderer).

In, through the model's own chat template (Qwen3-VL's):
- `tools`: declared in the template's tool block (the system text, a blank line, `# Tools` ..., one
  JSON line per tool as its `tojson` writes it). Each tool is first normalised as vLLM does before it
  renders: `{"type": "function", "function": {"name", "description", "parameters"[, "strict"]}}` in
  that order, a missing description or parameters written as null, other keys dropped.
- an assistant message's `tool_calls`: after its content, one `<tool_call>` block per call (a newline
  before each, but before the first only when the message has content; a content of "" counts as
  content, a missing or null one does not), its arguments read into an object first (JSON text that
  is no object becomes {}).
- `role: "tool"` messages: consecutive ones in one user turn, each inside `<tool_response>`; the text
  parts of one are joined by newlines, images stay where they are. `tool_call_id` is accepted, not
  required (lmms-eval's loop sends none), and not checked against the calls.

`tool_choice`: "auto" (the default when tools are given) reads the reply for calls; "none" declares
the tools all the same (vLLM's default) and leaves the reply as text; "required" and a named function
are refused (400): vLLM forces them with guided decoding, which paravt serve does not have.
`parallel_tool_calls: false`: the generation stops at the end of the first call (`</tool_call>` as a
stop string; vLLM stops it there with a grammar), and only the first call is returned. `functions` / `function_call` (the API's
deprecated form) are refused.

Out, as the hermes parser reads a reply: every `<tool_call>` block (the last one to the end of the
text when it is never closed) must be one JSON object with a string "name" and an "arguments", or
none is a call and the whole reply stays `content`. When all are, `content` is the text before the
first block (null when blank: what follows the first block is not returned), `tool_calls` holds
`{"id": "chatcmpl-tool-...", "type": "function", "function": {"name", "arguments"}}` with the
arguments as JSON text, and `finish_reason` is "tool_calls".

Streaming: the text before the first `<tool_call>` goes out as it is decoded (what could be the start
of the tag, and a reply that is still blank, are held back); from the first `<tool_call>` on, the
reply is held until it ends, then sent as tool-call deltas in OpenAI's shape (per call, one with its
index, id, type, name and empty arguments, then one with the arguments) or, when a block cannot be
read, as content. So the chunks join to exactly the non-streamed message. (vLLM instead streams the
arguments as they are decoded, and drops a block it cannot read from the stream, where its
non-streamed reply keeps the text.)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from paravt import protocol as P
from paravt.messages import TextPart
from paravt.serve.errors import PayloadError

_CHOICE_HELP = ('tool_choice must be "auto" (the model decides), "none" (the tools are declared, no call is read), '
                '"required" or {"type": "function", "function": {"name": ...}}')


@dataclass
class ToolUse:
    """A request's tools, normalised as rendered, and how its reply is read."""

    tools: list[dict]
    choice: str = "auto"  # auto | none
    parallel: bool = True

    @property
    def reads_calls(self) -> bool:
        return self.choice == "auto"


def read_tool_use(body: dict) -> ToolUse | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a body, checked; None without tools."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise PayloadError("functions and function_call are the API's deprecated form of tool calling; send tools "
                           "and tool_choice")
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise PayloadError(f"parallel_tool_calls must be true or false, got {parallel!r}")
    if tools is None:
        if choice not in (None, "none"):
            raise PayloadError("tool_choice needs tools: declare the functions in tools")
        return None
    if not isinstance(tools, list) or not tools:
        raise PayloadError('tools must be a non-empty list of {"type": "function", "function": {"name", '
                           '"description", "parameters"}}')
    normal = [_tool(t, i) for i, t in enumerate(tools)]
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str) or not name:
            raise PayloadError(_CHOICE_HELP)
        if name not in {t["function"]["name"] for t in normal}:
            raise PayloadError(f"tool_choice names the function {name!r}, which is not among the tools")
        raise PayloadError(f"tool_choice naming a function ({name!r}) is not supported: paravt serve cannot force a "
                           'call (vLLM does it with guided decoding); send "auto" to let the model decide, or "none"')
    if choice == "required":
        raise PayloadError('tool_choice "required" is not supported: paravt serve cannot force a call (vLLM does it '
                           'with guided decoding); send "auto" to let the model decide, or "none"')
    if choice not in ("auto", "none"):
        raise PayloadError(_CHOICE_HELP)
    return ToolUse(normal, choice, parallel is not False)


def _tool(t: Any, i: int) -> dict:
    """One tool as vLLM renders it (its request model's fields, in their order)."""
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise PayloadError(f'{where} must be {{"type": "function", "function": {{"name", "description", '
                           '"parameters"}}')
    f = t["function"]
    name, desc, params, strict = f.get("name"), f.get("description"), f.get("parameters"), f.get("strict")
    if not isinstance(name, str) or not name:
        raise PayloadError(f"{where}.function.name must be a non-empty string")
    if desc is not None and not isinstance(desc, str):
        raise PayloadError(f"{where}.function.description must be a string")
    if params is not None and not isinstance(params, dict):
        raise PayloadError(f"{where}.function.parameters must be a JSON Schema object")
    if strict is not None and not isinstance(strict, bool):
        raise PayloadError(f"{where}.function.strict must be true or false")
    fn: dict = {"name": name, "description": desc, "parameters": params}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def system_with_tools(system: str | None, tools: list[dict]) -> str:
    """The template's system turn when tools are declared: the first message's text if it is a system
    message (even an empty one), a blank line, the tool block; the block alone without one."""
    block = P.native_tools_block(tools)
    return block if system is None else f"{system}\n\n{block}"


def assistant_calls_text(calls: Any, has_content: bool, where: str) -> str:
    """An assistant message's `tool_calls` as the template writes them after the content."""
    if not isinstance(calls, list):
        raise PayloadError(f"{where}.tool_calls must be a list")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or c.get("type", "function") != "function":
            raise PayloadError(f'{where}.tool_calls[{j}] must be {{"type": "function", "function": {{"name", '
                               '"arguments"}}')
        name = fn.get("name")
        if not isinstance(name, str):
            raise PayloadError(f"{where}.tool_calls[{j}].function.name must be a string")
        sep = "\n" if j or has_content else ""
        out.append(f'{sep}{P.TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": '
                   f"{json.dumps(_arguments(fn.get('arguments')), ensure_ascii=False)}}}\n{P.TOOL_CALL_CLOSE}")
    return "".join(out)


def _arguments(args: Any) -> dict:
    """A call's arguments as the template is given them: an object (vLLM reads JSON text into one; what
    is not an object, or not JSON, becomes {}: a bad call in the history must not fail every later turn)."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else {}
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return {}
    return args if isinstance(args, dict) else {}


def open_tool_response(parts: list) -> None:
    """Start one tool message's response inside the user turn `parts` (a run of tool messages)."""
    add_text(parts, ("\n" if parts else "") + P.TOOL_RESPONSE_OPEN + "\n")


def close_tool_response(parts: list) -> None:
    add_text(parts, "\n" + P.TOOL_RESPONSE_CLOSE)


def add_text(parts: list, text: str) -> None:
    """Text appended to the last text part (so the turn is tokenized as the template's one string is),
    or as a new part after an image."""
    if parts and isinstance(parts[-1], TextPart):
        parts[-1] = TextPart(parts[-1].text + text)
    elif text:
        parts.append(TextPart(text))


@dataclass
class CallsRead:
    content: str | None
    calls: list[dict]


def read_calls(text: str, use: ToolUse | None) -> CallsRead | None:
    """The reply's tool calls, read as the hermes parser reads them (module docstring); None when the
    reply stays text (no tools, tool_choice "none", no block, or a block that cannot be read)."""
    if use is None or not use.reads_calls:
        return None
    calls, _ = P.strict_calls(text)
    if not calls:
        return None
    out = []
    for c in calls:
        obj = json.loads(c.raw)
        if not isinstance(obj["name"], str):
            return None
        try:
            args = json.dumps(obj["arguments"], ensure_ascii=False)
        except (ValueError, RecursionError):  # nested deeper than the encoder goes
            return None
        out.append({"id": "chatcmpl-tool-" + uuid.uuid4().hex[:16], "type": "function",
                    "function": {"name": obj["name"], "arguments": args}})
    content = text[: text.find(P.TOOL_CALL_OPEN)]
    return CallsRead(content if content.strip() else None, out if use.parallel else out[:1])


class CallStream:
    """The content of a streamed reply that may go out while it is decoded, when its calls are read
    (module docstring); without tools (or with tool_choice "none") every piece goes out as it comes."""

    def __init__(self, use: ToolUse | None):
        self.use = use if use is not None and use.reads_calls else None
        self.text = ""
        self.sent = 0
        self.holding = False

    def push(self, piece: str) -> str:
        self.text += piece
        if self.use is None:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out
        if self.holding:
            return ""
        at = self.text.find(P.TOOL_CALL_OPEN)
        if at >= 0:
            self.holding = True
            end = at
        else:
            end = len(self.text) - _partial_tag(self.text, P.TOOL_CALL_OPEN)
        if end <= self.sent or not self.text[:end].strip():
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self, final: str) -> tuple[str, CallsRead | None]:
        """(the content not sent yet, the calls) once the backend's final text (the authority) is known."""
        read = read_calls(final, self.use)
        target = (read.content or "") if read else final
        sent = self.text[: self.sent]
        if not target.startswith(sent):
            return "", read  # cannot happen with a backend whose pieces join to its text
        return target[len(sent):], read


def call_deltas(read: CallsRead) -> list[dict]:
    """The stream deltas of the calls: per call its header (index, id, type, name, empty arguments),
    then its arguments, as OpenAI's API streams them."""
    out = []
    for i, c in enumerate(read.calls):
        out.append({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                    "function": {"name": c["function"]["name"], "arguments": ""}}]})
        out.append({"tool_calls": [{"index": i, "function": {"arguments": c["function"]["arguments"]}}]})
    return out


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
