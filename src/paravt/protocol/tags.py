"""The protocol's tags and their structure: the only place the tags are spelled, and the readers of
their nesting (think blocks, balanced pairs, open…close blocks) that parsing and rewards share."""

from __future__ import annotations

import re

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
# Positions where Exploration Anchoring applies the format signal (the paper's abstract: "the
# structural-token positions most prone to collapse"; docs/rewards.md): the closures that decay
# under temperature sampling, and the tool-call boundaries.
STRUCTURAL_TAGS = (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

THINK_PREFIX = THINK_OPEN + "\n"


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


def blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
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


def drop_blocks(text: str, open_tag: str, close_tag: str) -> str:
    """The text without its open…close blocks (closed and unclosed ones, tags and bodies)."""
    closed, unclosed = blocks(text, open_tag, close_tag)
    spans = sorted([(i, i + len(open_tag) + len(b) + len(close_tag)) for i, b in closed]
                   + [(i, i + len(open_tag) + len(b)) for i, b in unclosed])
    out, pos = [], 0
    for a, b in spans:
        if a >= pos:
            out.append(text[pos:a])
            pos = b
    out.append(text[pos:])
    return "".join(out)
