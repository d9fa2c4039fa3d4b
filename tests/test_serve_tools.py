"""OpenAI tool calling on paravt serve: tools, assistant tool_calls and tool messages rendered as the
checkpoint's chat template renders what vLLM gives it; replies read into tool_calls as vLLM's hermes
parser reads them (plain and streamed, through the official openai client); tool_choice and
response_format honoured or refused; the openai backend's native mode, whose prompts are the text
mode's. (The same requests against a real vLLM: tests/test_vllm.py, opt-in.)"""

import asyncio
import json

import httpx
import numpy as np
import pytest
from servetools import Server
from test_serve_stream import StreamingFake, events

from paravt import protocol as P
from paravt.backends.base import Completion, GenerateRequest
from paravt.backends.hf import Renderer
from paravt.backends.openai import image_data_url, to_native_messages, to_openai_messages
from paravt.serve import create_app
from paravt.serve.schema import parse_chat_request

CHAT = "/v1/chat/completions"
CROP = P.CROP_VIDEO_TOOL
TWO_CALLS = ("<think>\nTwo windows may hold it.\n</think>\n" + P.format_tool_call(0, 15) + "\n"
             + P.format_tool_call(15, 30))


@pytest.fixture(scope="module")
def renderer():
    """The shipped model's processor: its tokenizer and its own chat template (what paravt serve serves)."""
    from paravt.ask import DEFAULT_MODEL
    from paravt.models import VLProcessor

    return Renderer(VLProcessor.from_pretrained(str(DEFAULT_MODEL)))


def png(seed: int) -> str:
    return image_data_url(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8))


def as_vllm_gives_the_template(messages: list[dict], tools: list[dict]) -> tuple[list[dict], list[dict]]:
    """What vLLM 0.32 hands the chat template (read from vllm/renderers/chat_utils.py and its request
    models): each tool as its request model dumps it; content as a list of parts (a string is one
    text part; an image is {"type": "image"}); a tool message of text parts only joined by newlines;
    an assistant's tool-call arguments read into an object ({} when not one)."""
    norm = [{"type": "function", "function": {k: t["function"].get(k) for k in ("name", "description", "parameters")}}
            for t in tools]
    out = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        parts = [] if c is None else [{"type": "text", "text": c}] if isinstance(c, str) else list(c)
        parts = [{"type": "image"} if p["type"] == "image_url" else p for p in parts]
        if m["role"] == "tool" and all(p["type"] == "text" for p in parts):
            m["content"] = "\n".join(p["text"] for p in parts)
        else:
            m["content"] = parts
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                args = call["function"]["arguments"]
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    args = {}
                calls.append({"type": "function", "function": {"name": call["function"]["name"],
                                                               "arguments": args if isinstance(args, dict) else {}}})
            m["tool_calls"] = calls
        out.append(m)
    return out, norm


def template_ids(renderer, messages, tools) -> list[int]:
    conv, norm = as_vllm_gives_the_template(messages, tools)
    text = renderer.tok.apply_chat_template(conv, tools=norm, tokenize=False, add_generation_prompt=True)
    return renderer.tok.encode(text, add_special_tokens=False)


def served_ids(renderer, body: dict) -> list[int]:
    """The prompt paravt serve feeds its model for `body`, one <|image_pad|> per image (as the template)."""
    ids = renderer.render(parse_chat_request(body).request.messages).ids
    return [i for k, i in enumerate(ids) if not (i == renderer.image_pad and k and ids[k - 1] == i)]


TOOLS = [CROP, {"function": {"parameters": {"type": "object"}, "name": "note", "extra": 1}}]
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "<0.0 seconds>"}, {"type": "image_url",
                                 "image_url": {"url": png(0)}}, {"type": "text", "text": "\nWhat colour?"}]},
    {"role": "assistant", "content": "<think>\nLook closer.\n</think>", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "crop_video",
                                                     "arguments": '{"start_time": 1,"end_time":2}'}},
        {"id": "b", "type": "function", "function": {"name": "note", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "a", "content": "At 1.5 s a red star."},
    {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    {"role": "tool", "content": [{"type": "text", "text": "Frames of 1-2 s<1.5 seconds>"},
                                 {"type": "image_url", "image_url": {"url": png(1)}}, {"type": "text", "text": "."}]},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "name": "crop_video", "arguments": {"start_time": 3, "end_time": 4}}}]},
    {"role": "tool", "content": "x"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "note", "arguments": ""}}]},
    {"role": "tool", "content": []},
    {"role": "user", "content": "Answer now."},
]


