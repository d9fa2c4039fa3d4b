"""The ParaVT episode (arXiv 2605.20342): one loop for `paravt ask`, `paravt eval` and PARA-GRPO rollouts.

overview (K timestamped frames) -> main turn -> the turn's crop_video calls run concurrently,
each by a sub-agent with a fresh context -> summaries return in call order -> ... -> answer.
Failures are local: a bad call becomes an error text inside its own <tool_response>.

    episode.py   run_episode: the loop over main turns
    dispatch.py  one round of calls: plan, decode windows, ask the sub-agents, answer in call order
    messages.py  the messages the main agent and the sub-agents are sent (SFT rows use them too)
    record.py    Episode, MainTurn, SubCall, ModelCall: the trace, JSON both ways
    config.py    EpisodeConfig, EventHook
"""

from paravt.agent.config import EpisodeConfig, EventHook
from paravt.agent.dispatch import dispatch_calls, ordered_calls, plan_calls
from paravt.agent.episode import run_episode, run_episode_sync
from paravt.agent.messages import (build_final_message, build_main_messages, build_subagent_messages,
                                   build_tool_response_messages, frame_parts, summary_of, tool_response_parts)
from paravt.agent.record import (TOKEN_FIELDS, Episode, MainTurn, ModelCall, SubCall, image_placeholder, prompt_text,
                                 record_call)
from paravt.video import MAX_FRAMES

__all__ = ["MAX_FRAMES", "TOKEN_FIELDS", "Episode", "EpisodeConfig", "EventHook", "MainTurn", "ModelCall", "SubCall",
           "build_final_message", "build_main_messages", "build_subagent_messages", "build_tool_response_messages",
           "dispatch_calls", "frame_parts", "image_placeholder", "ordered_calls", "plan_calls", "prompt_text",
           "record_call", "run_episode", "run_episode_sync", "summary_of", "tool_response_parts"]
