"""The episode loop (its steps: paravt.agent): one loop for `paravt ask`, `paravt eval`, PARA-GRPO rollouts.

overview (K timestamped frames) -> main turn -> the turn's crop_video calls run concurrently
(paravt.agent.dispatch) -> summaries return in call order -> ... -> answer.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from paravt import protocol as P
from paravt.agent.config import EpisodeConfig, EventHook
from paravt.agent.dispatch import dispatch_calls
from paravt.agent.messages import build_final_message, build_main_messages, build_tool_response_messages
from paravt.agent.record import Episode, MainTurn, record_call, substitutes
from paravt.aio import run
from paravt.backends.base import Backend, BackendError, GenerateRequest
from paravt.messages import Message
from paravt.video import VideoReader


async def run_episode(
    backend: Backend,
    video: str | Path | VideoReader,
    question: str,
    config: EpisodeConfig | None = None,
    *,
    question_type: str = "mcq",
    subtitles=None,
    on_event: EventHook | None = None,
    overview_frames: int | None = None,
    system: str | None = None,
) -> Episode:
    """Run one episode. Raises VideoError when the episode's own video cannot be read,
    and BackendError when the main agent's model cannot be reached; everything that goes wrong
    inside a tool call stays inside that call's <tool_response>.

    on_event(name, payload) sees, in order: overview, then per turn turn_started, think (if any),
    generated, calls_dispatched, subcall_finished (one per call, as each finishes), tool_response;
    finally answer. `overview_frames` overrides config.frames (nFrames gating in training).
    `subtitles`: a text or timed `paravt.subtitles.Subtitles`; `system`: a data row's own system
    prompt, used instead of the profile's instructions (the tool block is still declared)."""
    cfg = config or EpisodeConfig()
    if question_type not in P.QUESTION_TYPES:
        raise ValueError(f"question_type must be one of {', '.join(P.QUESTION_TYPES)}, got {question_type!r}")
    emit: EventHook = on_event or (lambda name, payload: None)
    t0 = time.perf_counter()
    own = isinstance(video, (str, os.PathLike))  # else an open reader (a VideoReader, or one with its interface)
    # probing opens and reads the file: off the event loop, so concurrent episodes keep going;
    # a URL's reads get the model calls' deadline
    reader = await asyncio.to_thread(VideoReader, video, timeout_s=cfg.model_timeout_s) if own else video
    try:
        return await _episode(backend, reader, question, cfg, question_type, subtitles, emit,
                              lambda: time.perf_counter() - t0, overview_frames or cfg.frames, system)
    finally:
        if own:
            reader.close()  # safe with a decode still running: the reader closes after it


async def _episode(backend: Backend, reader: VideoReader, question: str, cfg: EpisodeConfig, question_type: str,
                   subtitles, emit: EventHook, now: Callable[[], float], k: int, system: str | None) -> Episode:
    frames = await reader.aoverview(k)
    ep = Episode(video=str(reader.path), question=question, question_type=question_type, config=cfg,
                 duration=reader.duration, overview_times=[f.timestamp for f in frames])
    ep.substituted_frames = [{"where": "overview", "requested": r, "got": g} for r, g in substitutes(frames)]
    emit("overview", {"times": ep.overview_times, "duration": ep.duration, "substituted": ep.substituted_frames})
    messages = build_main_messages(frames, reader.duration, question, question_type, cfg.mode, cfg.max_parallel,
                                   subtitles, prompts=cfg.prompts, system=system)

    for turn_index in range(cfg.max_turns):
        last = turn_index == cfg.max_turns - 1
        forced = last and turn_index > 0  # the answer-now message came after the previous round's responses
        direct_answer = forced and not cfg.final_turn_think
        prefix = "" if direct_answer else cfg.prefix
        req = GenerateRequest(messages=list(messages), max_new_tokens=cfg.answer_tokens(question_type)
                              if direct_answer else cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                              prefix=prefix, seed=None if cfg.seed is None else cfg.seed + turn_index, role="main",
                              tool_calls=cfg.tool_calls)
        emit("turn_started", {"turn": turn_index, "forced_answer": forced})
        started = now()
        # a backend over several servers gives each server it waits on a deadline of its own
        limit = max(cfg.model_timeout_s, getattr(backend, "call_deadline_s", 0.0))
        try:
            completion = (await asyncio.wait_for(backend.generate([req]), limit))[0]
        except asyncio.TimeoutError:
            raise BackendError(f"the main agent's model gave no answer within {limit:g} s "
                               "(model_timeout_s / --timeout)") from None
        gen = record_call(completion, prefix, started, now(), req.messages)
        turn = P.parse(completion.text, prefix=prefix)
        main_turn = MainTurn(index=turn_index, generation=gen, parsed=turn.to_dict(), calls=[], tool_response=None,
                             forced_answer=forced)
        ep.turns.append(main_turn)
        ep.main_visual_tokens = max(ep.main_visual_tokens, completion.visual_tokens)
        ep.main_prompt_tokens_final = completion.prompt_tokens
        if completion.error or completion.finish_reason == "error":
            ep.error = f"the main agent's model failed: {completion.error or 'no reason given'}"
            break
        if turn.think:
            emit("think", {"turn": turn_index, "text": turn.think, "closed": turn.think_closed})
        emit("generated", {"turn": turn_index, "text": completion.text, "think": turn.think, "answer": turn.answer,
                           "calls": [c.arguments for c in turn.calls], "problems": [p.kind for p in turn.problems],
                           "finish_reason": completion.finish_reason})
        ep.n_parsed_calls += len(turn.calls)

        wants_tools = bool(turn.calls or turn.bad_calls) and cfg.mode != "none"
        if (turn.answer is not None and turn.answer_closed) or not wants_tools or last:
            break
        if cfg.on_bad_call == "end":  # the release's reading: the turn's calls all run, or none and it ends
            strict, why = P.strict_calls(completion.text)
            if strict is not None:  # what runs is what the strict reader read (an unclosed last call included)
                turn = replace(turn, calls=strict, bad_calls=[])
            elif why is None and not turn.calls:  # only <tool_code>, none of it readable
                why = turn.bad_calls[0][1]
            if why is not None:
                ep.stopped_on_bad_call = why
                break

        subcalls, responses = await dispatch_calls(backend, reader, turn, turn_index, cfg, question, now, emit)
        ep.substituted_frames += [{"where": f"call {c.turn}.{c.index}", "requested": r, "got": g}
                                  for c in subcalls for r, g in c.substituted]
        main_turn.calls = subcalls
        ep.n_executed_calls += sum(1 for c in subcalls if c.status == "ok")
        replies = build_tool_response_messages(responses, cfg.prompts)
        if turn_index + 1 == cfg.max_turns - 1:
            replies.append(build_final_message(question_type, cfg.prompts))
        main_turn.tool_response = "\n".join(m.text() for m in replies)
        emit("tool_response", {"turn": turn_index, "text": main_turn.tool_response})
        # token-exact continuation: the backend re-feeds the ids it produced, not a re-tokenized text
        messages.append(Message("assistant", prefix + completion.text, token_ids=completion.assistant_ids))
        messages += replies

    ep.answer = P.extract_answer(ep.turns[-1].generation.prefix + ep.turns[-1].generation.text) if ep.turns else None
    ep.wall_time = now()
    emit("answer", {"answer": ep.answer, "wall_time": ep.wall_time, "error": ep.error})
    return ep


def run_episode_sync(*args: Any, **kwargs: Any) -> Episode:
    """`run_episode` for scripts without an event loop."""
    return run(run_episode(*args, **kwargs))
