"""What a paravt HTTP service (`paravt serve`, `paravt app`) refuses so that no web page can drive it.

A server on loopback without a key is still reachable from every page the user's browser opens:
a page may POST to http://127.0.0.1:8000 cross-site without a CORS preflight when the body is
`text/plain` or a form, and a DNS-rebinding page reaches it under its own host name. So:
- bound to loopback, a Host header that is not a loopback name (localhost, ::1, any 127.0.0.0/8
  address) is refused (421): a rebinding page's requests carry the page's own name;
- bound beyond loopback without a key, a Host header must be an IP address, a loopback name or a
  name the server was given (`named_hosts`: its machine's names, --allow-host): a rebinding page's
  name is none of these, and the key, where there is one, is what a page cannot know;
- a request whose Origin is not the server's own (scheme-less host:port as the Host header says)
  nor in the allowed origins is refused (403): browsers send Origin on every cross-site POST;
- a POST to a JSON endpoint must say `Content-Type: application/json` (415): that type is one a
  cross-site page cannot send without a preflight, which the server answers (CORS) only for the
  origins it was told to let in (`allowed_origins`, compared as browsers send them: `origin_of`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import AsyncIterable
from urllib.parse import urlsplit

LOOPBACK_HOSTNAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` (a bind address or a Host header's name, without port) names this machine:
    localhost, ::1, or any address of 127.0.0.0/8."""
    name = host.strip("[]").lower().rstrip(".")
    if name in LOOPBACK_HOSTNAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name of a Host header (`127.0.0.1:8000`, `[::1]:8000`, `localhost`), without its port."""
    h = host_header.strip()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def origin_of(url: str) -> str:
    """`url` as a browser's Origin header spells it (scheme://host[:port], lower case, no default
    port, no path), or ValueError: `--allow-origin http://Localhost:5173/` must match the
    `http://localhost:5173` a browser sends."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise ValueError(f"not an origin: {url!r} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"not an origin: {url!r} (an origin is scheme://host[:port], e.g. http://localhost:5173)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


def refusal(method: str, path: str, headers, loopback_only: bool, json_paths: tuple[str, ...] = (),
            allowed_origins: tuple[str, ...] = (), named_hosts: tuple[str, ...] | None = None) -> tuple[int, str] | None:
    """(status, message) when the request is one a foreign web page could have sent, else None.
    `headers` is any case-insensitive mapping (Starlette's); `allowed_origins` as `origin_of` spells
    them; `named_hosts` (lower case), where given, the only names besides IP addresses and loopback
    names that the Host header may carry."""
    host = headers.get("host") or ""
    name = host_name(host).lower().rstrip(".")
    if loopback_only and not is_loopback(name):
        return 421, (f"this server answers on its loopback address only, not as {host[:80]!r} "
                     "(open it as http://127.0.0.1:PORT)")
    if named_hosts is not None and not (is_ip(name) or is_loopback(name) or name in named_hosts):
        return 421, (f"this server has no API key, so it answers only as an IP address or a name it was given, "
                     f"not as {host[:80]!r} (start it with --api-key, or name the host with --allow-host)")
    origin = headers.get("origin")
    if origin is not None and not _same_origin(origin, host) and origin.lower().rstrip("/") not in allowed_origins:
        return 403, (f"cross-origin requests are refused (Origin {origin[:80]!r}); a browser front-end on "
                     "another origin needs --allow-origin")
    if method == "POST" and path in json_paths:
        kind = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return 415, f"send the body as Content-Type: application/json (got {kind or 'none'!r})"
    return None


def _same_origin(origin: str, host: str) -> bool:
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == host.strip().lower()


CORS_MAX_AGE_S = 600  # a browser may reuse a preflight's answer this long


def add_cors(app, origins: tuple[str, ...], methods: tuple[str, ...], headers: tuple[str, ...],
             expose: tuple[str, ...] = ()) -> None:
    """Let the browser front-ends at `origins` (as `origin_of` spells them; `--allow-origin`) in: their
    preflights answered, every answer to them with its CORS headers (Starlette's CORSMiddleware, added
    outermost to the Starlette or FastAPI `app`, so a preflight is answered before `refusal` is asked).
    `expose`: response headers their scripts may read. No origins: nothing is added."""
    if not origins:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=list(methods),
                       allow_headers=list(headers), expose_headers=list(expose), max_age=CORS_MAX_AGE_S)


async def read_body(chunks: AsyncIterable[bytes], max_bytes: int, timeout_s: float) -> bytes | tuple[int, str]:
    """A request's whole body from `chunks`, or (status, why) to answer instead: 408 when it has not
    all arrived within `timeout_s` (uvicorn bounds only the headers' time, so a client that stops
    sending would hold a worker), 413 past `max_bytes` (a chunked upload without Content-Length is
    stopped there too). What `chunks` raises (a client that left) is the caller's."""
    got, size = [], 0
    reading = chunks.__aiter__()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            chunk = await asyncio.wait_for(reading.__anext__(), max(deadline - time.monotonic(), 0.001))
        except StopAsyncIteration:
            return b"".join(got)
        except asyncio.TimeoutError:
            return 408, f"the request body did not arrive within {timeout_s:g} s"
        size += len(chunk)
        if size > max_bytes:
            return 413, f"the request body is over the limit of {max_bytes} bytes"
        got.append(chunk)


HEADER_TIMEOUT_S = 30.0


def h11_protocol(header_timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's h11 protocol with a deadline on each request's headers: uvicorn times out idle
    keep-alive connections but not one that never finishes its headers, so 1,000 such connections
    (one byte now and then) would hold every file descriptor of the server. Pass it as
    `uvicorn.run(..., http=h11_protocol())`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineH11(H11Protocol):
        _deadline = None
        _cycle_seen = None

        def _arm(self) -> None:
            self._disarm()
            self._cycle_seen = self.cycle
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            if self.cycle is self._cycle_seen and not self.transport.is_closing():
                self.transport.close()  # no request's headers arrived in time

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._cycle_seen:  # a request's headers were read
                self._disarm()
                self._cycle_seen = self.cycle

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection gets its own deadline

    return HeaderDeadlineH11