@pytest.mark.parametrize("system", [None, "You watch videos.", ""], ids=["no-system", "system", "empty-system"])
def test_tools_calls_and_tool_messages_render_as_the_template(renderer, system):
    """Every shape lmms-eval's loop and the openai backend send: tools (one with null description, an
    extra key), calls with string / object / invalid / empty arguments, content null, "" and text,
    consecutive tool messages with text, text parts and images, an empty one."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + HISTORY
    assert served_ids(renderer, {"messages": messages, "tools": TOOLS}) == template_ids(renderer, messages, TOOLS)


def test_tool_messages_without_tools_and_tool_choice_none_render_the_same(renderer):
    """tool_choice "none" still declares the tools (vLLM's default); tool messages need no tools."""
    body = {"messages": HISTORY, "tools": TOOLS}
    assert served_ids(renderer, {**body, "tool_choice": "none"}) == served_ids(renderer, body)
    plain = served_ids(renderer, {"messages": HISTORY})
    assert renderer.tok.decode(plain).count("<tool_response>") == 5 and "# Tools" not in renderer.tok.decode(plain)


class Replies:
    """A backend that answers with the given texts in turn (and records the requests)."""

    name = "replies"

    def __init__(self, *texts: str):
        self.texts, self.seen = list(texts), []

    async def generate(self, reqs):
        self.seen += reqs
        return [Completion(text=self.texts.pop(0), finish_reason="stop", prompt_tokens=5, completion_tokens=9)
                for _ in reqs]

    async def aclose(self):
        pass


def ask(client, **extra):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Where?"}],
                                          tools=[CROP], **extra)


UNREADABLE = ["<tool_call>\n{\"name\": \"crop_video\", \"arguments\": {\"start_time\": 1}\n</tool_call>",  # bad JSON
              P.format_tool_call(0, 5) + "\n<tool_call>\n{\"arguments\": {}}\n</tool_call>",  # one has no name
              "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",  # name not a string
              "<tool_call></tool_call>"]


def test_the_openai_client_gets_tool_calls_as_vllm_hermes_gives_them():
    import openai

    texts = [TWO_CALLS, TWO_CALLS, "\n" + P.format_tool_call(3, 4), TWO_CALLS, "<answer>red</answer>", *UNREADABLE,
             "Unclosed: <tool_call>\n{\"name\": \"crop_video\", \"arguments\": {\"start_time\": 5, \"end_time\": 6}}"]
    b = Replies(*texts)
    with Server(create_app(b, "m")) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        r = ask(client)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        assert c.message.content == "<think>\nTwo windows may hold it.\n</think>\n"  # the text before the first call
        assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
            ("function", "crop_video", {"start_time": 0, "end_time": 15}),
            ("function", "crop_video", {"start_time": 15, "end_time": 30})]
        assert all(t.id.startswith("chatcmpl-tool-") for t in c.message.tool_calls)
        assert len({t.id for t in c.message.tool_calls}) == 2
        assert b.seen[-1].messages[0].text() == P.native_tools_block([CROP])  # declared in a system turn
        one = ask(client, parallel_tool_calls=False).choices[0].message.tool_calls
        assert [json.loads(t.function.arguments) for t in one] == [{"start_time": 0, "end_time": 15}]
        assert b.seen[-1].stop == ["</tool_call>"]  # the model is stopped after its first call
        blank = ask(client).choices[0]  # only blank text before the call: content is null
        assert blank.message.content is None and blank.finish_reason == "tool_calls"
        none = ask(client, tool_choice="none").choices[0]  # declared, not read
        assert none.message.content == TWO_CALLS and not none.message.tool_calls and none.finish_reason == "stop"
        answer = ask(client).choices[0]
        assert answer.message.content == "<answer>red</answer>" and not answer.message.tool_calls
        for text in UNREADABLE:  # all or nothing: the whole reply stays text
            got = ask(client).choices[0]
            assert got.message.content == text and not got.message.tool_calls and got.finish_reason == "stop", text
        unclosed = ask(client).choices[0]  # an unclosed last block is read to the end of the text
        assert unclosed.message.content == "Unclosed: " and unclosed.finish_reason == "tool_calls"
        assert json.loads(unclosed.message.tool_calls[0].function.arguments) == {"start_time": 5, "end_time": 6}


