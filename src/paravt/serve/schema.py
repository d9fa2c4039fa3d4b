"""The /v1/chat/completions request: its schema, checked, into a GenerateRequest.

Supported: string or list content with text and image_url parts; temperature, top_p,
max_tokens / max_completion_tokens, seed, stop, n=1, stream, logprobs (tokens are
reported as "token_id:N", as vLLM's --return-tokens-as-token-ids does, because the server
is tokenizer-agnostic and exact ids are what a trainer needs), and vLLM's
`continue_final_message` / `add_generation_prompt` for a forced assistant prefix; OpenAI tool
calling (`tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls`, `tool` messages:
paravt.serve.tool_calls); `response_format` {"type": "text"} (a JSON mode or schema is 400).
Lone UTF-16 surrogates (`"\\ud800"`, valid JSON but not text) are 400. Every error is a
PayloadError whose message goes back to the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from paravt import protocol as P
from paravt.backends.base import GenerateRequest, Message, TextPart
from paravt.serve.errors import PayloadError, PayloadTooLarge
from paravt.serve.images import (MAX_IMAGE_PIXELS, ImageFit, ImageLimits, PendingImage, decode_pending, open_image,
                                 plan_image)
from paravt.serve.tool_calls import (ToolUse, add_text, assistant_calls_text, close_tool_response, open_tool_response,
                                     read_tool_use, system_with_tools)

MAX_NEW_TOKENS = 32768
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class ChatRequest:
    """A parsed /v1/chat/completions body. `pending` lists images not decoded yet
    (`parse_chat_request(..., decode=False)`; `decode_pending` fills them in)."""

    request: GenerateRequest
    model: str | None
    logprobs: bool
    return_token_ids: bool = False
    stream: bool = False
    include_usage: bool = False
    pending: list[PendingImage] = field(default_factory=list)
    tools: ToolUse | None = None  # the request's tools (paravt.serve.tool_calls), None without

    def pixels_needed(self) -> int:
        """What decoding the pending images needs at its peak: every image's decoded size, plus the
        largest full decode (images are decoded one at a time, each shrunk before the next)."""
        held = sum(p.held_pixels for p in self.pending)
        return held + max((p.decode_pixels - p.held_pixels for p in self.pending), default=0)

    def pixels_held(self) -> int:
        return sum(p.held_pixels for p in self.pending)


def _is_image_part(p: Any) -> bool:
    return isinstance(p, dict) and p.get("type") == "image_url"


def count_images(raw: Any) -> int:
    """Image parts in a messages list, counted before any of them is decoded."""
    if not isinstance(raw, list):
        return 0
    return sum(_is_image_part(p) for m in raw if isinstance(m, dict) and isinstance(m.get("content"), list)
               for p in m["content"])


def check_text(body: Any) -> None:
    """Refuse lone UTF-16 surrogates anywhere in the body. JSON's "\\ud800" escape parses into a str
    that cannot be encoded as UTF-8, so it would fail later, in the tokenizer, as a 500."""
    stack: list[tuple[str, Any]] = [("body", body)]
    while stack:  # iterative: the parsed body may be nested as deep as the JSON parser allowed
        where, v = stack.pop()
        if isinstance(v, str):
            m = None if v.isascii() else _SURROGATE.search(v)  # isascii is O(1): base64 images cost nothing
            if m:
                raise PayloadError(f"{where} holds a lone surrogate (\\u{ord(m.group()):04x} at character "
                                   f"{m.start()}), which is not text; send valid UTF-8 / paired \\u escapes")
        elif isinstance(v, dict):
            for k, x in v.items():
                if not k.isascii() and _SURROGATE.search(k):
                    raise PayloadError(f"a key of {where} holds a lone surrogate, which is not text")
                stack.append((k if where == "body" else f"{where}.{k}", x))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))


def parse_messages(raw: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None,
                   fit: ImageFit | None = None) -> list[Message]:
    """OpenAI chat messages -> our Messages (images decoded to arrays; with `fit`, shrunk to the model's
    size while decoding). The request's image count and total pixels are checked against `limits` from
    the headers before any image is decoded."""
    msgs, pending = read_messages(raw, limits or ImageLimits(max_pixels=max_pixels), fit)
    decode_pending(pending)
    return msgs


def read_messages(raw: Any, limits: ImageLimits, fit: ImageFit | None = None
                  ) -> tuple[list[Message], list[PendingImage]]:
    """OpenAI chat messages -> our Messages, with every image's header read and checked against
    `limits` but its pixels not decoded: each is a PendingImage (its ImagePart slot is None until
    `decode_pending`)."""
    if not isinstance(raw, list) or not raw:
        raise PayloadError("messages must be a non-empty list")
    n_images = count_images(raw)
    if n_images > limits.max_images:
        raise PayloadError(f"the request holds {n_images} images, over the limit of {limits.max_images} images "
                           "per request")
    msgs: list[Message] = []
    pending: list[PendingImage] = []
    total = 0
    run: list | None = None  # the user turn a run of consecutive tool messages is written into
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "developer":  # the newer OpenAI name of the system role
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise PayloadError(f"messages[{i}].role must be system, user, assistant or tool, got {role!r}")
        content = m.get("content")
        if role == "tool":
            if run is None:
                run = []
                msgs.append(Message("user", run))
            total += _tool_message(content, i, run, limits, fit, pending)
            continue
        run = None
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None:  # the template writes them after the content
            has_content = content is not None and content != []
            suffix = assistant_calls_text(calls, has_content, f"messages[{i}]")
            if content is None or isinstance(content, str):
                content = (content or "") + suffix
            elif isinstance(content, list):
                content = content + [{"type": "text", "text": suffix}]
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, str):
            msgs.append(Message(role, content))
            continue
        if not isinstance(content, list):
            raise PayloadError(f"messages[{i}].content must be a string or a list of parts")
        parts: list = []
        for j, p in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if _is_image_part(p) and role != "user":
                raise PayloadError(f"messages[{i}]: images are accepted in user and tool messages only")
            total += _add_part(p, where, parts, limits, fit, pending)
        msgs.append(Message(role, parts))
    if total > limits.max_total_pixels:
        raise PayloadTooLarge(f"the request's {n_images} images decode to {total} pixels, over the limit of "
                              f"{limits.max_total_pixels} pixels per request")
    return msgs, pending


def _add_part(p: Any, where: str, parts: list, limits: ImageLimits, fit: ImageFit | None,
              pending: list[PendingImage], merge: bool = False) -> int:
    """A text or image_url part appended to `parts` (an image as a None slot, pending its decode;
    `merge`: text joined to the text before it); returns the image's pixels (0 for text)."""
    kind = p.get("type") if isinstance(p, dict) else None
    if kind == "text" and isinstance(p.get("text"), str):
        if merge:
            add_text(parts, p["text"])
        else:
            parts.append(TextPart(p["text"]))
        return 0
    if kind == "image_url" and isinstance(p.get("image_url"), (dict, str)):
        url = p["image_url"].get("url") if isinstance(p["image_url"], dict) else p["image_url"]
        try:
            img = open_image(url, limits.max_pixels)
        except PayloadError as e:
            raise PayloadError(f"{where}: {e}") from None
        pending.append(PendingImage(img, where, parts, len(parts), plan_image(img, fit)))
        parts.append(None)  # decoded later, once every image's size is known to fit
        return img.size[0] * img.size[1]
    raise PayloadError(f"{where} must be a text part or an image_url part (got type {kind!r})")


