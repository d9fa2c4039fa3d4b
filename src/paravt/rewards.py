"""PARA-GRPO rewards (docs/rewards.md): accuracy, format, exploration anchoring, tool use, their sum.

Every term reads the main agent's generated text of the whole episode: each main turn with its
forced prefix counted as present (the public release scored the text without the forced
`<think>\\n`, so its anchor bonuses never fired), tool responses excluded. The
"executed" tool tier comes from the episode's record of executed calls, never from the
generated text, where `<tool_response>` never appears.

`RewardConfig.release_compat` scores as the release did instead (both defects, for comparison runs):
`scored_prefix` drops the forced prefix, `release_executed` reads the executed tier from the text.

`format_reward` and `anchor_reward` take one turn (a string) or an episode (a list of turns):
the think and balance terms are judged per turn, so that one turn's `</think>` cannot close
another turn's `<think>` when the texts are joined.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Callable

from paravt import protocol as P
from paravt.protocol.options import LETTERS, option_body, options_from_question  # the option grammar, one place

# ----------------------------------------------------------------------------------------------
# configuration


@dataclass
class RewardConfig:
    """The reward constants of the public recipe (docs/rewards.md) as defaults."""

    w_fmt: float = 1.0  # weight of R_fmt
    w_acc: float = 1.0  # R = w_acc·R_acc + w_fmt·R_fmt + w_tool·R_tool; the recipe weighs accuracy and tool at 1
    w_tool: float = 1.0  # 0: the paper's "PARA-GRPO − R_tool" ablation
    answer_suffix: bool = True  # format weights think/answer body/</answer>: 0.2/0.3/0.2 on, 0.3/0.2/0.1 off
    fmt_think_before_call: float = 0.3  # a closed substantive think before a parseable tool call
    fmt_balanced: float = 0.1  # every tag pair balanced (only added when the score is already > 0)
    min_think_chars: int = 10  # a "substantive" think has at least this many characters of content
    lambda_anchor: float = 0.5  # λ: weight of the anchor terms
    anchor_close_think: float = 0.4  # </think> closes a substantive think
    anchor_full_flow: float = 0.3  # <think>…</think> … <answer>…</answer>
    gamma: float = 0.3  # penalty: a <think> opened and never closed
    tool_parsed: float = 0.1  # R_tool of a parseable call
    tool_executed: float = 0.3  # R_tool of a call that ran
    tool_correct_bonus: float = 0.5  # added to the tool tier when R_acc > 0
    oe_metric: str = "f1"  # f1 | exact | judge
    judge: Callable[[str, str, str], float] | None = None  # (question, prediction, answer) -> [0, 1]
    degenerate_marker: str = "<|im_start|>"  # the text whose repeats make an output degenerate
    degenerate_im_start: int = 5  # this many markers ...
    degenerate_window: int = 300  # ... within fewer than this many characters: degenerate, reward 0
    shaping_bias: float = 0.2  # trainer side: r' = clip((R - bias) * scale, ±clip)
    shaping_scale: float = 10.0  # the scale of that shaping
    shaping_clip: float = 20.0  # its clip
    # score as the public release did (docs/rewards.md): the forced prefix left out of the text that R_fmt,
    # the anchor terms and the degeneracy check read, and the executed tool tier read from
    # `<tool_response>` in the generated text, where it never is. For comparison runs only.
    release_compat: bool = False  # score as the public release did (docs/rewards.md; comparison runs only)

    def __post_init__(self) -> None:
        if not isinstance(self.release_compat, bool):
            raise ValueError(f"release_compat must be true or false, got {self.release_compat!r}")
        if self.oe_metric not in ("f1", "exact", "judge"):
            raise ValueError(f"oe_metric must be f1, exact or judge, got {self.oe_metric!r}")
        if self.oe_metric == "judge" and self.judge is None:
            raise ValueError("oe_metric='judge' needs a judge callable (question, prediction, answer) -> [0, 1]")
        if self.degenerate_im_start < 1 or self.min_think_chars < 0:
            raise ValueError("degenerate_im_start must be >= 1 and min_think_chars >= 0")

    @property
    def format_weights(self) -> tuple[float, float, float]:
        """(substantive think, non-empty answer body, its </answer>) for the answer-suffix setting."""
        return (0.2, 0.3, 0.2) if self.answer_suffix else (0.3, 0.2, 0.1)


# ----------------------------------------------------------------------------------------------
# accuracy

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_text(s: str) -> str:
    """SQuAD-style: lowercase, drop punctuation and articles, collapse spaces."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(prediction: str, answer: str) -> float:
    """SQuAD token F1 between normalized texts."""
    p, a = normalize_text(prediction).split(), normalize_text(answer).split()
    if not p or not a:
        return float(p == a)
    same = sum((Counter(p) & Counter(a)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(a)
    return 2 * precision * recall / (precision + recall)


_L = r"[\(\[]?([A-J])[\)\]]?"
_BARE_RE = re.compile(r"^[\(\[]?([A-Ja-j])[\)\]]?[.:)]?$")  # "B", "b", "(B)", "[B]", "B.", "B)"
_ANSWER_KW_RE = re.compile(  # "The answer is B", "Answer: (C)", "the correct choice is option D"
    rf"(?i:\b(?:answer|choice))(?:\s+(?i:is|was|would\s+be|should\s+be))?(?:\s+(?i:option|choice))?\s*[:=-]?\s*{_L}"
    r"(?![A-Za-z0-9])"
)
_OPTION_KW_RE = re.compile(rf"(?i:\boption)\s*[:=-]?\s*{_L}(?![A-Za-z0-9])")  # "Option B"
# a capital used as a letter: "A" and "I" not when they are the article or the pronoun ("I think B")
_VERBS = r"(?:is|was|would|should|seems|looks|matches|fits|best|and|or)\b"
_LETTER = rf"([B-HJ]|[AI](?!\s+(?!{_VERBS})[a-z]|\s*'))"
_LEADING_RE = re.compile(rf"^[\(\[]?{_LETTER}[\)\]]?(?:[.:)]|\s)")  # "B. red", "B) red", "B red"
_LONE_RE = re.compile(rf"(?<![A-Za-z0-9']){_LETTER}(?![A-Za-z0-9'])")


def mcq_letter(text: str | None, options: list[str] | None = None) -> str | None:
    """The option letter (A–J) a text chooses, or None when it names none or several.

    Tried in order: a bare letter ("B", "(B)", "B."); the text of one option; an answer phrase
    ("The answer is B"); "Option B" naming one letter; a leading letter ("B. red"); a single
    stand-alone capital A–J anywhere. The option text comes before the leading letter so that
    an option like "A red circle" is not read as the letter A. With the options known, a letter
    the question does not offer ("E" of four) is no answer, as the benchmarks' own scorers read it
    (Video-MME and lmms-eval look for A-D only; docs/lmms_eval.md)."""
    letter = _any_letter(text, options)
    if letter is not None and options and letter not in LETTERS[: len(options)]:
        return None
    return letter


def _any_letter(text: str | None, options: list[str] | None) -> str | None:
    if not text:
        return None
    s = P.strip_tags(str(text)).replace("*", "").strip()
    if not s:
        return None
    m = _BARE_RE.match(s)
    if m:
        return m.group(1).upper()
    if options:
        ns = normalize_text(s.rstrip("."))
        for i, opt in enumerate(options[: len(LETTERS)]):
            if ns and ns == normalize_text(option_body(opt)):
                return LETTERS[i]
    said = _ANSWER_KW_RE.findall(s)
    if said:
        return said[-1]
    named = set(_OPTION_KW_RE.findall(s))
    if len(named) == 1:
        return named.pop()
    m = _LEADING_RE.match(s)
    if m:
        return m.group(1)
    lone = set(_LONE_RE.findall(s))
    return lone.pop() if len(lone) == 1 else None


_TIME_TOKEN = re.compile(r"\d+(?::\d{1,2}){1,2}(?:\.\d+)?|\d+(?:\.\d+)?")


def parse_span(value) -> tuple[float, float] | None:
    """The first [start, end] pair of a text ('12.5 - 20', '[12.5, 20]', 'from 12.5 to 20 seconds',
    '01:05 - 01:20') or of a two-element list; None when there is no pair. A reversed pair is
    read as the span it names. Times are non-negative, so a '-' is a separator, never a sign."""
    if value is None:
        return None
    try:
        if isinstance(value, (list, tuple)):
            if len(value) < 2:
                return None
            s, e = P.parse_seconds(value[0]), P.parse_seconds(value[1])
        else:
            found = _TIME_TOKEN.findall(str(value))
            if len(found) < 2:
                return None
            s, e = P.parse_seconds(found[0]), P.parse_seconds(found[1])
    except P.ToolCallError:
        return None
    return (s, e) if s <= e else (e, s)


def temporal_iou(pred: tuple[float, float] | None, gt: tuple[float, float] | None) -> float:
    """Intersection over union of two [start, end] spans (1 for two identical points)."""
    if pred is None or gt is None:
        return 0.0
    inter = max(0.0, min(pred[1], gt[1]) - max(pred[0], gt[0]))
    union = max(pred[1], gt[1]) - min(pred[0], gt[0])
    return inter / union if union > 0 else float(pred == gt)


def accuracy_reward(
    prediction: str | None,
    answer,
    question_type: str,
    cfg: RewardConfig | None = None,
    *,
    options: list[str] | None = None,
    question: str = "",
) -> float:
    """R_acc in [0, 1]: normalized exact match -> 1, else by question type.

    mcq: option-letter match (options, when not given, are read from the question, so
    an answer written as the option's text also counts); tvg: temporal IoU of the first pair
    (no string match first: normalization would drop the decimal points and make '1.5 - 2'
    equal '15 - 2'); oe: token F1, exact match or the judge, by `cfg.oe_metric`."""
    cfg = cfg or RewardConfig()
    if question_type not in P.QUESTION_TYPES:
        raise ValueError(f"unknown question_type {question_type!r}; expected one of {P.QUESTION_TYPES}")
    if prediction is None or not str(prediction).strip():
        return 0.0
    prediction = str(prediction)
    if question_type == "tvg":
        return temporal_iou(parse_span(prediction), parse_span(answer))
    answer = str(answer)
    if normalize_text(answer) and normalize_text(prediction) == normalize_text(answer):
        return 1.0
    if question_type == "mcq":
        options = options or options_from_question(question)
        gt = _any_letter(answer, options)  # the truth as given, even a letter the options lack
        return float(gt is not None and mcq_letter(prediction, options) == gt)
    if cfg.oe_metric == "exact":
        return 0.0
    if cfg.oe_metric == "judge":
        score = float(cfg.judge(question, prediction, answer))  # type: ignore[misc]
        return 0.0 if math.isnan(score) else max(0.0, min(1.0, score))
    return token_f1(prediction, answer)


# ----------------------------------------------------------------------------------------------
# format and anchoring


def scored_prefix(prefix: str, cfg: RewardConfig) -> str:
    """The forced prefix as the scorer sees it: present (paravt), or left out as the release left it
    (`release_compat`; docs/rewards.md, "The release's reward as an option", 1), so that the terms reading
    the think cannot see the one it opened."""
    return "" if cfg.release_compat else (prefix or "")


def _turns(text: str | Sequence[str], prefix: str) -> list[str]:
    """The scored turns: one string is one turn; each turn gets the forced prefix."""
    texts = [text] if isinstance(text, str) else list(text)
    return [(prefix or "") + ("" if t is None else str(t)) for t in texts]


def _substantive(body: str, cfg: RewardConfig) -> bool:
    return len(P.strip_tags(body).strip()) >= cfg.min_think_chars


def _substantive_close(turn: str, cfg: RewardConfig) -> int | None:
    """Offset of the </think> that closes the turn's first substantive think, else None."""
    for a, b, closed in P.think_spans(turn):
        if closed and _substantive(turn[a:b], cfg):
            return b
    return None


def _flow_close(turn: str, cfg: RewardConfig) -> int | None:
    """Offset of the </answer> that completes the turn's <think>…</think> … <answer>…</answer>
    flow (a closed substantive think, then a closed answer with a non-empty body), else None. An
    empty think does not earn the flow (the empty-tag exploit)."""
    close = _substantive_close(turn, cfg)
    if close is None:
        return None
    pos = close + len(P.THINK_CLOSE)
    while True:
        k = turn.find(P.ANSWER_OPEN, pos)
        if k < 0:
            return None
        m = turn.find(P.ANSWER_CLOSE, k + len(P.ANSWER_OPEN))
        if m < 0:
            return None
        if P.strip_tags(turn[k + len(P.ANSWER_OPEN):m]).strip():
            return m
        pos = m + len(P.ANSWER_CLOSE)


def _think_before_call(turn: str, cfg: RewardConfig) -> bool:
    """A closed substantive think ends before the turn's first tool-call block, and the turn has a
    readable call. `</think>` right after the forced `<think>\n` (an empty think) does not count:
    the credit is for reasoning before calling, not for the tags."""
    if not P.parse(turn).calls:
        return False
    starts = [i for i in (turn.find(P.TOOL_CALL_OPEN), turn.find(P.TOOL_CODE_OPEN)) if i >= 0]
    close = _substantive_close(turn, cfg)
    return bool(starts) and close is not None and close < min(starts)


def format_reward(text: str | Sequence[str], cfg: RewardConfig | None = None, prefix: str = "",
                  anchor_weight: float = 0.0) -> float:
    """R_fmt of a turn or an episode's turns (each with the forced `prefix`), in the public
    release's order of terms:
    + think weight when some turn closes a substantive think (>= min_think_chars of content);
    + body and close weights when the final answer (the last one) is non-empty AND closed
      (weights 0.2/0.3/0.2, answer suffix off 0.3/0.2/0.1);
    + anchor_weight · `anchor_reward` (the sequence-level Exploration Anchoring: λ inside R_fmt,
      before the balance gate and the cap, as the release computes it; 0 otherwise);
    + 0.3 when some turn closes a substantive think before its first parseable tool call;
    + 0.1 when every turn's tags are balanced, only if the score is already > 0; capped at 1.
    Without the anchor R_fmt is in [0, 1]; with it, in [−λγ, 1]."""
    cfg = cfg or RewardConfig()
    turns = _turns(text, scored_prefix(prefix, cfg))
    if not turns:
        return 0.0
    w_think, w_body, w_close = cfg.format_weights
    score = 0.0
    if any(_substantive_close(t, cfg) is not None for t in turns):
        score += w_think
    final = P.parse("\n".join(turns))
    if final.answer and final.answer_closed:
        score += w_body + w_close
    if anchor_weight:
        score += anchor_weight * anchor_reward(turns, cfg)
    if any(_think_before_call(t, cfg) for t in turns):
        score += cfg.fmt_think_before_call
    if score > 0 and all(P.tags_balanced(t) for t in turns):
        score += cfg.fmt_balanced
    return min(score, 1.0)


def anchor_reward(text: str | Sequence[str], cfg: RewardConfig | None = None, prefix: str = "") -> float:
    """The Exploration-Anchoring terms, BEFORE the λ weight, each counted once per episode:
    +0.4 when some turn's </think> closes a substantive think; +0.3 when some turn has the full
    <think>substantive</think> … <answer>non-empty</answer> flow; −γ (0.3) when some turn ends with
    a <think> still open. Range [−γ, 0.7]."""
    cfg = cfg or RewardConfig()
    turns = _turns(text, scored_prefix(prefix, cfg))
    value = 0.0
    if any(_substantive_close(t, cfg) is not None for t in turns):
        value += cfg.anchor_close_think
    if any(_flow_close(t, cfg) is not None for t in turns):
        value += cfg.anchor_full_flow
    if any(P.think_open_at_end(t) for t in turns):
        value -= cfg.gamma
    return value


# ----------------------------------------------------------------------------------------------
# tool use, degenerate outputs, total


def tool_reward(n_parsed_calls: int, n_executed_calls: int, acc: float, cfg: RewardConfig | None = None) -> float:
    """R_tool in [0, 1]: 0 without a parseable call; 0.1 with one; 0.3 when one was executed;
    +0.5 when R_acc > 0; capped at 1. The executed count comes from the episode's record."""
    cfg = cfg or RewardConfig()
    if n_parsed_calls < 0 or n_executed_calls < 0:
        raise ValueError(f"call counts must be >= 0, got {n_parsed_calls} parsed and {n_executed_calls} executed")
    if n_parsed_calls == 0 and n_executed_calls == 0:
        return 0.0
    value = cfg.tool_executed if n_executed_calls > 0 else cfg.tool_parsed
    if acc > 0:
        value += cfg.tool_correct_bonus
    return min(value, 1.0)


def release_executed(main_texts: Sequence[str], n_parsed_calls: int) -> int:
    """The release's executed tier (docs/rewards.md, "The release's reward as an option", 2): 1 when the
    generated text holds `<tool_response>` beside a parseable call, else 0. Tool responses are never part of
    the generated text, so this is 0 in practice and a call that ran earns the parsed tier (0.1), not the
    executed one (0.3)."""
    return int(n_parsed_calls > 0 and any(P.TOOL_RESPONSE_OPEN in (t or "") for t in main_texts))


def is_degenerate(text: str, cfg: RewardConfig | None = None) -> bool:
    """Chat-format collapse: `degenerate_im_start` (5) `<|im_start|>` markers within fewer than
    `degenerate_window` (300) characters, measured from the first marker's start to the last's."""
    cfg = cfg or RewardConfig()
    starts = [m.start() for m in re.finditer(re.escape(cfg.degenerate_marker), text or "")]
    n = cfg.degenerate_im_start
    return any(starts[i + n - 1] - starts[i] < cfg.degenerate_window for i in range(len(starts) - n + 1))


@dataclass
class RewardBreakdown:
    accuracy: float
    format: float  # R_fmt without the anchor: comparable across anchoring modes (fτ is its mean)
    anchor: float  # unweighted anchor terms, reported whatever the anchoring mode
    tool: float
    total: float
    degenerate: bool = False
    format_total: float | None = None  # the format term that entered the total (with λ·anchor in sequence mode)

    def to_dict(self) -> dict:
        return asdict(self)


def join_turns(main_texts: list[str], prefix: str = "") -> str:
    """The scored text of an episode: every main turn with its forced prefix."""
    return "\n".join(_turns(main_texts, prefix))


def score_episode(
    main_texts: list[str],
    prediction: str | None,
    answer,
    question_type: str,
    n_parsed_calls: int,
    n_executed_calls: int,
    cfg: RewardConfig | None = None,
    prefix: str = "",
    anchoring: str = "sequence",
    *,
    options: list[str] | None = None,
    question: str = "",
) -> RewardBreakdown:
    """R = w_acc·R_acc + w_fmt·R_fmt + w_tool·R_tool (the recipe: weights 1, 1, 1).

    anchoring == "sequence": R_fmt carries λ·anchor inside it, before its balance gate and cap, as
    the public release computes it (the paper's numbers come from that placement). "token": the
    anchor enters per token in the trainer instead (at the structural positions,
    `anchor_token_rewards`), so R_fmt leaves it out; "off": not used. A degenerate output scores a
    total of 0 (its terms are still reported). With `cfg.release_compat` the terms are the release's:
    the prefix left out (`scored_prefix`), the executed count read from the text (`release_executed`)."""
    if anchoring not in ("sequence", "token", "off"):
        raise ValueError(f"anchoring must be sequence, token or off, got {anchoring!r}")
    cfg = cfg or RewardConfig()
    if cfg.release_compat:
        n_executed_calls = release_executed(main_texts, n_parsed_calls)
    acc = accuracy_reward(prediction, answer, question_type, cfg, options=options, question=question)
    fmt = format_reward(main_texts, cfg, prefix)
    anc = anchor_reward(main_texts, cfg, prefix)
    fmt_total = format_reward(main_texts, cfg, prefix, anchor_weight=cfg.lambda_anchor) if anchoring == "sequence" else fmt
    tool = tool_reward(n_parsed_calls, n_executed_calls, acc, cfg)
    if is_degenerate(join_turns(main_texts, scored_prefix(prefix, cfg)), cfg):
        return RewardBreakdown(acc, fmt, anc, tool, 0.0, degenerate=True, format_total=fmt_total)
    return RewardBreakdown(acc, fmt, anc, tool, cfg.w_acc * acc + cfg.w_fmt * fmt_total + cfg.w_tool * tool,
                           format_total=fmt_total)


def shape(total: float, cfg: RewardConfig | None = None) -> float:
    """Trainer-side shaping of the public recipe: (R − 0.2)·10 clipped to ±20 (group normalization follows)."""
    cfg = cfg or RewardConfig()
    return max(-cfg.shaping_clip, min(cfg.shaping_clip, (total - cfg.shaping_bias) * cfg.shaping_scale))


# ----------------------------------------------------------------------------------------------
# token-level anchoring


def _decode_one_by_one(tokenizer, ids: list[int]) -> list[str]:
    seqs = [[int(t)] for t in ids]
    if hasattr(tokenizer, "batch_decode"):  # transformers
        return tokenizer.batch_decode(seqs, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return tokenizer.decode_batch(seqs, skip_special_tokens=False)  # a raw `tokenizers.Tokenizer`


def _decode(tokenizer, ids: list[int]) -> str:
    if hasattr(tokenizer, "batch_decode"):
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def _occurrences(text: str, tag: str) -> list[int]:
    out, i = [], text.find(tag)
    while i >= 0:
        out.append(i)
        i = text.find(tag, i + 1)
    return out


class _TokenText:
    """The decoded text of a token sequence and a map from tag occurrences to the token that
    holds each occurrence's last character.

    Why hand-written: decoders give no character offsets for generated ids. Decoding each id on
    its own keeps every ASCII character (our tags are ASCII; only the bytes of a multi-byte
    character split over tokens turn into U+FFFD), so the n-th occurrence of a tag in the joined
    pieces is the n-th in the real decode. If a decoder breaks that (the counts differ), the
    offsets come from decoding growing prefixes instead: exact, but quadratic."""

    def __init__(self, token_ids: list[int], tokenizer) -> None:
        self.ids = [int(t) for t in token_ids]
        self.text = _decode(tokenizer, self.ids) if self.ids else ""
        pieces = _decode_one_by_one(tokenizer, self.ids) if self.ids else []
        self.joined = "".join(pieces)
        if any(len(_occurrences(self.joined, t)) != len(_occurrences(self.text, t)) for t in P.ALL_TAGS):
            self.joined = self.text
            ends = [len(_decode(tokenizer, self.ids[: i + 1])) for i in range(len(self.ids))]
        else:
            ends, pos = [], 0
            for p in pieces:
                pos += len(p)
                ends.append(pos)
        self.ends = ends

    def token_at(self, char_index: int) -> int:
        """The token that holds character `char_index` of `joined` (binary search on end offsets)."""
        lo, hi = 0, len(self.ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ends[mid] > char_index:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def tag_token(self, tag: str, text_offset: int) -> int | None:
        """The token ending the occurrence of `tag` that starts at `text_offset` of `text`."""
        occ = _occurrences(self.text, tag)
        if text_offset not in occ:
            return None
        k = occ.index(text_offset)
        joined_occ = _occurrences(self.joined, tag)
        return self.token_at(joined_occ[k] + len(tag) - 1) if k < len(joined_occ) else None


def structural_positions(token_ids: list[int], tokenizer) -> list[int]:
    """Indices of the tokens that are (or end) a structural tag: </think>, <answer>, </answer>,
    <tool_call>, </tool_call>. Works whether a tag is one token or split over several (then the
    token holding the tag's last character is the one returned)."""
    if not token_ids:
        return []
    tt = _TokenText(token_ids, tokenizer)
    return sorted({tt.token_at(i + len(tag) - 1) for tag in P.STRUCTURAL_TAGS for i in _occurrences(tt.joined, tag)})


def anchor_token_rewards(
    token_ids: list[int], tokenizer, cfg: RewardConfig | None = None, prefix: str = ""
) -> dict[int, float]:
    """Per-token anchor values (BEFORE λ) of ONE generated main turn: {token index: value}.

    Placement (the terms of `anchor_reward`, judged on this turn):
    - +0.4 at the `</think>` closing the turn's first substantive think;
    - +0.3 at the `</answer>` completing the think → answer flow;
    - −γ, when the turn ends inside its think, at the first `<tool_call>`/`<answer>` written while
      the think was open (the token that should have been `</think>`), else at the last token
      (a turn cut off mid-think: the latest place a closure could have come).
    `prefix` is the forced start (e.g. "<think>\\n"): not among token_ids, but present (left out with
    `release_compat`, so no term fires after a forced think, as in the release). Every turn
    carries its own terms, so over an episode the token-level bonus can exceed the sequence-level
    one, which counts each term once."""
    cfg = cfg or RewardConfig()
    if not token_ids:
        return {}
    tt = _TokenText(token_ids, tokenizer)
    prefix = scored_prefix(prefix, cfg)
    shift = len(prefix)
    full = prefix + tt.text
    values: dict[int, float] = {}

    def add(tag: str, full_offset: int | None, value: float) -> None:
        if full_offset is None or full_offset < shift:
            return
        pos = tt.tag_token(tag, full_offset - shift)
        if pos is not None:
            values[pos] = values.get(pos, 0.0) + value

    add(P.THINK_CLOSE, _substantive_close(full, cfg), cfg.anchor_close_think)
    add(P.ANSWER_CLOSE, _flow_close(full, cfg), cfg.anchor_full_flow)
    if P.think_open_at_end(full):
        body_start = P.think_spans(full)[-1][0]
        hits = [(i, tag) for tag in (P.TOOL_CALL_OPEN, P.ANSWER_OPEN) for i in [full.find(tag, max(body_start, shift))]
                if i >= 0]
        pos = None
        if hits:
            i, tag = min(hits)
            pos = tt.tag_token(tag, i - shift)
        if pos is None:
            pos = len(token_ids) - 1
        values[pos] = values.get(pos, 0.0) - cfg.gamma
    return values