PIECES = ["<think>\nTwo win", "dows may hold it.\n</think>\n<tool", "_call>\n{\"name\": \"crop_video\", \"argu",
          "ments\": {\"start_time\": 0, \"end_time\": 15}}\n</tool_call>\n" + P.format_tool_call(15, 30)]


@pytest.mark.parametrize("pieces, final", [(PIECES, TWO_CALLS), ([" ", "\n" + P.format_tool_call(3, 4)], None),
                                           (["Bad <tool", "_call>{x</tool_call>"], None),
                                           (["plain ", "<tool", "box> answer"], None)],
                         ids=["calls", "blank-content", "unreadable", "tag-look-alike"])
def test_streamed_tool_calls_join_to_the_plain_reply(pieces, final):
    """Streamed with the official client: text before the first call goes out as it is decoded (never
    a piece of the tag), then each call as OpenAI's deltas; the joined stream is the plain reply (the
    openai client's own accumulator agrees)."""
    import openai

    final = final or "".join(pieces)
    fake = StreamingFake(pieces, final)
    with Server(create_app(fake, "m")) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        plain = ask(client).choices[0]
        chunks = list(ask(client, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        content = "".join(d.content or "" for d in deltas)
        assert content == (plain.message.content or "")
        assert not any(d.content and "<tool_c" in d.content for d in deltas if plain.message.tool_calls)
        calls: dict[int, dict] = {}
        for d in deltas:
            for t in d.tool_calls or []:
                entry = calls.setdefault(t.index, {"id": t.id, "name": t.function.name, "arguments": ""})
                entry["arguments"] += t.function.arguments or ""
        want = [(t.function.name, t.function.arguments) for t in plain.message.tool_calls or []]
        assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == want
        assert all(calls[i]["id"].startswith("chatcmpl-tool-") for i in calls)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [plain.finish_reason]
        strict = {"type": "function", "function": {**CROP["function"], "strict": True}}  # what the helper takes
        with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "Where?"}],
                                            tools=[strict]) as stream:  # the client's own accumulator
            done = stream.get_final_completion().choices[0]
        # (the first chunk carries content "", as vLLM's and OpenAI's do: the accumulator keeps it)
        assert (done.message.content or None) == plain.message.content and done.finish_reason == plain.finish_reason
        assert [(t.function.name, t.function.arguments) for t in done.message.tool_calls or []] == want
    if final == TWO_CALLS:  # the think went out before the model finished its calls
        first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
        assert sum(1 for d in deltas[:first_call] if d.content) >= 2


