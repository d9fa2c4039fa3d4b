"""The record of an episode: every model call (ModelCall), every sub-agent call (SubCall), every
main turn (MainTurn) and the Episode; JSON both ways (`to_dict` / `from_dict`), so any trace paravt
wrote loads back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from paravt.agent.config import EpisodeConfig
from paravt.backends.base import Completion
from paravt.messages import ImagePart, Message, TextPart
from paravt.video import Frame

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
    # on_bad_call="end": why the last turn's calls were not run and the episode ended there
    stopped_on_bad_call: str | None = None

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
            "stopped_on_bad_call": self.stopped_on_bad_call,
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


def record_call(c: Completion, prefix: str, started: float, finished: float, messages: list[Message]) -> ModelCall:
    """The record of one generation: its completion, the input it was given, when it ran."""
    images = [p for m in messages for p in m.images()]
    return ModelCall(
        prefix=prefix, text=c.text, finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
        visual_tokens=c.visual_tokens, completion_tokens=c.completion_tokens, prompt_ids=c.prompt_ids,
        token_ids=c.token_ids, logprobs=c.logprobs, assistant_ids=c.assistant_ids, started=started,
        finished=finished, image_times=[float(p.timestamp) for p in images if p.timestamp is not None],
        n_images=len(images), served_by=c.served_by, weight_version=c.weight_version, messages=messages,
    )


def substitutes(frames: list[Frame]) -> list[list[float]]:
    """[requested, got] of the frames a damaged video replaced by the nearest decodable one."""
    return [[f.requested, f.timestamp] for f in frames if f.substituted]
