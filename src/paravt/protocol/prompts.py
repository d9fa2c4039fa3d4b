"""What the model is told: the system prompts of each dispatch mode, the user turn, the sub-agent's
instruction, the last round's answer-now nudge, and the native tool block, in two profiles.
"""

from __future__ import annotations

import json

from paravt.protocol.tools import MAX_CALL_FRAMES, TOOL_NAME, format_tool_call, tool_schema

QUESTION_TYPES = ("mcq", "tvg", "oe")
MODES = ("parallel", "sequential", "inline", "none")  # dispatch modes (the paper's Table 2 compares the first two)
PROMPT_KINDS = MODES + ("reasoning", "direct")  # system prompts: "reasoning" = "none"; "direct" = no think


# prompts
#
# Two prompt profiles, one episode loop (EpisodeConfig.prompts):
# - "paravt": our own instructions; the tool is declared through Qwen's native tool block (what a
#   Qwen3-VL-Instruct checkpoint's chat template renders for `tools=`), all tool responses of a turn
#   in one user message, laid out as that template lays out consecutive `tool` messages.
# - "official": the layout ParaVT-8B was RL-trained with (the public release's RL workflow): the
#   native tool block appended to the row's own system prompt, a `crop_video` schema with
#   `video_path`, one user message per tool response, and the release's sub-agent prompt (frames
#   without timestamps, the window as MM:SS, no question). Where the public EVALUATION prompt
#   differs from training (no timestamps on the overview, the tool and no-tool answer instructions
#   swapped), this profile follows training.

PROMPT_PROFILES = ("paravt", "official")

# Qwen's native tool declaration, exactly as the Qwen2.5 / Qwen3 / Qwen3-VL chat templates render it
# for `tools=`. Kept character-for-character: it is the text those checkpoints learned to read, and a
# system message that carries it renders to the same tokens as the template given `tools=`
# (tests/test_chat_template.py checks that against the template itself).
_NATIVE_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_NATIVE_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)


def native_tools_block(tools: list[dict]) -> str:
    """The native tool block for `tools` (one JSON object per line, as the template's `tojson`)."""
    return _NATIVE_TOOLS_HEAD + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _NATIVE_TOOLS_TAIL


def with_tools(system: str | None, tools: list[dict]) -> str:
    """A system text with the native tool block after it, as the chat template joins them; a text
    that already declares tools (`<tools>`, e.g. a training row's own prompt) is kept as it is."""
    if system and "<tools>" in system:
        return system
    block = native_tools_block(tools)
    return f"{system}\n\n{block}" if system else block

def split_native_tools(text: str) -> tuple[str | None, list[dict]] | None:
    """The inverse of `with_tools`: (the system text before the native tool block, None when the text
    is the block alone; the tools it declares), or None when the text does not end with a block
    that `native_tools_block` writes (a server given these tools renders the same text)."""
    if not isinstance(text, str) or not text.endswith(_NATIVE_TOOLS_TAIL):
        return None
    at = text.rfind(_NATIVE_TOOLS_HEAD)
    lines = text[at + len(_NATIVE_TOOLS_HEAD): len(text) - len(_NATIVE_TOOLS_TAIL)] if at >= 0 else ""
    if not lines.startswith("\n"):
        return None
    try:
        tools = [json.loads(line) for line in lines[1:].split("\n")]
    except ValueError:
        return None
    if not all(isinstance(t, dict) for t in tools) or native_tools_block(tools) != text[at:]:
        return None
    before = text[:at]
    if before and not before.endswith("\n\n"):
        return None
    return (before[:-2] if before else None), tools


_INTRO = (
    "You are a video analyst answering questions about a long video. You first see frames sampled evenly "
    "over the whole video, each labelled with its time in seconds, like <12.5 seconds>. Short events can "
    "fall between those frames, and small details are hard to read in them."
)

_TURN_SHAPE = (
    "Every reply starts with your reasoning inside <think> </think>. After </think> write either tool calls "
    "or the final answer, never both:\n"
    "<think>\nwhat the frames show, what is still uncertain, which moments to check\n</think>\n"
    "{calls}\n"
    "or\n"
    "<think>\nwhy the evidence settles the question\n</think>\n"
    "<answer>your answer</answer>\n"
    "Close every tag you open."
)


