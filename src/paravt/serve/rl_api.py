"""Weight sync for RL (`--rl-api`, off by default; behind --api-key when one is set): the endpoints
and semantics of vLLM's dev-mode RL API, so a trainer drives `paravt serve` and vLLM alike:
`POST /pause?mode=wait|abort|keep` (new requests wait; "wait" and "keep" let the requests in flight
finish first, "abort" cancels them), `POST /resume`, `GET /is_paused`, `POST /collective_rpc` with
`{"method": "reload_weights", "kwargs": {"weights_path": DIR}}` (safetensors written by the
trainer; only while paused), `POST /update_weight_version {"new_version": V}`, `GET /weight_info`.
"""

# no `from __future__ import annotations`: FastAPI resolves the handlers' annotations (Request) at runtime
import asyncio
import json

from paravt.backends.base import Backend

RL_PATHS = ("/pause", "/resume", "/is_paused", "/collective_rpc", "/update_weight_version", "/weight_info")


class WeightGate:
    """Pause/resume around weight updates (the RL API): requests pass while it is open, wait while
    it is paused, and a pause can wait for, or cancel, the requests in flight."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.inflight: set[asyncio.Task] = set()
        self.version: str | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    async def enter(self) -> None:
        await self.open.wait()
        self.track(asyncio.current_task())

    def track(self, task: asyncio.Task) -> None:
        """Count `task` as a request in flight (a pause with mode=abort cancels it)."""
        self.inflight.add(task)
        self.idle.clear()

    def leave(self, task: asyncio.Task | None = None) -> None:
        self.inflight.discard(task or asyncio.current_task())
        if not self.inflight:
            self.idle.set()

    async def pause(self, mode: str) -> None:
        self.open.clear()
        if mode == "abort":
            for t in list(self.inflight):
                t.cancel()
        await self.idle.wait()

    def resume(self) -> None:
        self.open.set()

    @property
    def paused(self) -> bool:
        return not self.open.is_set()


def add_rl_api(app, backend: Backend, gate: WeightGate, error) -> None:
    """vLLM's dev-mode RL endpoints (module docstring), over `backend.reload_weights(path)`."""
    from fastapi import Request

    @app.post("/pause")
    async def pause(mode: str = "abort"):
        if mode not in ("abort", "wait", "keep"):
            return error(400, f"mode must be abort, wait or keep, got {mode!r}")
        await gate.pause(mode)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume():
        gate.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused():
        return {"is_paused": gate.paused}

    @app.get("/weight_info")
    async def weight_info():
        return {"weight_version": gate.version}

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await _json_object(request)
        version = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(version, str):
            return error(400, 'the body must be {"new_version": "<string>"}')
        gate.version = version
        return {"success": True, "new_version": version}

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        body = await _json_object(request)
        if not isinstance(body, dict) or body.get("method") != "reload_weights":
            return error(400, 'only {"method": "reload_weights", "kwargs": {"weights_path": DIR}} is served here')
        path = (body.get("kwargs") or {}).get("weights_path")
        if not isinstance(path, str) or not path:
            return error(400, "reload_weights needs kwargs.weights_path, a directory of safetensors files")
        if not gate.paused:
            return error(409, "pause generation first (POST /pause): weights change under no request")
        reload = getattr(backend, "reload_weights", None)
        if reload is None:
            return error(400, "this server's backend cannot reload weights")
        try:
            await asyncio.to_thread(reload, path)
        except (OSError, ValueError) as e:
            return error(400, f"reload_weights failed: {e}")
        return {"results": [None]}


async def _json_object(request) -> object:
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):
        return None