BAD = [
    ({"tool_choice": "required"}, '"required" is not supported'),
    ({"tool_choice": {"type": "function", "function": {"name": "crop_video"}}}, "naming a function ('crop_video') is "
                                                                                "not supported"),
    ({"tool_choice": {"type": "function", "function": {"name": "zoom"}}}, "not among the tools"),
    ({"tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": []}, "non-empty list"),
    ({"tools": [{"type": "function"}]}, "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "name must be a non-empty string"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "JSON Schema object"),
    ({"tools": None, "tool_choice": "auto"}, "tool_choice needs tools"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false"),
    ({"functions": [{"name": "f"}]}, "deprecated form"),
    ({"response_format": {"type": "json_object"}}, "'json_object' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}},
     "'json_schema' is not supported"),
    ({"response_format": "json"}, 'response_format must be {"type": "text"}'),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": 1}}]}, "tool_calls must be a list"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {}}]}]}, "tool_calls[0] must be"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 7}}]}]}, "name must be a string"),
    ({"messages": [{"role": "tool", "content": 5}]}, "content must be a string or a list"),
    ({"messages": [{"role": "tool", "content": [{"type": "video"}]}]}, "text part or an image_url part"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": png(2)}}]}]},
     "images are accepted in user and tool messages only"),
]


@pytest.fixture(scope="module")
def refuser():
    b = Replies()
    with Server(create_app(b, "m")) as s:
        yield b, s


@pytest.mark.parametrize("extra, needle", BAD, ids=[n for _, n in BAD])
def test_what_is_not_honoured_is_refused_with_a_clear_400(refuser, extra, needle):
    b, s = refuser
    body = {"messages": [{"role": "user", "content": "Where?"}], "tools": [CROP], **extra}
    if body.get("tools") is None:
        body.pop("tools")
    r = httpx.post(s.url + CHAT, json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert not b.seen


def test_images_of_tool_messages_are_bounded_as_a_users_are():
    """A tool message's frames count toward the request's image limits and are data URLs only; a
    history whose call arguments nest past the JSON parser is still served (they become {})."""
    b = Replies("fine")
    tool = {"role": "tool", "content": [{"type": "text", "text": "frames"},
                                        {"type": "image_url", "image_url": {"url": png(3)}}]}
    with Server(create_app(b, "m", max_images=1)) as s:
        two = httpx.post(s.url + CHAT, json={"messages": [tool, tool]})
        assert two.status_code == 400 and "over the limit of 1 images" in two.json()["error"]["message"]
        url = {"role": "tool", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}
        far = httpx.post(s.url + CHAT, json={"messages": [url]})
        assert far.status_code == 400 and "never fetches" in far.json()["error"]["message"]
        deep = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {
            "name": "crop_video", "arguments": "[" * 100000 + "]" * 100000}}]}
        ok = httpx.post(s.url + CHAT, json={"messages": [deep, tool]})
        assert ok.status_code == 200, ok.text
    assert '"arguments": {}' in b.seen[-1].messages[0].text()


def test_response_format_text_and_auto_are_accepted():
    b = Replies("fine", "fine")
    with Server(create_app(b, "m")) as s:
        for extra in ({"response_format": {"type": "text"}}, {"tool_choice": "auto"}):
            r = httpx.post(s.url + CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "tools": [CROP],
                                               **extra})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine"


# ---- the openai backend's native mode -----------------------------------------------------------------

def episode(mode: str, prompts: str, calls: str, final: bool = True):
    """An episode's main-agent messages after one round of calls, as the episode builds them."""
    from paravt.agent import build_final_message, build_main_messages, build_tool_response_messages
    from paravt.agent.messages import frame_parts, tool_response_parts
    from paravt.backends.base import Message
    from paravt.video import Frame

    rng = np.random.default_rng(0)
    frames = [Frame(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8), 2.5 + 5 * i) for i in range(3)]
    msgs = build_main_messages(frames, 60.0, "What colour was the star?", "oe", mode, prompts=prompts)
    msgs.append(Message("assistant", calls))
    n = len(P.parse(calls).calls) + len(P.parse(calls).bad_calls)
    responses = [tool_response_parts(f"At {i} s a red star.", frame_parts(frames[:2]) if mode == "inline" else None)
                 for i in range(n)]
    msgs += build_tool_response_messages(responses, prompts)
    if final:
        msgs.append(build_final_message("oe", prompts))
    return msgs


