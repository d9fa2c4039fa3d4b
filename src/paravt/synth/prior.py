"""The tool-prior layout: the oracle's episodes written as a model pretrained on another tool format
writes them. SFT on these rows at length gives a *base* model with a tool habit of its own, standing
in for Qwen3-VL's pretrained tool behaviour (the paper's Tool Prior Paradox; docs/paradox.md):

- no think block (an instruct model's habit): the turn starts with the call or the answer;
- one crop_video call per turn, only on windows that hold the evidence (LongVT-style sequential
  use), each answered by its sub-agent's summary in a tool response of its own;
- the answer as a plain sentence, "The answer is magenta.", without <answer> tags;
- crops only where the overview misses the evidence (an episode the oracle crops to confirm, the
  cold start's redundant calls, is written as the direct answer here).

The calls are Hermes `<tool_call>` JSON, the format paravt parses: the base's tool use is its own,
scored like anyone's, while its format is not paravt's (no think, no answer tags), as the paper's
base scores fτ 0.03 with κ 0.45. A short cold start on paravt's own rows (oracle.to_sft_rows) then
competes with this prior: whether greedy decoding follows the new format while τ = 0.7 sampling slips
back is what the testbed measures.
"""

from __future__ import annotations

from paravt import protocol as P
from paravt.agent import (EpisodeConfig, build_final_message, build_main_messages, build_subagent_messages,
                          build_tool_response_messages, tool_response_parts)
from paravt.messages import Message
from paravt.synth.oracle import Trajectory, _frames, answer_text, conversation_rows
from paravt.synth.questions import Question


def prior_answer(q: Question) -> str:
    """The base's answer sentence (extract_answer reads the sentence as the answer when no tag is there)."""
    return f"The answer is {answer_text(q)}."


def prior_messages(traj: Trajectory, q: Question, duration: float,
                   config: EpisodeConfig | None = None) -> tuple[list[Message], list[list[Message]]]:
    """The main conversation and one conversation per sub-agent in the tool-prior layout, on the same
    system and user messages as the episode loop builds (the prior and paravt's format then compete
    for the same context)."""
    cfg = config or EpisodeConfig()
    msgs = build_main_messages(_frames(traj.overview_times), duration, q.question, q.question_type, cfg.mode,
                               cfg.max_parallel, prompts=cfg.prompts)
    calls = [] if traj.direct or traj.redundant else [c for c in traj.calls if not c.decoy] or traj.calls[:1]
    calls = calls[: cfg.max_turns - 1]  # one call a turn, the windows with the evidence; the last turn answers
    for r, c in enumerate(calls):
        msgs.append(Message("assistant", P.format_tool_call(c.start, c.end)))
        msgs += build_tool_response_messages([tool_response_parts(c.summary)], cfg.prompts)
        if r + 1 == cfg.max_turns - 1:
            msgs.append(build_final_message(q.question_type, cfg.prompts))
    msgs.append(Message("assistant", prior_answer(q)))
    subs = []
    for c in calls:
        sub = build_subagent_messages(_frames(c.frame_times), c.start, c.end,
                                      q.question if cfg.subagent_sees_question else None, cfg.prompts)
        subs.append(sub + [Message("assistant", c.summary)])
    return msgs, subs


def to_prior_rows(traj: Trajectory, q: Question, video: str, duration: float,
                  config: EpisodeConfig | None = None) -> list[dict]:
    """SFT rows of the tool-prior layout, in the schema of oracle.to_sft_rows."""
    main, subs = prior_messages(traj, q, duration, config)
    return conversation_rows(main, subs, traj, q, video, layout="prior")
