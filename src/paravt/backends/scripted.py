"""A backend that replays written completions: drives the episode in tests and benchmarks
without a model, and can simulate model latency to make concurrency measurable."""

from __future__ import annotations

import asyncio
from typing import Callable

from paravt.backends.base import Completion, GenerateRequest

Script = Callable[[GenerateRequest], str]


class ScriptedBackend:
    """`main` gives the main agent's turns in order (a list, or a function of the request);
    `sub` gives a sub-agent's reply (a string or a function of the request).

    latency_s: simulated seconds per model call. Calls that arrive together share one
    'batch' and wait once, as a batching backend would (batch_window_s collects them)."""

    name = "scripted"

    def __init__(self, main: list[str] | Script, sub: str | Script = "Nothing notable happens.", *,
                 latency_s: float = 0.0, batch_window_s: float = 0.005, fail_sub: Callable[[GenerateRequest], bool] | None = None):
        self._main = main
        self._sub = sub
        self.latency_s = latency_s
        self.batch_window_s = batch_window_s
        self.fail_sub = fail_sub
        self.requests: list[GenerateRequest] = []
        self.batches: list[int] = []
        self._main_index = 0
        self._pending: list[tuple[GenerateRequest, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    def _reply(self, req: GenerateRequest) -> str:
        if req.role == "sub":
            if self.fail_sub and self.fail_sub(req):
                from paravt.backends.base import BackendError

                raise BackendError("scripted sub-agent failure")
            return self._sub(req) if callable(self._sub) else self._sub
        if callable(self._main):
            return self._main(req)
        if self._main_index >= len(self._main):
            return "<think>no more script</think><answer>A</answer>"
        text = self._main[self._main_index]
        self._main_index += 1
        return text

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
        # Keep serving until nothing is waiting: requests that arrive while a batch is
        # "running" form the next batch.
        while self._pending:
            await asyncio.sleep(self.batch_window_s)
            batch, self._pending = self._pending, []
            self.batches.append(len(batch))
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            for req, fut in batch:
                self.requests.append(req)
                try:
                    text = self._reply(req)
                    n_img = sum(len(m.images()) for m in req.messages)
                    fut.set_result(Completion(text=text, prompt_tokens=100 + 4 * n_img, visual_tokens=4 * n_img,
                                              completion_tokens=max(1, len(text) // 4)))
                except Exception as e:
                    fut.set_exception(e)

    async def aclose(self) -> None:
        return None
