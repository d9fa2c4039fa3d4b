"""How an episode runs (EpisodeConfig; the defaults are the paper's evaluation settings) and the
hook that watches it (EventHook)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from paravt import protocol as P
from paravt.video import MAX_FRAMES

EventHook = Callable[[str, dict], None]


@dataclass
class EpisodeConfig:
    """How an episode runs; the defaults are the paper's evaluation settings (listed in
    paravt.eval.runner.eval_config)."""

    mode: str = "parallel"  # parallel | sequential | inline | none
    frames: int = 64  # overview K
    max_turns: int = 3  # main-agent generations at most; the last one is told to answer now
    max_parallel: int = 5  # crop calls executed per turn (the rest are answered 'skipped')
    sub_fps: float = 1.0  # frames a second a sub-agent sees of its window
    sub_min_frames: int = 1  # fewest frames of a window (fewer: the call is an error)
    sub_max_frames: int = 16  # most frames a sub-agent sees (a call's num_frames may ask fewer)
    think_prefix: bool = True  # force "<think>\n" at the start of every main turn
    temperature: float = 0.0  # sampling temperature (0: greedy; training samples at its own τ)
    top_p: float = 1.0  # sampling top-p
    max_new_tokens: int = 2048  # new tokens per main-agent turn
    answer_max_new_tokens_mcq: int = 64  # new tokens of a forced mcq answer (final_turn_think false)
    answer_max_new_tokens_tvg: int = 128  # the same, grounding
    answer_max_new_tokens_oe: int = 128  # the same, open-ended
    sub_max_new_tokens: int = 512  # new tokens of a sub-agent's summary
    call_timeout_s: float = 120.0  # seconds one crop call may take, decode and sub-agent together
    # one main-agent generation may take this long (a dead or stalled server fails the episode
    # with a clear error instead of hanging it)
    model_timeout_s: float = 600.0  # seconds one main-agent generation may take
    subagent_sees_question: bool = True  # the sub-agents' prompt includes the main question as their task
    seed: int | None = None  # sampling seed of the episode's generations (null: unseeded)
    prompts: str = "paravt"  # prompt profile: paravt | official (the layout ParaVT-8B was trained with)
    # The last round's forced turn keeps the think prefix and the full max_new_tokens: a real model
    # reasons before it answers, and with a forced `<think>` the evaluation's 64-token MCQ answer
    # budget ends it mid-thought, before any <answer>. False: no think prefix,
    # answer_max_new_tokens_* budget (the public evaluation's direct "answer with the letter" turn).
    final_turn_think: bool = True  # the forced last turn keeps the think prefix and max_new_tokens (false: answer budgets)
    # A turn with a call that cannot be read. "respond": its good calls run and each bad one is
    # answered with an error in its own response (why: docs/rl.md, 'Departures from the release that
    # stay, and why'). "end": read as the public release reads calls (`protocol.strict_calls`, all or
    # nothing): none of the turn's calls run and the episode ends on that turn, so a broken call costs
    # the answer (for comparison runs).
    on_bad_call: str = "respond"  # respond (each bad call answered with its error) | end (the release's all-or-nothing read)
    # How a served model is told of the tool and its calls are read (the openai backend; an in-process
    # model sees the same prompt either way): "text", the tags in the messages; "native", OpenAI's
    # tool calling (`tools`, `tool_calls`, `tool` messages), for a server whose own parser reads the
    # calls (vLLM --enable-auto-tool-choice --tool-call-parser hermes, paravt serve).
    tool_calls: str = "text"

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
        if self.on_bad_call not in ("respond", "end"):
            raise ValueError(f"on_bad_call must be respond or end, got {self.on_bad_call!r}")
        if self.tool_calls not in ("text", "native"):
            raise ValueError(f"tool_calls must be text or native, got {self.tool_calls!r}")
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
