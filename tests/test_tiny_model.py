"""The offline tiny Qwen3-VL: tokenizer, chat template, config, save/load round trip, load errors."""

import json

import numpy as np
import pytest
import torch

from paravt import protocol as P
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend, Renderer
from paravt.models import ModelLoadError, load_model
from paravt.models.tiny import QWEN_SPECIAL, build_tiny, save_pretrained


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


def frame(seed, h=64, w=64):
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def test_specials_and_our_tags_are_single_tokens(tiny):
    tok = tiny[1].tokenizer
    singles = list(P.ALL_TAGS) + QWEN_SPECIAL
    ids = [tok.encode(t, add_special_tokens=False) for t in singles]
    assert all(len(i) == 1 for i in ids), [t for t, i in zip(singles, ids) if len(i) != 1]
    assert len({i[0] for i in ids}) == len(singles)  # all distinct
    text = f"{P.THINK_OPEN}look at 12.5 s{P.THINK_CLOSE}{P.format_tool_call(12.5, 30)} é ∑ 🙂"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_every_synthvt_answer_word_is_one_token_after_the_answer_tag(tiny):
    """A colour the think names (" cyan") and the same colour in the answer tag ("<answer>cyan") are
    each one token: split into pieces after the tag, the first SFT model named the right colour in
    its think and wrote a fragment ("reen") in its answer."""
    from paravt.synth.render import BACKGROUNDS, COLOURS, SHAPES

    tok = tiny[1].tokenizer
    words = [*COLOURS, *SHAPES, *(b for b in BACKGROUNDS if " " not in b)]
    for w in words:
        assert len(tok.encode(f" {w}", add_special_tokens=False)) == 1, w
    for w in [*words, *"ABCD"]:
        assert tok.tokenize(f"{P.ANSWER_OPEN}{w}{P.ANSWER_CLOSE}") == [P.ANSWER_OPEN, w, P.ANSWER_CLOSE]


def test_the_oracle_answer_tag_repeats_the_token_its_think_ended_on(tiny):
    """The word in the oracle's answer tag is the same token as in "So the answer is: <w>." (a copy,
    which the tiny model learns), not the no-space form (a second token per word, which it did not
    learn to map to: 2/30 teacher-forced)."""
    from paravt.synth.oracle import Trajectory, oracle_messages
    from paravt.synth.questions import Question

    tok = tiny[1].tokenizer
    q = Question(id="q", video_id="v", kind="colour_oe", question_type="oe", question="What colour was the star?",
                 answer="magenta", answer_text="magenta", events=[0], evidence=[[10.0, 12.0]])
    traj = Trajectory("q", 4, [1.0, 2.0, 3.0, 4.0], True, "I saw it. So the answer is: magenta.", answer="magenta")
    msgs, _ = oracle_messages(traj, q, 80.0)
    ids = tok.encode(msgs[-1].text(), add_special_tokens=False)
    word = tok.encode(" magenta", add_special_tokens=False)
    tag = ids.index(tok.convert_tokens_to_ids(P.ANSWER_OPEN))
    assert len(word) == 1 and ids[tag + 1] == word[0] and ids.count(word[0]) == 2


def test_config_is_tiny_qwen3_vl(tiny):
    model, processor = tiny
    n = sum(p.numel() for p in model.parameters())
    assert 1e6 <= n <= 5e6
    v = model.config.vision_config
    assert (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) == (16, 2, 2)
    assert all(i < v.depth for i in v.deepstack_visual_indexes)
    ip = processor.image_processor
    assert (ip.size["longest_edge"], ip.size["shortest_edge"]) == (50176, 784)
    assert model.config.text_config.vocab_size == len(processor.tokenizer)


def test_seeded_build_is_deterministic():
    a, _ = build_tiny(seed=0)
    b, _ = build_tiny(seed=0)
    c, _ = build_tiny(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_chat_template_matches_renderer(tiny):
    """The template shipped with the tokenizer and the backend's segment renderer agree, so a
    checkpoint served by another stack (vLLM) sees the same prompt layout."""
    _, processor = tiny
    tok, r = processor.tokenizer, Renderer(processor)
    img = frame(0, 64, 96)
    msgs = [Message("system", P.system_prompt("parallel")),
            Message("user", [TextPart(P.timestamp_text(1.5)), ImagePart(img), TextPart("\nWhat is red?")]),
            Message("assistant", "<think>hm</think><answer>A</answer>"),
            Message("user", "and?")]
    as_dicts = [{"role": m.role, "content": [{"type": "text", "text": p.text} if isinstance(p, TextPart)
                                             else {"type": "image"} for p in m.parts()]} for m in msgs]
    text = tok.apply_chat_template(as_dicts, tokenize=False, add_generation_prompt=True)
    n = r.image_tokens(img)
    assert n == (64 // 32) * (96 // 32)
    text = text.replace("<|image_pad|>", "<|image_pad|>" * n)
    assert tok.encode(text, add_special_tokens=False) == r.render(msgs).ids


def test_save_load_round_trip_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, processor = tiny
    path = save_pretrained(model, processor, tmp_path / "m")
    assert json.loads((path / "preprocessor_config.json").read_text())["processor_class"] == "Qwen3VLProcessor"
    assert json.loads((path / "video_preprocessor_config.json").read_text())["patch_size"] == 16
    m2, p2 = load_model(str(path))
    s1, s2 = model.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    text = "<think>hi</think><|im_end|>"
    assert p2.tokenizer.encode(text, add_special_tokens=False) == processor.tokenizer.encode(text, add_special_tokens=False)
    assert p2.tokenizer.chat_template == processor.tokenizer.chat_template
    assert p2.image_processor.size == processor.image_processor.size
    req = GenerateRequest([Message("user", [TextPart("<0.0 seconds>"), ImagePart(frame(1)), TextPart("Hi")])],
                          max_new_tokens=6)
    r1 = HFBackend(model, processor).generate_sync([req])[0]
    r2 = HFBackend(m2, p2).generate_sync([req])[0]
    assert r1.token_ids == r2.token_ids and r1.prompt_ids == r2.prompt_ids


def test_saved_dir_loads_with_plain_transformers(tiny, tmp_path, monkeypatch):
    """The directory is an ordinary checkpoint: the Auto classes read it without our code."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen3VLForConditionalGeneration

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = save_pretrained(*tiny, tmp_path / "m")
    assert AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("<|image_pad|>") == tiny[0].config.image_token_id
    assert AutoImageProcessor.from_pretrained(path).patch_size == 16
    assert Qwen3VLForConditionalGeneration.from_pretrained(path).config.text_config.hidden_size == \
        tiny[0].config.text_config.hidden_size


def test_a_mistyped_model_path_is_said_before_the_model_code_loads(tmp_path):
    """A missing directory or one that is not a model fails at once: no seconds of transformers imports first."""
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    code = ("import sys\nfrom paravt.models import ModelLoadError, load_model\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n        load_model(path)\n    except ModelLoadError as e:\n        print(e)\n"
            "print('transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing"), str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    said = r.stdout.splitlines()
    assert "does not exist" in said[0] and "config.json" in said[1] and said[2] == "False", said


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="not found locally"):
        load_model("ParaVT/no-such-model-in-cache")
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model(str(tmp_path / "empty"), dtype="int3")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError):
        load_model(str(bad))
