"""Backend for any OpenAI-compatible chat server (vLLM, SGLang, `paravt serve`).

Frames travel as base64 PNG data URLs in `image_url` parts, in message order. A forced
assistant prefix is sent as a trailing assistant message with `continue_final_message`
(vLLM / SGLang / paravt serve read it from the request body; plain OpenAI ignores it).
Several endpoints (data-parallel servers) are used at once: each request goes to the
endpoint with the fewest requests in flight.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random

import httpx
import numpy as np

from paravt.backends.base import BackendError, Completion, GenerateRequest, ImagePart, Message, TextPart


def image_data_url(image: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def to_openai_messages(messages: list[Message], prefix: str = "") -> list[dict]:
    out = []
    for m in messages:
        if isinstance(m.content, str) or not m.images():
            out.append({"role": m.role, "content": m.text()})
            continue
        parts = []
        for p in m.parts():
            if isinstance(p, TextPart):
                parts.append({"type": "text", "text": p.text})
            elif isinstance(p, ImagePart):
                parts.append({"type": "image_url", "image_url": {"url": image_data_url(p.image)}})
        out.append({"role": m.role, "content": parts})
    if prefix:
        out.append({"role": "assistant", "content": prefix})
    return out


class OpenAIBackend:
    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, *, concurrency: int = 8,
                 timeout_s: float = 300.0, max_retries: int = 4, backoff_s: float = 0.5,
                 endpoints: list[str] | None = None):
        urls = endpoints or [base_url]
        self.endpoints = [self._v1(u) for u in urls]
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._sem = asyncio.Semaphore(concurrency * len(self.endpoints))
        self._inflight = {u: 0 for u in self.endpoints}
        self._client: httpx.AsyncClient | None = None

    @staticmethod
    def _v1(url: str) -> str:
        url = url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=headers)
        return self._client

    async def _model_name(self, url: str) -> str:
        if self.model is None:
            data = await self._request("GET", url + "/models", None)
            try:
                self.model = data["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise BackendError(f"{url}/models lists no model; pass the model name") from None
        return self.model

    async def _request(self, method: str, url: str, body: dict | None) -> dict:
        """One HTTP call with retries on connection errors, timeouts and 5xx."""
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                r = await self._http().request(method, url, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code < 400:
                    return r.json()
                msg = _error_message(r)
                if r.status_code < 500 and r.status_code != 429:
                    raise BackendError(f"{url} refused the request ({r.status_code}): {msg}")
                last = f"HTTP {r.status_code}: {msg}"
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))
        raise BackendError(f"server at {url} unreachable after {self.max_retries + 1} tries ({last})")

    def _pick(self) -> str:
        return min(self.endpoints, key=lambda u: self._inflight[u])

    async def _one(self, req: GenerateRequest) -> Completion:
        async with self._sem:
            url = self._pick()
            self._inflight[url] += 1
            try:
                body = {
                    "model": await self._model_name(url),
                    "messages": to_openai_messages(req.messages, req.prefix),
                    "max_tokens": req.max_new_tokens,
                    "temperature": req.temperature,
                    "top_p": req.top_p,
                }
                if req.seed is not None:
                    body["seed"] = req.seed
                if req.stop:
                    body["stop"] = req.stop
                if req.prefix:
                    body["continue_final_message"] = True
                    body["add_generation_prompt"] = False
                data = await self._request("POST", url + "/chat/completions", body)
            finally:
                self._inflight[url] -= 1
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{url} returned an unexpected body: {str(data)[:200]}") from None
        if req.prefix and text.startswith(req.prefix):
            text = text[len(req.prefix):]  # some servers echo the continued message
        usage = data.get("usage") or {}
        return Completion(text=text, finish_reason=choice.get("finish_reason") or "stop",
                          prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0),
                          visual_tokens=int((usage.get("prompt_tokens_details") or {}).get("image_tokens") or 0))

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        return list(await asyncio.gather(*[self._one(r) for r in requests]))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _error_message(r: httpx.Response) -> str:
    try:
        data = r.json()
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data))
            if isinstance(err, dict):
                return str(err.get("message", err))
            return str(err)
    except ValueError:
        pass
    return r.text[:300]
