"""The option grammar of multiple-choice questions: the one place that says what an option looks like.

`options_from_question` is what `--question-type auto` (ask, lmms-eval) and the mcq scorer
(`rewards.accuracy_reward`) both read, so a question the detector calls mcq is scored against the same
options. Two forms:

- one option a line: "A. circle" / "(A) circle" / "A) circle" / "A: circle" lines, A, B, ... in order;
- inline, as people type them: "Which shape? A. circle B. square C. star". Letters A, B, ... in order,
  each once, all in one marker style ("A." or "(A)" ...), each marker standing alone between spaces.
  "A" is also the article and "B." ends sentences ("Was it Plan B. Then what?" stays open-ended), so
  bare-letter markers ("A.", "A)", "A:") after a word need three options at least ("... action A. 2
  B. 1 C. 5", as MLVU writes a question); after the start of the text or of a line, or a sentence's end
  ("?", ":", ".", "!", ";"), two will do, as they do for "(A)" and "[A]" anywhere. An option's text runs
  to the next marker (the last one's to the end of its line), less a separating ",", ";" or "or".

Letters run A–J, as far as the scorer reads them (no benchmark here offers more than five options).
"""

from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"

_LINE_RE = re.compile(r"^\s*[\(\[]?([A-J])[\)\]]?[.:)]\s*(.+?)\s*$", re.M)
_LEADING_RE = re.compile(r"^\s*[\(\[]?([A-J])[\)\]]?[.:)]\s*(.*)$", re.S)
# an inline marker: "(A)", "[A]", "A.", "A)" or "A:", with whitespace (or the text's edge) on both sides
_MARK_RE = re.compile(r"(?<!\S)(?:\(([A-J])\)|\[([A-J])\]|([A-J])([.:)]))(?=\s)")
_OPENS_AFTER = "?:.!;"  # a bare-letter marker opens the options after one of these (or a line start)
_TRAILING_RE = re.compile(r"(?:\s*(?:[,;]|\bor\b))+\s*$")  # "A. red, B. blue or C. green"


def split_marker(option: str) -> tuple[str, str] | None:
    """("B", "square") for an option written with its letter ("B. square", "(B) square"), else None."""
    m = _LEADING_RE.match(str(option))
    return (m.group(1), m.group(2).strip()) if m else None


def option_body(option: str) -> str:
    """An option's text without its leading letter marker ("B. square" -> "square")."""
    split = split_marker(option)
    return split[1] if split else str(option).strip()


def options_from_question(question: str) -> list[str] | None:
    """The option texts of a question that lists them (one a line, or inline), or None."""
    question = question or ""
    found = _LINE_RE.findall(question)
    letters = "".join(letter for letter, _ in found)
    if len(found) >= 2 and letters == LETTERS[: len(found)]:
        return [body for _, body in found]
    return _inline_options(question)


def _inline_options(question: str) -> list[str] | None:
    marks = []
    for m in _MARK_RE.finditer(question):
        paren, bracket, bare, punct = m.groups()
        style = "()" if paren else "[]" if bracket else punct
        marks.append((m.start(), m.end(), paren or bracket or bare, style))
    for i, (start, _, letter, style) in enumerate(marks):
        if letter != "A":
            continue
        chosen = [marks[i]]
        for mark in marks[i + 1:]:
            if len(chosen) < len(LETTERS) and mark[3] == style and mark[2] == LETTERS[len(chosen)]:
                chosen.append(mark)
        if len(chosen) < (2 if _opens(question, start, style) else 3):
            continue
        ends = [nxt[0] for nxt in chosen[1:]] + [_line_end(question, chosen[-1][1])]
        bodies = [_TRAILING_RE.sub("", question[mark[1]:end]).strip() for mark, end in zip(chosen, ends)]
        if all(bodies):
            return bodies
    return None


def _opens(text: str, start: int, style: str) -> bool:
    if style in ("()", "[]"):
        return True
    before = text[:start].rstrip(" \t")
    return not before or before[-1] == "\n" or before[-1] in _OPENS_AFTER


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end
