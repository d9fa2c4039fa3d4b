"""Server-wide limits: the body size, and the decoded image pixels all requests together may hold.

A request reserves what its images will hold (plus the largest one's full decode) before
decoding and keeps it until its answer is sent; a request that does not fit waits for others to
finish (up to `pixel_wait_s`, 30 s) and is then answered 503 with Retry-After. A request larger
than the whole budget runs alone. Once no request holds pixels the freed heap is handed back to
the system (glibc's malloc_trim), so the server's memory returns to its idle size.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from paravt.serve.images import MAX_TOTAL_PIXELS

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_INFLIGHT_PIXELS = 2 * MAX_TOTAL_PIXELS  # decoded pixels all requests together may hold (~1.5 GB as RGB)
PIXEL_WAIT_S = 30.0  # how long a request waits for others to free pixels before it is answered 503
RETRY_AFTER_S = 5


class PixelBudget:
    """The decoded image pixels all requests together may hold (server-wide), so that concurrent
    requests with large images queue instead of exhausting memory. Requests are served in arrival
    order (a large one is not starved by a stream of small ones); one that waits longer than
    `wait_s` is turned away (the caller answers 503 with Retry-After)."""

    def __init__(self, capacity: int, wait_s: float = PIXEL_WAIT_S):
        if capacity < 1:
            raise ValueError(f"max_inflight_pixels must be >= 1, got {capacity}")
        if wait_s < 0:
            raise ValueError(f"pixel_wait_s must be >= 0, got {wait_s}")
        self.capacity = capacity
        self.wait_s = wait_s
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    async def acquire(self, n: int) -> int | None:
        """Take `n` pixels (at most the whole budget: a request larger than it runs alone) once the
        requests before it leave room; the amount taken, or None after `wait_s` without room."""
        n = min(n, self.capacity)
        if not self._waiters and self.used + n <= self.capacity:
            self.used += n
            return n
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_s):
                await entry[1]
            return n
        except BaseException as e:  # a timeout, or the handler cancelled (shutdown, abort)
            if entry[1].done() and not entry[1].cancelled():  # granted just as it gave up: give it back
                self.release(n)
            else:
                self._waiters.remove(entry)
                self._grant()  # a large request at the head that gives up may unblock smaller ones
            if isinstance(e, TimeoutError):
                return None
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            n, fut = self._waiters.popleft()
            self.used += n
            fut.set_result(None)


class Reservation:
    """Pixels a request holds in a PixelBudget: shrunk once its images are decoded, given back once
    (`release` is idempotent, so every path out of a request may call it). The last request out
    hands the freed memory back to the system (`trim_memory`)."""

    def __init__(self, budget: PixelBudget | None = None, n: int = 0):
        self.budget, self.n = budget, n

    def shrink(self, n: int) -> None:
        if self.budget is not None and n < self.n:
            self.budget.release(self.n - n)
            self.n = n

    def release(self) -> None:
        had = self.n
        self.shrink(0)
        if had and self.budget is not None and self.budget.used == 0:
            trim_memory_soon()


def trim_memory() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).
    Decoding images frees hundreds of MB in pieces glibc keeps in its arenas (one per decoding
    thread); without this the server's RSS stays near its peak long after the requests left
    (measured: 808 MB after 16 requests of 16 4096x4096 images, 450-500 MB with it; 400 MB idle)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


def trim_memory_soon() -> None:
    """`trim_memory` on a thread of its own (it can take ~0.1 s, which the event loop must not wait
    for), at most one at a time."""
    if not _trimming.acquire(blocking=False):
        return

    def run() -> None:
        try:
            trim_memory()
        finally:
            _trimming.release()

    threading.Thread(target=run, name="paravt-trim", daemon=True).start()


_malloc_trim: Any = None
_trimming = threading.Lock()
