"""How the server says no: the request's own fault (PayloadError, 400; PayloadTooLarge, 413) or a
failed generation (`failure_of`), as OpenAI-shaped JSON `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

from paravt.backends.base import BackendError, RequestRejected

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               503: "service_unavailable"}


class PayloadError(ValueError):
    """A request the server understands to be wrong; its message goes back to the client (400)."""

    status = 400


class PayloadTooLarge(PayloadError):
    """A request whose images would decode to more pixels than the server accepts (413)."""

    status = 413


def error_body(status: int, message: str, kind: str | None = None) -> dict:
    """The OpenAI error object for an HTTP status (its `type` from the status unless given)."""
    default = "invalid_request_error" if 400 <= status < 500 else "server_error"  # a 4xx is the client's to fix
    return {"error": {"message": message, "type": kind or ERROR_TYPES.get(status, default), "code": status}}


def failure_of(exc: BaseException) -> tuple[int, str, str]:
    """(status, message, type) of a failed generation: the client's fault (400) or the model's (500)."""
    if isinstance(exc, RequestRejected):
        return 400, str(exc), "invalid_request_error"
    if isinstance(exc, BackendError):
        return 500, f"the model failed: {exc}", "server_error"
    return 500, f"internal error: {type(exc).__name__}: {exc}", "server_error"
