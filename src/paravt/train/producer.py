"""Asynchronous PARA-GRPO rollouts (`rollout.max_staleness` s > 0): a producer keeps the rollout
servers busy while the trainer updates, as the recipe runs (AReaL's `max_head_offpolicyness`).

The producer is an event loop on a thread of its own. It submits whole prompt groups (the run's
seeded prompt schedule, group by group) as long as the recipe's capacity rule allows:

    accepted + running <= (s + v + 1) · prompts_per_step      (v: the trainer's version)

where `accepted` counts the groups that finished (handed to the trainer or waiting) since the run
began, a resumed run counting its past steps' as accepted. So the servers are at most s versions
ahead of the trainer, and a batch trained at version v can hold groups whose calls were generated
at v − s at the oldest; `take` drops any group older than that (counted, its room refilled).

Every model call goes through the `ServerGate` (train.rollout), which tags it with the version of
the server that generated it. The sync after an update runs on this loop: close the server's gate,
POST /pause?mode=abort (the generations in flight are cut: they are sent again once the server is
open, on the new weights), reload, set the version, resume, open the gate. A launched server that
dies is started again on the newest weights, and its requests wait for it (or go to another).
A failed episode drops its group, as in the synchronous step.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from paravt.backends.base import BackendError
from paravt.train.rollout import RolloutServers, ServerGate


@dataclass
class Group:
    """One prompt group's rollouts, as they finished."""

    index: int  # the run's group number: prompt schedule position step·P + j
    jobs: list  # grpo.Job
    results: list  # Episode, or the exception that ended it
    submitted_at: int  # the trainer's version when it was submitted
    versions: list[int] = field(default_factory=list)  # the versions of every model call

    @property
    def oldest(self) -> int:
        return min(self.versions) if self.versions else self.submitted_at


def call_versions(episode) -> list[int]:
    """The weight version of each model call of an episode (main turns and sub-agents)."""
    calls = [t.generation for t in episode.turns] + [c.generation for c in episode.subcalls() if c.generation]
    out = []
    for c in calls:
        if c.weight_version is None:
            raise BackendError(f"a rollout call from {c.served_by} carries no weight version")
        out.append(int(c.weight_version))
    return out


