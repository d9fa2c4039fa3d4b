import math

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from paravt import protocol as P
from paravt.rewards import (
    RewardBreakdown,
    RewardConfig,
    accuracy_reward,
    anchor_reward,
    anchor_token_rewards,
    format_reward,
    is_degenerate,
    mcq_letter,
    options_from_question,
    parse_span,
    score_episode,
    shape,
    structural_positions,
    temporal_iou,
    token_f1,
    tool_reward,
)

CALL = P.format_tool_call(10, 20)
THINK = "<think>the red circle shows up late</think>"  # substantive: 28 characters of content
ANS = "<answer>B</answer>"
OPTS = ["A. blue", "B. red", "C. green", "D. a man walks"]


# ---- accuracy: mcq ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, expected",
    [
        ("B", 1.0), ("b", 1.0), ("(B)", 1.0), ("[B]", 1.0), ("B.", 1.0), ("**B**", 1.0),
        ("Option B", 1.0), ("The answer is B", 1.0), ("The answer is (B).", 1.0), ("Answer: B", 1.0),
        ("the correct answer is option B.", 1.0), ("B. red", 1.0), ("B) red", 1.0), ("I think B.", 1.0),
        ("Option A is wrong; the answer is B", 1.0),  # the answer phrase beats an option named in passing
        ("red", 1.0), ("Red.", 1.0),  # the option's text instead of its letter
        ("C", 0.0), ("The answer is C", 0.0), ("a man walks", 0.0),  # option D's text, which starts with "a"
        ("It is B or C", 0.0),  # two letters: no choice
        ("", 0.0), (None, 0.0), ("Because of this", 0.0), ("I am not sure", 0.0),
    ],
)
def test_mcq(pred, expected):
    assert accuracy_reward(pred, "B", "mcq", options=OPTS) == expected


@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("A", "A. blue", 1.0), ("D", "D. a man walks", 1.0),
        ("a man walks", "D", 1.0),  # read as option D's text, not as the letter A
        ("A", "D", 0.0),
    ],
)
def test_mcq_ground_truth_forms(pred, answer, expected):
    assert accuracy_reward(pred, answer, "mcq", options=OPTS) == expected


def test_mcq_tenth_letter():
    ten = [f"{c}. option {c}" for c in "ABCDEFGHIJ"]
    assert accuracy_reward("J", "J", "mcq", options=ten) == 1.0
    assert accuracy_reward("J", "(J) tenth", "mcq", options=ten) == 1.0
    assert accuracy_reward("J", "(J) tenth", "mcq", options=OPTS) == 0.0  # J is not one of the four options


def test_mcq_options_read_from_the_question():
    q = "Which colour did the circle have?\nA. blue\nB. red\nC. green"
    assert options_from_question(q) == ["blue", "red", "green"]
    assert accuracy_reward("red", "B", "mcq", question=q) == 1.0
    assert accuracy_reward("red", "B", "mcq") == 0.0  # no options: the text cannot be mapped
    assert options_from_question("What?\nA. only one") is None
    assert options_from_question("What?\nB. x\nC. y") is None  # must start at A


@pytest.mark.parametrize(
    "text, letter",
    [("The answer is a red circle", None), ("A is correct", "A"), ("A man walks", None), ("I", "I"),
     ("<answer>C</answer>", "C"), ("It's B, not C", None), ("choice: (E)", "E")],
)
def test_mcq_letter(text, letter):
    assert mcq_letter(text) == letter


@pytest.mark.parametrize("text", ["E", "(E)", "The answer is E", "Option E", "E. purple"])
def test_a_letter_the_question_does_not_offer_is_no_answer(text):
    """Video-MME's and lmms-eval's scorers read only the question's letters: "E" of four options is
    no answer there, and here (without the options any A-J letter is read)."""
    four = ["A. red", "B. green", "C. blue", "D. white"]
    assert mcq_letter(text, four) is None
    assert mcq_letter(text, four + ["E. purple"]) == "E"
    assert mcq_letter(text) == "E"


