"""Run summaries, computed by hand for small tables of results rows."""

import pytest

from paravt.eval.metrics import headline, markdown, normalized_prediction, score_prediction, summarize


def row(i, qtype="mcq", score=0.0, calls=0, problems=0, latency=1.0, error=None, pred="A", **extras):
    return {"id": str(i), "question_type": qtype, "score": score, "n_calls": calls, "n_executed": calls,
            "n_problems": problems, "n_turns": 1 + (calls > 0), "latency_s": latency, "error": error,
            "prediction": pred, "main_visual_tokens": 100, "prompt_tokens": 200 + 10 * calls,
            "completion_tokens": 20, "extras": extras}


MCQ_ROWS = [
    row(1, score=1.0, calls=2, latency=1.0, duration="short", task="count"),
    row(2, score=0.0, calls=0, problems=1, latency=2.0, duration="short", task="count"),
    row(3, score=1.0, calls=1, latency=3.0, duration="long", task="plotQA"),
    row(4, score=1.0, calls=0, latency=4.0, duration="long", task="plotQA", pred=None),
    row(5, score=1.0, error="BackendError: down", duration="medium", task="plotQA"),  # an error never scores
]


@pytest.mark.parametrize("key, want", [
    ("n", 5), ("errors", 1), ("error_rate", 20.0),
    ("accuracy", 60.0),  # 3 right of 5: the error row counts as wrong
    ("score", 60.0),
    ("answered_rate", 75.0),  # of the 4 rows without error, 3 have a prediction
    ("mean_tool_calls", 0.75), ("tool_usage_rate", 50.0), ("parse_problem_rate", 25.0), ("mean_turns", 1.5),
    ("latency_p50_s", 2.5), ("latency_p90_s", 3.7), ("latency_p99_s", 3.97),  # numpy linear percentiles of 1..4
    ("mean_main_visual_tokens", 100.0), ("mean_prompt_tokens", 207.5), ("mean_completion_tokens", 20.0),
])
def test_mcq_summary(key, want):
    assert summarize(MCQ_ROWS)[key] == pytest.approx(want)


def test_breakdowns_and_mlvu_task_mean():
    s = summarize(MCQ_ROWS, breakdowns=("duration", "task"), headline="task_mean_accuracy")
    assert s["by_duration"] == {"long": {"n": 2, "score": 100.0}, "medium": {"n": 1, "score": 0.0},
                                "short": {"n": 2, "score": 50.0}}
    assert s["by_task"] == {"count": {"n": 2, "score": 50.0}, "plotQA": {"n": 3, "score": pytest.approx(200 / 3)}}
    assert s["task_mean_accuracy"] == pytest.approx((50.0 + 200 / 3) / 2)  # M-Avg, not the pooled 60
    assert headline(s) == ("M-Avg", pytest.approx((50.0 + 200 / 3) / 2))
    assert "miou" not in s and "by_subject" not in s


def test_list_valued_groups_count_in_each():
    rows = [row(1, score=1.0, task=["reasoning", "temporal grounding"]), row(2, score=0.0, task=["reasoning"])]
    s = summarize(rows, breakdowns=("task",))
    assert s["by_task"] == {"reasoning": {"n": 2, "score": 50.0}, "temporal grounding": {"n": 1, "score": 100.0}}


def test_grounding_miou_and_recall():
    ious = [0.9, 0.6, 0.4, 0.2, 0.0]
    rows = [row(i, "tvg", score=v) for i, v in enumerate(ious)] + [row(9, "tvg", score=0.8, error="VideoError: x")]
    s = summarize(rows, breakdowns=())
    assert s["miou"] == pytest.approx(100 * sum(ious) / 6)  # the error row is an IoU of 0
    assert s["r@0.3"] == pytest.approx(100 * 3 / 6)
    assert s["r@0.5"] == pytest.approx(100 * 2 / 6)
    assert s["r@0.7"] == pytest.approx(100 * 1 / 6)
    assert "accuracy" not in s and headline(s) == ("mIoU", pytest.approx(s["miou"]))


def test_mixed_types_by_question_type():
    rows = [row(1, "mcq", 1.0), row(2, "tvg", 0.5), row(3, "oe", 0.25), row(4, "oe", 0.75)]
    s = summarize(rows, breakdowns=("question_type",), headline="score")
    assert s["accuracy"] == pytest.approx(100 * 2.0 / 3)  # mcq + oe
    assert s["miou"] == pytest.approx(50.0) and s["score"] == pytest.approx(62.5)
    assert s["by_question_type"]["oe"] == {"n": 2, "score": 50.0}
    assert s["headline"] == {"metric": "score", "value": pytest.approx(62.5)}


def test_empty_run():
    s = summarize([])
    assert s["n"] == 0 and s["score"] == 0.0 and s["latency_p50_s"] == 0.0 and s["headline"]["metric"] == "score"


@pytest.mark.parametrize("pred, answer, qtype, options, want", [
    ("B", "B", "mcq", ["A. x", "B. y"], 1.0),
    ("The answer is (B).", "B", "mcq", None, 1.0),
    ("y", "B", "mcq", ["A. x", "B. y"], 1.0),  # the option's text
    ("A", "B", "mcq", None, 0.0),
    (None, "B", "mcq", None, 0.0),
    ("10 - 20", "[10, 20]", "tvg", None, 1.0),
    ("15 - 25", "[10, 20]", "tvg", None, pytest.approx(5 / 15)),
    ("sometime", "[10, 20]", "tvg", None, 0.0),
    ("the blue square", "blue square", "oe", None, 1.0),
    ("blue circle", "blue square", "oe", None, 0.5),
])
def test_score_prediction(pred, answer, qtype, options, want):
    assert score_prediction(pred, answer, qtype, options=options) == want


def test_normalized_prediction():
    assert normalized_prediction("Option C", "mcq") == "C"
    assert normalized_prediction("from 3 to 7.5 s", "tvg") == [3.0, 7.5]
    assert normalized_prediction(None, "tvg") is None


def test_markdown_lists_metrics_and_breakdowns():
    md = markdown(summarize(MCQ_ROWS), "videomme · parallel")
    assert md.startswith("# videomme · parallel") and "**accuracy: 60.00**" in md
    assert "| mean_tool_calls | 0.75 |" in md and "## duration" in md and "| short | 2 | 50.00 |" in md
