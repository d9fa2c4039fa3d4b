import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

from paravt import protocol as P
from paravt.rewards import (
    RewardConfig,
    accuracy_reward,
    anchor_reward,
    anchor_token_rewards,
    format_reward,
    is_degenerate,
    mcq_letter,
    parse_span,
    score_episode,
    shape,
    structural_positions,
    temporal_iou,
    token_f1,
    tool_reward,
)

CALL = P.format_tool_call(10, 20)
THINK = "<think>the red circle shows up late</think>"  # substantive (>= 10 chars)


# ---- accuracy ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("B", "B", 1.0),
        ("(B)", "B", 1.0),
        ("Option B", "B", 1.0),
        ("The answer is B", "B", 1.0),
        ("B. red", "B", 1.0),
        ("b", "B", 1.0),
        ("C", "B", 0.0),
        ("J", "J", 1.0),
        ("", "B", 0.0),
        (None, "B", 0.0),
        ("red", "B", 1.0),  # option text, via options
        ("Because of this", "B", 0.0),
    ],
)
def test_mcq(pred, answer, expected):
    opts = ["A. blue", "B. red", "C. green", "D. white"]
    assert accuracy_reward(pred, answer, "mcq", options=opts) == expected


def test_mcq_letter_parses_gt_with_text():
    assert mcq_letter("(C) a square") == "C"


@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("10 - 20", "[10, 20]", 1.0),
        ("[15, 25]", [10, 20], 5 / 15),
        ("from 0 to 5 seconds", "10 - 20", 0.0),
        ("12.5 - 17.5", "10 - 20", 0.5),
        ("20 - 10", "10 - 20", 1.0),  # reversed pair is read as a span
        ("no idea", "10 - 20", 0.0),
    ],
)
def test_tvg_iou(pred, answer, expected):
    assert accuracy_reward(pred, answer, "tvg") == pytest.approx(expected)


def test_iou_helpers():
    assert parse_span("The event runs 3.5 - 7 s") == (3.5, 7.0)
    assert temporal_iou((0, 0), (0, 0)) == 1.0
    assert temporal_iou(None, (1, 2)) == 0.0


@pytest.mark.parametrize(
    "pred, answer, expected",
    [
        ("red circle", "red circle", 1.0),
        ("The red circle.", "red circle", 1.0),  # normalized exact
        ("a red square", "red circle", 0.5),  # tokens [red, square] vs [red, circle]: P=R=1/2
        ("blue", "red circle", 0.0),
        ("red", "red circle", pytest.approx(2 / 3)),
    ],
)
def test_oe_f1(pred, answer, expected):
    assert accuracy_reward(pred, answer, "oe") == expected


def test_oe_exact_and_judge():
    assert accuracy_reward("red", "red circle", "oe", RewardConfig(oe_metric="exact")) == 0.0
    judge = lambda q, p, a: 0.7 if "red" in p else 0.0  # noqa: E731
    assert accuracy_reward("red", "red circle", "oe", RewardConfig(oe_metric="judge", judge=judge)) == 0.7
    with pytest.raises(ValueError):
        RewardConfig(oe_metric="judge")
    with pytest.raises(ValueError):
        accuracy_reward("x", "y", "essay")
    assert token_f1("", "") == 1.0


# ---- format --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, prefix, suffix_on, expected",
    [
        (THINK + "<answer>B</answer>", "", True, 0.2 + 0.3 + 0.2 + 0.1),
        (THINK + "<answer>B</answer>", "", False, 0.3 + 0.2 + 0.1 + 0.1),
        (THINK + "<answer>B", "", True, 0.2 + 0.3),  # unbalanced answer: no </answer>, no balance bonus
        (THINK + CALL, "", True, 0.2 + 0.3 + 0.1),
        ("<think>short</think>" + CALL, "", True, 0.3 + 0.1),  # think too short for +0.2
        ("<answer></answer>", "", True, 0.0),  # empty body: nothing, so no balance bonus either
        ("B", "", True, 0.0),
        # forced "<think>\n" prefix: the model's text starts inside the think and still gets credit
        ("the red circle shows up late</think><answer>B</answer>", P.THINK_PREFIX, True, 0.8),
        (THINK + CALL + "\n" + THINK + "<answer>B</answer>", "", True, 1.0),  # 0.2+0.3+0.2+0.3+0.1 = 1.1 capped
    ],
)
def test_format(text, prefix, suffix_on, expected):
    assert format_reward(text, RewardConfig(answer_suffix=suffix_on), prefix=prefix) == pytest.approx(expected)


def test_public_release_defect_prefix_excluded_would_lose_credit():
    body = "the red circle shows up late</think><answer>B</answer>"
    assert format_reward(body) < format_reward(body, prefix=P.THINK_PREFIX)
    assert anchor_reward(body) < anchor_reward(body, prefix=P.THINK_PREFIX)


