"""Backend for any OpenAI-compatible chat server (vLLM, SGLang, `paravt serve`).

What goes over the wire, and why:
- Frames travel as base64 data URLs (PNG by default: lossless, so the served model sees the
  pixels the episode sampled; JPEG on request for smaller bodies) in `image_url` parts, in
  message order, interleaved with the text parts (the `<12.5 seconds>` timestamps).
- A forced assistant prefix (e.g. "<think>\\n") is sent as a trailing assistant message with
  `continue_final_message=true, add_generation_prompt=false` in the body. vLLM and
  `paravt serve` continue that message (check other servers' support); the official OpenAI
  API does not know these fields (it would answer a new turn). `Completion.text` never includes the prefix; servers that
  echo it have it cut off.
- Concurrency: at most `concurrency` requests in flight per endpoint. With several endpoints
  (data-parallel servers) each request goes to the endpoint with the fewest requests in
  flight, ties broken round-robin; a retry after a failure goes to another endpoint if there
  is one, so one dead replica does not fail an evaluation. An endpoint that does not answer (no
  connection, or no answer within the deadline: a hung server accepts connections and never
  answers) is taken out of the rotation until it answers GET /health again (`endpoint_events`
  records both), so a stuck replica costs one deadline per call in flight on it, not one per call.
- Retries with exponential backoff (and jitter) on connection errors, timeouts, 429 and 5xx;
  any other 4xx is a `BackendError` at once, with the status and the server's message.
- Server extensions (on by default; `server_extensions=False` for servers that reject unknown
  fields): `skip_special_tokens: false`, because vLLM drops special tokens from the returned
  text by default and a tokenizer that marks `</think>` or `<tool_call>` special (as some
  fine-tuned checkpoints do) would lose the episode's structure; `return_token_ids: true`, which
  makes vLLM return the generated ids per choice (`token_ids`) and the prompt's
  (`prompt_token_ids`), the exact sequences a trainer needs; and `logprobs: true`.
- Tool calls (`GenerateRequest.tool_calls`): "text" (the default) writes the tool block, the calls
  and their responses as the episode's text; "native" says them in OpenAI's tool-calling convention
  (`tools`, assistant `tool_calls`, `tool` messages; paravt.backends.openai_tools), for a server whose
  own tool calling reads them (vLLM with the hermes parser, `paravt serve`).
- Servers that parse for the client: vLLM started with `--enable-auto-tool-choice
  --tool-call-parser hermes` moves calls out of `content` into `message.tool_calls`, and a
  reasoning parser moves the think into `reasoning` (`reasoning_content` before vLLM 0.11).
  The turn is rebuilt so that `protocol.parse` sees what the model wrote: exactly, from the
  logprobs' token bytes when present, else from the fields (think, `</think>`, content, then
  each call as a Hermes block).
- `banned_ids` go out as `logit_bias` −100: the trainer's policy never samples the vision
  placeholders (a generated one has no frame behind it), and a server must sample from that same
  distribution, or a sampled placeholder gets log π = −inf in the trainer.
- Weight versions (asynchronous RL, `gate=`): every request enters the gate of the server it goes
  to, which records the weight version the server holds; a server being synced or restarted is
  closed, and requests wait for an open one. A generation the server cut for a weight update
  (`paravt serve`'s 503 "aborted for a weight update", vLLM's `finish_reason: "abort"`), or lost with
  a server the gate says is down, is sent again once a server is open, without using up a retry; so
  is one that ended after a pause that cut generations (it may have met two versions). So every
  completion comes from one version and `Completion.weight_version` names it.
- Deadlines: `timeout_s` bounds one request from its first byte sent to its answer, retries and
  the model lookup included (a server that accepts connections and never answers, or trickles
  one byte at a time, fails within it, with a clear error). A request whose server let the
  deadline pass goes on to another endpoint, with a deadline of its own; it fails when no endpoint
  it has not waited on is left.
- `down(url, why)` (the trainer's launched rollout servers): asked after a failed call; when it
  found the server dead or hung and started it again, the call is sent again.

Assistant messages are sent as text (`Message.token_ids` is ignored): a server re-tokenizes
them, so token-exact multi-turn training sequences come from the server's own ids
(`Completion.prompt_ids` + `Completion.token_ids`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from paravt.backends.base import BackendError, Completion, GenerateRequest
from paravt.backends.openai_messages import (  # noqa: F401 - image_data_url re-exported for callers
    UrlCache, image_data_url, to_native_messages, to_openai_messages)

PROBE_S = 5.0  # a server out of the rotation is asked GET /health this often (at most the call timeout)
STALL_S = 30.0  # a call waiting this long (at most timeout/3) asks its server's GET /health; none: it hangs


class _Retryable(Exception):
    """A failure worth another try (connection error, timeout, 429, 5xx). `unreachable`: no HTTP
    answer came (the server may be gone or hung); `timed_out`: none came in time."""

    def __init__(self, message: str, wait_s: float = 0.0, unreachable: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.wait_s = wait_s
        self.unreachable = unreachable or timed_out
        self.timed_out = timed_out


class _Cut(Exception):
    """The server cut the generation for a weight update, or went down under it: send it again."""


@dataclass
class _LoopState:
    """Things bound to one event loop (an httpx client and asyncio primitives cannot cross loops;
    callers such as `run_episode_sync` and the trainer start a fresh loop per call)."""

    loop: asyncio.AbstractEventLoop
    client: httpx.AsyncClient
    sem: asyncio.Semaphore
    model_lock: asyncio.Lock
    inflight: dict[str, int] = field(default_factory=dict)
    probes: dict[str, asyncio.Task] = field(default_factory=dict)  # health checks of servers out of the rotation
    health: httpx.AsyncClient | None = None  # for health checks: never queued behind the calls' connections
    checked: dict[str, tuple[float, bool]] = field(default_factory=dict)  # endpoint -> (when, healthy)


class OpenAIBackend:
    """`Backend` over one or more OpenAI-compatible servers."""

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, concurrency: int = 8,
                 timeout_s: float = 600.0, max_retries: int = 4, endpoints: list[str] | None = None, *,
                 backoff_s: float = 0.5, logprobs: bool = True, image_format: str = "png",
                 server_extensions: bool = True, gate=None, banned_ids: list[int] | None = None, down=None):
        urls = list(endpoints) if endpoints else [base_url]
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise BackendError(f"server URLs must start with http:// or https://, got {urls!r}")
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError("concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")
        if image_format not in ("png", "jpeg", "jpg"):
            raise ValueError(f"image_format must be png or jpeg, not {image_format!r}")
        self.endpoints = list(dict.fromkeys(self._v1(u) for u in urls))
        self.model = model
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.logprobs = logprobs
        self.image_format = image_format
        self.server_extensions = server_extensions
        self._models: dict[str, str] = {}  # endpoint -> served model id (when model is None)
        self._rr = itertools.count()
        self._state: _LoopState | None = None
        self.image_cache = UrlCache()
        self.requests_sent: dict[str, int] = {u: 0 for u in self.endpoints}  # observable: load per endpoint
        self.banned_ids = list(banned_ids or [])  # never to be sampled (logit_bias −100)
        self.gate = gate  # train.rollout.ServerGate: weight versions, servers closed for a sync or restart
        self.resent = 0  # generations cut by a weight update or a server's death and sent again
        # async (url, why) -> bool, asked after a failed call: True when the server was found dead or
        # hung and started again (the trainer's launched servers), so the call is sent again
        self.down = down
        self.out_of_rotation: dict[str, str] = {}  # endpoint -> why it was taken out (no answer)
        self.endpoint_events: list[dict] = []  # servers taken out of the rotation and back, in order

    @property
    def call_deadline_s(self) -> float:
        """The longest a call can take (without a weight gate): a deadline on each server it may wait on."""
        return self.timeout_s * len(self.endpoints)

    def forget_model(self, url: str) -> None:
        """Look the served model id of `url` up again (a server started again may serve another name)."""
        self._models.pop(self._v1(url), None)

    @staticmethod
    def _v1(url: str) -> str:
        url = url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            client = httpx.AsyncClient(timeout=self.timeout_s, headers=headers,
                                       limits=httpx.Limits(max_connections=self.concurrency * len(self.endpoints)))
            # A global bound of concurrency x endpoints plus least-busy picking keeps every
            # endpoint at <= concurrency in flight without committing a waiting request to one.
            self._state = _LoopState(loop, client, asyncio.Semaphore(self.concurrency * len(self.endpoints)),
                                     asyncio.Lock(), {u: 0 for u in self.endpoints},
                                     health=httpx.AsyncClient(headers=headers))
            for url in self.out_of_rotation:  # taken out on an earlier loop: checked from this one now
                self._ensure_probe(self._state, url)
        return self._state

    def _pick(self, st: _LoopState, avoid: str | None, among: list[str] | None = None,
              waited: set[str] | frozenset = frozenset()) -> str:
        """Least busy endpoint in the rotation, ties round-robin; `avoid` (the one that just failed)
        only if it is the only one; `waited` (servers this call waited on in vain) and servers out of
        the rotation only if nothing else is left."""
        among = among or self.endpoints
        fresh = [u for u in among if u not in waited] or among
        live = [u for u in fresh if u not in self.out_of_rotation] or fresh
        candidates = [u for u in live if u != avoid] or live
        start = next(self._rr) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda u: st.inflight[u])

    async def _call(self, st: _LoopState, method: str, url: str, body: dict | None) -> dict:
        """One HTTP call: the JSON body, `_Retryable`, or `BackendError` for a final refusal."""
        try:
            r = await st.client.request(method, url, json=body)
        except httpx.TimeoutException as e:
            raise _Retryable(f"no answer within {self.timeout_s:g} s ({type(e).__name__})", timed_out=True) from None
        except httpx.TransportError as e:
            raise _Retryable(f"{type(e).__name__}: {e}", unreachable=True) from None
        if r.status_code >= 400:
            msg = _error_message(r)
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {msg}", _retry_after(r))
            raise BackendError(f"{url} refused the request (HTTP {r.status_code}): {msg}")
        try:
            data = r.json()
        except ValueError:
            raise BackendError(f"{url} answered HTTP {r.status_code} with a body that is not JSON: "
                               f"{r.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise BackendError(f"{url} answered with JSON that is not an object: {str(data)[:200]}")
        return data

    async def _model_for(self, st: _LoopState, url: str) -> str:
        if self.model is not None:
            return self.model
        if url not in self._models:
            async with st.model_lock:
                if url not in self._models:
                    data = await self._call(st, "GET", url + "/models", None)
                    try:
                        self._models[url] = str(data["data"][0]["id"])
                    except (KeyError, IndexError, TypeError):
                        raise BackendError(f"{url}/models lists no model; pass the model name") from None
        return self._models[url]

    async def _body(self, req: GenerateRequest) -> dict:
        # PNG-encoding 64 frames takes tens of ms: off the event loop, so other episodes go on.
        tools = None
        if req.tool_calls == "native":
            messages, tools = await asyncio.to_thread(to_native_messages, req.messages, req.prefix,
                                                      self.image_format, self.image_cache)
        else:
            messages = await asyncio.to_thread(to_openai_messages, req.messages, req.prefix, self.image_format,
                                               self.image_cache)
        body: dict = {"messages": messages, "max_tokens": req.max_new_tokens, "temperature": req.temperature,
                      "top_p": req.top_p, "stream": False}
        if tools:
            body["tools"], body["tool_choice"] = tools, "auto"
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.prefix:
            if not self.server_extensions:
                raise BackendError("a forced assistant prefix (think_prefix) needs a server that continues the final "
                                   "message (vLLM, SGLang, paravt serve); turn server extensions on or the prefix off")
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if self.logprobs:
            body["logprobs"] = True
        if self.banned_ids:
            body["logit_bias"] = {str(i): -100 for i in self.banned_ids}
        if self.server_extensions:
            body["skip_special_tokens"] = False
            body["return_token_ids"] = True
        return body

    async def _one(self, req: GenerateRequest) -> Completion:
        st = self._loop_state()
        body = await self._body(req)
        async with st.sem:  # waiting for a free slot does not count against the deadline
            return await self._attempts(st, body, req.prefix)

    async def _attempts(self, st: _LoopState, body: dict, prefix: str) -> Completion:
        """Up to 1 + max_retries tries, each on the least busy endpoint in rotation but the one that
        just failed, with backoff, under a deadline of `timeout_s` (the model lookup and the retries
        included). A server that does not answer within it is taken out of the rotation, and the
        call goes on to another with a deadline of its own; it fails when no server it has not yet
        waited on is left. Through the weight gate (when there is one): only on open servers, each
        try its own deadline, the completion tagged with the version its server held, and a
        generation cut by a sync or a restart sent again without counting as a failure. A failure
        after which `down(url, why)` says the server was started again is sent again too."""
        gate, failures, last, failed = self.gate, 0, "", None
        tried: list[str] = []
        timed_out: set[str] = set()
        deadline: float | None = None
        while True:
            among = None
            if gate is not None:
                among = [u for u in self.endpoints if gate.is_open(u.removesuffix("/v1"))]
                if not among:
                    await gate.wait_open()
                    continue
            url = self._pick(st, failed, among, timed_out)
            base = url.removesuffix("/v1")
            tried.append(url)
            version, epoch = await gate.enter(base) if gate is not None else (None, 0)
            if deadline is None or gate is not None:
                deadline = st.loop.time() + self.timeout_s
            st.inflight[url] += 1
            self.requests_sent[url] += 1
            try:
                data = await self._watched(st, url, self._try(st, url, body), deadline)
                c = _completion(data, prefix, url)
                if gate is not None and (c.finish_reason == "abort" or not gate.valid(base, epoch)):
                    raise _Cut()  # cut by the pause (vLLM), or ended across a sync that cut generations
                c.weight_version = version
                return c
            except _Cut:
                self.resent += 1
                continue
            except (_Retryable, asyncio.TimeoutError) as e:
                why = str(e) if isinstance(e, _Retryable) else f"no answer within {self.timeout_s:g} s"
                no_answer = isinstance(e, asyncio.TimeoutError) or e.timed_out
                if no_answer or e.unreachable:
                    self.take_out(url, why)
                if await self._sent_again(base, epoch, why):
                    self.resent += 1  # paused, synced or started again under it
                    deadline = None
                    continue
                failures += 1
                last, failed = why, url
                where = " and ".join(dict.fromkeys(u.removesuffix("/v1") for u in tried))
                if no_answer or deadline - st.loop.time() <= 0:
                    timed_out.add(url)
                    if not [u for u in (among or self.endpoints) if u not in timed_out]:
                        raise BackendError(f"no answer from {where} within {self.timeout_s:g} s "
                                           f"({len(tried)} tries; raise the limit with --timeout)") from None
                    deadline = None  # another server, with a deadline of its own
                    continue
                if failures > self.max_retries:
                    raise BackendError(f"server at {where} unreachable after {len(tried)} tries (last: {last})") from None
                wait = max(getattr(e, "wait_s", 0.0), self.backoff_s * (2 ** (failures - 1)) * (0.5 + random.random()))
                await asyncio.sleep(min(wait, max(deadline - st.loop.time(), 0.0)))
            finally:
                st.inflight[url] -= 1
                if gate is not None:
                    gate.leave(base)

    async def _try(self, st: _LoopState, url: str, body: dict) -> dict:
        body["model"] = await self._model_for(st, url)
        return await self._call(st, "POST", url + "/chat/completions", body)

    async def _watched(self, st: _LoopState, url: str, attempt, deadline: float) -> dict:
        """`attempt` (one try on `url`) until `deadline` (asyncio.TimeoutError after it). Every
        STALL_S (at most a third of the deadline) of waiting, the server is asked GET /health: a server that does not answer it hangs
        (a stopped process, a deadlock), and the try ends as a timeout at once, long before a
        generous deadline (600 s by default) would end it; a busy server answers and is waited for."""
        task = asyncio.ensure_future(attempt)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, however the wait ended
        start = st.loop.time()
        try:
            while True:
                left = deadline - st.loop.time()
                every = min(STALL_S, self.timeout_s / 3)
                done, _ = await asyncio.wait({task}, timeout=max(min(every, left), 0.0))
                if done:
                    return task.result()
                if left <= every:
                    raise asyncio.TimeoutError()
                if not await self._healthy(st, url, min(PROBE_S, self.timeout_s), cached=every / 2):
                    raise _Retryable(f"no answer within {st.loop.time() - start:.0f} s, and its health check got "
                                     "no answer either", timed_out=True)
        finally:
            if not task.done():
                task.cancel()

    async def _sent_again(self, base: str, epoch: int, why: str) -> bool:
        """Whether a failed call is sent again without counting as a failure: its server was synced
        or paused under it (the gate), or `down` started it again."""
        gate = self.gate
        if gate is not None and (gate.epoch(base) != epoch or "weight update" in why):
            return True
        return bool(self.down is not None and await self.down(base, why))

    # ---- servers taken out of the rotation

    def take_out(self, url: str, why: str) -> None:
        """`url` did not answer: no new call goes there while another server is in the rotation, until
        it answers a health check (probed every few seconds on the event loop of the calls)."""
        url = self._v1(url)
        if len(self.endpoints) < 2 or url in self.out_of_rotation or url not in self.endpoints:
            return
        self.out_of_rotation[url] = why
        self.endpoint_events.append({"endpoint": url.removesuffix("/v1"), "event": "out", "why": why,
                                     "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        if self._state is not None and not self._state.loop.is_closed():
            self._ensure_probe(self._state, url)  # else: the next loop's state starts it

    def _ensure_probe(self, st: _LoopState, url: str) -> None:
        task = st.probes.get(url)
        if task is None or task.done():
            st.probes[url] = st.loop.create_task(self._probe(st, url))

    async def _probe(self, st: _LoopState, url: str) -> None:
        every = min(PROBE_S, self.timeout_s)
        while url in self.out_of_rotation:
            await asyncio.sleep(every)
            if await self._healthy(st, url, every):
                self.out_of_rotation.pop(url, None)
                self.endpoint_events.append({"endpoint": url.removesuffix("/v1"), "event": "back",
                                             "time": time.strftime("%Y-%m-%dT%H:%M:%S")})

    async def _healthy(self, st: _LoopState, url: str, timeout_s: float, cached: float = 0.0) -> bool:
        """GET /health (vLLM, SGLang, paravt serve), else GET /v1/models: any answer but 5xx. An
        answer younger than `cached` seconds is reused (every call waiting on a server asks)."""
        when, ok = st.checked.get(url, (-1e9, False))
        if st.loop.time() - when < cached:
            return ok
        ok = False
        base = url.removesuffix("/v1")
        for probe in (base + "/health", url + "/models"):
            try:  # the status line only, under a deadline of its own (a body trickled forever must not hold it)
                status = await asyncio.wait_for(_status(st.health, probe, timeout_s), timeout_s)
            except (httpx.HTTPError, asyncio.TimeoutError):
                break
            if status != 404:
                ok = status < 500
                break
        st.checked[url] = (st.loop.time(), ok)
        return ok

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        return list(await asyncio.gather(*[self._one(r) for r in requests]))

    async def aclose(self) -> None:
        st, self._state = self._state, None
        if st is not None and not st.loop.is_closed():
            for task in st.probes.values():
                task.cancel()
            try:
                await st.health.aclose()
                await st.client.aclose()
            except RuntimeError:  # closed from another loop than the one that opened it
                pass


async def _status(client: httpx.AsyncClient, url: str, timeout_s: float) -> int:
    async with client.stream("GET", url, timeout=timeout_s) as r:
        return r.status_code


def _completion(data: dict, prefix: str, url: str) -> Completion:
    try:
        choice = data["choices"][0]
        message = choice["message"]
        text = message.get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise BackendError(f"{url} returned an unexpected body: {str(data)[:200]}") from None
    finish = choice.get("finish_reason") or "stop"
    if finish in ("tool_calls", "function_call"):  # a server-side tool parser's name for an ordinary stop
        finish = "stop"
    entries = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    entries = entries if isinstance(entries, list) and entries else None
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    calls = message.get("tool_calls") or []
    if reasoning or calls:  # a server-side parser split the turn: put it back together
        text = _generated_text(entries, finish, choice.get("stop_reason")) or _rebuilt_text(reasoning, text, calls)
    if prefix and text.startswith(prefix):
        text = text[len(prefix):]  # some servers echo the continued message
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    logprobs, token_ids = None, None
    if entries:
        logprobs = [float(t.get("logprob", 0.0)) for t in entries]
        toks = [str(t.get("token", "")) for t in entries]
        if all(t.startswith("token_id:") and t[9:].isdigit() for t in toks):
            token_ids = [int(t[9:]) for t in toks]
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        token_ids = list(ids)  # vLLM's return_token_ids (the stop token included, as the hf backend reports it)
    prompt_ids = data.get("prompt_token_ids")
    prompt_ids = list(prompt_ids) if isinstance(prompt_ids, list) and all(isinstance(i, int) for i in prompt_ids) else None
    return Completion(
        text=text,
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        visual_tokens=int(details.get("image_tokens") or 0),  # paravt serve reports it; vLLM does not
        logprobs=logprobs,
        token_ids=token_ids,
        prompt_ids=prompt_ids,
        served_by=url.removesuffix("/v1"),
    )


def _generated_text(entries: list | None, finish: str, stop_reason) -> str | None:
    """The generated text from the logprobs' token bytes (exact, whatever the server's parsers did),
    without the end-of-turn token that ended it; None when the server sent no bytes."""
    if not entries or not all(isinstance(t.get("bytes"), list) for t in entries):
        return None
    if finish == "stop" and stop_reason is None:  # stopped by an end-of-sequence token: not part of the text
        entries = entries[:-1]
    return bytes(b for t in entries for b in t["bytes"]).decode("utf-8", errors="replace")


def _rebuilt_text(reasoning: str | None, content: str, calls: list) -> str:
    """The turn from a parser's fields when no token bytes came back: the think (closed), the rest of
    the content, then each call as the Hermes block the model wrote. Whitespace around the parts
    may differ from the original; the tags and the calls do not."""
    from paravt import protocol as P

    parts = [reasoning.strip() + "\n" + P.THINK_CLOSE] if reasoning else []
    if content.strip():
        parts.append(content.strip())
    for c in calls:
        fn = (c or {}).get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass  # kept as written: protocol.parse reports it as an unreadable call
        body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
        parts.append(f"{P.TOOL_CALL_OPEN}\n{body}\n{P.TOOL_CALL_CLOSE}")
    return "\n".join(parts)


def _retry_after(r: httpx.Response) -> float:
    try:
        return min(float(r.headers.get("retry-after", 0)), 30.0)
    except ValueError:
        return 0.0


def _error_message(r: httpx.Response) -> str:
    """The server's own words: OpenAI-style `error.message`, FastAPI `detail`, or the raw text."""
    try:
        data = r.json()
    except ValueError:
        return r.text[:300] or r.reason_phrase
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message", data)))
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    return str(data)[:300]
