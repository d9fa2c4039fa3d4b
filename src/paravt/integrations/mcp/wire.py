"""Requests the server answers itself, before the MCP SDK reads them: JSON-RPC text that holds a lone
UTF-16 surrogate (`"\\ud800"` with no low half after it).

Python's json reads such an escape into a str that no UTF-8 can encode; the SDK's parser (pydantic)
refuses the line, and over stdio it then drops it without an answer, so the client waits forever.
Here such a request gets a JSON-RPC error with its own id (code -32700, the SDK's own for a body it
cannot parse over HTTP), and the connection goes on. Used on both transports: stdio's read stream
(`AnsweringReads`) and each HTTP body (`paravt.integrations.mcp.web`).
"""

from __future__ import annotations

import json
from typing import Any

PARSE_ERROR = -32700  # JSON-RPC's "Parse error"


def lone_surrogate(value: Any, where: str = "the request") -> str | None:
    """Where parsed JSON `value` holds a string UTF-8 cannot encode (a lone surrogate), said in one
    line; None when it holds none. Iterative: a request nested as deep as a parser allows is walked."""
    todo = [(value, where)]
    while todo:
        v, at = todo.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"{at} holds a lone surrogate ({ascii(v[e.start])}), which is no Unicode character"
        elif isinstance(v, dict):
            for k, item in v.items():
                todo.append((item, _within(at, ascii(k))))
                todo.append((k, f"a key of {at}"))
        elif isinstance(v, list):
            todo.extend((item, _within(at, str(i))) for i, item in enumerate(v))
    return None


def _within(at: str, key: str) -> str:
    return f"{at}[{key[:40]}]" if len(at) < 200 else at  # a path's first steps say enough


def unreadable(raw: str | bytes) -> dict | None:
    """The JSON-RPC error answering `raw` when it is a request whose text holds a lone surrogate;
    None for anything else (the SDK's to read, or to refuse as it does), and for a notification
    (which gets no answer). The id is echoed where it is one JSON-RPC allows, else null."""
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
        return None
    why = lone_surrogate(msg)
    if why is None:
        return None
    rid = msg["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or lone_surrogate(rid) is not None:
        rid = None
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": PARSE_ERROR, "message": (
        f"Parse error: {why}; send text as UTF-8 (a \\uXXXX escape of a high surrogate must be followed by "
        "one of a low surrogate)")}}


class AnsweringReads:
    """The stdio transport's read stream, with the lines its parser refused that are requests
    `unreadable` answers: their error is written back here, and the SDK never sees them. Anything
    else passes through unchanged (an unparseable line that is no such request stays the SDK's)."""

    def __init__(self, read, write) -> None:
        self._read, self._write = read, write

    @property
    def last_context(self):  # the SDK reads each message's sender context from here
        return getattr(self._read, "last_context", None)

    async def receive(self):
        while True:
            item = await self._read.receive()
            if not isinstance(item, Exception):
                return item
            answer = _answer(item)
            if answer is None:
                return item
            await self._write.send(answer)

    def __aiter__(self) -> "AnsweringReads":
        return self

    async def __anext__(self):
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._read.aclose()

    async def __aenter__(self) -> "AnsweringReads":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _answer(error: Exception):
    """The SessionMessage answering the line the stdio parser refused with `error` (pydantic's
    ValidationError keeps the line as its input), or None."""
    from mcp.shared.message import SessionMessage
    from mcp.types import JSONRPCError
    from pydantic import ValidationError

    if not isinstance(error, ValidationError):
        return None
    raws = [e.get("input") for e in error.errors() if e.get("type") == "json_invalid"]
    answer = unreadable(raws[0]) if raws and isinstance(raws[0], (str, bytes)) else None
    return None if answer is None else SessionMessage(JSONRPCError.model_validate(answer))