def _tool_message(content: Any, i: int, run: list, limits: ImageLimits, fit: ImageFit | None,
                  pending: list[PendingImage]) -> int:
    """A tool message written into its run's user turn as the template writes it (paravt.serve.tool_calls);
    returns its images' pixels."""
    open_tool_response(run)
    total = 0
    if isinstance(content, str):
        add_text(run, content)
    elif isinstance(content, list):
        if content and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                           for p in content):  # text only: joined by newlines (vLLM)
            content = [{"type": "text", "text": "\n".join(p["text"] for p in content)}]
        for j, p in enumerate(content):
            total += _add_part(p, f"messages[{i}].content[{j}]", run, limits, fit, pending, merge=True)
    elif content is not None:
        raise PayloadError(f"messages[{i}].content must be a string or a list of parts")
    close_tool_response(run)
    return total


def _number(body: dict, key: str, default: float, lo: float, hi: float, kind: type = float) -> Any:
    v = body.get(key)
    if v is None:
        return default
    # an int is compared as an int: float() of a 4,000-digit seed raises OverflowError
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (
            kind is int and isinstance(v, float) and not v.is_integer()):
        raise PayloadError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {_shown(v)}")
    if not lo <= v <= hi:
        raise PayloadError(f"{key} must be between {lo:g} and {hi:g}, got {_shown(v)}")
    return kind(v)