# ---- accuracy: tvg ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("10 - 20", "[10, 20]", 1.0),
        ("[15, 25]", [10, 20], 5 / 15),
        ("from 0 to 5 seconds", "10 - 20", 0.0),
        ("12.5 - 17.5", "10 - 20", 0.5),
        ("12.5-17.5", "10 - 20", 0.5),  # '-' is a separator, not a sign
        ("20 - 10", "10 - 20", 1.0),  # a reversed pair is read as the span it names
        ("00:10 - 00:15", "10 - 20", 0.5),
        ("The event runs from 5 to 15 s, then again 40 - 50", (10, 20), 5 / 15),  # the first pair
        ("1.5 - 2", "15 - 20", 0.0),  # no normalized string match for tvg ('1.5' would become '15')
        ("no idea", "10 - 20", 0.0),
        ("12", "10 - 20", 0.0),
    ],
)
def test_tvg_iou(pred, answer, expected):
    assert accuracy_reward(pred, answer, "tvg") == pytest.approx(expected)


def test_span_and_iou_helpers():
    assert parse_span("The event runs 3.5 - 7 s") == (3.5, 7.0)
    assert parse_span(["1:00", 70]) == (60.0, 70.0)
    assert parse_span([1]) is None and parse_span(None) is None and parse_span(["x", 2]) is None
    assert temporal_iou((0, 0), (0, 0)) == 1.0 and temporal_iou((1, 1), (2, 2)) == 0.0
    assert temporal_iou(None, (1, 2)) == 0.0
    assert temporal_iou((0, 10), (5, 20)) == pytest.approx(5 / 20)


# ---- accuracy: oe ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("red circle", "red circle", 1.0),
        ("The red circle.", "red circle", 1.0),  # normalized exact
        ("a red square", "red circle", 0.5),  # [red, square] vs [red, circle]: P = R = 1/2
        ("blue", "red circle", 0.0),
        ("red", "red circle", 2 / 3),  # P = 1, R = 1/2
        ("red red circle", "red circle", 0.8),  # P = 2/3, R = 1
        ("the", "a", 1.0),  # both normalize to nothing: SQuAD scores that as a match
    ],
)
def test_oe_f1(pred, answer, expected):
    assert accuracy_reward(pred, answer, "oe") == pytest.approx(expected)


def test_oe_exact_and_judge():
    assert accuracy_reward("red", "red circle", "oe", RewardConfig(oe_metric="exact")) == 0.0
    assert accuracy_reward("The Red Circle!", "red circle", "oe", RewardConfig(oe_metric="exact")) == 1.0
    seen = []

    def judge(q, p, a):
        seen.append((q, p, a))
        return {"red": 0.7, "huge": 5.0, "neg": -1.0}.get(p, math.nan)

    cfg = RewardConfig(oe_metric="judge", judge=judge)
    assert accuracy_reward("red", "red circle", "oe", cfg, question="Which shape?") == 0.7
    assert seen == [("Which shape?", "red", "red circle")]
    assert accuracy_reward("huge", "x", "oe", cfg) == 1.0 and accuracy_reward("neg", "x", "oe", cfg) == 0.0
    assert accuracy_reward("other", "x", "oe", cfg) == 0.0  # NaN from the judge
    assert token_f1("", "") == 1.0


def test_config_and_type_errors():
    with pytest.raises(ValueError, match="needs a judge"):
        RewardConfig(oe_metric="judge")
    with pytest.raises(ValueError, match="oe_metric"):
        RewardConfig(oe_metric="bleu")
    with pytest.raises(ValueError, match="question_type"):
        accuracy_reward(None, "y", "essay")


