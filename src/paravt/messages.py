"""The types every layer speaks: a chat message of text and timestamped frames, and the two
errors a model call can end in. They live at the bottom of the package so that the chat renderer,
the episode loop, the trainers and the backends import them from one place without importing each
other (paravt.backends.base re-exports them for code written against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np


class BackendError(RuntimeError):
    """A model call failed in a way the caller should report (dead server, 4xx, bad model path)."""


class RequestRejected(BackendError):
    """A request that can never be served as sent (longer than the model's context, an image that
    cannot be read): the caller's fault, not the model's. `paravt serve` answers it with HTTP 400
    before any generation work."""


# Qwen's chat-format special tokens: structure of the conversation, never content of a message.
CHAT_SPECIALS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>")


def strip_chat_tokens(text: str) -> str:
    """The text without chat-format special tokens (our tags, <think>, <tool_call>..., kept): for
    generated text that becomes part of another message (a sub-agent's summary), where a stray
    `<|im_start|>` would be read as a new turn."""
    for special in CHAT_SPECIALS:
        text = text.replace(special, "")
    return text


@dataclass
class TextPart:
    text: str
    type: Literal["text"] = "text"


@dataclass
class ImagePart:
    """One RGB frame, HxWx3 uint8, already resized by paravt.video to the pixel budget."""

    image: np.ndarray
    timestamp: float | None = None  # seconds in the source video, for records only
    type: Literal["image"] = "image"


Part = Union[TextPart, ImagePart]


@dataclass
class Message:
    role: Literal["system", "user", "assistant"]
    content: list[Part] | str
    # For assistant messages produced by a token-reporting backend: the ids of the whole
    # assistant body as the model saw and produced it (forced prefix + generated ids,
    # including the end-of-turn token if one was generated). Backends that build prompts
    # from ids insert these verbatim; others use the text.
    token_ids: list[int] | None = None

    def parts(self) -> list[Part]:
        return [TextPart(self.content)] if isinstance(self.content, str) else list(self.content)

    def text(self) -> str:
        """The text of the message with images left out."""
        return "".join(p.text for p in self.parts() if isinstance(p, TextPart))

    def images(self) -> list[ImagePart]:
        return [p for p in self.parts() if isinstance(p, ImagePart)]
