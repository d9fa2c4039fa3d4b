"""PARA-GRPO rollouts on inference servers, and the weight sync that keeps them on-policy.

The episodes run through the same `run_episode` as in-process rollouts, with the OpenAI backend
spread over the servers (least-busy routing, retries on another server when one fails). What
training needs from a server, and where it comes from:
- exact sequences: the server's `prompt_token_ids` and generated `token_ids` (vLLM's
  `return_token_ids`, `paravt serve` the same); the sampling logprobs of those tokens (`logprobs`).
  A multi-turn episode whose next prompt, re-tokenized by the server, does not begin with the
  previous prompt and generation is trained turn by turn and counted (`drift_episodes`).
- the weights: after every optimizer step, before the next rollouts, each server loads the new
  weights (every parameter by name, tied ones included) through the server's own RL API (vLLM's dev-mode endpoints, which `paravt serve --rl-api`
  implements too): POST /pause?mode=wait, POST /collective_rpc reload_weights(weights_path) from
  the consolidated safetensors the trainer just wrote, POST /update_weight_version, POST /resume;
  GET /weight_info confirms the version. This disk path works everywhere (CPU included); its cost
  is one write and one read of the model per step. vLLM's NCCL weight transfer (the GPU path,
  /init_weight_transfer_engine then /update_weights) is not built: it needs the trainer and the
  servers on GPUs in one NCCL group.
- staleness: with `max_staleness` 0 (the default) rollouts and updates take turns, and a step
  refuses episodes of another version than the policy it updates. With s > 0 a producer
  (train.producer) keeps the servers busy while the trainer updates: every model call is tagged
  with the version that generated it (`ServerGate`), a batch trained at version v holds only groups
  whose every call is at least v − s, and the sync lets the calls in flight end on the old weights
  before it pauses the server (or cuts them and sends them again), so no call mixes two versions.
- death and hangs: a launched server that dies, or that lets a call's deadline pass and then fails
  a health check (GET /health; a stopped process, a deadlock, a KV cache that never drains), is
  stopped whole (its process group: SIGTERM, then SIGKILL) and started again on its port with the
  newest synced weights; its requests wait, then run there. Servers given as URLs are dropped when
  they fail a sync.

Servers are either given (URLs of servers a user runs, on this node or another) or started here as
subprocesses (`launch: paravt` or `launch: vllm`, one per entry of `devices`) under a guard
(paravt.procs) that stops each with the trainer, however the trainer ends (kill -9 included). Their
pid files in OUT/servers let a rerun stop what a run killed with its guards left behind.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from paravt.backends.base import BackendError
from paravt.procs import free_port, start_guarded, stop_group, stop_leftovers, wait_port_free

ENGINES = ("inprocess", "servers")
LAUNCH = ("none", "paravt", "vllm")


@dataclass
class RolloutConfig:
    engine: str = "inprocess"  # inprocess | servers
    servers: list[str] = field(default_factory=list)  # URLs of running servers (engine: servers)
    launch: str = "none"  # none | paravt | vllm: start this many servers here (one per entry of devices)
    devices: list[str] = field(default_factory=list)  # e.g. ["cpu", "cpu"], or ["0", "1"] (CUDA_VISIBLE_DEVICES)
    vllm_python: str = ""  # the python of a vLLM environment (default: this one)
    server_args: list[str] = field(default_factory=list)  # extra command-line arguments for launched servers
    api_key: str | None = None  # bearer key for rollout.servers
    concurrency: int = 16  # requests in flight per server
    timeout_s: float = 600.0  # one model call, retries included
    start_timeout_s: float = 900.0  # a launched server must answer within this
    max_staleness: int = 0  # s: versions a rollout's weights may lag the policy it trains (0: synchronous steps)
    sync_pause: str = "drain"  # s > 0: drain (calls in flight end on the old weights first) | abort (cut, sent again)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.launch not in LAUNCH:
            raise ValueError(f"rollout.launch must be one of {', '.join(LAUNCH)}, got {self.launch!r}")
        if self.engine == "servers" and not self.servers and (self.launch == "none" or not self.devices):
            raise ValueError("rollout.engine servers needs rollout.servers (URLs), or rollout.launch with devices")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")
        if self.sync_pause not in ("drain", "abort"):
            raise ValueError(f"rollout.sync_pause must be drain or abort, got {self.sync_pause!r}")
        if self.max_staleness > 0 and self.engine != "servers":
            raise ValueError("rollout.max_staleness > 0 (asynchronous rollouts) needs rollout.engine servers: "
                             "in-process rollouts share the trainer's weights and run between updates")
        if self.concurrency < 1 or self.timeout_s <= 0:
            raise ValueError("rollout.concurrency must be >= 1 and rollout.timeout_s > 0")


HEALTH_TIMEOUT_S = 5.0  # a health check after a failed call waits at most this (or the call timeout)


def describe(e: BaseException, timeout_s: float) -> str:
    """An HTTP failure in words (httpx's timeouts have no message of their own)."""
    if isinstance(e, httpx.TimeoutException):
        return f"no answer within {timeout_s:g} s"
    return str(e) or type(e).__name__


def error_text(e: BaseException, timeout_s: float) -> str:
    """An exception in words, never empty: its type, then its message (or what a timeout means)."""
    text = describe(e, timeout_s)
    return text if text == type(e).__name__ else f"{type(e).__name__}: {text}"


def launch_command(kind: str, model: str, port: int, python: str = "", extra: list[str] | None = None,
                   device: str = "") -> list[str]:
    """The command line of one rollout server on loopback. vLLM is asked for processed logprobs: log π_τ
    of the sampled token after temperature scaling, the behaviour policy the trainer's ratio divides by
    (its default, raw logprobs, are the τ = 1 values; see docs/rl.md). On a CPU it runs without chunked
    prefill: its CPU engine dies under many concurrent seeded requests otherwise ("CPU Generator does
    not use offset")."""
    if kind == "paravt":
        return [python or sys.executable, "-m", "paravt", "serve", "--model", model, "--port", str(port), "--rl-api",
                *(extra or [])]
    if kind == "vllm":
        cpu = ["--no-enable-chunked-prefill"] if device == "cpu" else []
        return [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
                "127.0.0.1", "--port", str(port), "--logprobs-mode", "processed_logprobs", *cpu, *(extra or [])]
    raise ValueError(f"cannot launch {kind!r} servers")


class RolloutServers:
    """The servers one trainer process rolls out on: their URLs, the weight version each holds, and
    the subprocesses started here."""

    def __init__(self, cfg: RolloutConfig, urls: list[str], procs: list[subprocess.Popen] | None = None,
                 launched: dict[str, dict] | None = None, api_key: str | None = None):
        self.cfg = cfg
        self.urls = [u.rstrip("/").removesuffix("/v1") for u in urls]
        self.procs = procs or []
        self.launched = launched or {}  # url -> how it was started (port, device, log), to start it again
        self.weights: Path | None = None  # the newest synced weights, and their version
        self.current: str | None = None
        self.restarts = 0
        self.banned_ids: list[int] = []  # the policy's never-sampled ids (the trainer sets them): logit_bias
        self.version: dict[str, str | None] = {u: None for u in self.urls}
        self._restart_lock = {u: threading.Lock() for u in self.launched}
        self.in_use: set[str] = set()  # synced weights a server being started again reads: not to be removed yet
        self.api_key = api_key or cfg.api_key or os.environ.get("PARAVT_API_KEY")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # readiness checks: one client per server (an httpx.Client shared between threads, when the
        # syncs ran on a thread per server, broke a live server's sync once another had died: EBADF);
        # the syncs use one async client on one event loop
        self._http = {u: httpx.Client(timeout=cfg.timeout_s, headers=headers) for u in self.urls}

    @classmethod
    def start(cls, cfg: RolloutConfig, model: str, log_dir: Path) -> "RolloutServers":
        """Use the given servers, or launch `cfg.launch` servers on `cfg.devices` serving `model`."""
        if cfg.launch == "none":
            return cls(cfg, list(cfg.servers))
        if cfg.launch == "vllm":
            from paravt.extras import require_vllm

            require_vllm(cfg.vllm_python or sys.executable)  # the one command to run, not a server's exit code
        procs, urls, launched = [], [], {}
        # the servers started here answer only to this trainer: a random key unless one is given (their
        # RL API swaps weights and pauses generation; a web page must not reach it)
        key = cfg.api_key or os.environ.get("PARAVT_API_KEY") or secrets.token_urlsafe(24)
        log_dir.mkdir(parents=True, exist_ok=True)
        for line in stop_leftovers(log_dir):  # an earlier run of OUT killed together with its guards
            print(f"rollout servers: {line}", file=sys.stderr)
        try:
            for i, dev in enumerate(cfg.devices):
                how = {"port": free_port(), "device": dev, "log": log_dir / f"server_{i}.log", "index": i}
                procs.append(_launch(cfg, model, how, key))
                urls.append(f"http://127.0.0.1:{how['port']}")
                launched[urls[-1]] = how
            servers = cls(cfg, list(cfg.servers) + urls, procs, launched, api_key=key)
            servers.wait_ready(log_dir)
            return servers
        except BaseException:
            for p in procs:
                stop_group(p, grace_s=2)
            raise

    def wait_ready(self, log_dir: Path, urls: list[str] | None = None) -> None:
        deadline = time.time() + self.cfg.start_timeout_s
        pending = list(urls or self.urls)
        while pending:
            for p in (self.procs if urls is None else [self.proc(u) for u in urls]):
                if p is not None and p.poll() is not None:
                    raise BackendError(f"a rollout server exited with code {p.returncode}; see {log_dir}/server_*.log")
            for u in list(pending):
                try:
                    if self._http[u].get(u + "/v1/models", timeout=2).status_code == 200:
                        pending.remove(u)
                except httpx.HTTPError:
                    pass
            if pending and time.time() > deadline:
                raise BackendError(f"rollout servers {pending} did not answer within {self.cfg.start_timeout_s:g} s")
            if pending:
                time.sleep(1)

    def backend(self, gate: "ServerGate | None" = None, down=None):
        """An OpenAI backend over the live servers, asking for token ids and logprobs (through `gate`
        for asynchronous rollouts). `down(url, why)` is asked after a failed call (default: `recover`
        on a worker thread)."""
        from paravt.backends.openai import OpenAIBackend

        if not self.urls:
            raise BackendError("no rollout server is left")

        async def recover(url: str, why: str) -> bool:
            return await asyncio.to_thread(self.recover, url, why)

        return OpenAIBackend(self.urls[0], endpoints=self.urls, api_key=self.api_key, concurrency=self.cfg.concurrency,
                             timeout_s=self.cfg.timeout_s, logprobs=True, server_extensions=True, gate=gate,
                             banned_ids=self.banned_ids, down=down or recover)

    # ---- launched servers that die

    def proc(self, url: str) -> subprocess.Popen | None:
        how = self.launched.get(url)
        return self.procs[how["index"]] if how else None

    def dead(self, url: str) -> bool:
        """Whether `url` is a server started here whose process has exited."""
        p = self.proc(url)
        return p is not None and p.poll() is not None

    def responsive(self, url: str) -> bool:
        """Whether `url` answers GET /health (vLLM, paravt serve) within a few seconds."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:  # a client of its own (checks may run at once, on worker threads); the status line only
            with httpx.stream("GET", url + "/health", headers=headers, timeout=min(HEALTH_TIMEOUT_S, self.cfg.timeout_s)) as r:
                return r.status_code < 500
        except httpx.HTTPError:
            return False

    def failure(self, url: str, why: str) -> str | None:
        """Why the launched server `url` must be started again after a call to it failed with `why`:
        it exited, or it does not answer its health check either (hung); None when it is fine (or
        not started here)."""
        p = self.proc(url)
        if p is None:
            return None
        if p.poll() is not None:
            return f"exited with code {p.returncode}"
        if not self.responsive(url):
            return why if "health check" in why else f"{why}, and its health check got no answer either"
        return None

    def relaunch(self, url: str, why: str | None = None) -> None:
        """Start the server `url` again, on its port and device, serving the newest synced weights
        (blocking until it answers); one that still runs (hung) is stopped first, whole, and its port
        must be free before the new one starts. The caller then sets its weight version."""
        how = self.launched[url]
        old = self.proc(url)
        why = why or f"exited with code {old.returncode}"
        stopped = old.poll() is None
        if stopped:
            stop_group(old)
        if not wait_port_free(how["port"]):
            raise BackendError(f"rollout server {url}: {why}; it was stopped, but port {how['port']} is still "
                               "held by another process, so it was not started again")
        verb = "stopped it and started it again" if stopped else "started it again"
        print(f"rollout server {url}: {why}: {verb} on the weights of version {self.current} (see {how['log']})",
              file=sys.stderr)
        model = str(self.weights) if self.weights is not None else how["model"]
        self.in_use.add(model)  # the trainer's next syncs must not remove it before the server has read it
        try:
            self.procs[how["index"]] = _launch(self.cfg, model, how, self.api_key, append=True)
            self.restarts += 1
            self.version[url] = None
            self.wait_ready(Path(how["log"]).parent, [url])
        finally:
            self.in_use.discard(model)

    def log_tail(self, url: str, lines: int = 6) -> str:
        """The last lines of a launched server's log, to end an error message with ('' if none)."""
        how = self.launched.get(url)
        try:
            tail = Path(how["log"]).read_text(errors="replace").strip().splitlines()[-lines:] if how else []
        except OSError:
            return ""
        return f"; the end of {how['log']}:\n" + "\n".join(tail) if tail else ""

    def recover(self, url: str, why: str) -> bool:
        """After a call to `url` failed with `why` (synchronous rollouts, on a worker thread): a
        launched server that died or hangs is started again on the current weights, at the current
        version. True when this call started it again (the caller sends its request again)."""
        if url not in self.launched or self.weights is None:
            return False
        with self._restart_lock[url]:
            reason = self.failure(url, f"a call failed ({why})")
            if reason is None:
                return False
            self.relaunch(url, reason)
            asyncio.run(self._load_current(url))
        return True

    async def _load_current(self, url: str) -> None:
        async with self.async_client() as http:
            await load_weights(http, url, self.weights, self.current)
        self.version[url] = self.current

    # ---- weight sync

    def async_client(self) -> httpx.AsyncClient:
        """A client for the RL endpoints (the API key, the call timeout)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=headers)

    async def _sync_one(self, http: httpx.AsyncClient, url: str, weights: Path, version: str) -> None:
        if self.dead(url):  # started here and died: start it again on the new weights
            await asyncio.to_thread(self.relaunch, url)
        try:
            await load_weights(http, url, weights, version)
        except (httpx.HTTPError, BackendError) as e:
            if url not in self.launched:
                raise
            # started here: dead or hung under the sync (a given server is dropped by the caller)
            why = f"the weight sync failed ({describe(e, self.cfg.timeout_s)})"
            await asyncio.to_thread(self.relaunch, url, await asyncio.to_thread(self.failure, url, why) or why)
            await load_weights(http, url, weights, version)
        self.version[url] = version

    def sync(self, weights: Path, version: str) -> float:
        """Every server loads `weights` and takes `version`; a server that fails is dropped (its
        requests go to the others). Returns the seconds it took; raises when no server is left."""
        t0 = time.perf_counter()
        self.weights, self.current = weights, version

        async def all_servers():
            async with self.async_client() as http:
                return await asyncio.gather(*[self._sync_one(http, u, weights, version) for u in self.urls],
                                            return_exceptions=True)

        errors = {u: e for u, e in zip(list(self.urls), asyncio.run(all_servers())) if isinstance(e, BaseException)}
        for u, e in errors.items():
            print(f"rollout server {u} dropped: weight sync failed ({e})", file=sys.stderr)
            self.urls.remove(u)
        if not self.urls:
            raise BackendError("no rollout server is left: " + "; ".join(f"{u}: {e}" for u, e in errors.items()))
        return time.perf_counter() - t0

    def close(self) -> None:
        for http in self._http.values():
            http.close()
        # each server its own grace period, all at once
        threads = [threading.Thread(target=stop_group, args=(p,)) for p in self.procs if p.poll() is None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for how in self.launched.values():
            Path(how["log"]).with_suffix(".pid").unlink(missing_ok=True)


async def load_weights(http: httpx.AsyncClient, url: str, weights: Path, version: str, pause: str = "wait") -> None:
    """The RL API's weight update on one server (module docstring): POST /pause?mode=`pause`,
    /collective_rpc reload_weights, /update_weight_version, then /resume whatever happened; GET
    /weight_info must then report `version`."""
    async def post(path: str, **kw) -> None:
        r = await http.post(url + path, **kw)
        if r.status_code >= 400:
            raise BackendError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:300]}")

    await post("/pause", params={"mode": pause})
    try:
        await post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(weights)}})
        await post("/update_weight_version", json={"new_version": version})
    finally:
        await post("/resume")
    got = (await http.get(url + "/weight_info")).json().get("weight_version")
    if str(got) != version:
        raise BackendError(f"{url} reports weight version {got!r} after loading {version!r}")


def _launch(cfg: RolloutConfig, model: str, how: dict, api_key: str, append: bool = False) -> subprocess.Popen:
    """One rollout server process (`how`: port, device, log file), requiring `api_key` (handed over in
    its environment, not on its command line, which every user of the machine can read)."""
    how.setdefault("model", model)
    dev = how["device"]
    env = dict(os.environ)
    env["PARAVT_API_KEY" if cfg.launch == "paravt" else "VLLM_API_KEY"] = api_key
    if dev != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = dev
    if cfg.launch == "vllm":
        env["VLLM_SERVER_DEV_MODE"] = "1"  # the RL endpoints
        if dev == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = launch_command(cfg.launch, model, how["port"], cfg.vllm_python, cfg.server_args, dev)
    with open(how["log"], "a" if append else "w") as log:  # the pid file: for a rerun (or whoever watches the run)
        return start_guarded(cmd, log=log, env=env, pid_file=Path(how["log"]).with_suffix(".pid"), port=how["port"])


class ServerGate:
    """The client side of the weight sync for asynchronous rollouts (on the producer's event loop):
    which servers are open, the weight version each holds, and an epoch per server that a sync or a
    restart moves on. The gate opens only after the weights are loaded and the server resumed, and
    closes before the pause is sent, so a call is generated by the version it entered with when
    either it ends in its epoch, or the sync drained it (`drained`: waited for this client's calls
    in flight to end before pausing). Otherwise (a pause that cut generations) a call that ended in
    another epoch may have met two versions, and the backend sends it again. Also counts the time
    at least one request was in flight (the rollout side's busy time)."""

    def __init__(self, versions: dict[str, str | None], drained: bool = True):
        self.version = dict(versions)
        self.drained = drained
        self._epoch = {u: 0 for u in versions}
        self._open = {u: asyncio.Event() for u in versions}
        self._calls = {u: 0 for u in versions}
        self._idle = {u: asyncio.Event() for u in versions}
        for e in [*self._open.values(), *self._idle.values()]:
            e.set()
        self._changed = asyncio.Event()
        self.drained_calls = 0  # calls a sync let end on the old weights before pausing
        self.busy_s = 0.0
        self._busy_since: float | None = None

    def is_open(self, url: str) -> bool:
        return url in self._open and self._open[url].is_set()

    def epoch(self, url: str) -> int:
        return self._epoch[url]

    def valid(self, url: str, epoch: int) -> bool:
        """Whether a call that entered at `epoch` and has just ended carries one version: its own."""
        return self.drained or self._epoch[url] == epoch

    async def wait_open(self) -> None:
        while not any(e.is_set() for e in self._open.values()):
            self._changed.clear()
            await self._changed.wait()

    async def enter(self, url: str) -> tuple[str | None, int]:
        await self._open[url].wait()
        if not any(self._calls.values()):
            self._busy_since = time.perf_counter()
        self._calls[url] += 1
        self._idle[url].clear()
        return self.version[url], self._epoch[url]

    def leave(self, url: str) -> None:
        self._calls[url] -= 1
        if self._calls[url] == 0:
            self._idle[url].set()
        if not any(self._calls.values()) and self._busy_since is not None:
            self.busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    def busy(self) -> float:
        """Seconds with a request in flight so far."""
        return self.busy_s + (time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0)

    def close(self, url: str) -> None:
        self._open[url].clear()
        self._epoch[url] += 1

    async def drain(self, url: str) -> None:
        """Until this client has no call in flight on `url` (close it first)."""
        self.drained_calls += self._calls[url]
        await self._idle[url].wait()

    def reopen(self, url: str, version: str) -> None:
        self.version[url] = version
        self._open[url].set()
        self._changed.set()

    def remove(self, url: str) -> None:
        """A server that is gone for good: it stays closed."""
        self.close(url)


def write_sync_weights(engine, model, processor, out: Path, version: str, keep: int = 2,
                       protect: set[str] | frozenset = frozenset()) -> Path | None:
    """The policy's consolidated weights for the servers to load, at OUT/sync/<version> (collective;
    rank 0 writes, older versions beyond `keep` are removed, except those in `protect`: a server
    started again is reading them). Returns the directory on rank 0."""
    from paravt.models.tiny import save_pretrained

    full = engine.full_state_dict(model, keep_tied=True)
    if not engine.main:
        return None
    root = out / "sync"
    d = root / version
    tmp = root / (version + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(engine.unwrap(model), processor, tmp, state_dict=full)
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    done = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".tmp")),
                  key=lambda p: p.stat().st_mtime)
    for old in done[:-keep]:
        if str(old) not in protect:
            shutil.rmtree(old, ignore_errors=True)
    return d
