"""The episode: one loop for `paravt ask`, `paravt eval` and PARA-GRPO rollouts (SPEC §1).

overview (K timestamped frames) -> main turn -> the turn's crop_video calls run concurrently,
each by a sub-agent with a fresh context -> summaries return in call order -> ... -> answer.
Failures are local: a bad call becomes an error text inside its own <tool_response>.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from paravt import protocol as P
from paravt.backends.base import (Backend, BackendError, Completion, GenerateRequest, ImagePart, Message, TextPart,
                                  strip_chat_tokens)
from paravt.video import MAX_FRAMES, Frame, VideoError, VideoReader

EventHook = Callable[[str, dict], None]


@dataclass
class EpisodeConfig:
    """How an episode runs; the defaults are the paper's evaluation settings (SPEC §1)."""

    mode: str = "parallel"  # parallel | sequential | inline | none
    frames: int = 64  # overview K
    max_turns: int = 3
    max_parallel: int = 5
    sub_fps: float = 1.0
    sub_min_frames: int = 1
    sub_max_frames: int = 16
    think_prefix: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 2048
    answer_max_new_tokens_mcq: int = 64
    answer_max_new_tokens_tvg: int = 128
    answer_max_new_tokens_oe: int = 128
    sub_max_new_tokens: int = 512
    call_timeout_s: float = 120.0
    # one main-agent generation may take this long (a dead or stalled server fails the episode
    # with a clear error instead of hanging it)
    model_timeout_s: float = 600.0
    subagent_sees_question: bool = True
    seed: int | None = None
    prompts: str = "paravt"  # prompt profile: paravt | official (the layout ParaVT-8B was trained with)
    # The last round's forced turn keeps the think prefix and the full max_new_tokens: a real model
    # reasons before it answers, and with a forced `<think>` the SPEC's 64-token answer budget ends
    # it mid-thought, before any <answer>. False: no think prefix, answer_max_new_tokens_* budget
    # (the public evaluation's direct "answer with the letter" turn).
    final_turn_think: bool = True

    def __post_init__(self) -> None:
        if self.mode not in P.MODES:
            raise ValueError(f"mode must be one of {', '.join(P.MODES)}, got {self.mode!r}")
        for name in ("frames", "max_turns", "max_parallel", "sub_max_frames", "max_new_tokens", "sub_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.frames > MAX_FRAMES:
            raise ValueError(f"frames must be <= {MAX_FRAMES}, got {self.frames}")
        if not 1 <= self.sub_min_frames <= self.sub_max_frames:
            raise ValueError("need 1 <= sub_min_frames <= sub_max_frames")
        for name in ("answer_max_new_tokens_mcq", "answer_max_new_tokens_tvg", "answer_max_new_tokens_oe"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sub_fps <= 0 or self.call_timeout_s <= 0 or self.model_timeout_s <= 0:
            raise ValueError("sub_fps, call_timeout_s and model_timeout_s must be positive")
        if self.prompts not in P.PROMPT_PROFILES:
            raise ValueError(f"prompts must be one of {', '.join(P.PROMPT_PROFILES)}, got {self.prompts!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")

    @classmethod
    def from_dict(cls, d: dict) -> "EpisodeConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown episode config keys: {', '.join(sorted(unknown))}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EpisodeConfig":
        """A config from a YAML mapping of field names (missing fields keep their defaults)."""
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: an episode config must be a YAML mapping")
        return cls.from_dict(data)

    @property
    def prefix(self) -> str:
        return P.THINK_PREFIX if self.think_prefix else ""

    def answer_tokens(self, question_type: str) -> int:
        return {"mcq": self.answer_max_new_tokens_mcq, "tvg": self.answer_max_new_tokens_tvg}.get(
            question_type, self.answer_max_new_tokens_oe)


@dataclass
class ModelCall:
    prefix: str
    text: str
    finish_reason: str
    prompt_tokens: int
    visual_tokens: int
    completion_tokens: int
    prompt_ids: list[int] | None
    token_ids: list[int] | None
    logprobs: list[float] | None
    assistant_ids: list[int] | None
    started: float
    finished: float
    image_times: list[float]
    n_images: int = 0
    served_by: str | None = None  # the server that generated it, when one did
    weight_version: str | None = None  # the policy version that generated it (asynchronous RL), when known
    messages: list[Message] | None = None  # in memory only: the exact input, images included
    # The input as text ({role, content}, images as "[image 12.5 s]"): what a trace shows of
    # `messages`. Computed from `messages` by to_dict; a call loaded from JSON keeps it here, and
    # leaves `messages` None, so it is never mistaken for a trainable input (train.sequences).
    prompt: list[dict] | None = None

    def prompt_text(self) -> list[dict] | None:
        """The input messages as text, or None when neither they nor their text are known."""
        return prompt_text(self.messages) if self.messages is not None else self.prompt

    def to_dict(self, tokens: bool = True) -> dict:
        """JSON-ready; `tokens=False` leaves out the token ids and logprobs (large, and only
        trainers and token-exact checks read them)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("messages", "prompt")}
        d["prompt"] = self.prompt_text()
        if not tokens:
            for k in TOKEN_FIELDS:
                d.pop(k, None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelCall":
        """A call from `to_dict`'s output, with or without its token ids (eval rows drop them);
        keys this version does not know are ignored, so traces of later versions still load."""
        known = {f.name for f in fields(cls)} - {"messages"}
        kw = {k: v for k, v in d.items() if k in known}
        for k in TOKEN_FIELDS:
            kw.setdefault(k, None)
        return cls(**kw)


TOKEN_FIELDS = ("prompt_ids", "token_ids", "logprobs", "assistant_ids")  # what `to_dict(tokens=False)` drops


def image_placeholder(part: ImagePart) -> str:
    """How a trace's prompt text shows a frame: where it is in the video, not its pixels."""
    return "[image]" if part.timestamp is None else f"[image {float(part.timestamp):.1f} s]"


def prompt_text(messages: list[Message]) -> list[dict]:
    """Messages as {role, content} text, each image replaced by its placeholder where it stood."""
    return [{"role": m.role, "content": "".join(p.text if isinstance(p, TextPart) else image_placeholder(p)
                                                for p in m.parts())} for m in messages]


@dataclass
class SubCall:
    turn: int
    index: int
    call: dict
    start: float | None
    end: float | None
    status: str  # ok | error | skipped
    error: str | None
    response: str
    frame_times: list[float]
    generation: ModelCall | None
    started: float
    finished: float
    substituted: list[list[float]] = field(default_factory=list)  # [requested, got] of frames damage replaced

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["generation"] = self.generation.to_dict() if self.generation else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SubCall":
        d = dict(d)
        d["generation"] = ModelCall.from_dict(d["generation"]) if d.get("generation") else None
        return cls(**d)


@dataclass
class MainTurn:
    index: int
    generation: ModelCall
    parsed: dict
    calls: list[SubCall]
    tool_response: str | None
    forced_answer: bool

    def to_dict(self) -> dict:
        return {"index": self.index, "generation": self.generation.to_dict(), "parsed": self.parsed,
                "calls": [c.to_dict() for c in self.calls], "tool_response": self.tool_response,
                "forced_answer": self.forced_answer}

    @classmethod
    def from_dict(cls, d: dict) -> "MainTurn":
        return cls(index=d["index"], generation=ModelCall.from_dict(d["generation"]), parsed=d["parsed"],
                   calls=[SubCall.from_dict(c) for c in d["calls"]], tool_response=d["tool_response"],
                   forced_answer=d["forced_answer"])


@dataclass
class Episode:
    video: str
    question: str
    question_type: str
    config: EpisodeConfig
    duration: float
    overview_times: list[float]
    turns: list[MainTurn] = field(default_factory=list)
    answer: str | None = None
    n_parsed_calls: int = 0
    n_executed_calls: int = 0
    wall_time: float = 0.0
    error: str | None = None
    main_visual_tokens: int = 0
    main_prompt_tokens_final: int = 0
    # frames a damaged video could not give, replaced by the nearest decodable one (its own true time)
    substituted_frames: list[dict] = field(default_factory=list)

    def main_texts(self) -> list[str]:
        """The generated text of every main turn (forced prefix not included)."""
        return [t.generation.text for t in self.turns]

    def subcalls(self) -> list[SubCall]:
        return [c for t in self.turns for c in t.calls]

    def model_calls(self) -> list[ModelCall]:
        """Every generation of the episode: the main turns', then the sub-agents' that ran."""
        return [t.generation for t in self.turns] + [c.generation for c in self.subcalls() if c.generation]

    @property
    def n_problems(self) -> int:
        return sum(len(t.parsed.get("problems", [])) for t in self.turns)

    def to_dict(self, tokens: bool = True) -> dict:
        """The whole trace, JSON-ready: every model call with its prompt text. `tokens=False`
        leaves out every call's token ids and logprobs (`paravt ask --json --no-tokens`)."""
        d = {
            "video": self.video, "question": self.question, "question_type": self.question_type,
            "config": asdict(self.config), "duration": self.duration, "overview_times": self.overview_times,
            "turns": [t.to_dict() for t in self.turns], "answer": self.answer,
            "n_parsed_calls": self.n_parsed_calls, "n_executed_calls": self.n_executed_calls,
            "wall_time": self.wall_time, "error": self.error, "main_visual_tokens": self.main_visual_tokens,
            "main_prompt_tokens_final": self.main_prompt_tokens_final, "substituted_frames": self.substituted_frames,
        }
        if not tokens:
            for t in d["turns"]:
                for g in [t["generation"]] + [c["generation"] for c in t["calls"] if c.get("generation")]:
                    for k in TOKEN_FIELDS:
                        g.pop(k, None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Episode":
        """An episode from `to_dict`'s output, from an eval row's trace (no token ids), or from a
        whole results.jsonl row (its "episode"), so that any trace paravt wrote loads back.
        Raises ValueError for a row that has no trace (a sample that failed before its episode)."""
        if "turns" not in d and "episode" in d:
            if not d["episode"]:
                raise ValueError(f"eval row {d.get('id')!r} has no episode trace (error: {d.get('error')})")
            d = d["episode"]
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["config"] = EpisodeConfig.from_dict(d["config"])
        d["turns"] = [MainTurn.from_dict(t) for t in d["turns"]]
        return cls(**d)


# ----------------------------------------------------------------------------------------------
# message builders (also used to render SFT trajectories, so training sees what inference sends)


def frame_parts(frames: list[Frame], timestamps: bool = True, after: list[str] | None = None) -> list:
    """Each frame preceded by its timestamp text (unless `timestamps` is off), and followed by
    `after[i]` when given (subtitles interleaved by time)."""
    parts: list = []
    for i, f in enumerate(frames):
        if timestamps:
            parts.append(TextPart(P.timestamp_text(f.timestamp)))
        parts.append(ImagePart(f.image, timestamp=f.timestamp))
        if after and after[i]:
            parts.append(TextPart(after[i]))
    return parts


def _subtitle_texts(subtitles, frames: list[Frame]) -> tuple[list[str] | None, str | None]:
    """(text after each frame, block before the question) for plain-text or timed subtitles; timed
    ones are placed by each benchmark's protocol (paravt.subtitles)."""
    if subtitles is None or isinstance(subtitles, str):
        return None, subtitles
    from paravt.subtitles import for_frames

    after, block = for_frames(subtitles, [f.timestamp for f in frames])
    return (after if any(after) else None), (block or None)


def build_main_messages(frames: list[Frame], duration: float, question: str, question_type: str, mode: str,
                        max_parallel: int = 5, subtitles=None, *, prompts: str = "paravt",
                        system: str | None = None) -> list[Message]:
    """The first two messages of an episode: the system text (profile instructions or the row's own
    system prompt, plus the native tool block) and the user turn (timestamped overview frames, then
    the question). `subtitles`: a text, or `paravt.subtitles.Subtitles` placed by its protocol."""
    after, block = _subtitle_texts(subtitles, frames)
    content = frame_parts(frames, after=after) + [
        TextPart("\n" + P.user_prompt_text(question, duration, question_type, block, profile=prompts))]
    sys_text = P.main_system(mode, max_parallel, prompts, system)
    return ([Message("system", sys_text)] if sys_text else []) + [Message("user", content)]


def build_subagent_messages(frames: list[Frame], start: float, end: float, task: str | None,
                            prompts: str = "paravt") -> list[Message]:
    official = prompts == "official"  # the release's sub-agent saw bare frames and no question
    content = frame_parts(frames, timestamps=not official) + [
        TextPart(("" if official else "\n") + P.subagent_prompt(start, end, None if official else task, prompts))]
    return [Message("user", content)]


def tool_response_parts(text: str, frames: list | None = None) -> list:
    """One call's response: its text inside <tool_response>, with the window's frames after the
    text in inline mode."""
    if not frames:
        return [TextPart(P.format_tool_response(text))]
    return [TextPart(P.TOOL_RESPONSE_OPEN + "\n" + text.strip() + "\n"), *frames, TextPart("\n" + P.TOOL_RESPONSE_CLOSE)]


def build_tool_response_messages(responses: list[list], prompts: str = "paravt") -> list[Message]:
    """The user turn(s) that return a round's responses (`tool_response_parts` each), in call order:
    all in one message joined by newlines, as Qwen's chat template renders consecutive tool
    messages ("paravt"), or one message per response, as the release's RL workflow did ("official")."""
    if prompts == "official":
        return [Message("user", list(r)) for r in responses]
    parts: list = []
    for i, r in enumerate(responses):
        if i:
            parts.append(TextPart("\n"))
        parts += r
    return [Message("user", parts)]


def build_final_message(question_type: str, prompts: str = "paravt") -> Message:
    """The last round's answer-now instruction, a user message of its own."""
    return Message("user", P.final_answer_instruction(question_type, prompts))


_THINK_BLOCK = re.compile(re.escape(P.THINK_OPEN) + r".*?(" + re.escape(P.THINK_CLOSE) + r"|$)", re.S)


def summary_of(text: str) -> str:
    """What a sub-agent returns to the main agent: its text without any think block or chat-format
    token (a stray `<|im_start|>` inside a user message would open a fake turn)."""
    text = strip_chat_tokens(text)
    out = _THINK_BLOCK.sub("", text).strip()
    return out or text.strip()


# ----------------------------------------------------------------------------------------------
# the loop


def _record(c: Completion, prefix: str, started: float, finished: float, messages: list[Message]) -> ModelCall:
    images = [p for m in messages for p in m.images()]
    return ModelCall(
        prefix=prefix, text=c.text, finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
        visual_tokens=c.visual_tokens, completion_tokens=c.completion_tokens, prompt_ids=c.prompt_ids,
        token_ids=c.token_ids, logprobs=c.logprobs, assistant_ids=c.assistant_ids, started=started,
        finished=finished, image_times=[float(p.timestamp) for p in images if p.timestamp is not None],
        n_images=len(images), served_by=c.served_by, weight_version=c.weight_version, messages=messages,
    )


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
    """Run one episode (SPEC §1). Raises VideoError when the episode's own video cannot be read,
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
    own = not isinstance(video, VideoReader)
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
    ep.substituted_frames = [{"where": "overview", "requested": r, "got": g} for r, g in _substitutes(frames)]
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
                              prefix=prefix, seed=None if cfg.seed is None else cfg.seed + turn_index, role="main")
        emit("turn_started", {"turn": turn_index, "forced_answer": forced})
        started = now()
        # a backend over several servers gives each server it waits on a deadline of its own
        limit = max(cfg.model_timeout_s, getattr(backend, "call_deadline_s", 0.0))
        try:
            completion = (await asyncio.wait_for(backend.generate([req]), limit))[0]
        except asyncio.TimeoutError:
            raise BackendError(f"the main agent's model gave no answer within {limit:g} s "
                               "(model_timeout_s / --timeout)") from None
        gen = _record(completion, prefix, started, now(), req.messages)
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

        subcalls, responses = await _dispatch(backend, reader, turn, turn_index, cfg, question, now, emit)
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


async def _dispatch(backend: Backend, reader: VideoReader, turn: P.Turn, turn_index: int, cfg: EpisodeConfig,
                    question: str, now: Callable[[], float], emit: EventHook) -> tuple[list[SubCall], list]:
    """Run the calls of one turn; returns their records and their responses (`tool_response_parts`
    each), both in call order."""
    limit = 1 if cfg.mode == "sequential" else cfg.max_parallel
    why_skipped = ("this mode runs one call per turn; call it again next turn if still needed"
                   if cfg.mode == "sequential" else f"at most {cfg.max_parallel} calls run per turn")
    records: list[tuple[SubCall, list, P.ToolCall | None]] = []  # (record, inline frame parts, call to run)
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

    emit("calls_dispatched", {"turn": turn_index, "calls": [
        {"index": s.index, "status": "run" if c is not None else s.status, "arguments": s.call.get("arguments"),
         "error": s.error} for s, _, c in records]})

    def finish(sub: SubCall, ran: bool = True) -> None:
        sub.finished = now()
        if sub.status == "error" and not sub.response:
            sub.response = P.format_error(sub.error or "the call failed")
        emit("subcall_finished", {"turn": turn_index, "index": sub.index, "start": sub.start, "end": sub.end,
                                  "status": sub.status, "error": sub.error, "response": sub.response,
                                  "seconds": sub.finished - sub.started, "ran": ran})

    for sub, _, call in records:
        if call is None:  # unreadable or over the limit: answered without running
            finish(sub, ran=False)

    # Two phases so that the sub-agents reach the backend together and share one batch: first
    # every window is validated and decoded concurrently (on the reader's pool), then every
    # sub-agent is asked at once. One time budget (call_timeout_s) covers both phases of a call.
    async def prepare(sub: SubCall, call: P.ToolCall) -> tuple[list, GenerateRequest | None, float]:
        extra, req = await _prepare(sub, call)
        return extra, req, now() - sub.started

    async def _prepare(sub: SubCall, call: P.ToolCall) -> tuple[list, GenerateRequest | None]:
        try:
            args = P.crop_args(call, reader.duration)  # never reads a model-written path
            sub.start, sub.end = args.start, args.end
            frames = await asyncio.wait_for(
                reader.acrop(args.start, args.end, fps=cfg.sub_fps, max_frames=cfg.sub_max_frames,
                             num_frames=args.num_frames),
                timeout=cfg.call_timeout_s)
            sub.substituted = _substitutes(frames)
            if len(frames) < cfg.sub_min_frames:
                raise VideoError(f"only {len(frames)} frames in the window, fewer than {cfg.sub_min_frames}")
            sub.frame_times = [f.timestamp for f in frames]
            if cfg.mode == "inline":
                sub.status = "ok"
                sub.response = f"{len(frames)} frames of {args.start:.1f}-{args.end:.1f} seconds follow."
                return frame_parts(frames), None
            msgs = build_subagent_messages(frames, args.start, args.end,
                                           question if cfg.subagent_sees_question else None, cfg.prompts)
            return [], GenerateRequest(messages=msgs, max_new_tokens=cfg.sub_max_new_tokens,
                                       temperature=cfg.temperature, top_p=cfg.top_p, role="sub",
                                       seed=None if cfg.seed is None else cfg.seed + 1000 * (turn_index + 1) + sub.index)
        except P.ToolCallError as e:
            sub.error = str(e)
        except VideoError as e:
            sub.error = f"could not read the video window: {str(e).split(': ', 1)[-1]}"
        except asyncio.TimeoutError:
            sub.error = f"decoding the window took longer than {cfg.call_timeout_s:g} seconds"
        except Exception as e:  # noqa: BLE001 - failure is local to the call (SPEC §1.6)
            sub.error = f"the call failed ({type(e).__name__}: {e})"
        return [], None

    async def ask(sub: SubCall, req: GenerateRequest, decode_s: float) -> None:
        g_started = now()
        # the call's own decode time counts against its budget; waiting for its siblings' decodes does not
        budget = cfg.call_timeout_s - decode_s
        try:
            if budget <= 0:
                raise asyncio.TimeoutError
            c = (await asyncio.wait_for(backend.generate([req]), timeout=budget))[0]
            sub.generation = _record(c, "", g_started, now(), req.messages)
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
        finish(sub)

    to_run = [(i, sub, call) for i, (sub, _, call) in enumerate(records) if call is not None]
    prepared = await asyncio.gather(*[prepare(sub, call) for _, sub, call in to_run])
    asks = []
    for (i, sub, _), (extra, req, decode_s) in zip(to_run, prepared):
        records[i] = (sub, extra, None)
        if req is None:
            finish(sub)
        else:
            asks.append(ask(sub, req, decode_s))
    await asyncio.gather(*asks)

    # inline mode: the window's frames themselves, inside the call's own response
    return [r[0] for r in records], [tool_response_parts(sub.response, extra) for sub, extra, _ in records]


def _substitutes(frames: list[Frame]) -> list[list[float]]:
    """[requested, got] of the frames a damaged video replaced by the nearest decodable one."""
    return [[f.requested, f.timestamp] for f in frames if f.substituted]


def run_episode_sync(*args: Any, **kwargs: Any) -> Episode:
    """`run_episode` for scripts without an event loop."""
    return asyncio.run(run_episode(*args, **kwargs))