@pytest.mark.parametrize("mode", ["parallel", "inline"])
@pytest.mark.parametrize("calls", [TWO_CALLS, "<think>\nOne.\n</think>\n" + P.format_tool_call(5, 9)])
def test_native_requests_give_paravt_serve_the_text_modes_prompt(renderer, mode, calls):
    """The episode's messages said natively (tools, tool_calls, tool messages, frames inside tool messages
    in inline mode) reach the model as the same tokens as the text mode's."""
    msgs = episode(mode, "paravt", calls)
    native, tools = to_native_messages(msgs, prefix=P.THINK_PREFIX)
    assert tools == [P.tool_schema(mode)]
    roles = [m["role"] for m in native]
    n = len(P.parse(calls).calls)
    assert roles == ["system", "user", "assistant"] + ["tool"] * n + ["user", "assistant"]
    assistant = native[2]
    assert assistant["content"] == calls[: calls.index("<tool_call>") - 1]
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        c.arguments for c in P.parse(calls).calls]
    assert [m["tool_call_id"] for m in native if m["role"] == "tool"] == [c["id"] for c in assistant["tool_calls"]]
    if mode == "inline":
        assert sum(p["type"] == "image_url" for p in native[3]["content"]) == 2
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    text_body = {"messages": to_openai_messages(msgs, prefix=P.THINK_PREFIX), **extra}
    native_body = {"messages": native, "tools": tools, "tool_choice": "auto", **extra}
    assert served_ids(renderer, native_body) == served_ids(renderer, text_body)


def test_native_mode_keeps_text_where_calls_cannot_be_said_natively():
    """A turn with an unreadable call (the server would not read it as calls either) or a <tool_code>
    call stays text with its responses; no tool block: no tools (the reply is then read as text)."""
    bad = TWO_CALLS + "\n<tool_call>\n{oops}\n</tool_call>"
    for calls in (bad, "<think>\nx\n</think>\n<tool_code>crop_video(start_time=1, end_time=2)</tool_code>"):
        msgs = episode("parallel", "paravt", calls, final=False)
        native, tools = to_native_messages(msgs)
        assert tools == [CROP] and [m["role"] for m in native] == ["system", "user", "assistant", "user"]
        assert native[2] == {"role": "assistant", "content": calls}
    native, tools = to_native_messages(episode("none", "paravt", "<answer>x</answer>", final=False)[:2])
    assert tools is None and native[0]["content"] == P.system_prompt("none")


def test_native_mode_with_the_official_profile_sends_one_tool_message_per_response():
    msgs = episode("parallel", "official", TWO_CALLS)
    native, tools = to_native_messages(msgs)
    assert tools == [P.OFFICIAL_CROP_VIDEO_TOOL] and native[0]["role"] == "user"  # no system text of its own
    assert [m["role"] for m in native] == ["user", "assistant", "tool", "tool", "user"]
    assert native[2]["content"] == "At 0 s a red star." and native[3]["content"] == "At 1 s a red star."


def test_native_backend_requests_carry_tools_and_read_tool_calls():
    """Over HTTP: the backend's native body has tools and tool_choice auto; the server's tool_calls
    come back as the turn's text, which parses to the same calls."""
    from paravt.backends.openai import OpenAIBackend

    b = Replies(TWO_CALLS[len(P.THINK_PREFIX):], TWO_CALLS[len(P.THINK_PREFIX):])
    seen = []

    class Recording(OpenAIBackend):
        async def _try(self, st, url, body):
            seen.append(json.loads(json.dumps(body)))
            return await super()._try(st, url, body)

    msgs = episode("parallel", "paravt", TWO_CALLS, final=False)[:2]
    with Server(create_app(b, "m")) as s:
        be = Recording(s.url, model="m")
        native, text = asyncio.run(be.generate([GenerateRequest(msgs, prefix=P.THINK_PREFIX, tool_calls="native"),
                                                GenerateRequest(msgs, prefix=P.THINK_PREFIX)]))
    by_mode = {("tools" in body): body for body in seen}
    assert by_mode[True]["tool_choice"] == "auto" and by_mode[True]["tools"] == [CROP]
    assert "tools" not in by_mode[False]
    assert [c.arguments for c in P.parse(native.text).calls] == [c.arguments for c in P.parse(text.text).calls]
    assert native.text == text.text == TWO_CALLS[len(P.THINK_PREFIX):]