# ---- format ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, prefix, suffix_on, expected",
    [
        (THINK + ANS, "", True, 0.2 + 0.3 + 0.2 + 0.1),
        (THINK + ANS, "", False, 0.3 + 0.2 + 0.1 + 0.1),
        (THINK + "<answer>B", "", True, 0.2),  # an unclosed answer earns nothing (closure is what is paid)
        (THINK + "<answer>B", "", False, 0.3),
        (THINK + "<answer>  </answer>", "", True, 0.2 + 0.1),  # empty body: neither answer term
        (THINK + CALL, "", True, 0.2 + 0.3 + 0.1),
        (THINK + "<tool_code>crop_video(1, 2)</tool_code>", "", True, 0.2 + 0.3 + 0.1),
        (THINK + "<tool_call>{bad}</tool_call>", "", True, 0.2 + 0.1),  # no parseable call
        ("<think>short</think>" + CALL, "", True, 0.0),  # too short: no think credit, no think-before-call
        ("</think>\n" + CALL, P.THINK_PREFIX, True, 0.0),  # an empty forced think, then a call (was 0.4)
        ("<think>the red circle shows up late" + ANS, "", True, 0.5),  # unclosed think: the answer's 0.5 only
        ("<think>0123456789</think>" + ANS, "", True, 0.8),  # exactly 10 characters: substantive
        ("<think>012345678</think>" + ANS, "", True, 0.3 + 0.2 + 0.1),
        ("<think>" + " " * 20 + "</think>" + ANS, "", True, 0.6),  # whitespace is not content
        ("<think>the red circle shows up late" + CALL, "", True, 0.0),  # unclosed think: nothing, so no bonus
        (THINK + "<think>again", "", True, 0.2),
        (CALL + THINK, "", True, 0.2 + 0.1),  # think after the call does not precede it
        ("<think>the red circle shows up late<answer></think>B</answer>", "", True, 0.2 + 0.3 + 0.2),  # crossed
        ("<answer></answer>", "", True, 0.0),
        ("B", "", True, 0.0),
        # forced "<think>\n" prefix: the model's text starts inside the think and still gets credit
        ("the red circle shows up late</think>" + ANS, P.THINK_PREFIX, True, 0.8),
        ("the red circle shows up late</think>" + ANS, "", True, 0.3 + 0.2),  # the public release's scoring
        (THINK + CALL + "\n" + THINK + ANS, "", True, 1.0),  # 0.2+0.3+0.2+0.3+0.1 = 1.1, capped
    ],
)
def test_format(text, prefix, suffix_on, expected):
    assert format_reward(text, RewardConfig(answer_suffix=suffix_on), prefix=prefix) == pytest.approx(expected)


@pytest.mark.parametrize(
    "turns, prefix, expected",
    [
        ([THINK + CALL, THINK + ANS], "", 1.0),
        (["the red circle shows up late</think>" + CALL, "it was red, clearly</think>" + ANS], P.THINK_PREFIX, 1.0),
        (["the red circle shows up late</think>" + CALL, "it was red, clearly</think>" + ANS], "", 0.3 + 0.2),
        # one turn's </think> cannot close the previous turn's <think>: judged per turn
        (["<think>the red circle shows up late", "</think>" + ANS], "", 0.3 + 0.2),
        ([THINK + CALL, "<answer>B</answer>"], "", 0.2 + 0.3 + 0.2 + 0.3 + 0.1),  # 1.1 capped
        ([THINK + CALL, "it is B"], "", 0.2 + 0.3 + 0.1),  # forced answer without tags: no answer terms
        ([], "", 0.0),
    ],
)
def test_format_of_episodes(turns, prefix, expected):
    assert format_reward(turns, prefix=prefix) == pytest.approx(min(expected, 1.0))


# ---- anchoring -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, prefix, expected",
    [
        (THINK + ANS, "", 0.4 + 0.3),
        (THINK + CALL, "", 0.4),
        ("<think>short</think>" + ANS, "", 0.0),  # the flow needs a substantive think
        ("</think>\n" + ANS, P.THINK_PREFIX, 0.0),  # an empty forced think earns no flow
        ("<think>never closed and long enough", "", -0.3),
        ("<think>the red circle shows up late" + ANS, "", -0.3),  # answer written inside an open think
        (ANS, "", 0.0),
        (THINK + "<answer></answer>", "", 0.4),  # empty answer: no flow bonus
        (THINK + "<answer>B", "", 0.4),  # unclosed answer: no flow bonus
        (ANS + THINK, "", 0.4),  # answer before think: no flow
        (THINK + "<think>again", "", 0.4 - 0.3),
        ("the red circle shows up late</think>" + ANS, P.THINK_PREFIX, 0.7),
        ("the red circle shows up late</think>" + ANS, "", 0.0),  # without the prefix nothing fires
        ("still thinking about it", P.THINK_PREFIX, -0.3),
    ],
)
def test_anchor(text, prefix, expected):
    assert anchor_reward(text, prefix=prefix) == pytest.approx(expected)


@pytest.mark.parametrize(
    "turns, expected",
    [
        ([THINK + CALL, THINK + ANS], 0.7),  # each term once per episode
        ([THINK + CALL, "<think>never closed"], 0.4 - 0.3),
        (["<think>the red circle shows up late", "</think>" + ANS], -0.3),
    ],
)
def test_anchor_of_episodes(turns, expected):
    assert anchor_reward(turns) == pytest.approx(expected)


