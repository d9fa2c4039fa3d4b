"""One round of tool calls: every call the main agent wrote, in the order written, answered in that
order. Readable calls within the mode's limit run concurrently, each by a sub-agent with a fresh
context (or, in inline mode, as the window's frames themselves); an unreadable call, one over the
limit, and any failure inside a call become an error text in that call's own response: the other
calls and the episode go on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from paravt import protocol as P
from paravt.agent.config import EpisodeConfig, EventHook
from paravt.agent.messages import build_subagent_messages, frame_parts, summary_of, tool_response_parts
from paravt.agent.record import SubCall, record_call, substitutes
from paravt.backends.base import Backend, BackendError, GenerateRequest
from paravt.video import VideoError, VideoReader

# (record, inline frame parts, call still to run): a call's place in the round, in call order
Planned = tuple[SubCall, list, "P.ToolCall | None"]


def ordered_calls(turn: P.Turn) -> list[tuple[P.ToolCall | None, str, str | None]]:
    """Every call the model wrote, readable (call, raw, None) or not (None, raw, problem), in the
    order written, so that the responses come back in call order. protocol.Turn keeps the two
    kinds in separate lists; their places are found again in the turn's text."""
    items = [(c, c.raw, None) for c in turn.calls] + [(None, raw, why) for raw, why in turn.bad_calls]
    cursor: dict[str, int] = {}
    keyed = []
    for n, (call, raw, why) in enumerate(items):
        pos = turn.text.find(raw, cursor.get(raw, 0)) if raw.strip() else -1
        if pos >= 0:
            cursor[raw] = pos + 1
        keyed.append((pos if pos >= 0 else len(turn.text) + n, n, (call, raw, why)))
    return [item for _, _, item in sorted(keyed, key=lambda k: (k[0], k[1]))]


async def dispatch_calls(backend: Backend, reader: VideoReader, turn: P.Turn, turn_index: int, cfg: EpisodeConfig,
                         question: str, now: Callable[[], float], emit: EventHook) -> tuple[list[SubCall], list]:
    """Run the calls of one turn; returns their records and their responses (`tool_response_parts`
    each), both in call order."""
    rnd = _Round(backend, reader, turn_index, cfg, question, now, emit)
    records = plan_calls(turn, turn_index, cfg, now)
    emit("calls_dispatched", {"turn": turn_index, "calls": [
        {"index": s.index, "status": "run" if c is not None else s.status, "arguments": s.call.get("arguments"),
         "error": s.error} for s, _, c in records]})
    for sub, _, call in records:
        if call is None:  # unreadable or over the limit: answered without running
            rnd.finish(sub, ran=False)

    # Two phases so that the sub-agents reach the backend together and share one batch: first
    # every window is validated and decoded concurrently (on the reader's pool), then every
    # sub-agent is asked at once. One time budget (call_timeout_s) covers both phases of a call.
    to_run = [(i, sub, call) for i, (sub, _, call) in enumerate(records) if call is not None]
    prepared = await asyncio.gather(*[rnd.prepare(sub, call) for _, sub, call in to_run])
    asks = []
    for (i, sub, _), (extra, req, decode_s) in zip(to_run, prepared):
        records[i] = (sub, extra, None)
        if req is None:
            rnd.finish(sub)
        else:
            asks.append(rnd.ask(sub, req, decode_s))
    await asyncio.gather(*asks)

    # inline mode: the window's frames themselves, inside the call's own response
    return [r[0] for r in records], [tool_response_parts(sub.response, extra) for sub, extra, _ in records]


def plan_calls(turn: P.Turn, turn_index: int, cfg: EpisodeConfig, now: Callable[[], float]) -> list[Planned]:
    """A record per call written, in order: the ones to run (at most one per turn in sequential mode,
    else max_parallel), and the ones answered at once with an error (unreadable, or over the limit)."""
    limit = 1 if cfg.mode == "sequential" else cfg.max_parallel
    why_skipped = ("this mode runs one call per turn; call it again next turn if still needed"
                   if cfg.mode == "sequential" else f"at most {cfg.max_parallel} calls run per turn")
    records: list[Planned] = []
    n_run = 0
    for index, (call, raw, problem) in enumerate(ordered_calls(turn)):
        t = now()
        sub = SubCall(turn=turn_index, index=index, call={"name": None, "arguments": None, "raw": raw[:500]},
                      start=None, end=None, status="error", error=None, response="", frame_times=[],
                      generation=None, started=t, finished=t)
        if call is None:
            sub.error = problem
            sub.response = P.format_error(f"could not read this tool call ({problem}); write it as "
                                          + P.format_tool_call(10, 20))
            records.append((sub, [], None))
            continue
        sub.call = {"name": call.name, "arguments": call.arguments}
        if n_run >= limit:
            sub.status, sub.error = "skipped", why_skipped
            sub.response = P.format_error(f"not run: {why_skipped}")
            records.append((sub, [], None))
            continue
        n_run += 1
        records.append((sub, [], call))
    return records


