"""`paravt mcp --http`: the SDK's streamable HTTP app (both protocol eras: the `initialize` handshake
with its sessions, and 2026-07-28's sessionless requests) behind what every paravt server refuses and
bounds, served by uvicorn on loopback.

Outermost first: the CORS answers for `--allow-origin`'s origins (`paravt.webguard.add_cors`, as
`paravt serve`); `paravt.webguard.refusal` (a Host that is not a loopback name, a foreign Origin, a
POST to /mcp that is not JSON); then each POST's whole body read here (`WholeBody`: a deadline and a
size bound, a client that leaves mid-body one log line, a request holding a lone surrogate answered:
`paravt.integrations.mcp.wire`) before the SDK sees it.
"""

from __future__ import annotations

import logging
from typing import Any

from paravt.integrations.mcp import wire

MCP_PATH = "/mcp"
BODY_TIMEOUT_S = 30.0  # a request body must arrive whole within this (its headers have HEADER_TIMEOUT_S)
MAX_BODY_BYTES = 4 * 1024 * 1024  # the SDK's own bound (DEFAULT_MAX_REQUEST_BODY_SIZE)
SHUTDOWN_S = 5.0  # on SIGTERM/SIGINT, requests still running after this are cancelled
CORS_METHODS = ("GET", "POST", "DELETE")  # a session's event stream, its requests, its end
# a browser client's requests carry Mcp-Session-Id, Mcp-Protocol-Version, Mcp-Method, Mcp-Name and
# Mcp-Param-* headers (2026-07-28): any header, from an origin the user let in
CORS_HEADERS = ("*",)
CORS_EXPOSE = ("mcp-session-id", "mcp-protocol-version")  # a browser client reads its session's id

log = logging.getLogger("paravt.mcp")


def check_http_options(host: str, allowed_origins: tuple[str, ...] = ()) -> None:
    """ValueError for a bind beyond loopback (the server has no authentication) or an --allow-origin
    that is no origin: light, so `paravt mcp --http` says so before the SDK loads."""
    from paravt.webguard import is_loopback, origin_of

    if not is_loopback(host):
        raise ValueError(f"--host {host}: the MCP server binds a loopback address only (it has no authentication; "
                         "put a proxy that authenticates in front of it to reach it from elsewhere)")
    for origin in allowed_origins:
        origin_of(origin)


def http_app(server, loopback_only: bool = True, allowed_origins: tuple[str, ...] = (),
             body_timeout_s: float = BODY_TIMEOUT_S):
    """The streamable HTTP app of `server` (an MCPServer) at /mcp, behind the layers above. Its
    own DNS-rebinding check is off: paravt.webguard's is the one rule of every paravt server."""
    from mcp.server.transport_security import TransportSecuritySettings

    from paravt.webguard import add_cors, origin_of

    origins = tuple(origin_of(o) for o in allowed_origins)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, max_request_body_size=MAX_BODY_BYTES,
                                     transport_security=TransportSecuritySettings(
                                         enable_dns_rebinding_protection=False))
    app.add_middleware(WholeBody, timeout_s=body_timeout_s)  # each add_middleware goes outside the ones before
    app.add_middleware(Guard, loopback_only=loopback_only, origins=origins)
    add_cors(app, origins, CORS_METHODS, CORS_HEADERS, CORS_EXPOSE)
    return app


async def serve(app, host: str, port: int) -> None:
    """uvicorn on host:port, with paravt.webguard's header deadline, the process's one-line logging
    (no log config of uvicorn's own), and a bounded graceful shutdown."""
    import uvicorn

    from paravt.webguard import h11_protocol

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", log_config=None, http=h11_protocol(),
                            timeout_graceful_shutdown=int(SHUTDOWN_S))
    await uvicorn.Server(config).serve()


class Guard:
    """What a web page could send, refused before the SDK sees it (paravt.webguard.refusal)."""

    def __init__(self, app, loopback_only: bool, origins: tuple[str, ...]) -> None:
        self.app, self.loopback_only, self.origins = app, loopback_only, origins

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            from starlette.datastructures import Headers

            from paravt.webguard import refusal

            why = refusal(scope["method"], scope["path"].rstrip("/") or "/", Headers(scope=scope), self.loopback_only,
                          json_paths=(MCP_PATH,), allowed_origins=self.origins)
            if why is not None:
                await _answer(scope, receive, send, why[0], {"error": why[1]})
                return
        await self.app(scope, receive, send)


class WholeBody:
    """A POST's body read whole here, within BODY_TIMEOUT_S and MAX_BODY_BYTES, then handed to the SDK
    as one message: a body that trickles in gets 408 (uvicorn bounds only the headers' time), one over
    the bound 413, a client that leaves mid-body one log line (the SDK would log each as a traceback,
    and 300 of them rendered on the event loop froze the server for a minute); a request the SDK
    cannot read (`wire.unreadable`) its JSON-RPC error, 400."""

    def __init__(self, app, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        got = await read_body(scope, receive, self.timeout_s)
        if isinstance(got, tuple):
            if got[0]:
                await _answer(scope, receive, send, got[0], {"error": got[1]})
            else:
                log.warning("%s", got[1])
            return
        answer = wire.unreadable(got)
        if answer is not None:
            await _answer(scope, receive, send, 400, answer)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": got, "more_body": False}
            return await receive()  # after the body: only the client's disconnect is left to hear

        await self.app(scope, replay, send)


async def read_body(scope, receive, timeout_s: float) -> bytes | tuple[int, str]:
    """The whole body within `timeout_s` (`paravt.webguard.read_body`, as serve reads one), or
    (status, why) to answer instead, or (0, why) when the client left."""
    from paravt.webguard import read_body as read_whole

    declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return 413, f"the request body of {int(declared)} bytes is over the limit of {MAX_BODY_BYTES} bytes"
    size = 0

    async def chunks():
        nonlocal size
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientLeft
            chunk = message.get("body", b"")
            size += len(chunk)
            yield chunk
            if not message.get("more_body", False):
                return

    try:
        return await read_whole(chunks(), MAX_BODY_BYTES, timeout_s)
    except _ClientLeft:
        return 0, (f"client left before its request body arrived ({scope['method']} {scope['path']}, "
                   f"{size} bytes of {declared.decode() or 'an unstated length'})")


class _ClientLeft(Exception):
    """The client disconnected before its body arrived whole."""


async def _answer(scope, receive, send, status: int, body: dict) -> None:
    from starlette.responses import JSONResponse

    await JSONResponse(body, status_code=status)(scope, receive, send)