def system_prompt(mode: str, max_parallel: int = 5) -> str:
    """Our instructions to the main agent (profile "paravt"), without the tool declaration, which
    `main_system` appends as the native block. `mode` is a dispatch mode (parallel, sequential,
    inline, none) or "reasoning" (= none: think, then answer, no tool) or "direct" (answer only)."""
    if mode not in PROMPT_KINDS:
        raise ValueError(f"unknown prompt mode {mode!r}; choose one of {', '.join(PROMPT_KINDS)}")
    if mode in ("none", "reasoning"):
        return (
            "You are a video analyst answering questions about a video. You see frames sampled evenly over the "
            "whole video, each labelled with its time in seconds, like <12.5 seconds>. No tools are available: "
            "answer from these frames alone.\n\n"
            "First reason step by step inside <think> </think>: what each relevant frame shows and when. Then "
            "give the final answer inside <answer> </answer>, in the format the question asks for:\n"
            "<think>\nyour reasoning\n</think>\n<answer>your answer</answer>"
        )
    if mode == "direct":
        return (
            "You are a video analyst answering questions about a video. You see frames sampled evenly over the "
            "whole video, each labelled with its time in seconds, like <12.5 seconds>. Answer from these frames "
            "alone, at once and without explanation, inside <answer> </answer>, in the format the question "
            "asks for."
        )
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, got {max_parallel}")
    one_call = format_tool_call(30, 45)
    if mode == "sequential":
        calls = one_call
        how_many = (
            "Call the tool once per reply. Its result comes back in the next message; then decide whether to "
            "look at another window or to answer."
        )
    else:
        calls = one_call + "\n" + format_tool_call(120, 135)
        how_many = (
            f"You may call the tool several times in one reply, up to {max_parallel} calls, one "
            "<tool_call> </tool_call> block per window. All windows of a reply are examined at the same time and "
            "their results come back together, in the order of your calls, so when several moments could "
            "matter (the candidate moments of different options, or the parts of a long stretch) check them "
            f"in one reply. Calls beyond the first {max_parallel} are not run."
        )
    if mode == "inline":
        result = (
            f"The result of a call is the frames of its window (one per second, at most {MAX_CALL_FRAMES}, "
            "spread evenly over longer windows), each labelled with its time, inside <tool_response> </tool_response>."
        )
    else:
        result = (
            f"A helper watches each window at one frame per second (at most {MAX_CALL_FRAMES} frames, spread "
            "evenly over longer windows, so windows of up to about 16 seconds are seen in full detail) and "
            "replies with a short factual summary inside <tool_response> </tool_response>."
        )
    return (
        f"{_INTRO} When the frames do not settle the question, look closer with the {TOOL_NAME} tool, declared "
        f"below. Times are seconds from the start of the video. {result} {how_many} A call that cannot run "
        "returns an error message instead; the other calls are not affected.\n\n"
        + _TURN_SHAPE.format(calls=calls)
        + "\nAnswer without calling the tool when the frames you have already settle the question."
    )


def _check_profile(profile: str) -> None:
    if profile not in PROMPT_PROFILES:
        raise ValueError(f"unknown prompt profile {profile!r}; choose one of {', '.join(PROMPT_PROFILES)}")


def main_system(mode: str, max_parallel: int = 5, profile: str = "paravt", system: str | None = None) -> str | None:
    """The main agent's whole system text: the instructions (a data row's own system prompt when it
    has one, else the profile's), then the native tool block in the modes that have the tool.
    None when the profile has no system message (official, no tool, no row prompt)."""
    _check_profile(profile)
    tools = mode not in ("none", "reasoning", "direct")
    if profile == "official":
        return with_tools(system, [OFFICIAL_CROP_VIDEO_TOOL]) if tools else (system or None)
    text = system or system_prompt(mode, max_parallel)
    return with_tools(text, [tool_schema(mode)]) if tools else text


def answer_instruction(question_type: str) -> str:
    """How to write the answer for a question type; the same whether tools are used or not (the release's
    evaluation swapped those of its tool and no-tool prompts)."""
    if question_type == "mcq":
        return "Answer with the letter of the correct option only, inside <answer> </answer>, e.g. <answer>B</answer>."
    if question_type == "tvg":
        return (
            "Answer with the start and end time of the moment in seconds, as 'start - end', inside "
            "<answer> </answer>, e.g. <answer>12.5 - 20.0</answer>."
        )
    if question_type == "oe":
        return "Answer with a short phrase inside <answer> </answer>, e.g. <answer>a red circle</answer>."
    raise ValueError(f"unknown question_type {question_type!r}; expected one of {', '.join(QUESTION_TYPES)}")


