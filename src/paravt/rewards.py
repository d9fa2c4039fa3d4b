"""PARA-GRPO rewards (SPEC §2): accuracy, format, exploration anchoring, tool use, their sum.

Every term reads the main agent's generated text of the whole episode (each main turn with
its forced prefix counted as present; tool responses excluded). The "executed" tool tier
comes from the episode's record of executed calls, never from the generated text.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable

from paravt import protocol as P

# ----------------------------------------------------------------------------------------------
# configuration


@dataclass
class RewardConfig:
    w_fmt: float = 1.0
    answer_suffix: bool = True  # format: 0.2/0.3/0.2 (think/answer body/</answer>) on; 0.3/0.2/0.1 off
    lambda_anchor: float = 0.5
    anchor_close_think: float = 0.4  # </think> closes a substantive think
    anchor_full_flow: float = 0.3  # <think>…</think> … <answer>…</answer>
    gamma: float = 0.3  # penalty: <think> opened and never closed
    min_think_chars: int = 10  # a "substantive" think
    oe_metric: str = "f1"  # f1 | exact | judge
    judge: Callable[[str, str, str], float] | None = None  # (question, prediction, answer) -> [0, 1]
    degenerate_im_start: int = 5  # this many <|im_start|> ...
    degenerate_window: int = 300  # ... within this many characters: degenerate, reward 0
    shaping_bias: float = 0.2  # trainer side: r' = (R - bias) * scale
    shaping_scale: float = 10.0

    def __post_init__(self) -> None:
        if self.oe_metric not in ("f1", "exact", "judge"):
            raise ValueError(f"oe_metric must be f1, exact or judge, got {self.oe_metric!r}")
        if self.oe_metric == "judge" and self.judge is None:
            raise ValueError("oe_metric='judge' needs a judge callable")


# ----------------------------------------------------------------------------------------------
# accuracy

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_text(s: str) -> str:
    """SQuAD-style: lowercase, drop punctuation and articles, collapse spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def token_f1(prediction: str, answer: str) -> float:
    p, a = normalize_text(prediction).split(), normalize_text(answer).split()
    if not p or not a:
        return float(p == a)
    common = Counter(p) & Counter(a)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(a)
    return 2 * precision * recall / (precision + recall)


_LETTER_PATTERNS = [
    re.compile(r"^\(?([A-J])\)?(?:[.:)\s]|$)"),  # "B", "(B)", "B.", "B) text", "B: text"
    re.compile(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-J])\)?(?![A-Za-z])", re.I),
    re.compile(r"^\s*\(([A-J])\)"),
]