def test_anchor_constants_come_from_the_config():
    cfg = RewardConfig(gamma=0.0, anchor_close_think=1.0, anchor_full_flow=0.5)  # e.g. the "- penalty γ" ablation
    assert anchor_reward("<think>never closed and long enough", cfg) == 0.0
    assert anchor_reward(THINK + ANS, cfg) == pytest.approx(1.5)


# ---- tool ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parsed, executed, acc, expected",
    [(0, 0, 1.0, 0.0), (2, 0, 0.0, 0.1), (2, 2, 0.0, 0.3), (2, 2, 1.0, 0.8), (1, 0, 0.5, 0.6), (3, 1, 0.2, 0.8)],
)
def test_tool(parsed, executed, acc, expected):
    assert tool_reward(parsed, executed, acc) == pytest.approx(expected)


def test_tool_cap_and_errors():
    assert tool_reward(1, 1, 1.0, RewardConfig(tool_executed=0.7)) == 1.0  # 0.7 + 0.5 capped
    with pytest.raises(ValueError):
        tool_reward(-1, 0, 0.0)


def test_executed_tier_comes_from_record_not_text():
    turns = [THINK + CALL, THINK + ANS]  # generated text never holds <tool_response>
    ran = score_episode(turns, "B", "B", "mcq", n_parsed_calls=1, n_executed_calls=1)
    failed = score_episode(turns, "B", "B", "mcq", n_parsed_calls=1, n_executed_calls=0)
    assert ran.tool == pytest.approx(0.8) and failed.tool == pytest.approx(0.6)


# ---- degenerate, total, shaping -------------------------------------------------------------------


@pytest.mark.parametrize("gap, expected", [(74, True), (75, False)])
def test_degenerate_window(gap, expected):
    # five markers whose starts are `gap` apart: first to last = 4 * gap characters (< 300 is degenerate)
    text = ("<|im_start|>" + "x" * (gap - len("<|im_start|>"))) * 5
    assert is_degenerate(text) is expected
    assert not is_degenerate(text[: 4 * gap])  # four markers only


def test_degenerate_scores_zero():
    junk = "<|im_start|>assistant\n" * 6
    r = score_episode([THINK + ANS + junk], "B", "B", "mcq", 0, 0)
    assert r.degenerate and r.total == 0.0 and r.accuracy == 1.0  # terms still reported


@pytest.mark.parametrize(
    "turns, pred, answer, qtype, parsed, executed, prefix, anchoring, cfg, expected",
    [
        # acc 1 + fmt 1.0 + tool 0.8; in sequence mode λ·anchor is inside R_fmt, before its cap at 1
        ([THINK + CALL, THINK + ANS], "B", "B", "mcq", 1, 1, "", "sequence", None, (1, 1.0, 0.7, 0.8, 2.8)),
        ([THINK + CALL, THINK + ANS], "B", "B", "mcq", 1, 1, "", "token", None, (1, 1.0, 0.7, 0.8, 2.8)),
        ([THINK + CALL, THINK + ANS], "B", "B", "mcq", 1, 1, "", "off", None, (1, 1.0, 0.7, 0.8, 2.8)),
        # the same episode generated after a forced "<think>\n": identical scores
        (["the red circle shows up late</think>" + CALL, "it was red, clearly</think>" + ANS], "B", "B", "mcq",
         1, 1, P.THINK_PREFIX, "sequence", None, (1, 1.0, 0.7, 0.8, 2.8)),
        # ... and what the public release computed by leaving the prefix out: fmt 0.5, anchor 0
        (["the red circle shows up late</think>" + CALL, "it was red, clearly</think>" + ANS], "B", "B", "mcq",
         1, 1, "", "sequence", None, (1, 0.5, 0.0, 0.8, 2.3)),
        # wrong answer, a call that did not run: 0 + 1.0 + 0.1
        ([THINK + CALL, THINK + "<answer>C</answer>"], "C", "B", "mcq", 1, 0, "", "sequence", None,
         (0, 1.0, 0.7, 0.1, 1.1)),
        # a well-formed answer, no tool, w_fmt 0.5: R_fmt = min(0.2 + 0.5 + 0.5 * 0.7 + 0.1, 1) = 1.0 (was 1.15)
        ([THINK + ANS], "B", "B", "mcq", 0, 0, "", "sequence", RewardConfig(w_fmt=0.5), (1, 0.8, 0.7, 0, 1.5)),
        ([THINK + ANS], "B", "B", "mcq", 0, 0, "", "token", None, (1, 0.8, 0.7, 0, 1.8)),
        # grounding: IoU 0.5 + R_fmt 1.0 (0.8 + 0.35, capped)
        ([THINK + "<answer>12.5 - 17.5</answer>"], "12.5 - 17.5", "10 - 20", "tvg", 0, 0, "", "sequence", None,
         (0.5, 0.8, 0.7, 0, 1.5)),
        # an empty forced think, then a call that ran: no format credit at all; tool 0.3
        (["</think>\n" + CALL], None, "B", "mcq", 1, 1, P.THINK_PREFIX, "sequence", None, (0, 0, 0, 0.3, 0.3)),
        # a turn cut off mid-think: fmt 0, anchor -0.3, sequence total -0.15
        (["<think>still looking at the frames"], None, "B", "mcq", 0, 0, "", "sequence", None, (0, 0, -0.3, 0, -0.15)),
    ],
)
def test_score_episode(turns, pred, answer, qtype, parsed, executed, prefix, anchoring, cfg, expected):
    r = score_episode(turns, pred, answer, qtype, parsed, executed, cfg, prefix=prefix, anchoring=anchoring)
    assert (r.accuracy, r.format, r.anchor, r.tool, r.total) == pytest.approx(expected)
    assert not r.degenerate and set(r.to_dict()) == {"accuracy", "format", "anchor", "tool", "total", "degenerate",
                                                      "format_total"}