# ---- anchoring -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        (THINK + "<answer>B</answer>", 0.4 + 0.3),
        (THINK + CALL, 0.4),
        ("<think>short</think><answer>B</answer>", 0.3),
        ("<think>never closed and long enough", -0.3),
        ("<answer>B</answer>", 0.0),
        (THINK + "<answer></answer>", 0.4),  # empty answer: no flow bonus
    ],
)
def test_anchor(text, expected):
    assert anchor_reward(text) == pytest.approx(expected)


# ---- tool ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "parsed, executed, acc, expected",
    [(0, 0, 1.0, 0.0), (2, 0, 0.0, 0.1), (2, 2, 0.0, 0.3), (2, 2, 1.0, 0.8), (1, 0, 0.5, 0.6)],
)
def test_tool(parsed, executed, acc, expected):
    assert tool_reward(parsed, executed, acc) == pytest.approx(expected)


def test_executed_tier_comes_from_record_not_text():
    turn1 = THINK + CALL
    turn2 = THINK + "<answer>B</answer>"
    # generated text never holds <tool_response>; the record says the call ran
    r = score_episode([turn1, turn2], "B", "B", "mcq", n_parsed_calls=1, n_executed_calls=1)
    assert r.tool == pytest.approx(0.8)


# ---- total -----------------------------------------------------------------------------------------
def test_total_sequence_vs_token_anchoring():
    texts = [THINK + "<answer>B</answer>"]
    seq = score_episode(texts, "B", "B", "mcq", 0, 0, anchoring="sequence")
    tok = score_episode(texts, "B", "B", "mcq", 0, 0, anchoring="token")
    # acc 1 + fmt 0.8 + tool 0 (+ 0.5 * 0.7 in sequence mode)
    assert tok.total == pytest.approx(1.8)
    assert seq.total == pytest.approx(1.8 + 0.35)
    assert seq.anchor == tok.anchor == pytest.approx(0.7)
    with pytest.raises(ValueError):
        score_episode(texts, "B", "B", "mcq", 0, 0, anchoring="both")


def test_degenerate_scores_zero():
    junk = "<|im_start|>assistant\n" * 6
    assert is_degenerate(junk)
    assert not is_degenerate("<|im_start|>" + "x" * 400 + "<|im_start|>")
    r = score_episode([junk + "<answer>B</answer>"], "B", "B", "mcq", 0, 0)
    assert r.degenerate and r.total == 0.0


def test_shaping():
    assert shape(1.2) == pytest.approx(10.0)
    assert shape(0.2) == 0.0


# ---- token positions ----------------------------------------------------------------------------
def _tokenizer(tags_as_tokens: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["the red circle shows up late", "answer B crop video start time end time", '{"name": "crop_video"}'] * 20
    tok.train_from_iterator(corpus, trainer)
    if tags_as_tokens:
        tok.add_special_tokens(list(P.ALL_TAGS))
    return tok


@pytest.mark.parametrize("tags_as_tokens", [True, False])
def test_structural_positions(tags_as_tokens):
    tok = _tokenizer(tags_as_tokens)
    text = "<think>the red circle shows up late</think>" + CALL + "<answer>B</answer>"
    ids = tok.encode(text).ids
    positions = structural_positions(ids, tok)
    pieces = [tok.decode(ids[: i + 1], skip_special_tokens=False) for i in range(len(ids))]
    # each position is the token where a structural tag is completed
    done = []
    for pos in positions:
        before = pieces[pos - 1] if pos else ""
        completed = [t for t in P.STRUCTURAL_TAGS if pieces[pos].endswith(t) or (t in pieces[pos] and t not in before)]
        assert completed, (pos, pieces[pos])
        done += completed
    assert sorted(done) == sorted(["</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>"])
    if tags_as_tokens:
        assert len(positions) == 5


@pytest.mark.parametrize("tags_as_tokens", [True, False])
def test_anchor_token_rewards_sit_on_structural_tokens(tags_as_tokens):
    tok = _tokenizer(tags_as_tokens)
    body = "the red circle shows up late</think><answer>B</answer>"
    ids = tok.encode(body).ids
    values = anchor_token_rewards(ids, tok, prefix=P.THINK_PREFIX)
    assert sorted(values.values()) == pytest.approx([0.3, 0.4])
    assert set(values) <= set(structural_positions(ids, tok))
    assert sum(values.values()) == pytest.approx(anchor_reward(body, prefix=P.THINK_PREFIX))
    unclosed = tok.encode("<think>never closed and long enough").ids
    v = anchor_token_rewards(unclosed, tok)
    assert v == {len(unclosed) - 1: pytest.approx(-0.3)}