@dataclass
class _Round:
    """What every call of one round shares: the model, the video, the settings, the clock, the hook."""

    backend: Backend
    reader: VideoReader
    turn_index: int
    cfg: EpisodeConfig
    question: str
    now: Callable[[], float]
    emit: EventHook

    def finish(self, sub: SubCall, ran: bool = True) -> None:
        """Close the call's record (an error without a response gets the error's text) and report it."""
        sub.finished = self.now()
        if sub.status == "error" and not sub.response:
            sub.response = P.format_error(sub.error or "the call failed")
        self.emit("subcall_finished", {"turn": self.turn_index, "index": sub.index, "start": sub.start,
                                       "end": sub.end, "status": sub.status, "error": sub.error,
                                       "response": sub.response, "seconds": sub.finished - sub.started, "ran": ran})

    async def prepare(self, sub: SubCall, call: P.ToolCall) -> tuple[list, GenerateRequest | None, float]:
        """The call's window checked and decoded: (inline frame parts, the sub-agent's request or None,
        seconds it took). A failure is recorded on `sub` (its request is then None)."""
        extra, req = await self._prepare(sub, call)
        return extra, req, self.now() - sub.started

    async def _prepare(self, sub: SubCall, call: P.ToolCall) -> tuple[list, GenerateRequest | None]:
        cfg, reader = self.cfg, self.reader
        try:
            args = P.crop_args(call, reader.duration)  # never reads a model-written path
            sub.start, sub.end = args.start, args.end
            frames = await asyncio.wait_for(
                reader.acrop(args.start, args.end, fps=cfg.sub_fps, max_frames=cfg.sub_max_frames,
                             num_frames=args.num_frames),
                timeout=cfg.call_timeout_s)
            sub.substituted = substitutes(frames)
            if len(frames) < cfg.sub_min_frames:
                raise VideoError(f"only {len(frames)} frames in the window, fewer than {cfg.sub_min_frames}")
            sub.frame_times = [f.timestamp for f in frames]
            if cfg.mode == "inline":
                sub.status = "ok"
                sub.response = f"{len(frames)} frames of {args.start:.1f}-{args.end:.1f} seconds follow."
                return frame_parts(frames), None
            msgs = build_subagent_messages(frames, args.start, args.end,
                                           self.question if cfg.subagent_sees_question else None, cfg.prompts)
            seed = None if cfg.seed is None else cfg.seed + 1000 * (self.turn_index + 1) + sub.index
            return [], GenerateRequest(messages=msgs, max_new_tokens=cfg.sub_max_new_tokens,
                                       temperature=cfg.temperature, top_p=cfg.top_p, role="sub", seed=seed)
        except P.ToolCallError as e:
            sub.error = str(e)
        except VideoError as e:
            sub.error = f"could not read the video window: {str(e).split(': ', 1)[-1]}"
        except asyncio.TimeoutError:
            sub.error = f"decoding the window took longer than {cfg.call_timeout_s:g} seconds"
        except Exception as e:  # noqa: BLE001 - failure is local to the call
            sub.error = f"the call failed ({type(e).__name__}: {e})"
        return [], None

    async def ask(self, sub: SubCall, req: GenerateRequest, decode_s: float) -> None:
        """The sub-agent's summary of its window, within what is left of the call's time budget."""
        cfg, now = self.cfg, self.now
        g_started = now()
        # the call's own decode time counts against its budget; waiting for its siblings' decodes does not
        budget = cfg.call_timeout_s - decode_s
        try:
            if budget <= 0:
                raise asyncio.TimeoutError
            c = (await asyncio.wait_for(self.backend.generate([req]), timeout=budget))[0]
            sub.generation = record_call(c, "", g_started, now(), req.messages)
            if c.error or c.finish_reason == "error":
                sub.error = f"the helper model failed: {c.error or 'no reason given'}"
            else:
                sub.response, sub.status = summary_of(c.text), "ok"
        except asyncio.TimeoutError:
            sub.error = f"the call took longer than {cfg.call_timeout_s:g} seconds and was stopped"
        except BackendError as e:
            sub.error = f"the helper model failed: {e}"
        except Exception as e:  # noqa: BLE001 - failure is local to the call
            sub.error = f"the helper model failed ({type(e).__name__}: {e})"
        self.finish(sub)