def test_score_episode_options_and_errors():
    q = "Which colour?\nA. blue\nB. red"
    r = score_episode([THINK + "<answer>red</answer>"], "red", "B", "mcq", 0, 0, question=q)
    assert r.accuracy == 1.0
    with pytest.raises(ValueError, match="anchoring"):
        score_episode([THINK + ANS], "B", "B", "mcq", 0, 0, anchoring="both")
    assert isinstance(r, RewardBreakdown)


def test_shaping():
    assert shape(1.2) == pytest.approx(10.0)
    assert shape(0.2) == 0.0
    assert shape(3.15) == 20.0  # (3.15 − 0.2)·10 = 29.5, clipped at ±20 as the recipe (AReaL reward_clip)
    assert shape(-5.0) == -20.0
    assert shape(3.15, RewardConfig(shaping_clip=100.0)) == pytest.approx(29.5)
    assert shape(1.0, RewardConfig(shaping_bias=0.5, shaping_scale=2.0)) == pytest.approx(1.0)


# ---- token positions ----------------------------------------------------------------------------


def _bpe(tags_as_tokens: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["the red circle shows up late", "answer B crop video start time end time", '{"name": "crop_video"}',
              "think answer tool call </think> <answer>"] * 20
    tok.train_from_iterator(corpus, trainer)
    if tags_as_tokens:
        tok.add_special_tokens(list(P.ALL_TAGS))
    return tok


@pytest.fixture(scope="module", params=["tags_as_tokens", "split_tags", "hf_fast"])
def tok(request):
    if request.param == "hf_fast":
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=_bpe(True))
    return _bpe(request.param == "tags_as_tokens")


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text).ids if isinstance(tok, Tokenizer) else tok.encode(text, add_special_tokens=False)


def _decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def _reference_token(tok, ids: list[int], char_end: int) -> int:
    """By brute force: the first token whose prefix decode reaches `char_end` characters."""
    return next(i for i in range(len(ids)) if len(_decode(tok, ids[: i + 1])) >= char_end)


def _reference_positions(tok, ids, tags=P.STRUCTURAL_TAGS) -> dict[int, str]:
    text = _decode(tok, ids)
    out = {}
    for tag in tags:
        i = text.find(tag)
        while i >= 0:
            out[_reference_token(tok, ids, i + len(tag))] = tag
            i = text.find(tag, i + 1)
    return out


TEXTS = [
    THINK + CALL + "<answer>B</answer>",
    "<think>der rote Kreis erscheint spät — 红色的圆 é</think>\n" + CALL + "\n" + CALL,  # multi-byte characters
    "x</think>y</think><answer></answer><tool_call></tool_call>",
    "no tags at all",
]


