"""paravt eval: loaders on fixtures in each benchmark's published schema, metrics, resumable runner."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.agent import EpisodeConfig
from paravt.backends.scripted import ScriptedBackend
from paravt.eval.benchmarks import BenchmarkError, load_benchmark
from paravt.eval.metrics import summarize
from paravt.eval.runner import ManifestMismatch, read_results, run_eval
from videotools import make_test_video


@pytest.fixture(scope="module")
def vid(tmp_path_factory):
    return make_test_video(tmp_path_factory.mktemp("ev") / "clip.mp4", seconds=20, fps=2)


def put_video(vid, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(vid.read_bytes())


def test_videomme(tmp_path, vid):
    rows = [{"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity & History",
             "url": "https://www.youtube.com/watch?v=fFjv93ACGo8", "videoID": "fFjv93ACGo8", "question_id": "001-1",
             "task_type": "Counting Problem", "question": "How many people?", "options": ["A. 1", "B. 2", "C. 3", "D. 4"],
             "answer": "C"},
            {"video_id": "002", "duration": "long", "domain": "Sports", "sub_category": "Football", "url": "u",
             "videoID": "missingvid", "question_id": "002-1", "task_type": "OCR Problems", "question": "Q?",
             "options": ["A. a", "B. b", "C. c", "D. d"], "answer": "A"}]
    (tmp_path / "videomme").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "videomme" / "test-00000-of-00001.parquet")
    (tmp_path / "subtitle").mkdir()
    (tmp_path / "subtitle" / "fFjv93ACGo8.srt").write_text("1\n00:00:01,000 --> 00:00:02,000\nHello <i>there</i>\n\n")
    put_video(vid, tmp_path / "videos" / "fFjv93ACGo8.mp4")
    plain = load_benchmark("videomme", tmp_path, tmp_path / "videos")
    assert [s.id for s in plain.samples] == ["001-1"] and plain.missing_videos == ["002-1"]
    s = plain.samples[0]
    assert s.answer == "C" and s.question.endswith("D. 4") and s.extras["duration"] == "short" and s.subtitles is None
    sub = load_benchmark("videomme_sub", tmp_path, tmp_path / "videos").samples[0]
    assert sub.subtitles == "Hello there" and sub.bench == "videomme_sub"


def test_longvideobench(tmp_path, vid):
    (tmp_path / "lvb_val.json").write_text(json.dumps([{
        "video_id": "86CxyhFV9MI", "question": "What is the man holding?", "question_wo_referring_query": "x",
        "candidates": ["a cup", "a phone", "a book"], "correct_choice": 1, "position": [1], "topic_category": "NP-News-Programs",
        "question_category": "TOS", "level": "L2-Relation", "id": "86CxyhFV9MI_0", "video_path": "86CxyhFV9MI.mp4",
        "subtitle_path": "86CxyhFV9MI_en.json", "duration_group": 600, "starting_timestamp_for_subtitles": 0,
        "duration": 527.0, "view_count": 1}]))
    put_video(vid, tmp_path / "v" / "86CxyhFV9MI.mp4")
    s = load_benchmark("longvideobench", tmp_path, tmp_path / "v").samples[0]
    assert s.answer == "B" and "B. a phone" in s.question and s.extras["duration_group"] == 600


def test_lvbench(tmp_path, vid):
    line = {"key": "d8XsHdHGcxw", "type": "cartoon", "qa": [
        {"uid": "1", "question": "What happens first?\n(A) a\n(B) b\n(C) c\n(D) d", "answer": "B",
         "question_type": ["event understanding"], "time_reference": "00:15-00:19"}], "video_info": {"duration_minutes": 70}}
    (tmp_path / "video_info.meta.jsonl").write_text(json.dumps(line) + "\n")
    put_video(vid, tmp_path / "d8XsHdHGcxw.mp4")
    s = load_benchmark("lvbench", tmp_path).samples[0]
    assert s.answer == "B" and s.options == ["A. a", "B. b", "C. c", "D. d"] and s.question.startswith("What happens first?")


def test_mlvu(tmp_path, vid):
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "1_plotQA.json").write_text(json.dumps([
        {"video": "movie101_66.mp4", "duration": 246, "question": "What colour is the car?",
         "candidates": ["red", "blue", "green", "white"], "answer": "green", "question_type": "plotQA"}]))
    put_video(vid, tmp_path / "video" / "1_plotQA" / "movie101_66.mp4")
    s = load_benchmark("mlvu", tmp_path, tmp_path / "video").samples[0]
    assert s.answer == "C" and s.extras["task"] == "plotQA"


def test_mmvu(tmp_path, vid):
    (tmp_path / "validation.json").write_text(json.dumps([
        {"id": "v1", "question": "Which law?", "choices": {"A": "x", "B": "y", "C": "z", "D": "w", "E": "v"},
         "answer": "D", "question_type": "multiple-choice",
         "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Physics/3.mp4",
         "metadata": {"subject": "Physics", "textbook": "t"}},
        {"id": "v2", "question": "Name the process.", "choices": {}, "answer": "osmosis", "question_type": "open-ended",
         "video": "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Biology/1.mp4",
         "metadata": {"subject": "Biology"}}]))
    put_video(vid, tmp_path / "videos" / "Physics" / "3.mp4")
    put_video(vid, tmp_path / "videos" / "Biology" / "1.mp4")
    a, b = load_benchmark("mmvu", tmp_path, tmp_path / "videos").samples
    assert a.question_type == "mcq" and a.answer == "D" and "E. v" in a.question
    assert b.question_type == "oe" and b.answer == "osmosis" and b.extras["subject"] == "Biology"


def test_charades(tmp_path, vid):
    (tmp_path / "charades_sta_test.txt").write_text("3MSZA 24.3 30.4##person turn a light on.\nXXXXX 1 2##gone.\n")
    put_video(vid, tmp_path / "3MSZA.mp4")
    loaded = load_benchmark("charades", tmp_path)
    s = loaded.samples[0]
    assert s.question_type == "tvg" and s.answer == "[24.3, 30.4]" and "turn a light on" in s.question
    assert loaded.missing_videos == ["XXXXX-1"]


def test_unknown_benchmark_and_missing_files(tmp_path):
    with pytest.raises(BenchmarkError, match="unknown benchmark"):
        load_benchmark("imagenet", tmp_path)
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark("longvideobench", tmp_path)


def test_metrics_table():
    rows = [
        {"id": "1", "question_type": "mcq", "score": 1.0, "n_calls": 2, "n_problems": 0, "latency_s": 1.0,
         "extras": {"duration": "short"}},
        {"id": "2", "question_type": "mcq", "score": 0.0, "n_calls": 0, "n_problems": 1, "latency_s": 3.0,
         "extras": {"duration": "long"}},
        {"id": "3", "question_type": "tvg", "score": 0.6, "n_calls": 1, "latency_s": 2.0},
        {"id": "4", "question_type": "tvg", "score": 0.2, "n_calls": 1, "latency_s": 2.0},
        {"id": "5", "question_type": "mcq", "score": 0.0, "error": "VideoError: x"},
    ]
    s = summarize(rows)
    assert s["n"] == 5 and s["errors"] == 1
    assert s["accuracy"] == pytest.approx(50.0)
    assert s["miou"] == pytest.approx(40.0) and s["r@0.3"] == 50.0 and s["r@0.5"] == 50.0 and s["r@0.7"] == 0.0
    assert s["mean_tool_calls"] == pytest.approx(1.0) and s["tool_usage_rate"] == pytest.approx(75.0)
    assert s["parse_problem_rate"] == pytest.approx(25.0)
    assert s["by_duration"] == {"long": {"n": 1, "score": 0.0}, "short": {"n": 1, "score": 100.0}}


def synth_samples(tmp_path):
    from paravt.synth.dataset import SynthConfig, build_split

    build_split(tmp_path / "synth", SynthConfig(n=10, seed=1, split="test", min_len=60, max_len=90))
    return load_benchmark("synthvt", tmp_path / "synth").samples


def scripted():
    def main(req):
        q = req.messages[1].text()
        letter = "ABCD"[len(q) % 4]
        return f"<think>guessing</think><answer>{letter}</answer>"

    return ScriptedBackend(main)


def test_kill_and_resume_gives_the_same_summary(tmp_path):
    samples = synth_samples(tmp_path)
    cfg = EpisodeConfig(frames=4, max_turns=2)
    full = run_eval(samples, scripted(), cfg, tmp_path / "full", concurrency=3)
    part_dir = tmp_path / "part"
    run_eval(samples, scripted(), cfg, part_dir, concurrency=3, stop_after=4)
    assert len(read_results(part_dir / "results.jsonl")) == 4
    with open(part_dir / "results.jsonl", "a") as f:  # a crash mid-write leaves a torn line
        f.write('{"id": "torn", "sc')
    resumed = run_eval(samples, scripted(), cfg, part_dir, concurrency=3)
    rows = read_results(part_dir / "results.jsonl")
    assert len(rows) == len(samples) and len({r["id"] for r in rows}) == len(samples)
    timeless = lambda d: {k: v for k, v in d.items() if not k.startswith("latency")}  # noqa: E731
    assert timeless(resumed) == timeless(full)
    assert timeless(json.loads((part_dir / "summary.json").read_text())) == timeless(full)
    assert [r["prediction"] for r in sorted(rows, key=lambda r: r["id"])] == \
        [r["prediction"] for r in sorted(read_results(tmp_path / "full" / "results.jsonl"), key=lambda r: r["id"])]


def test_resume_refuses_other_settings(tmp_path):
    samples = synth_samples(tmp_path)[:2]
    run_eval(samples, scripted(), EpisodeConfig(frames=4), tmp_path / "r")
    with pytest.raises(ManifestMismatch, match="episode"):
        run_eval(samples, scripted(), EpisodeConfig(frames=8), tmp_path / "r")


def test_missing_video_is_an_error_row_not_a_crash(tmp_path):
    samples = synth_samples(tmp_path)[:3]
    samples[1].video = str(tmp_path / "gone.mp4")
    s = run_eval(samples, scripted(), EpisodeConfig(frames=4), tmp_path / "m")
    assert s["n"] == 3 and s["errors"] == 1