def mcq_letter(text: str | None, options: list[str] | None = None) -> str | None:
    """The option letter a text chooses, or None."""
    if not text:
        return None
    s = text.strip()
    s = re.sub(r"^<answer>|</answer>$", "", s).strip()
    for pat in _LETTER_PATTERNS:
        m = pat.search(s)
        if m:
            return m.group(1).upper()
    if options:  # the option's text instead of its letter
        ns = normalize_text(s)
        for i, opt in enumerate(options):
            body = re.sub(r"^\(?[A-J][.):]\s*", "", opt.strip())
            if ns and ns == normalize_text(body):
                return "ABCDEFGHIJ"[i]
    m = re.fullmatch(r"\W*([A-J])\W*", s)
    return m.group(1) if m else None


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def parse_span(text) -> tuple[float, float] | None:
    """The first [start, end] pair in a text ('12.5 - 20', '[12.5, 20]', 'from 12 to 20 s') or a list."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)) and len(text) >= 2:
        try:
            nums = [float(text[0]), float(text[1])]
        except (TypeError, ValueError):
            return None
    else:
        nums = [float(x) for x in _NUM.findall(str(text))[:2]]
    if len(nums) < 2:
        return None
    s, e = nums
    return (s, e) if s <= e else (e, s)


def temporal_iou(pred: tuple[float, float] | None, gt: tuple[float, float] | None) -> float:
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
    """R_acc in [0, 1]: exact match after normalization, else by question type."""
    cfg = cfg or RewardConfig()
    if prediction is None:
        return 0.0
    if question_type == "tvg":
        return temporal_iou(parse_span(prediction), parse_span(answer))
    answer = str(answer)
    if normalize_text(prediction) == normalize_text(answer) and normalize_text(answer):
        return 1.0
    if question_type == "mcq":
        gt = mcq_letter(answer, options) or answer.strip().upper()[:1]
        return float(mcq_letter(prediction, options) == gt)
    if question_type == "oe":
        if cfg.oe_metric == "exact":
            return 0.0
        if cfg.oe_metric == "judge":
            return float(max(0.0, min(1.0, cfg.judge(question, prediction, answer))))  # type: ignore[misc]
        return token_f1(prediction, answer)
    raise ValueError(f"unknown question_type {question_type!r}; expected one of {P.QUESTION_TYPES}")


# ----------------------------------------------------------------------------------------------
# format and anchoring


def _balanced(text: str) -> bool:
    pairs = [(P.THINK_OPEN, P.THINK_CLOSE), (P.ANSWER_OPEN, P.ANSWER_CLOSE), (P.TOOL_CALL_OPEN, P.TOOL_CALL_CLOSE)]
    return all(text.count(a) == text.count(b) for a, b in pairs)


def _substantive_think(turn: P.Turn, cfg: RewardConfig) -> bool:
    return turn.think is not None and len(turn.think.strip()) >= cfg.min_think_chars


def format_reward(text: str, cfg: RewardConfig | None = None, prefix: str = "") -> float:
    """R_fmt in [0, 1] of one text (for an episode, pass the joined main turns with prefixes)."""
    cfg = cfg or RewardConfig()
    full = (prefix or "") + text
    turn = P.parse(full)
    w_think, w_body, w_close = (0.2, 0.3, 0.2) if cfg.answer_suffix else (0.3, 0.2, 0.1)
    score = 0.0
    if _substantive_think(turn, cfg):
        score += w_think
    if turn.answer:
        score += w_body
        if turn.answer_closed:
            score += w_close
    if turn.calls and turn.think is not None and full.find(P.THINK_OPEN) < _first_call_pos(full):
        score += 0.3
    if score > 0 and _balanced(full):
        score += 0.1
    return min(score, 1.0)


def _first_call_pos(text: str) -> int:
    positions = [i for i in (text.find(P.TOOL_CALL_OPEN), text.find(P.TOOL_CODE_OPEN)) if i >= 0]
    return min(positions) if positions else -1


def anchor_reward(text: str, cfg: RewardConfig | None = None, prefix: str = "") -> float:
    """The Exploration-Anchoring terms, before the λ weight: +0.4 a substantive think closed by
    </think>; +0.3 the full think→answer flow; −γ a <think> opened and never closed."""
    cfg = cfg or RewardConfig()
    full = (prefix or "") + text
    turn = P.parse(full)
    value = 0.0
    if turn.think_closed and _substantive_think(turn, cfg):
        value += cfg.anchor_close_think
    if _full_flow(full):
        value += cfg.anchor_full_flow
    if full.count(P.THINK_OPEN) > full.count(P.THINK_CLOSE):
        value -= cfg.gamma
    return value


def _full_flow(full: str) -> bool:
    i = full.find(P.THINK_OPEN)
    j = full.find(P.THINK_CLOSE, i + 1) if i >= 0 else -1
    k = full.find(P.ANSWER_OPEN, j + 1) if j >= 0 else -1
    m = full.find(P.ANSWER_CLOSE, k + 1) if k >= 0 else -1
    return m > k >= 0 and full[k + len(P.ANSWER_OPEN):m].strip() != ""


# ----------------------------------------------------------------------------------------------
# tool use, degenerate outputs, total


def tool_reward(n_parsed_calls: int, n_executed_calls: int, acc: float) -> float:
    """R_tool: 0 without a parseable call; 0.1 parseable; 0.3 executed; +0.5 when the answer scores."""
    if n_parsed_calls <= 0 and n_executed_calls <= 0:
        return 0.0
    value = 0.3 if n_executed_calls > 0 else 0.1
    if acc > 0:
        value += 0.5
    return min(value, 1.0)


def is_degenerate(text: str, cfg: RewardConfig | None = None) -> bool:
    """Chat-format collapse: many <|im_start|> packed into a short span."""
    cfg = cfg or RewardConfig()
    marker = "<|im_start|>"
    starts = [m.start() for m in re.finditer(re.escape(marker), text)]
    n = cfg.degenerate_im_start
    return any(starts[i + n - 1] - starts[i] < cfg.degenerate_window for i in range(len(starts) - n + 1))


@dataclass
class RewardBreakdown:
    accuracy: float
    format: float
    anchor: float  # unweighted anchor terms (reported in both anchoring modes)
    tool: float
    total: float
    degenerate: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def join_turns(main_texts: list[str], prefix: str = "") -> str:
    """The scored text of an episode: every main turn with its forced prefix."""
    return "\n".join((prefix or "") + t for t in main_texts)


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
    """R = R_acc + w_fmt·R_fmt + R_tool (+ λ·anchor when anchoring == "sequence").

    With anchoring == "token" the anchor enters per token in the trainer (at structural
    positions), so the scalar total leaves it out; with "off" it is not used at all."""
    if anchoring not in ("sequence", "token", "off"):
        raise ValueError(f"anchoring must be sequence, token or off, got {anchoring!r}")
    cfg = cfg or RewardConfig()
    text = join_turns(main_texts, prefix)
    acc = accuracy_reward(prediction, answer, question_type, cfg, options=options, question=question)
    fmt = format_reward(text, cfg)
    anc = anchor_reward(text, cfg)
    tool = tool_reward(n_parsed_calls, n_executed_calls, acc)
    if is_degenerate(text, cfg):
        return RewardBreakdown(acc, fmt, anc, tool, 0.0, degenerate=True)
    total = acc + cfg.w_fmt * fmt + tool
    if anchoring == "sequence":
        total += cfg.lambda_anchor * anc
    return RewardBreakdown(acc, fmt, anc, tool, total)


def shape(total: float, cfg: RewardConfig | None = None) -> float:
    cfg = cfg or RewardConfig()
    return (total - cfg.shaping_bias) * cfg.shaping_scale


# ----------------------------------------------------------------------------------------------
# token-level anchoring


def _decode(tokenizer, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except TypeError:  # a raw `tokenizers.Tokenizer`
        return tokenizer.decode(ids, skip_special_tokens=False)


def token_char_ends(token_ids: list[int], tokenizer) -> tuple[str, list[int]]:
    """Decoded text and, per token, the character offset where it ends.

    Decoding token by token is exact for ASCII tags; when the pieces do not add up to the
    whole decode (multi-byte characters split across byte-level tokens) we fall back to
    decoding growing prefixes, which is quadratic but exact."""
    text = _decode(tokenizer, list(token_ids))
    pieces = [_decode(tokenizer, [t]) for t in token_ids]
    if "".join(pieces) == text:
        ends, pos = [], 0
        for p in pieces:
            pos += len(p)
            ends.append(pos)
        return text, ends
    ends = [len(_decode(tokenizer, list(token_ids[: i + 1]))) for i in range(len(token_ids))]
    return text, ends


def _token_at(ends: list[int], char_index: int) -> int:
    """Index of the token that contains character `char_index`."""
    lo, hi = 0, len(ends) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ends[mid] > char_index:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _tag_positions(text: str, ends: list[int], tags) -> list[tuple[int, str, int]]:
    """(token index holding the tag's last character, tag, char offset) for every tag occurrence."""
    out = []
    for tag in tags:
        start = 0
        while True:
            i = text.find(tag, start)
            if i < 0:
                break
            out.append((_token_at(ends, i + len(tag) - 1), tag, i))
            start = i + 1
    return sorted(out)


def structural_positions(token_ids: list[int], tokenizer) -> list[int]:
    """Indices of the tokens that are (or end) a structural tag: </think>, <answer>, </answer>,
    <tool_call>, </tool_call>. Works whether tags are single tokens or split."""
    if not token_ids:
        return []
    text, ends = token_char_ends(token_ids, tokenizer)
    return sorted({pos for pos, _, _ in _tag_positions(text, ends, P.STRUCTURAL_TAGS)})


def anchor_token_rewards(
    token_ids: list[int], tokenizer, cfg: RewardConfig | None = None, prefix: str = ""
) -> dict[int, float]:
    """Per-token anchor values (before λ) for one generated turn, placed at structural tokens:
    +0.4 at the </think> that closes a substantive think; +0.3 at the </answer> that completes
    the think→answer flow; −γ at the last generated token when a <think> never closes (the place
    where the missing closure should have come at the latest). `prefix` is the forced start,
    which is not among token_ids but counts as present."""
    cfg = cfg or RewardConfig()
    if not token_ids:
        return {}
    text, ends = token_char_ends(token_ids, tokenizer)
    full = (prefix or "") + text
    shift = len(prefix or "")
    turn = P.parse(full)
    values: dict[int, float] = {}
    tags = _tag_positions(text, ends, (P.THINK_CLOSE, P.ANSWER_CLOSE))
    if turn.think_closed and _substantive_think(turn, cfg):
        first_close = full.find(P.THINK_CLOSE) - shift
        for pos, tag, ci in tags:
            if tag == P.THINK_CLOSE and ci == first_close:
                values[pos] = values.get(pos, 0.0) + cfg.anchor_close_think
                break
    if _full_flow(full):
        last_close = full.rfind(P.ANSWER_CLOSE) - shift
        for pos, tag, ci in tags:
            if tag == P.ANSWER_CLOSE and ci == last_close:
                values[pos] = values.get(pos, 0.0) + cfg.anchor_full_flow
    if full.count(P.THINK_OPEN) > full.count(P.THINK_CLOSE):
        last = len(token_ids) - 1
        values[last] = values.get(last, 0.0) - cfg.gamma
    return values