class RolloutProducer:
    """Rollouts that run beside the trainer. `run_group(backend, readers, jobs)` plays one group's
    episodes (grpo); `plan_group(g)` gives group g's jobs."""

    def __init__(self, servers: RolloutServers, max_staleness: int, per_step: int, version: int,
                 plan_group: Callable[[int], list], run_group: Callable[..., Any], max_failed_groups: int = 0):
        self.servers = servers
        self.s = max_staleness
        self.per_step = per_step
        self.version = version
        self.plan_group = plan_group
        self.run_group = run_group
        self.next_group = version * per_step  # a resumed run goes on with the schedule; in-flight rollouts were lost
        self.accepted = version * per_step
        self.running = 0
        self.ready: list[Group] = []
        self.failed: list[str] = []  # why groups were dropped since the last take
        self.failed_in_a_row = 0
        self.max_failed_groups = max_failed_groups or 4 * (max_staleness + 1) * per_step
        self.stale_groups = 0
        self.error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollout-producer", daemon=True)
        self._thread.start()
        self._call(self._setup())

    # ---- called from the trainer's thread

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def take(self, version: int) -> tuple[list[Group], list[str]]:
        """The trainer at `version` takes `per_step` finished groups (oldest first), none older than
        version − s; blocks until they are there. Returns them and why groups were dropped since the
        last take (failed episodes)."""
        return self._call(self._take(version))

    def sync(self, weights: Path, version: int) -> float:
        """Every server loads `weights` as `version`, cutting the generations in flight; the
        producer may then run up to s versions ahead of it. Returns the seconds it took."""
        t0 = time.perf_counter()
        self._call(self._sync(weights, str(version)))
        return time.perf_counter() - t0

    def busy(self) -> float:
        """Seconds some server had a request in flight since the producer started."""
        return self._call(self._busy())

    def resent(self) -> int:
        return self.backend.resent

    def close(self) -> None:
        try:
            self._call(self._stop(), timeout=60)
        except Exception:  # noqa: BLE001 - closing after a failure: the loop may be gone
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)

    # ---- on the producer's loop

    async def _setup(self) -> None:
        s = self.servers
        self.gate = ServerGate({u: s.version.get(u) for u in s.urls}, down=self._down)
        self.backend = s.backend(self.gate)
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        self.http = httpx.AsyncClient(timeout=s.cfg.timeout_s, headers=headers)
        self.readers: dict[str, Any] = {}
        self.tasks: set[asyncio.Task] = set()
        self.restarting: dict[str, asyncio.Task] = {}
        self.changed = asyncio.Event()  # a group finished, was taken, or the version moved on
        self.main = asyncio.ensure_future(self._produce())
        self.watch = asyncio.ensure_future(self._watchdog())

    async def _produce(self) -> None:
        try:
            while True:
                while self.accepted + self.running < (self.s + self.version + 1) * self.per_step:
                    g = self.next_group
                    self.next_group += 1
                    self.running += 1
                    task = asyncio.ensure_future(self._group(g))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.changed.clear()
                await self.changed.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the trainer learns of it in take()
            self.error = e
            self.changed.set()

    async def _group(self, g: int) -> None:
        submitted = self.version
        try:
            jobs = self.plan_group(g)
            results = await self.run_group(self.backend, self.readers, jobs)
            group = Group(g, jobs, results, submitted)
            errors = [r for r in results if isinstance(r, BaseException)]
            if not errors:
                group.versions = [v for ep in results for v in call_versions(ep)]
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - planning or bookkeeping failed: the group is lost
            errors = [e]
            jobs = []
        self.running -= 1
        if errors:
            self.failed.append(f"group {g}: {type(errors[0]).__name__}: {errors[0]}")
            self.failed_in_a_row += 1
            if self.failed_in_a_row >= self.max_failed_groups:
                self.error = BackendError(f"{self.failed_in_a_row} rollout groups in a row failed; the last: "
                                          f"{self.failed[-1]}")
        else:
            self.failed_in_a_row = 0
            self.accepted += 1
            self.ready.append(group)
        self.changed.set()

    async def _take(self, version: int) -> list[Group]:
        while True:
            if self.error is not None:
                raise self.error
            for g in [g for g in self.ready if version - g.oldest > self.s]:
                self.ready.remove(g)  # older than the bound: dropped, its room refilled
                self.accepted -= 1
                self.stale_groups += 1
            if len(self.ready) >= self.per_step:
                out, self.ready = self.ready[:self.per_step], self.ready[self.per_step:]
                failed, self.failed = self.failed, []
                self.changed.set()
                return out, failed
            self.changed.clear()
            await self.changed.wait()

    async def _post(self, url: str, path: str, **kw) -> dict:
        r = await self.http.post(url + path, **kw)
        if r.status_code >= 400:
            raise BackendError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json() if r.content else {}

    async def _sync_one(self, url: str, weights: Path, version: str) -> None:
        """pause (cutting the generations in flight) → reload → version → resume, behind a closed gate."""
        self.gate.close(url)
        await self._post(url, "/pause", params={"mode": "abort"})
        try:
            await self._post(url, "/collective_rpc", json={"method": "reload_weights",
                                                            "kwargs": {"weights_path": str(weights)}})
            await self._post(url, "/update_weight_version", json={"new_version": version})
        finally:
            await self._post(url, "/resume")
        got = (await self.http.get(url + "/weight_info")).json().get("weight_version")
        if str(got) != version:
            raise BackendError(f"{url} reports weight version {got!r} after loading {version!r}")
        self.servers.version[url] = version
        self.gate.reopen(url, version)

    async def _sync(self, weights: Path, version: str) -> None:
        s = self.servers
        s.weights, s.current = weights, version
        live = [u for u in s.urls if u not in self.restarting]  # a restarting server loads the newest itself
        results = await asyncio.gather(*[self._sync_one(u, weights, version) for u in live], return_exceptions=True)
        for u, e in zip(live, results):
            if not isinstance(e, BaseException):
                continue
            if u in s.launched:  # it died under the sync: start it again on these weights
                self._restart(u)
            else:
                print(f"rollout server {u} dropped: weight sync failed ({e})", file=sys.stderr)
                s.urls.remove(u)
                self.gate.remove(u)
        if not s.urls:
            raise BackendError("no rollout server is left")
        self.version = int(version)
        self.changed.set()

    def _restart(self, url: str) -> None:
        if url not in self.restarting:
            self.gate.close(url)
            self.restarting[url] = asyncio.ensure_future(self._relaunch(url))

    async def _relaunch(self, url: str) -> None:
        try:
            await asyncio.to_thread(self.servers.relaunch, url)
            self.backend.forget_model(url)  # it serves the synced weights' directory now
            await self._sync_one(url, self.servers.weights, self.servers.current)
        except BaseException as e:  # noqa: BLE001
            self.error = BackendError(f"rollout server {url} died and did not come back: {e}")
            self.changed.set()
        finally:
            self.restarting.pop(url, None)

    async def _down(self, url: str) -> bool:
        """Asked by the backend after a failed call: is `url` a launched server that died?"""
        if url in self.restarting:
            return True
        if self.servers.dead(url) and self.servers.weights is not None:
            self._restart(url)
            return True
        return False

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for u in list(self.servers.launched):
                if u not in self.restarting and self.servers.dead(u) and self.servers.weights is not None:
                    self._restart(u)

    async def _busy(self) -> float:
        return self.gate.busy()

    async def _stop(self) -> None:
        for t in [self.main, self.watch, *self.tasks, *self.restarting.values()]:
            t.cancel()
        await asyncio.gather(self.main, self.watch, *self.tasks, return_exceptions=True)
        await self.backend.aclose()
        await self.http.aclose()
        for r in self.readers.values():
            r.close()
