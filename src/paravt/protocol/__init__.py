"""The tool-call protocol: tags, tool schema, prompts, parsing. The only package that spells the tags.

A main-agent turn is `<think>…</think>` followed by either `<answer>…</answer>` or one or more
`<tool_call>{"name": "crop_video", "arguments": {...}}</tool_call>` blocks (Hermes style).
Models with a Qwen prior sometimes leak `<tool_code>crop_video(start_time=…, end_time=…)</tool_code>`;
we accept that too (read with `ast`, never evaluated). `parse` never raises: anything it cannot
read becomes a `Problem`, and a call it cannot read is kept in `Turn.bad_calls` so that the
episode can answer it with an error inside its own `<tool_response>` (docs/rl.md,
'Departures from the release that stay, and why').

    tags.py     the tags, and the structure of tagged text (think blocks, balance, blocks)
    tools.py    the crop_video schema, ToolCall, checked arguments, call and response texts
    parse.py    parse(text) -> Turn, extract_answer, strict_calls (the release's all-or-nothing read)
    prompts.py  system, user, sub-agent and answer-now prompts; the paravt and official profiles
    options.py  the option grammar of multiple-choice questions (lines or inline), for detector and scorer

Use it as `from paravt import protocol as P`; every name is here.
"""

from paravt.protocol.tags import (ALL_TAGS, ANSWER_CLOSE, ANSWER_OPEN, STRUCTURAL_TAGS, TAG_PAIRS, THINK_CLOSE,
                                  THINK_OPEN, THINK_PREFIX, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_CODE_CLOSE,
                                  TOOL_CODE_OPEN, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, blocks, drop_blocks,
                                  strip_tags, tags_balanced, think_blocks, think_open_at_end, think_spans)
from paravt.protocol.tools import (CROP_VIDEO_TOOL, MAX_CALL_FRAMES, TOOL_NAME, CropArgs, ToolCall, ToolCallError,
                                   crop_args, format_error, format_tool_call, format_tool_response,
                                   format_tool_responses, parse_seconds, timestamp_text, tool_schema)
from paravt.protocol.parse import Problem, Turn, extract_answer, parse, strict_calls
from paravt.protocol.options import option_body, options_from_question, split_marker
from paravt.protocol.prompts import (MODES, OFFICIAL_CROP_VIDEO_TOOL, PROMPT_KINDS, PROMPT_PROFILES, QUESTION_TYPES,
                                     answer_instruction, final_answer_instruction, main_system, native_tools_block,
                                     split_native_tools, subagent_prompt, system_prompt, user_prompt_text, with_tools)

__all__ = ["ALL_TAGS", "ANSWER_CLOSE", "ANSWER_OPEN", "CROP_VIDEO_TOOL", "CropArgs", "MAX_CALL_FRAMES", "MODES",
           "OFFICIAL_CROP_VIDEO_TOOL", "PROMPT_KINDS", "PROMPT_PROFILES", "Problem", "QUESTION_TYPES",
           "STRUCTURAL_TAGS", "TAG_PAIRS", "THINK_CLOSE", "THINK_OPEN", "THINK_PREFIX", "TOOL_CALL_CLOSE",
           "TOOL_CALL_OPEN", "TOOL_CODE_CLOSE", "TOOL_CODE_OPEN", "TOOL_NAME", "TOOL_RESPONSE_CLOSE",
           "TOOL_RESPONSE_OPEN", "ToolCall", "ToolCallError", "Turn", "answer_instruction", "blocks", "crop_args",
           "drop_blocks", "extract_answer", "final_answer_instruction", "format_error", "format_tool_call",
           "format_tool_response", "format_tool_responses", "main_system", "native_tools_block", "option_body",
           "options_from_question", "parse", "parse_seconds", "split_marker", "split_native_tools", "strict_calls",
           "strip_tags", "subagent_prompt", "system_prompt", "tags_balanced", "think_blocks", "think_open_at_end",
           "think_spans", "timestamp_text", "tool_schema", "user_prompt_text",
           "with_tools"]