@pytest.mark.parametrize("text", TEXTS)
def test_structural_positions(tok, text):
    ids = _encode(tok, text)
    assert _decode(tok, ids) == text
    ref = _reference_positions(tok, ids)
    assert structural_positions(ids, tok) == sorted(ref)
    n_tags = sum(text.count(t) for t in P.STRUCTURAL_TAGS)
    assert len(ref) == n_tags  # every occurrence ends in its own token here
    if not isinstance(tok, Tokenizer) or tok.token_to_id("</think>") is not None:  # tags are single tokens
        tag_ids = {tok.convert_tokens_to_ids(t) if not isinstance(tok, Tokenizer) else tok.token_to_id(t)
                   for t in P.STRUCTURAL_TAGS}
        assert structural_positions(ids, tok) == [i for i, t in enumerate(ids) if t in tag_ids]
    elif ref:
        assert any(_decode(tok, [ids[p]]) not in P.STRUCTURAL_TAGS for p in ref)  # really split


def test_structural_positions_empty(tok):
    assert structural_positions([], tok) == []
    assert anchor_token_rewards([], tok) == {}


class _StripDecoder:
    """A decoder that drops a leading space when a token is decoded alone (as Metaspace-style
    decoders do): the per-token pieces then spell a tag the real text does not hold."""

    vocab = ["<think>", "abc", "<", " /think>", "</think>"]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids)

    def decode_batch(self, seqs, skip_special_tokens=False):
        return [self.decode(s).lstrip() for s in seqs]


def test_structural_positions_fall_back_to_exact_offsets():
    # real text "<think>abc< /think></think>" holds one </think>, the pieces would show two
    assert structural_positions([0, 1, 2, 3, 4], _StripDecoder()) == [4]


# ---- token-level anchoring -------------------------------------------------------------------------


def _tag_token(tok, ids, tag, nth=0):
    text = _decode(tok, ids)
    i = -1
    for _ in range(nth + 1):
        i = text.find(tag, i + 1)
    return _reference_token(tok, ids, i + len(tag))


def test_anchor_tokens_with_forced_prefix(tok):
    body = "the red circle shows up late</think><answer>B</answer>"
    ids = _encode(tok, body)
    values = anchor_token_rewards(ids, tok, prefix=P.THINK_PREFIX)
    assert values == pytest.approx({_tag_token(tok, ids, "</think>"): 0.4, _tag_token(tok, ids, "</answer>"): 0.3})
    assert set(values) <= set(structural_positions(ids, tok))
    assert sum(values.values()) == pytest.approx(anchor_reward(body, prefix=P.THINK_PREFIX))
    assert anchor_token_rewards(ids, tok) == {}  # without the prefix there is no think to credit


@pytest.mark.parametrize(
    "text, expected",  # expected: [(tag or "last", nth occurrence, value)]
    [
        (THINK + CALL, [("</think>", 0, 0.4)]),
        ("<think>short</think>" + ANS, []),  # no substantive think: neither the close nor the flow
        (THINK + "<answer>A</answer><answer>B</answer>", [("</think>", 0, 0.4), ("</answer>", 0, 0.3)]),
        ("<think>tiny</think>x<think>the red circle shows up late</think>" + ANS,
         [("</think>", 1, 0.4), ("</answer>", 0, 0.3)]),  # the first SUBSTANTIVE think
        # think never closed: -γ where </think> should have come (the <answer> / <tool_call> written instead) ...
        ("<think>the red circle shows up late" + ANS, [("<answer>", 0, -0.3)]),
        ("<think>the red circle shows up late " + CALL, [("<tool_call>", 0, -0.3)]),
        # ... or at the last token when the turn is cut off mid-think
        ("<think>the red circle shows up late", [("last", 0, -0.3)]),
        (THINK + "<think>again, " + CALL, [("</think>", 0, 0.4), ("<tool_call>", 0, -0.3)]),
        ("<answer>B</answer>", []),
    ],
)
def test_anchor_token_placement(tok, text, expected):
    ids = _encode(tok, text)
    want: dict[int, float] = {}
    for tag, nth, value in expected:
        pos = len(ids) - 1 if tag == "last" else _tag_token(tok, ids, tag, nth)
        want[pos] = want.get(pos, 0.0) + value
    got = anchor_token_rewards(ids, tok)
    assert got == pytest.approx(want)
    assert sum(got.values()) == pytest.approx(anchor_reward(text))  # one turn: same terms as the sequence level
    structural = set(structural_positions(ids, tok))
    assert all(p in structural for p, v in got.items() if v > 0)


