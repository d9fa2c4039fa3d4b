"""The models the page asks: one in-process model kept loaded, a URL model a fresh client per episode."""

import asyncio
from typing import Optional

from paravt.app.settings import BackendFactory
from paravt.backends.base import Backend


def default_backend_factory(timeout_s: float = 600.0) -> BackendFactory:
    """paravt ask's make_backend: a URL is the OpenAI-compatible client (called without a key),
    anything else loads in-process; None is $PARAVT_MODEL or the shipped model."""

    def make(model: Optional[str]) -> Backend:
        from rich.console import Console

        from paravt.ask import make_backend

        return make_backend(model, console=Console(stderr=True), timeout_s=timeout_s)

    return make


class Models:
    """One in-process model kept loaded (loading one takes from a second to minutes); a URL model
    gets a fresh client per episode, closed after it. Asking for another local model replaces the
    loaded one once its rows in flight are done (HFBackend.aclose)."""

    def __init__(self, factory: BackendFactory):
        self.factory = factory
        self.key: Optional[str] = None
        self.backend: Optional[Backend] = None
        self.lock = asyncio.Lock()

    def is_loaded(self, model: Optional[str]) -> bool:
        return self.backend is not None and self.key == (model or "")

    async def acquire(self, model: Optional[str]) -> tuple[Backend, bool]:
        """(backend, whether the caller closes it)."""
        from paravt.video import is_url

        if is_url(model):
            return await asyncio.to_thread(self.factory, model), True
        async with self.lock:
            if self.is_loaded(model):
                return self.backend, False
            new = await asyncio.to_thread(self.factory, model or None)
            old, self.backend, self.key = self.backend, new, model or ""
        if old is not None:
            await old.aclose()
        return new, False

    async def aclose(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()
            self.backend = None

