"""A backend that replays written completions.

It drives the episode in tests and benchmarks without a trained model: the main agent's
turns come from a script, the sub-agents' replies from a string, a function of the request,
or a real backend (so a benchmark can script the main agent and still batch real sub-agent
generations). A simulated per-batch latency makes the effect of concurrency measurable:
requests that arrive together share one "batch" and wait once, as a batching backend would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Union

from paravt.backends.base import Backend, BackendError, Completion, GenerateRequest

Script = Callable[[GenerateRequest], str]
Latency = Union[float, Callable[[GenerateRequest], float]]
TokenCounter = Callable[[GenerateRequest], "tuple[int, int]"]  # -> (prompt tokens, visual tokens)


def is_subagent(req: GenerateRequest) -> bool:
    """Who is asking. The episode tags each request with its role; a request without the tag
    (e.g. one rebuilt from a served chat) is told apart by its context: only the main agent has a system prompt."""
    return req.role == "sub" or not any(m.role == "system" for m in req.messages)


def _fake_ids(text: str) -> list[int]:
    # Stand-in token ids (one per character) so tests can follow ids through the loop.
    return [ord(c) for c in text]


class ScriptedBackend:
    """`main`: the main agent's turns in order (a list) or a function of the request.
    `sub`: a sub-agent's reply (a string, a function of the request, or a Backend to delegate to).

    latency_s: simulated seconds per batch (a number, or a function of the request; a batch
    waits for its slowest request). batch_window_s: how long a batch collects requests.
    fail_sub: requests for which a sub-agent call raises BackendError (to test local failures).
    count_tokens: (prompt tokens, visual tokens) of a request; by default every image counts
    `tokens_per_image` and text about four characters per token.

    Everything served is recorded: `requests` (in service order), `batches` (sizes), and
    `batch_log` (role, size, start, end) in seconds of time.perf_counter()."""

    name = "scripted"

    def __init__(self, main: list[str] | Script, sub: str | Script | Backend = "Nothing notable happens.", *,
                 latency_s: Latency = 0.0, batch_window_s: float = 0.005,
                 fail_sub: Callable[[GenerateRequest], bool] | None = None,
                 count_tokens: TokenCounter | None = None, tokens_per_image: int = 4):
        self._main = main
        self._sub = sub
        self.latency_s = latency_s
        self.batch_window_s = batch_window_s
        self.fail_sub = fail_sub
        self.count_tokens = count_tokens
        self.tokens_per_image = tokens_per_image
        self.requests: list[GenerateRequest] = []
        self.batches: list[int] = []
        self.batch_log: list[tuple[str, int, float, float]] = []
        self._main_index = 0
        self._pending: list[tuple[GenerateRequest, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    @property
    def delegates_sub(self) -> bool:
        return hasattr(self._sub, "generate")

    def _main_text(self, req: GenerateRequest) -> str:
        if callable(self._main):
            return self._main(req)
        if self._main_index >= len(self._main):
            raise BackendError(f"the script has only {len(self._main)} main turns; turn {self._main_index + 1} was asked")
        text = self._main[self._main_index]
        self._main_index += 1
        return text

    def _sub_text(self, req: GenerateRequest) -> str:
        if self.fail_sub and self.fail_sub(req):
            raise BackendError("scripted sub-agent failure")
        return self._sub(req) if callable(self._sub) else str(self._sub)

    def _completion(self, req: GenerateRequest, text: str) -> Completion:
        if self.count_tokens is not None:
            prompt, visual = self.count_tokens(req)
        else:
            n_img = sum(len(m.images()) for m in req.messages)
            visual = self.tokens_per_image * n_img
            prompt = visual + sum(len(m.text()) for m in req.messages) // 4 + len(req.prefix) // 4
        ids = _fake_ids(text)
        return Completion(text=text, finish_reason="stop", prompt_tokens=prompt, visual_tokens=visual,
                          completion_tokens=len(ids), token_ids=ids, assistant_ids=_fake_ids(req.prefix) + ids)

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        futs = []
        for r in requests:
            fut = loop.create_future()
            self._pending.append((r, fut))
            futs.append(fut)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return list(await asyncio.gather(*futs))

    async def _flush(self) -> None:
        # Serve until nothing waits: requests that arrive while a batch "runs" form the next one.
        while self._pending:
            await asyncio.sleep(self.batch_window_s)
            batch, self._pending = self._pending, []
            batch = [(r, f) for r, f in batch if not f.done()]  # drop requests whose caller gave up
            if not batch:
                continue
            started = time.perf_counter()
            self.batches.append(len(batch))
            subs = [(r, f) for r, f in batch if is_subagent(r)]
            mains = [(r, f) for r, f in batch if not is_subagent(r)]
            waits = [self.latency_s(r) if callable(self.latency_s) else self.latency_s for r, _ in batch]
            delegated = self.delegates_sub and subs
            if delegated:
                # the real backend does the sub-agents' work (its own time is the latency)
                try:
                    outs = await self._sub.generate([r for r, _ in subs])
                    for (r, f), c in zip(subs, outs):
                        self.requests.append(r)
                        if not f.done():
                            f.set_result(c)
                except Exception as e:  # noqa: BLE001 - handed to each waiting caller
                    for _, f in subs:
                        if not f.done():
                            f.set_exception(e)
                subs = []
            if max(waits, default=0.0) > 0:
                await asyncio.sleep(max(waits))
            for req, fut in mains + subs:
                self.requests.append(req)
                if fut.done():
                    continue
                try:
                    text = self._sub_text(req) if is_subagent(req) else self._main_text(req)
                    fut.set_result(self._completion(req, text))
                except Exception as e:  # noqa: BLE001 - handed to the caller, as a model error would be
                    fut.set_exception(e)
            role = "+".join(sorted({("sub" if is_subagent(r) else "main") for r, _ in batch}))
            self.batch_log.append((role, len(batch), started, time.perf_counter()))

    async def aclose(self) -> None:
        if self.delegates_sub:
            await self._sub.aclose()
