"""The messages of an episode, built in one place: the main agent's first turn (timestamped
overview frames, the question), a sub-agent's window, the tool responses of a round and the
answer-now nudge. Also used to render SFT trajectories, so training sees what inference sends."""

from __future__ import annotations

import re

from paravt import protocol as P
from paravt.messages import ImagePart, Message, TextPart, strip_chat_tokens
from paravt.video import Frame

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