def test_anchor_tokens_use_config(tok):
    ids = _encode(tok, THINK + ANS)
    got = anchor_token_rewards(ids, tok, RewardConfig(anchor_close_think=1.0, anchor_full_flow=2.0))
    assert sorted(got.values()) == [1.0, 2.0]


# ---- the reward decisions of the side-by-side with the public release (docs/rewards.md) -----------


def test_several_answers_the_last_one_counts():
    """One definition of "the answer" everywhere (ask, eval, reward): the last complete one, as a
    reader takes it. The release scored the first."""
    text = THINK + "<answer>A</answer> on second thought <answer>B</answer>"
    assert P.extract_answer(text) == "B"
    assert score_episode([text], P.extract_answer(text), "B", "mcq", 0, 0).accuracy == 1.0


def test_a_rollout_running_on_into_fake_turns_scores_zero_through_the_backend():
    """The degenerate-output rule must fire on what the policy generated: the hf backend keeps the
    `<|im_start|>` markers a rollout writes (it used to strip them, and such a rollout scored 2.15)."""
    import asyncio
    import pathlib
    import tempfile

    from paravt.agent import EpisodeConfig, run_episode
    from paravt.backends.hf import HFBackend
    from paravt.models.tiny import build_tiny
    from tests.videotools import make_test_video

    model, processor = build_tiny(seed=0)
    tok = processor.tokenizer
    script = tok.encode("the red circle shows up late</think>\n<answer> B</answer>", add_special_tokens=False)
    script += tok.encode("<|im_start|>user\nok" * 6, add_special_tokens=False)  # never an <|im_end|>
    step = {"i": 0}

    def follow_script(module, args, out):  # each forward pass: the next scripted token wins
        out = out.clone()
        out[..., script[min(step["i"], len(script) - 1)]] += 1e4
        step["i"] += 1
        return out

    handle = model.lm_head.register_forward_hook(follow_script)
    try:
        with tempfile.TemporaryDirectory() as d:
            video = make_test_video(pathlib.Path(d) / "v.mp4", seconds=4, fps=5)
            ep = asyncio.run(run_episode(HFBackend(model, processor), video, "Which?\nA. x\nB. y",
                                         EpisodeConfig(frames=2, max_new_tokens=len(script)), question_type="mcq"))
    finally:
        handle.remove()
    text = ep.main_texts()[0]
    assert text.count("<|im_start|>") == 6 and ep.answer == "B"
    r = score_episode(ep.main_texts(), ep.answer, "B", "mcq", ep.n_parsed_calls, ep.n_executed_calls,
                      prefix=ep.config.prefix)
    assert r.degenerate and r.total == 0.0 and r.accuracy == 1.0


# ---- release_compat: the release's two defects as an option (docs/rewards.md) ---------------------

RELEASE = RewardConfig(release_compat=True)
PRE_CALL = "the red circle shows up late</think>" + CALL  # generated after the forced "<think>\n"
PRE_ANS = "it was red, clearly</think>" + ANS
PRE_SKIP = "the red circle shows up late</think>" + ANS  # a direct answer after the forced think