def user_prompt_text(question: str, duration: float, question_type: str, subtitles: str | None = None,
                     profile: str = "paravt") -> str:
    """The text that follows the overview frames in the first user turn."""
    _check_profile(profile)
    answer_instruction(question_type)  # validates the type in both profiles
    if profile == "official":
        parts = [("This video's subtitles are listed below:\n" + subtitles.strip())] if subtitles and subtitles.strip() else []
        parts.append(question.strip() + "\n" + _OFFICIAL_ANSWER[question_type])
        return "\n".join(parts)
    parts = [f"The video lasts {duration:.1f} seconds. The frames above are sampled evenly over it."]
    if subtitles and subtitles.strip():
        parts.append("Subtitles of the video:\n" + subtitles.strip())
    parts.append("Question: " + question.strip())
    parts.append(answer_instruction(question_type))
    return "\n\n".join(parts)


def subagent_prompt(start: float, end: float, task: str | None = None, profile: str = "paravt") -> str:
    """Instruction of a sub-agent that watches one window of the video (the official profile's
    sub-agent never sees the question)."""
    _check_profile(profile)
    if profile == "official":
        return _official_subagent_prompt(start, end)
    text = (
        f"These frames come from a video between {start:.1f} and {end:.1f} seconds; each is labelled with its "
        "time. Describe briefly and factually what appears in them and when: people and objects, their colours, "
        "shapes and positions, actions, scene changes, any visible text. Give times in seconds. Report only what "
        "the frames show; if nothing changes, say so. Write a few plain sentences, without tags."
    )
    if task and task.strip():
        text += (
            "\n\nThe description will help answer this question: " + task.strip()
            + "\nMention first what is relevant to it, and say plainly when nothing relevant appears."
        )
    return text


def final_answer_instruction(question_type: str, profile: str = "paravt") -> str:
    """The nudge of the last round, sent as its own user message: no more calls, answer now."""
    _check_profile(profile)
    if profile == "official":
        return _OFFICIAL_FINAL[question_type if question_type in _OFFICIAL_FINAL else "oe"]
    return (
        "You cannot call the tool any more. Answer the question now from what you have seen. "
        + answer_instruction(question_type)
    )


# ----------------------------------------------------------------------------------------------
# the "official" profile: the public release's strings, reproduced verbatim because ParaVT-8B was
# trained on these exact tokens (a paraphrase would be a different prompt to that checkpoint).

# The release's crop_video declaration (paravt/rl/subagents/crop_video): its `parameters` holds the
# properties directly (no "type": "object" wrapper), and `video_path` is required. The model's
# `video_path` is never used: the episode's own video is cropped (a model never chooses a host file).
OFFICIAL_CROP_VIDEO_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Analyze a cropped video segment by sampling fixed number of frames and providing a summary of the "
            "content. Use this when you need to understand what happens in a specific time range of a video."
        ),
        "parameters": {
            "video_path": {"type": "string", "description": "Path to the video file"},
            "start_time": {"type": "number", "description": "Start time in seconds"},
            "end_time": {"type": "number", "description": "End time in seconds"},
        },
    },
}

# The release's answer instruction for the tool-using prompt (its evaluation code gave this one to
# the no-tool prompt and vice versa); grounding and open-ended follow our wording.
_OFFICIAL_ANSWER = {
    "mcq": "Think step by step, use crop_video if needed, then provide your answer in <answer>X</answer> tags "
           "where X is the option letter.",
    "tvg": "Think step by step, use crop_video if needed, then provide the start and end time of the moment in "
           "seconds as <answer>start - end</answer>.",
    "oe": "Think step by step, use crop_video if needed, then provide your answer in <answer></answer> tags.",
}
_OFFICIAL_FINAL = {
    "mcq": "Based on the video and cropped segments above, answer with ONLY the letter.",
    "tvg": "Based on the video and any cropped segments, provide your final answer about when the event happens. "
           "Use the format: 'The event happens in the X.X - Y.Y seconds.'",
    "oe": "Based on the video and cropped segments above, give your final answer inside <answer></answer> tags.",
}


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _official_subagent_prompt(start: float, end: float) -> str:
    return (
        f"You are analyzing a video segment from {_mmss(start)} to {_mmss(end)} (duration: {end - start:.1f} "
        "seconds).\n\nThe images shown are frames sampled from this video segment. Carefully examine each frame "
        "in sequence to understand the temporal progression of events.\n\nYour task: Provide a concise summary "
        "of what happens in this video segment.\n\nGuidelines:\n- Describe the key actions, events, or changes "
        "that occur across the frames\n- Note any important objects, people, or elements visible in the scene\n"
        "- Capture the temporal flow (what happens first, then, finally)\n- Focus on factual observations rather "
        "than interpretations\n\nSummary:"
    )
