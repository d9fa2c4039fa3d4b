"""The option grammar (`paravt.protocol.options`) that `--question-type auto` and the mcq scorer share:
options one a line or inline, on the real benchmark rows in tests/fixtures/eval, and the texts that
must stay open-ended."""

import json
from pathlib import Path

import pytest

from paravt.ask import question_type_of
from paravt.protocol.options import option_body, options_from_question, split_marker
from paravt.rewards import accuracy_reward, normalize_text

FIX = Path(__file__).parent / "fixtures" / "eval"
STYLES = {"A.": "{}. ", "(A)": "({}) ", "A)": "{}) ", "A:": "{}: "}


def _real_rows() -> list[tuple[str, str, list[str]]]:
    """(source, question, option texts) of every real MCQ row in the fixtures."""
    rows = []
    for r in json.loads((FIX / "videomme_export" / "video_mme.json").read_text()):
        rows.append(("videomme " + r["question_id"], r["question"], [option_body(o) for o in r["options"]]))
    for r in json.loads((FIX / "longvideobench" / "lvb_val.json").read_text()):
        rows.append(("longvideobench " + r["id"], r["question"], [c.strip() for c in r["candidates"]]))
    for path in sorted((FIX / "mlvu" / "json").glob("*.json")):
        for i, r in enumerate(json.loads(path.read_text())):
            if r.get("candidates"):
                rows.append((f"mlvu {path.stem} {i}", r["question"], [c.strip() for c in r["candidates"]]))
    return rows


REAL = _real_rows()


def test_the_fixtures_hold_the_three_benchmarks():
    assert {src.split()[0] for src, _, _ in REAL} == {"videomme", "longvideobench", "mlvu"}
    assert len(REAL) >= 20


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("src, question, options", REAL, ids=[r[0] for r in REAL])
def test_real_questions_with_inline_options_are_mcq(src, question, options, style):
    """Typed on one line after the question, every real row's options come back as the scorer compares
    them (normalised: a candidate's own trailing comma is read as a separator)."""
    inline = question + " " + " ".join(STYLES[style].format(chr(65 + i)) + o for i, o in enumerate(options))
    found = options_from_question(inline)
    assert found is not None and [normalize_text(o) for o in found] == [normalize_text(o) for o in options], inline
    assert question_type_of(inline) == "mcq"
    lines = question + "\n" + "\n".join(STYLES[style].format(chr(65 + i)) + o for i, o in enumerate(options))
    assert options_from_question(lines) == options


@pytest.mark.parametrize("src, question, options", REAL, ids=[r[0] for r in REAL])
def test_real_questions_alone_stay_open_ended(src, question, options):
    assert options_from_question(question) is None
    assert question_type_of(question) == "oe"


@pytest.mark.parametrize("text", [
    "Was it Plan B. Then what?",
    "Was it plan A. Then plan B. Then what?",
    "Is the vitamin A. or B. the one in carrots?",
    "Please summarize this video, including its main content.",  # MLVU 9_summary
    "What does the sign say? A. Smith Street",  # one option is no choice
    "Which of B. and C. came first?",  # no A
    "Grades A. B. C. What are these?",  # markers without texts
    "Which team won, A) or B)?",
    "What colour was the star?",
    "How many times does I. M. Pei appear?",
])
def test_texts_that_stay_open_ended(text):
    assert options_from_question(text) is None, options_from_question(text)
    assert question_type_of(text) == "oe"


@pytest.mark.parametrize("text, options", [
    ("Which shape appeared in red? A. circle B. square C. star D. cross", ["circle", "square", "star", "cross"]),
    ("Which shape appeared in red? A. circle, B. square or C. star", ["circle", "square", "star"]),
    ("Options: (A) a cup (B) a book (C) a pen", ["a cup", "a book", "a pen"]),
    ("Is it (A) a dog or (B) a cat?", ["a dog", "a cat?"]),
    ("Which? A. Plan A B. Plan B C. neither", ["Plan A", "Plan B", "neither"]),
    ("Which? A. red\nB. blue\nC. green", ["red", "blue", "green"]),  # one a line, the first on the question's
    ("Which colour?\nA. blue\nB. red\nAnswer with the letter.", ["blue", "red"]),
])
def test_inline_forms(text, options):
    assert options_from_question(text) == options


def test_the_scorer_reads_the_options_the_detector_found():
    """A question the detector calls mcq is scored against the same options: the option's text counts."""
    q = "Which shape appeared in red? A. circle B. square C. star D. cross"
    assert accuracy_reward("square", "B", "mcq", question=q) == 1.0
    assert accuracy_reward("The answer is (B).", "B", "mcq", question=q) == 1.0
    assert accuracy_reward("star", "B", "mcq", question=q) == 0.0


def test_split_marker():
    assert split_marker("B. square") == ("B", "square")
    assert split_marker("(C) a pen") == ("C", "a pen")
    assert split_marker("square") is None
    assert option_body("D. The three kinds are of the same number.") == "The three kinds are of the same number."
