"""Asynchronous PARA-GRPO rollouts (`rollout.max_staleness` s > 0): a producer keeps the rollout
servers busy while the trainer updates, as the recipe runs (AReaL's `max_head_offpolicyness`).

The producer is an event loop on a thread of its own. It submits whole prompt groups (the run's
seeded prompt schedule, group by group) as long as the recipe's capacity rule allows:

    accepted + running <= (s + v + 1) · P      (v: the version the servers hold, P groups a step)

where `accepted` counts the groups that finished (handed to the trainer or waiting) since the run
began, a resumed run counting its past steps' as accepted. The trainer takes groups in the order
they were submitted (failed ones skipped), not the order they finish. With the capacity rule this
bounds the staleness by construction: the i-th group taken goes into step ⌊i/P⌋ and was submitted
when at most (s + v + 1)·P groups were out, i.e. at a version v ≥ ⌊i/P⌋ − s. Taking groups as they
finish instead favours short episodes: long tool-calling groups then overrun the bound and are
dropped, and the trainer sees ever fewer of them (measured: κ fell to 0 at s = 2; docs/rl.md). A
group older than the bound all the same (a resumed run) is dropped and counted.

Every model call goes through the `ServerGate` (train.rollout), which tags it with the version of
the server that generated it. The sync after an update runs on this loop, while the trainer goes
on: close the server's gate (new calls wait), let this client's calls in flight end on the old
weights (`sync_pause: drain`; `abort` cuts them instead and they are sent again), POST /pause,
reload, set the version, resume, open the gate. A launched server that dies, or hangs (a call's
deadline passed and it fails its health check), is stopped whole and started again on the newest
weights, and its requests wait for it (or go to another). A failed episode drops its group.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from paravt.backends.base import BackendError

RELAUNCH_TRIES = 3  # starts of a dead or hung rollout server before the run stops
RELAUNCH_BACKOFF_S = 2.0  # doubled after each failed start, at most 10 s
from paravt.train.rollout import RolloutServers, ServerGate, describe, error_text, load_weights


@dataclass
class Group:
    """One prompt group's rollouts, as they finished."""

    index: int  # the producer's group number (its share of the schedule, in order)
    jobs: list  # grpo.Job
    results: list  # Episode, or the exception that ended it
    submitted_at: int  # the servers' version when it was submitted
    versions: list[int] = field(default_factory=list)  # the versions of every model call

    @property
    def oldest(self) -> int:
        return min(self.versions) if self.versions else self.submitted_at


def call_versions(episode) -> list[int]:
    """The weight version of each model call of an episode (main turns and sub-agents)."""
    out = []
    for c in episode.model_calls():
        if c.weight_version is None:
            raise BackendError(f"a rollout call from {c.served_by} carries no weight version")
        out.append(int(c.weight_version))
    return out


