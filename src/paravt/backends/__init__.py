"""Model backends: one async interface (`Backend`) over in-process transformers and OpenAI-compatible servers."""

from paravt.backends.base import (
    Backend,
    BackendError,
    Completion,
    GenerateRequest,
    ImagePart,
    Message,
    TextPart,
)

__all__ = [
    "Backend",
    "BackendError",
    "Completion",
    "GenerateRequest",
    "ImagePart",
    "Message",
    "TextPart",
]
