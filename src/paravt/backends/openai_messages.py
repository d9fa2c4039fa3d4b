"""The episode's messages as OpenAI chat messages (the openai backend's request bodies).

Frames go as base64 data URLs (`image_data_url`; `UrlCache` encodes each distinct frame once).

Tool calls, text mode (`GenerateRequest.tool_calls == "text"`, the default): the tool block, the calls
and their responses are the episode's own text, in system, assistant and user messages.

Native mode (`"native"`, `paravt ask/eval --tool-calls native`): the same messages said in OpenAI's
tool-calling convention, so that a server's own tool calling does the work (vLLM with
`--enable-auto-tool-choice --tool-call-parser hermes`, `paravt serve`):
- the native tool block at the end of the system text goes as `tools` (the system text before it
  stays the system message), with `tool_choice: "auto"`;
- an assistant turn whose `<tool_call>` blocks all read (as the hermes parser reads them) goes as its
  content (the text before the first block, one newline less) with `tool_calls`, and the responses
  of its calls, in the user turn(s) after it, go as one `tool` message each (`tool_call_id` = the
  call's id, frames of inline mode as images in it);
- the reply's `tool_calls` are read back into the turn's text by the backend (`_completion`), so the
  episode parses what the model wrote in either mode.

The chat template renders that as it renders paravt's text: the same tool block, a call as
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` after a newline, a round's responses
in one user turn, each in `<tool_response>`. So for a model whose calls are written that way (the
shipped one's are) the prompt is the text mode's, token for token. A turn written otherwise is
normalised by the template, as any tool-calling client's history is; one with a call that does not
read, or a `<tool_code>` call, stays text, with its responses (the server would not have read it as
calls either). With the "official" prompt profile the responses of a round, one user turn each in
text mode, become consecutive tool messages, which the template puts in one user turn.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from paravt import protocol as P
from paravt.messages import BackendError, ImagePart, Message, TextPart

_IMAGE = "\x00"  # stands for an image in a turn's text while its responses are found


def image_data_url(image: np.ndarray, fmt: str = "png", quality: int = 90) -> str:
    """An HxWx3 uint8 frame as a `data:image/...;base64,` URL."""
    from PIL import Image

    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise BackendError(f"frames must be HxWx3 uint8 arrays, got shape {arr.shape} dtype {arr.dtype}")
    buf = io.BytesIO()
    if fmt == "png":
        Image.fromarray(arr).save(buf, format="PNG", compress_level=1)  # speed over size: frames are noisy anyway
        mime = "image/png"
    elif fmt in ("jpeg", "jpg"):
        Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
        mime = "image/jpeg"
    else:
        raise ValueError(f"image format must be png or jpeg, not {fmt!r}")
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class UrlCache:
    """Encoded frames by content hash, bounded in bytes. The main agent resends the same K overview
    frames every turn (and a GRPO group resends them n times); encoding them once saves most of the
    client's CPU (PNG-encoding a 448x448 frame takes 10-40 ms)."""

    def __init__(self, max_bytes: int = 128 * 2**20):
        self.max_bytes = max_bytes
        self._d: OrderedDict[bytes, str] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, image: np.ndarray, fmt: str) -> str:
        arr = np.ascontiguousarray(image)
        h = hashlib.blake2b(arr.data, digest_size=16)
        h.update(f"{arr.shape}{arr.dtype}{fmt}".encode())
        key = h.digest()
        with self._lock:
            url = self._d.get(key)
            if url is not None:
                self._d.move_to_end(key)
                self.hits += 1
                return url
        url = image_data_url(arr, fmt)
        with self._lock:
            if key not in self._d and len(url) <= self.max_bytes:
                self._d[key] = url
                self._size += len(url)
                while self._size > self.max_bytes:
                    self._size -= len(self._d.popitem(last=False)[1])
        return url


def to_openai_messages(messages: list[Message], prefix: str = "", image_format: str = "png",
                       cache: UrlCache | None = None) -> list[dict]:
    """Our messages as OpenAI chat messages; the forced prefix becomes a trailing assistant message."""
    out = [to_openai_message(m, image_format, cache) for m in messages]
    if prefix:
        out.append({"role": "assistant", "content": prefix})
    return out


def to_openai_message(m: Message, image_format: str = "png", cache: UrlCache | None = None) -> dict:
    """One message: its text, or its text and image_url parts in order."""
    if isinstance(m.content, str) or not m.images():
        return {"role": m.role, "content": m.text()}
    parts: list[dict] = []
    for p in m.parts():
        if isinstance(p, TextPart):
            if p.text:
                parts.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            parts.append({"type": "image_url", "image_url": {"url": _url(p, image_format, cache)}})
    return {"role": m.role, "content": parts}


def _url(p: ImagePart, image_format: str, cache: UrlCache | None) -> str:
    return cache.get(p.image, image_format) if cache else image_data_url(p.image, image_format)