class RolloutProducer:
    """Rollouts that run beside the trainer. `run_group(backend, readers, jobs)` plays one group's
    episodes (grpo); `plan_group(i)` gives the producer's i-th group's jobs."""

    def __init__(self, servers: RolloutServers, max_staleness: int, per_step: int, version: int,
                 plan_group: Callable[[int], list], run_group: Callable[..., Any], pause: str = "drain",
                 max_failed_groups: int = 0):
        self.servers = servers
        self.s = max_staleness
        self.per_step = per_step
        self.version = version
        self.plan_group = plan_group
        self.run_group = run_group
        self.pause = pause  # drain | abort
        self.next_group = version * per_step  # a resumed run goes on with the schedule; in-flight rollouts were lost
        self.next_take = self.next_group
        self.accepted = version * per_step
        self.running = 0
        self.finished: dict[int, Group | None] = {}  # None: failed
        self.failed: list[str] = []  # why groups were dropped since the last take
        self.failed_in_a_row = 0
        self.max_failed_groups = max_failed_groups or 4 * (max_staleness + 1) * per_step
        self.stale_groups = 0
        self.server_sync_s = 0.0  # the last background sync's seconds
        self.error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollout-producer", daemon=True)
        self._thread.start()
        self._pending: Any = None  # the sync in progress (a concurrent future)
        self._call(self._setup())

    # ---- called from the trainer's thread

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def take(self, version: int) -> tuple[list[Group], list[str]]:
        """The trainer at `version` takes the next `per_step` groups in submission order (failed
        ones skipped), none older than version − s; blocks until they have finished. Returns them
        and why groups were dropped since the last take (failed episodes)."""
        return self._call(self._take(version))

    def request_sync(self, weights: Path, version: int) -> None:
        """Start loading `weights` as `version` on every server, in the background (`wait_sync` waits
        for it; the next request waits for the previous one first)."""
        self.wait_sync()
        self._pending = asyncio.run_coroutine_threadsafe(self._sync(weights, str(version)), self.loop)

    def wait_sync(self) -> None:
        """Until the sync in progress, if any, is done (raises its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def sync(self, weights: Path, version: int) -> float:
        """Every server loads `weights` as `version`; returns the seconds it took."""
        t0 = time.perf_counter()
        self.request_sync(weights, version)
        self.wait_sync()
        return time.perf_counter() - t0

    def close_gates(self) -> None:
        """No new call to any server, and this process's calls in flight ended (every process, before
        rank 0 pauses the servers)."""
        self._call(self._close_gates())

    def reopen(self, urls: list[str], version: int) -> None:
        """After rank 0 synced the servers (other processes): `urls` are open at `version`, the rest gone."""
        self._call(self._reopen(urls, version))

    def busy(self) -> float:
        """Seconds some server had a request of this process in flight since the producer started."""
        return self._call(self._busy())

    def resent(self) -> int:
        return self.backend.resent

    def close(self) -> None:
        try:
            self.wait_sync()  # a server given by URL must not stay paused
        except Exception:  # noqa: BLE001 - closing after a failure
            pass
        try:
            self._call(self._stop(), timeout=60)
        except Exception:  # noqa: BLE001 - closing after a failure: the loop may be gone
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)

    # ---- on the producer's loop

    async def _setup(self) -> None:
        s = self.servers
        self.gate = ServerGate({u: s.version.get(u) for u in s.urls}, drained=self.pause == "drain")
        self.backend = s.backend(self.gate, down=self._down)
        self.http = s.async_client()
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
        self.running -= 1
        if errors:
            self.finished[g] = None
            self.failed.append(f"group {g}: {type(errors[0]).__name__}: {errors[0]}")
            self.failed_in_a_row += 1
            if self.failed_in_a_row >= self.max_failed_groups:
                self.error = BackendError(f"{self.failed_in_a_row} rollout groups in a row failed; the last: "
                                          f"{self.failed[-1]}")
        else:
            self.failed_in_a_row = 0
            self.accepted += 1
            self.finished[g] = group
        self.changed.set()

    async def _take(self, version: int) -> tuple[list[Group], list[str]]:
        out: list[Group] = []
        while True:
            if self.error is not None:
                raise self.error
            while len(out) < self.per_step and self.next_take in self.finished:
                group = self.finished.pop(self.next_take)
                self.next_take += 1
                if group is None:
                    continue  # failed: its room was freed when it failed
                if version - group.oldest > self.s:  # past the bound (cannot happen in order; guard)
                    self.accepted -= 1
                    self.stale_groups += 1
                    self.changed.set()
                    continue
                out.append(group)
            if len(out) == self.per_step:
                failed, self.failed = self.failed, []
                self.changed.set()
                return out, failed
            self.changed.clear()
            await self.changed.wait()

    async def _sync_one(self, url: str, weights: Path, version: str) -> None:
        """close → (drain) → pause → reload → version → resume → open."""
        self.gate.close(url)
        if self.pause == "drain":
            await self.gate.drain(url)
        await load_weights(self.http, url, weights, version, "wait" if self.pause == "drain" else "abort")
        self.servers.version[url] = version
        self.gate.reopen(url, version)

    async def _sync(self, weights: Path, version: str) -> None:
        t0 = time.perf_counter()
        s = self.servers
        s.weights, s.current = weights, version
        live = [u for u in s.urls if u not in self.restarting]  # a restarting server loads the newest itself
        results = await asyncio.gather(*[self._sync_one(u, weights, version) for u in live], return_exceptions=True)
        for u, e in zip(live, results):
            if not isinstance(e, BaseException):
                continue
            if u in s.launched:  # it died or hung under the sync: start it again on these weights
                self._restart(u, f"the weight sync failed ({describe(e, s.cfg.timeout_s)})", checked=False)
            else:
                print(f"rollout server {u} dropped: weight sync failed ({e})", file=sys.stderr)
                s.urls.remove(u)
                self.gate.remove(u)
        if not s.urls:
            self.error = BackendError("no rollout server is left")
            self.changed.set()
            raise self.error
        self.version = int(version)  # room for the next step's groups, which run on these weights
        self.server_sync_s = time.perf_counter() - t0
        self.changed.set()

    async def _close_gates(self) -> None:
        for u in self.servers.urls:
            self.gate.close(u)
        if self.pause == "drain":
            await asyncio.gather(*[self.gate.drain(u) for u in self.servers.urls])

    async def _reopen(self, urls: list[str], version: int) -> None:
        for u in list(self.gate.version):
            if u in urls:
                self.gate.reopen(u, str(version))
            else:
                self.gate.remove(u)
        self.version = version
        self.changed.set()

    def _restart(self, url: str, why: str | None = None, checked: bool = True) -> None:
        """Start `url` again in the background; `why` was found by `servers.failure` (checked) or is
        what failed (then the server is checked first, to say whether it died or hangs)."""
        if url not in self.restarting:
            self.gate.close(url)
            self.restarting[url] = asyncio.ensure_future(self._relaunch(url, why, checked))

    async def _relaunch(self, url: str, why: str | None, checked: bool) -> None:
        """Start `url` again and load the current weights, up to RELAUNCH_TRIES times (a loaded machine
        can make one start or sync miss its deadline); then the run stops, saying why in full."""
        try:
            if not checked:
                why = await asyncio.to_thread(self.servers.failure, url, why) or why
            for attempt in range(1, RELAUNCH_TRIES + 1):
                try:
                    await asyncio.to_thread(self.servers.relaunch, url, why)
                    self.backend.forget_model(url)  # it serves the synced weights' directory now
                    version = self.servers.current
                    await self._sync_one(url, self.servers.weights, version)
                    print(f"rollout server {url}: back, on the weights of version {version}", file=sys.stderr,
                          flush=True)
                    return
                except Exception as e:  # noqa: BLE001 - tried again, then reported whole
                    why = f"start {attempt} of {RELAUNCH_TRIES} failed ({error_text(e, self.servers.cfg.timeout_s)})"
                    if attempt == RELAUNCH_TRIES:
                        raise
                    await asyncio.sleep(min(RELAUNCH_BACKOFF_S * 2 ** (attempt - 1), 10.0))
        except Exception as e:  # noqa: BLE001 - the trainer learns of it in take(); a cancellation passes
            self.error = BackendError(f"rollout server {url} died and did not come back after {RELAUNCH_TRIES} "
                                      f"starts: {error_text(e, self.servers.cfg.timeout_s)}"
                                      f"{self.servers.log_tail(url)}")
            self.changed.set()
        finally:
            self.restarting.pop(url, None)

    async def _down(self, url: str, why: str) -> bool:
        """Asked by the backend after a call to `url` failed with `why`: is it a launched server that
        died or hangs? Then it is (being) started again, and the call is sent again."""
        if url in self.restarting:
            return True
        if url not in self.servers.launched or self.servers.weights is None:
            return False
        reason = await asyncio.to_thread(self.servers.failure, url, f"a call failed ({why})")
        if reason is None or url in self.restarting:
            return reason is not None
        self._restart(url, reason)
        return True

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
