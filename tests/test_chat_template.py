"""The hf renderer produces the tokens of the checkpoint's own chat template (Qwen3-VL-Instruct's,
with its native tool block), for every message shape an episode sends; and the shipped tiny
tokenizer keeps its ids while treating our tags as ordinary (non-special) tokens."""

import numpy as np
import pytest

from paravt import protocol as P
from paravt.agent import build_final_message, build_main_messages, build_tool_response_messages, tool_response_parts
from paravt.backends.base import ImagePart, Message
from paravt.backends.hf import Renderer
from paravt.models.tiny import build_processor, build_tokenizer
from paravt.video import Frame


@pytest.fixture(scope="module")
def processor():
    return build_processor(build_tokenizer())


def frames(n: int, seed: int = 0) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [Frame(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8), 2.5 + 5 * i) for i in range(n)]


def template_messages(messages: list[Message], mode: str, prompts: str) -> tuple[list[dict], list[dict] | None]:
    """Our messages as the template's input: the system text WITHOUT the native block (the template
    adds it from `tools=`), and each round's tool responses as consecutive `tool` messages (the
    official profile sends each as a user message of its own, as the release's RL workflow did)."""
    out: list[dict] = []
    tools = None
    for m in messages:
        if m.role == "system":
            tool = P.OFFICIAL_CROP_VIDEO_TOOL if prompts == "official" else P.tool_schema(mode)
            block = P.native_tools_block([tool])
            text = m.text()
            if block in text:
                tools = [tool]
                text = text[: -len(block)].removesuffix("\n\n")
            if text:
                out.append({"role": "system", "content": text})
            continue
        text = m.text()
        if m.role == "user" and text.startswith(P.TOOL_RESPONSE_OPEN) and not m.images() and prompts != "official":
            for body in text.split(P.TOOL_RESPONSE_OPEN + "\n")[1:]:
                out.append({"role": "tool", "content": body.split("\n" + P.TOOL_RESPONSE_CLOSE)[0]})
            continue
        parts = [{"type": "image"} if isinstance(p, ImagePart) else {"type": "text", "text": p.text}
                 for p in m.parts()]
        out.append({"role": m.role, "content": parts if m.role == "user" else text})
    return out, tools


def collapse_pads(ids: list[int], pad: int) -> list[int]:
    """One <|image_pad|> per image, as the template writes it before the processor expands it."""
    out: list[int] = []
    for i in ids:
        if not (i == pad and out and out[-1] == pad):
            out.append(i)
    return out


def episode_messages(mode: str, prompts: str, n_calls: int, final: bool) -> list[Message]:
    msgs = build_main_messages(frames(3), 60.0, "What colour was the star?\nA. red\nB. blue", "mcq", mode,
                               prompts=prompts)
    if n_calls:
        calls = "\n".join(P.format_tool_call(10 * i, 10 * i + 8) for i in range(n_calls))
        msgs.append(Message("assistant", P.THINK_PREFIX + "Look closer.</think>\n" + calls))
        msgs += build_tool_response_messages([tool_response_parts(f"At {i} s a red star.") for i in range(n_calls)],
                                             prompts)
        if final:
            msgs.append(build_final_message("mcq", prompts))
    return msgs


@pytest.mark.parametrize("mode", ["parallel", "sequential", "none"])
@pytest.mark.parametrize("prompts", ["paravt", "official"])
@pytest.mark.parametrize("n_calls, final", [(0, False), (1, False), (3, False), (3, True)])
def test_renderer_equals_the_checkpoint_chat_template(processor, mode, prompts, n_calls, final):
    tok = processor.tokenizer
    r = Renderer(processor)
    msgs = episode_messages(mode, prompts, n_calls if mode != "none" else 0, final)
    ours = r.render(msgs, prefix=P.THINK_PREFIX)
    conv, tools = template_messages(msgs, mode, prompts)
    assert (tools is not None) == (mode != "none")
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=True) + P.THINK_PREFIX
    assert collapse_pads(ours.ids, r.image_pad) == tok.encode(text, add_special_tokens=False)


def test_renderer_equals_the_template_for_a_rows_own_system_prompt_and_subagents(processor):
    tok = processor.tokenizer
    r = Renderer(processor)
    msgs = build_main_messages(frames(2), 30.0, "Q?", "oe", "parallel", system="You are a careful video agent.")
    conv, tools = template_messages(msgs, "parallel", "paravt")
    assert conv[0]["content"] == "You are a careful video agent." and tools
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=True)
    assert collapse_pads(r.render(msgs).ids, r.image_pad) == tok.encode(text, add_special_tokens=False)
    from paravt.agent import build_subagent_messages

    for prompts in ("paravt", "official"):
        sub = build_subagent_messages(frames(4), 10, 14, "Q?", prompts)
        conv, _ = template_messages(sub, "parallel", prompts)
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert collapse_pads(r.render(sub).ids, r.image_pad) == tok.encode(text, add_special_tokens=False)


def test_tags_are_ordinary_added_tokens_with_their_old_ids():
    """The shipped model's ids must not move, and a server that skips special tokens (vLLM's
    default) must still return the tags."""
    from transformers import AutoTokenizer

    from paravt.ask import DEFAULT_MODEL

    for tok in (AutoTokenizer.from_pretrained(DEFAULT_MODEL), build_tokenizer()):
        ids = [tok.convert_tokens_to_ids(t) for t in P.ALL_TAGS]
        assert ids == list(range(14, 24))  # after the 14 Qwen special tokens, as when the model was trained
        text = "<think>\nx</think>\n<answer> y</answer><|im_end|>"
        assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True) == \
            "<think>\nx</think>\n<answer> y</answer>"
    shipped = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    # pinned: the ids the shipped model was trained on for a typical turn
    assert shipped.encode("<answer> magenta</answer><tool_call>\n", add_special_tokens=False) == [16, 547, 17, 18, 222]
    assert "tools" in shipped.chat_template and "tool_response" in shipped.chat_template