def _shown(v: Any) -> str:
    if isinstance(v, int) and v.bit_length() > 128:  # repr of a 5,000-digit int raises
        return f"an integer of {v.bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage), checked."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise PayloadError(f"stream must be true or false, got {stream!r}")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise PayloadError("stream_options is only allowed with stream=true")
    if not isinstance(opts, dict):
        raise PayloadError('stream_options must be an object like {"include_usage": true}')
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise PayloadError(f"stream_options.include_usage must be true or false, got {usage!r}")
    return True, usage


def _check_response_format(fmt: Any) -> None:
    """Only plain text is produced: a JSON mode or schema the reply would not honour is refused."""
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind in ("json_object", "json_schema", "structural_tag"):
        raise PayloadError(f"response_format {kind!r} is not supported: paravt serve cannot constrain the reply "
                           '(vLLM does it with guided decoding); leave it out or send {"type": "text"}')
    raise PayloadError('response_format must be {"type": "text"} (the only format paravt serve produces)')


def parse_chat_request(body: Any, max_pixels: int = MAX_IMAGE_PIXELS, limits: ImageLimits | None = None,
                       fit: ImageFit | None = None, decode: bool = True) -> ChatRequest:
    """Validate a /v1/chat/completions body and turn it into a GenerateRequest; PayloadError says what is
    wrong (its `status` is 400, or 413 for images over the pixel budget). With decode=False the images
    are left in `pending` (headers read and checked, pixels not decoded) for `decode_pending`."""
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    check_text(body)
    stream, include_usage = _stream_flags(body)
    if stream and body.get("logprobs"):
        raise PayloadError("logprobs are not streamed; send stream=false to get them")
    if stream and body.get("return_token_ids"):
        raise PayloadError("return_token_ids is not streamed; send stream=false to get them")
    if _number(body, "n", 1, 1, 128, int) != 1:
        raise PayloadError("only n=1 is supported")
    tools = read_tool_use(body)
    _check_response_format(body.get("response_format"))
    if _number(body, "top_logprobs", 0, 0, 20, int):
        raise PayloadError("top_logprobs is not supported (logprobs=true gives the sampled tokens' logprobs)")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise PayloadError("model must be a string")
    messages, pending = read_messages(body.get("messages"), limits or ImageLimits(max_pixels=max_pixels), fit)
    if tools is not None:  # declared in the system turn, as the chat template does
        if messages[0].role == "system":
            messages[0] = Message("system", system_with_tools(messages[0].text(), tools.tools))
        else:
            messages.insert(0, Message("system", system_with_tools(None, tools.tools)))
    cont = bool(body.get("continue_final_message", False))
    add_gen = body.get("add_generation_prompt")
    prefix = ""
    if cont:
        if add_gen:
            raise PayloadError("continue_final_message and add_generation_prompt cannot both be true")
        if messages[-1].role != "assistant":
            raise PayloadError("continue_final_message needs the last message to be the assistant's")
        prefix = messages.pop().text()
        if not messages:
            raise PayloadError("continue_final_message needs a message before the assistant's")
    elif add_gen is False:
        raise PayloadError("add_generation_prompt=false is only supported with continue_final_message=true")
    max_tokens = body.get("max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
        key = "max_tokens"
    max_new = _number(body, key, 1024, 1, MAX_NEW_TOKENS, int)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise PayloadError("top_p must be greater than 0")
    seed = _number(body, "seed", None, -(2**63), 2**63 - 1, int)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 16 or not all(isinstance(s, str) and s for s in stop):
        raise PayloadError("stop must be a non-empty string or a list of at most 16 non-empty strings")
    if tools is not None and tools.reads_calls and not tools.parallel:
        stop = [*stop, P.TOOL_CALL_CLOSE]  # one call: the reply ends with it (vLLM's grammar stops it there)
    req = GenerateRequest(messages=messages, max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                          prefix=prefix, stop=list(stop), seed=None if seed is None else seed % (2**63))
    parsed = ChatRequest(request=req, model=model, logprobs=bool(body.get("logprobs", False)),
                         return_token_ids=bool(body.get("return_token_ids", False)), stream=stream,
                         include_usage=include_usage, pending=pending, tools=tools)
    if decode:
        decode_pending(pending)
        parsed.pending = []
    return parsed