def to_native_messages(messages: list[Message], prefix: str = "", image_format: str = "png",
                       cache: UrlCache | None = None) -> tuple[list[dict], list[dict] | None]:
    """Our messages in OpenAI's tool-calling convention, and the tools to declare (openai_tools)."""
    out, tools = _native(messages, lambda p: _url(p, image_format, cache),
                         lambda m: to_openai_message(m, image_format, cache))
    if prefix:
        out.append({"role": "assistant", "content": prefix})
    return out, tools


def _native(messages: list[Message], image_url: Callable[[ImagePart], str],
                    as_openai: Callable[[Message], dict]) -> tuple[list[dict], list[dict] | None]:
    """(OpenAI messages, tools) for `messages` (module docstring); `as_openai` says a message as
    text mode does, `image_url` encodes a frame."""
    out: list[dict] = []
    tools = None
    i, turn = 0, 0
    while i < len(messages):
        m = messages[i]
        split = P.split_native_tools(m.text()) if m.role == "system" and i == 0 and not m.images() else None
        if split is not None and all(_plain_tool(t) for t in split[1]):
            system, tools = split
            if system is not None:
                out.append({"role": "system", "content": system})
            i += 1
            continue
        if m.role == "assistant" and tools is not None:
            native = _assistant(m.text(), turn)
            found = _responses(messages, i + 1, len(native[1])) if native else None
            if native and found:
                content, calls = native
                responses, used = found
                out.append({"role": "assistant", "content": content, "tool_calls": calls})
                out += [{"role": "tool", "tool_call_id": c["id"], "content": _tool_content(r, image_url)}
                        for c, r in zip(calls, responses)]
                i += 1 + used
                turn += 1
                continue
        turn += m.role == "assistant"
        out.append(as_openai(m))
        i += 1
    return out, tools


def _plain_tool(t: dict) -> bool:
    """A tool a server renders as written (vLLM writes a function's name, description and parameters,
    in that order, whatever the client sent)."""
    fn = t.get("function")
    return list(t) == ["type", "function"] and isinstance(fn, dict) and list(fn) == ["name", "description",
                                                                                      "parameters"]


def _assistant(text: str, turn: int) -> tuple[str | None, list[dict]] | None:
    """(content, tool_calls) of an assistant turn whose calls all read, else None."""
    if P.TOOL_CODE_OPEN in text:
        return None
    calls, _ = P.strict_calls(text)
    if not calls or not all(isinstance(json.loads(c.raw)["name"], str) for c in calls):
        return None
    content = text[: text.find(P.TOOL_CALL_OPEN)].removesuffix("\n")
    return (content or None), [
        {"id": f"call_{turn}_{k}", "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for k, c in enumerate(calls)]


def _responses(messages: list[Message], start: int, n: int) -> tuple[list[list], int] | None:
    """The `n` responses in the user turns from `start` on (each turn nothing but responses), and how
    many turns they took; None when they are not exactly that."""
    found: list[list] = []
    used = 0
    while len(found) < n and start + used < len(messages) and messages[start + used].role == "user":
        got = _split_responses(messages[start + used])
        if got is None:
            return None
        found += got
        used += 1
    return (found, used) if len(found) == n else None


def _split_responses(m: Message) -> list[list] | None:
    """A user turn of `<tool_response>` blocks (as `agent.build_tool_response_messages` writes them:
    joined by newlines) -> each block's parts, or None when the turn is anything else."""
    texts = [p.text for p in m.parts() if isinstance(p, TextPart)]
    if any(_IMAGE in t for t in texts):
        return None
    images = m.images()
    flat = "".join(p.text if isinstance(p, TextPart) else _IMAGE for p in m.parts())
    opener, closer = P.TOOL_RESPONSE_OPEN + "\n", "\n" + P.TOOL_RESPONSE_CLOSE
    bodies, pos = [], 0
    while pos < len(flat):
        head = opener if pos == 0 else "\n" + opener
        if not flat.startswith(head, pos):
            return None
        end = flat.find(closer, pos + len(head))
        if end < 0:
            return None
        bodies.append(flat[pos + len(head): end])
        pos = end + len(closer)
    if not bodies:
        return None
    out, k = [], 0
    for body in bodies:
        parts: list = []
        for j, piece in enumerate(body.split(_IMAGE)):
            if j:
                parts.append(images[k])
                k += 1
            if piece:
                parts.append(TextPart(piece))
        out.append(parts)
    return out


def _tool_content(parts: list, image_url: Callable[[ImagePart], str]) -> str | list[dict]:
    """A response's parts as a tool message's content: its text, or text and image_url parts."""
    if not any(isinstance(p, ImagePart) for p in parts):
        return "".join(p.text for p in parts)
    return [{"type": "text", "text": p.text} if isinstance(p, TextPart) else
            {"type": "image_url", "image_url": {"url": image_url(p)}} for p in parts]