@pytest.mark.slow
def test_native_and_text_tool_calls_dispatch_the_same_crops(tmp_path):
    """The shipped model served by paravt serve (in-process), one greedy K=4 episode per mode on a
    SynthVT-mini video: native mode's requests declare the tool as `tools` and its replies come back
    as `tool_calls`, its later turns send tool_calls and tool messages; both modes dispatch the same
    crops, and every turn's prompt is the same tokens."""
    import torch

    from paravt.agent import EpisodeConfig, run_episode_sync
    from paravt.ask import DEFAULT_MODEL
    from paravt.backends.hf import HFBackend
    from paravt.backends.openai import OpenAIBackend
    from paravt.models import load_model
    from paravt.synth.dataset import MINI_TASK
    from paravt.synth.render import make_spec, write_video

    torch.manual_seed(0)
    spec = make_spec(0, min_len=MINI_TASK["min_len"], max_len=MINI_TASK["max_len"], n_events=MINI_TASK["n_events"],
                     event_len=(MINI_TASK["event_min"], MINI_TASK["event_max"]))
    video = write_video(spec, tmp_path / "synth_0.mp4")
    question = f"What colour was the {spec.events[0].shape}? Answer with one word."  # SynthVT-mini's colour_oe
    bodies, replies = [], []

    class Recording(OpenAIBackend):
        async def _try(self, st, url, body):
            data = await super()._try(st, url, body)
            bodies.append(json.loads(json.dumps(body)))
            replies.append(data)
            return data

    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    with Server(create_app(HFBackend(model, processor, max_batch=8), "tiny-paravt")) as s:
        eps = {mode: run_episode_sync(Recording(s.url, timeout_s=120), video, question,
                                      EpisodeConfig(frames=4, max_new_tokens=256, sub_max_new_tokens=96,
                                                    tool_calls=mode), question_type="oe")
               for mode in ("text", "native")}
        first = next(b for b in bodies if "tools" in b)  # the native first turn again, streamed as it decodes
        chunks = [c for c in events(httpx.post(s.url + CHAT, json={**first, "stream": True, "logprobs": False,
                                                                   "return_token_ids": False}, timeout=120))
                  if isinstance(c, dict)]
    text, native = eps["text"], eps["native"]
    crops = {m: [[(c.start, c.end, c.status) for c in t.calls] for t in ep.turns] for m, ep in eps.items()}
    assert crops["native"] == crops["text"] and len(crops["text"][0]) >= 2 and text.n_executed_calls >= 2
    assert [t.generation.prompt_ids for t in native.turns] == [t.generation.prompt_ids for t in text.turns]
    assert native.answer == text.answer
    mains = [(b, r) for b, r in zip(bodies, replies) if any(m["role"] == "system" for m in b["messages"])]
    native_mains = [(b, r) for b, r in mains if "tools" in b]
    assert len(native_mains) == len(native.turns) and len(mains) == len(text.turns) + len(native.turns)
    first_reply = native_mains[0][1]["choices"][0]
    assert first_reply["finish_reason"] == "tool_calls" and len(first_reply["message"]["tool_calls"]) >= 2
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == first_reply["message"]["content"]
    assert sum(1 for d in deltas if d.get("content")) > 2  # the think went out while the model decoded
    streamed = [t["function"] for d in deltas for t in d.get("tool_calls") or [] if "name" in t["function"]]
    assert [f["name"] for f in streamed] == [t["function"]["name"] for t in first_reply["message"]["tool_calls"]]
    args = ["".join(t["function"]["arguments"] for d in deltas for t in d.get("tool_calls") or [] if t["index"] == i)
            for i in range(len(streamed))]
    assert args == [t["function"]["arguments"] for t in first_reply["message"]["tool_calls"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    later = native_mains[1][0]["messages"]
    assert [m["role"] for m in later].count("tool") == len(crops["native"][0])
    assert next(m for m in later if m["role"] == "assistant")["tool_calls"]