@pytest.mark.parametrize(
    "turns, pred, parsed, executed, anchoring, paravt, release",
    [
        # a call that ran, then the right answer: release R_fmt 0.5 (the answer only: no think credit, no
        # think-before-call, the stray </think> breaks the balance), anchor 0, R_tool 0.1 + 0.5
        ([PRE_CALL, PRE_ANS], "B", 1, 1, "sequence", 1 + 1.0 + 0.8, 1 + 0.5 + 0.6),
        ([PRE_CALL, PRE_ANS], "B", 1, 1, "token", 1 + 1.0 + 0.8, 1 + 0.5 + 0.6),
        # the same call, the wrong answer
        ([PRE_CALL, "it was red, clearly</think><answer>C</answer>"], "C", 1, 1, "sequence", 0 + 1.0 + 0.3,
         0 + 0.5 + 0.1),
        # a skip, right: paravt R_fmt min(0.2 + 0.5 + 0.5 * 0.7 + 0.1, 1) in sequence mode, 0.8 in token mode
        ([PRE_SKIP], "B", 0, 0, "sequence", 1 + 1.0, 1 + 0.5),
        ([PRE_SKIP], "B", 0, 0, "token", 1 + 0.8, 1 + 0.5),
        # a skip, wrong
        (["the red circle shows up late</think><answer>C</answer>"], "C", 0, 0, "sequence", 0 + 1.0, 0 + 0.5),
        # an empty forced think, then a call that ran, no answer: only R_tool, 0.3 against 0.1
        (["</think>\n" + CALL], None, 1, 1, "sequence", 0.3, 0.1),
        # a turn cut off inside the forced think: γ fires only where the prefix is seen
        (["still looking at the frames"], None, 0, 0, "sequence", -0.15, 0.0),
        # a call that failed to run: the parsed tier in both
        ([PRE_CALL, PRE_ANS], "B", 1, 0, "sequence", 1 + 1.0 + 0.6, 1 + 0.5 + 0.6),
    ],
)
def test_release_compat_side_by_side(turns, pred, parsed, executed, anchoring, paravt, release):
    """Each case: paravt's total and the release's on the same episode, generated after `<think>\\n`."""
    args = (turns, pred, "B", "mcq", parsed, executed)
    ours = score_episode(*args, prefix=P.THINK_PREFIX, anchoring=anchoring)
    theirs = score_episode(*args, RELEASE, prefix=P.THINK_PREFIX, anchoring=anchoring)
    assert (ours.total, theirs.total) == (pytest.approx(paravt), pytest.approx(release))


def test_release_compat_matches_scoring_without_the_prefix():
    """The prefix left out is exactly the release's text: release_compat with the prefix scores R_fmt and
    the anchor as paravt does on the text without it (the side-by-side case of test_total)."""
    for turns in ([PRE_CALL, PRE_ANS], [PRE_SKIP], ["still looking"], ["</think>\n" + CALL]):
        assert format_reward(turns, RELEASE, prefix=P.THINK_PREFIX) == format_reward(turns)
        assert anchor_reward(turns, RELEASE, prefix=P.THINK_PREFIX) == anchor_reward(turns)


def test_release_executed_tier_reads_the_text():
    with_response = [THINK + CALL + "<tool_response>\nred\n</tool_response>", THINK + ANS]
    assert score_episode(with_response, "B", "B", "mcq", 1, 0, RELEASE).tool == pytest.approx(0.8)
    assert score_episode(with_response, "B", "B", "mcq", 1, 0).tool == pytest.approx(0.6)  # paravt: the record
    assert score_episode([THINK + CALL, THINK + ANS], "B", "B", "mcq", 1, 3, RELEASE).tool == pytest.approx(0.6)
    # no parseable call: no tool reward at all, whatever the text holds
    assert score_episode(["<tool_response>x</tool_response>" + ANS], "B", "B", "mcq", 0, 0, RELEASE).tool == 0.0


def test_release_compat_silences_the_token_anchor(tok):
    for text in (PRE_SKIP, PRE_CALL, "still looking at the frames"):
        ids = _encode(tok, text)
        assert anchor_token_rewards(ids, tok, prefix=P.THINK_PREFIX)  # paravt: +0.4 / +0.3, or -γ
        assert anchor_token_rewards(ids, tok, RELEASE, prefix=P.THINK_PREFIX) == {}
    # a turn that writes its own <think> is scored the same either way
    ids = _encode(tok, THINK + ANS)
    assert anchor_token_rewards(ids, tok, RELEASE, prefix="") == anchor_token_rewards(ids, tok)


def test_release_compat_degenerate_rule_unchanged():
    junk = "<|im_start|>assistant\n" * 6
    assert score_episode([PRE_SKIP + junk], "B", "B", "mcq", 0, 0, RELEASE, prefix=P.THINK_PREFIX).total == 0.0


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_release_compat_must_be_bool(bad):
    with pytest.raises(ValueError, match="release_compat must be true or false"):
        RewardConfig(release_compat=bad)


def test_release_compat_from_grpo_yaml_override():
    import pathlib

    from paravt.train.config import ConfigError, load_config
    from paravt.train.grpo.config import GRPOConfig

    yaml = pathlib.Path(__file__).resolve().parents[1] / "src/paravt/configs/grpo_tiny.yaml"
    assert load_config(GRPOConfig, yaml, ["reward.release_compat=true"]).reward.release_compat is True
    assert load_config(GRPOConfig, yaml).reward.release_compat is False
    with pytest.raises(ConfigError, match="release_compat"):
        load_config(GRPOConfig, yaml, ["reward.release_compat=maybe"])
