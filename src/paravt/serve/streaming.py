"""Generation tied to the HTTP connection, and `stream: true`.

A client that disconnects cancels its generation (the backend sees asyncio cancellation): a gone
client must not keep the model busy.

Streaming follows the OpenAI API: `text/event-stream` of `chat.completion.chunk` objects (a first
chunk with the role, one per decode step with the new text in `delta.content`, a last one with
`finish_reason`; with `stream_options.include_usage` a final chunk of usage with no choices), then
`data: [DONE]`. Tool calls are streamed as paravt.serve.tool_calls says. A backend that decodes
step by step (hf: `generate_stream`) streams as it decodes; any other sends its whole text in one
chunk at the end. Text that might be the start of a stop
string is held back until it is known not to be, so the chunks join to exactly the non-streamed
message. An error before the first token is a plain JSON error (400/500/503); one after it is an
SSE `data: {"error": ...}` event. `logprobs` and `return_token_ids` are not streamed (400: ask
without stream for them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable

from paravt.backends.base import Backend, Completion, GenerateRequest
from paravt.serve.errors import failure_of
from paravt.serve.schema import ChatRequest
from paravt.serve.tool_calls import CallStream, call_deltas

log = logging.getLogger("paravt.serve")


async def _until_disconnect(receive) -> None:
    """Return once the ASGI server reports that the client went away (the body is already read,
    so the only message left to receive is http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def retrieve(task: asyncio.Task) -> None:
    """Done-callback of a task whose outcome nobody awaits: fetch it so asyncio does not warn."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned task ended with %r", task.exception())


async def generate_while_connected(backend: Backend, req: GenerateRequest, receive) -> Completion | None:
    """The completion, or None if the client disconnected first, in which case the generation is
    cancelled: a gone client must not keep the model busy (the hf backend drops the cancelled row)."""
    gen = asyncio.ensure_future(backend.generate([req]))
    gone = asyncio.ensure_future(_until_disconnect(receive))
    gone.add_done_callback(retrieve)
    try:
        await asyncio.wait({gen, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is itself cancelled (server shutdown)
        gone.cancel()
        if not gen.done():
            gen.add_done_callback(retrieve)
            gen.cancel()
    if not gen.done() or gen.cancelled():  # a cancel() above is only a request: gen may still be running
        return None
    return gen.result()[0]


class StreamText:
    """What of a streamed completion may be sent yet. The final text ends before the first stop
    string (OpenAI semantics), and a sent chunk cannot be taken back, so the last (longest stop - 1)
    characters, which could be the beginning of a stop string, wait for the next piece (as vLLM's
    detokenizer does: constant work per piece, whatever the stop strings); with no stop strings
    every piece goes out at once."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.sent = ""
        self.held = ""

    def push(self, piece: str) -> str:
        """Take the next piece of the text; return what can be sent now."""
        self.held += piece
        if not self.stops:
            out, self.held = self.held, ""
            self.sent += out
            return out
        # a stop string may begin in the last (longest - 1) characters already sent
        window = self.sent[-(self.longest - 1):] if self.longest > 1 else ""
        text = window + self.held
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            end = max(cut - len(window), 0)  # the completion ends there: never send past it
        else:
            end = max(len(self.held) - (self.longest - 1), 0)
        out, self.held = self.held[:end], self.held[end:]
        self.sent += out
        return out

    def finish(self, final: str) -> str:
        """The rest of the final text (the backend's, which is the authority) not sent yet."""
        if final.startswith(self.sent):
            return final[len(self.sent):]
        log.warning("the streamed text (%d chars) is not a prefix of the final text (%d chars); the stream "
                    "differs from the non-streamed answer", len(self.sent), len(final))
        return ""


async def pump_generation(backend: Backend, req: GenerateRequest, out: asyncio.Queue) -> None:
    """The generation of a streamed request, as a task of its own (the HTTP response reads `out`):
    ("piece", str) as the backend decodes (hf's `generate_stream`; other backends produce no pieces),
    then ("done", Completion), or ("error", exception), or ("aborted", None) if the task was cancelled
    (a weight-update pause with mode=abort, or the client gone)."""
    try:
        stream = getattr(backend, "generate_stream", None)
        if stream is None:
            out.put_nowait(("done", (await backend.generate([req]))[0]))
            return
        async for item in stream(req):
            out.put_nowait(("done", item) if isinstance(item, Completion) else ("piece", item))
    except asyncio.CancelledError:
        out.put_nowait(("aborted", None))
        raise
    except Exception as e:  # noqa: BLE001 - the response reports it
        out.put_nowait(("error", e))


async def first_while_connected(out: asyncio.Queue, receive) -> tuple[str, Any] | None:
    """The first item a pump puts in `out`, or None if the client disconnected first."""
    get = asyncio.ensure_future(out.get())
    gone = asyncio.ensure_future(_until_disconnect(receive))
    gone.add_done_callback(retrieve)
    try:
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not get.done():
            get.cancel()
    return get.result() if get.done() and not get.cancelled() else None


def sse(obj: Any) -> str:
    """One server-sent event carrying JSON, as the OpenAI API streams."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage_of(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"image_tokens": c.visual_tokens}}


async def stream_events(first: tuple[str, Any], out: asyncio.Queue, pump: asyncio.Task, parsed: ChatRequest,
                        model_name: str, error: Callable[[int, str, str], dict]) -> AsyncIterator[str]:
    """The SSE body of a streamed chat completion (module docstring), from the pump's items. Closing
    it (the client went away) cancels the pump, which drops the generation."""
    head = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model_name, "system_fingerprint": None}
    usage = {"usage": None} if parsed.include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> str:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    **usage})

    text = StreamText(parsed.request.stop)
    calls = CallStream(parsed.tools)  # what of the stop-safe text is content, not a tool call
    try:
        yield chunk({"role": "assistant", "content": ""})
        kind, value = first
        while kind == "piece":
            piece = calls.push(text.push(value))
            if piece:
                yield chunk({"content": piece})
            kind, value = await out.get()
        if kind == "done" and not (value.finish_reason == "error" or value.error):
            text.finish(value.text)  # warns when the pieces are not the final text's beginning
            rest, read = calls.finish(value.text)
            if rest:
                yield chunk({"content": rest})
            for delta in call_deltas(read) if read else []:
                yield chunk(delta)
            yield chunk({}, "tool_calls" if read else value.finish_reason)
            if parsed.include_usage:
                yield sse({**head, "choices": [], "usage": usage_of(value)})
        elif kind == "done":
            yield sse(error(500, f"the model failed: {value.error or 'unknown error'}", "server_error"))
        elif kind == "aborted":
            yield sse(error(503, "aborted for a weight update (POST /pause?mode=abort); send it again",
                            "service_unavailable"))
        else:
            yield sse(error(*failure_of(value)))
        yield "data: [DONE]\n\n"
    finally:
        pump.cancel()
