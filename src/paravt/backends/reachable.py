"""Is the model server there? One check, used before an evaluation or an `ask` starts (a dead server
fails the run at once, with the cause, instead of after the client's retries, or every sample's)
and after an episode's model call failed, to name the cause (a refused connection is not a slow
model: the episode only sees its deadline pass while the client retries).

A backend with `endpoints` (OpenAIBackend: vLLM, SGLang, `paravt serve`) is asked GET <endpoint>/models,
which these servers answer at once; an in-process backend has nothing to check. Any HTTP answer
counts as the server being there (one without /models is still a server), except 401/403 (the
API key is refused: every request would be) and 5xx.
"""

from __future__ import annotations

import asyncio
import os

import httpx

from paravt.backends.base import BackendError

CHECK_TIMEOUT_S = 10.0  # at most this long per check, whatever the model calls' deadline (GET /models is instant)


def endpoints_of(backend: object) -> list[str]:
    """The server URLs a backend sends requests to (empty for an in-process model)."""
    return [u for u in (getattr(backend, "endpoints", None) or []) if isinstance(u, str)]


async def unreachable(backend: object, timeout_s: float | None = None) -> list[str]:
    """'<server>: <cause>' for each of the backend's servers that does not answer."""
    urls = endpoints_of(backend)
    if not urls:
        return []
    t = timeout_s if timeout_s is not None else min(float(getattr(backend, "timeout_s", CHECK_TIMEOUT_S)),
                                                    CHECK_TIMEOUT_S)
    key = getattr(backend, "api_key", None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=t, headers=headers) as client:
        causes = await asyncio.gather(*[_cause(client, u, t) for u in urls])
    return [f"{u.removesuffix('/v1')}: {c}" for u, c in zip(urls, causes) if c]


async def _cause(client: httpx.AsyncClient, url: str, timeout_s: float) -> str | None:
    try:
        r = await client.get(url + "/models")
    except httpx.TimeoutException:
        return f"no answer within {timeout_s:g} s"
    except httpx.ConnectError as e:
        return f"cannot connect ({_reason(e)})"
    except httpx.TransportError as e:
        return f"{type(e).__name__}: {e}"
    if r.status_code in (401, 403):
        return f"refused the API key (HTTP {r.status_code}; set --api-key or PARAVT_API_KEY)"
    if r.status_code >= 500:
        return f"HTTP {r.status_code}: {r.text.strip()[:200]}"
    return None


async def outage(backend: object, timeout_s: float | None = None) -> str | None:
    """'model server unreachable: <server>: <cause>; ...' when none of the backend's servers
    answers, else None (with several, the client routes around a dead one)."""
    return _outage(backend, await unreachable(backend, timeout_s))


def _outage(backend: object, bad: list[str]) -> str | None:
    if bad and len(bad) == len(endpoints_of(backend)):
        return "model server unreachable: " + "; ".join(bad)
    return None


def _reason(e: BaseException) -> str:
    """The system's words for a failed connection ("Connection refused", "Name or service not
    known"), from the OSError at the root of the exception chain (httpx's own message is "All
    connection attempts failed" under asyncio)."""
    reason, seen = str(e) or type(e).__name__, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            reason = os.strerror(e.errno) if e.errno > 0 else (e.strerror or reason)
        e = e.__cause__ or e.__context__
    return reason


async def check_servers(backend: object, timeout_s: float | None = None) -> None:
    """Raise BackendError (one line: each server and its cause) when none of the backend's
    servers answers; the ones that do not answer while others do are taken out of the backend's
    rotation (until they answer its health check), so no sample waits on them."""
    bad = await unreachable(backend, timeout_s)
    if (msg := _outage(backend, bad)) is not None:
        raise BackendError(msg)
    take_out = getattr(backend, "take_out", None)
    for line in bad if take_out is not None else []:
        url, cause = line.split(": ", 1)
        take_out(url, f"before the run: {cause}")
