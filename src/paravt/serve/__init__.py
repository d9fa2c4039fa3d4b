"""`paravt serve`: an OpenAI-compatible chat server over any Backend (the in-process hf one by default).

    app.py       the FastAPI app: routes, the key and body guard, each step of a completion
    schema.py    the /v1/chat/completions body, checked, into a GenerateRequest
    tool_calls.py OpenAI tool calling as vLLM's hermes parser serves it: tools in, tool_calls out
    images.py    data-URL images: per-request limits from their headers, decoded to the model's size
    limits.py    the server-wide pixel budget (wait, then 503 with Retry-After) and the body limit
    streaming.py `stream: true` as OpenAI's chunks; a client that goes away cancels its generation
    rl_api.py    vLLM's dev-mode RL API (`--rl-api`): pause / resume / reload_weights / weight version
    errors.py    the request's fault (400/413) or the model's (500), as OpenAI-shaped JSON
    command.py   `paravt serve`: load the model, serve it

With `return_token_ids: true` a response carries the generated ids (`choices[0].token_ids`) and the
prompt's (`prompt_token_ids`), as vLLM's does. `usage.prompt_tokens_details.image_tokens` carries
the visual share of the prompt. Every error is OpenAI-shaped JSON `{"error": {"message", "type", "code"}}`.
"""

from paravt.serve.app import create_app
from paravt.serve.command import serve
from paravt.serve.errors import PayloadError, PayloadTooLarge, failure_of
from paravt.serve.images import (MAX_IMAGE_PIXELS, MAX_IMAGES, MAX_TOTAL_PIXELS, ImageFit, ImageLimits, PendingImage,
                                 decode_image, decode_pending, model_image_fit, open_image, plan_image, to_rgb)
from paravt.serve.limits import (MAX_BODY_BYTES, MAX_INFLIGHT_PIXELS, PIXEL_WAIT_S, RETRY_AFTER_S, PixelBudget,
                                 Reservation, trim_memory)
from paravt.serve.rl_api import WeightGate
from paravt.serve.schema import (MAX_NEW_TOKENS, ChatRequest, check_text, count_images, parse_chat_request,
                                 parse_messages, read_messages)
from paravt.serve.streaming import StreamText, generate_while_connected, sse, stream_events

__all__ = ["MAX_BODY_BYTES", "MAX_IMAGES", "MAX_IMAGE_PIXELS", "MAX_INFLIGHT_PIXELS", "MAX_NEW_TOKENS",
           "MAX_TOTAL_PIXELS", "PIXEL_WAIT_S", "RETRY_AFTER_S", "ChatRequest", "ImageFit", "ImageLimits",
           "PayloadError", "PayloadTooLarge", "PendingImage", "PixelBudget", "Reservation", "StreamText",
           "WeightGate", "check_text", "count_images", "create_app", "decode_image", "decode_pending",
           "failure_of", "generate_while_connected", "model_image_fit", "open_image", "parse_chat_request",
           "parse_messages", "plan_image", "read_messages", "serve", "sse", "stream_events", "to_rgb",
           "trim_memory"]
