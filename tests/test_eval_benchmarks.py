"""Benchmark loaders against fixtures in each benchmark's published schema (tests/fixtures/eval/),
with real (tiny) video files placed where the archives unpack them."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.eval.benchmarks import BENCHMARKS, BenchmarkError, VideoFinder, load_benchmark, mcq_text, srt_text
from videotools import make_test_video

FIX = Path(__file__).parent / "fixtures" / "eval"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return make_test_video(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=2, fps=4)


def bench_dir(tmp_path, name, clip, videos=()):
    d = tmp_path / name
    shutil.copytree(FIX / name, d)
    for rel in videos:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, d / rel)
    return d


def test_every_benchmark_has_a_fixture_test():
    assert set(BENCHMARKS) == {"videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu", "mmvu_all",
                               "charades", "synthvt"}


def test_videomme_parquet_schema_and_videos_in_data(tmp_path, clip):
    d = bench_dir(tmp_path, "videomme", clip, ["data/Vx1Vx2Vx3Vx.mp4", "data/Md3Md4Md5Md.mp4"])
    schema = pq.read_schema(d / "videomme" / "test-00000-of-00001.parquet")
    assert schema.field("options").type == pa.list_(pa.string()) and schema.field("answer").type == pa.string()
    loaded = load_benchmark("videomme", d)
    assert [s.id for s in loaded.samples] == ["001-1", "001-2", "302-3"]
    assert [(m.id, Path(m.looked_for).name) for m in loaded.missing] == [("601-1", "Lg0Lg1Lg2Lg.mp4")]
    s = loaded.samples[0]
    assert s.question == ("What is the cook doing at the start?\nA. Cutting onions.\nB. Kneading dough.\n"
                          "C. Washing dishes.\nD. Boiling water.")
    assert s.answer == "B" and s.question_type == "mcq" and len(s.options) == 4 and s.subtitles is None
    assert s.extras["duration"] == "short" and s.extras["task"] == "Action Recognition"
    assert Path(s.video_path) == d / "data" / "Vx1Vx2Vx3Vx.mp4"
    assert loaded.samples[2].extras["duration"] == "medium"


def test_videomme_with_subtitles_from_srt(tmp_path, clip):
    d = bench_dir(tmp_path, "videomme", clip, ["data/Vx1Vx2Vx3Vx.mp4", "data/Md3Md4Md5Md.mp4"])
    loaded = load_benchmark("videomme_sub", d, d / "data")
    by_id = {s.id: s for s in loaded.samples}
    assert by_id["001-1"].bench == "videomme_sub"
    assert by_id["001-1"].subtitles == "Welcome back to the kitchen.\nToday we bake bread."  # repeat, tags dropped
    assert by_id["302-3"].subtitles is None and by_id["302-3"].extras["has_subtitles"] is False


def test_srt_text_handles_bom_crlf_and_markup(tmp_path):
    p = tmp_path / "x.srt"
    p.write_bytes("\ufeff1\r\n00:00:00,000 --> 00:00:01,000\r\n<b>Hi</b> there\r\nsecond line\r\n\r\n2\r\n"
                  "00:00:01,000 --> 00:00:02,000\r\nsecond line\r\n".encode("utf-8"))
    assert srt_text(p) == "Hi there\nsecond line"
    assert srt_text(tmp_path / "absent.srt") is None


def test_longvideobench_json(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip, ["videos/aB3dE5fG7hI.mp4", "videos/zz9Yy8Xx7Ww.mp4"])
    loaded = load_benchmark("longvideobench", d)
    a, b = loaded.samples
    assert a.id == "aB3dE5fG7hI_0" and a.answer == "B" and "B. a green apple" in a.question
    assert b.answer == "E" and len(b.options) == 5
    assert a.extras["duration"] == "600" and a.extras["task"] == "E2O" and b.extras["duration"] == "60"
    assert loaded.missing_videos == ["noVideo0001_0"]


def test_longvideobench_bad_choice_names_the_row(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip)
    rows = json.loads((d / "lvb_val.json").read_text())
    rows[1]["correct_choice"] = 9
    (d / "lvb_val.json").write_text(json.dumps(rows))
    with pytest.raises(BenchmarkError, match="row 1.*correct_choice 9"):
        load_benchmark("longvideobench", d)


def test_lvbench_jsonl_options_and_categories(tmp_path, clip):
    d = bench_dir(tmp_path, "lvbench", clip, ["videos/Qw3rTy5uI7o.mp4"])
    loaded = load_benchmark("lvbench", d)
    a, b = loaded.samples
    assert a.id == "101" and a.answer == "B"
    assert a.question == "What animal crosses the river first?\nA. An elephant\nB. A zebra\nC. A lion\nD. A crocodile"
    assert a.options == ["A. An elephant", "B. A zebra", "C. A lion", "D. A crocodile"]
    assert a.extras["task"] == ["entity recognition", "temporal grounding"] and b.extras["task"] == ["reasoning"]
    assert loaded.missing_videos == ["201"]


def test_lvbench_video2dataset_layout(tmp_path, clip):
    """THUDM's download.sh fetches with video2dataset: shard folders named by its own keys."""
    d = bench_dir(tmp_path, "lvbench", clip, ["videos/00000/000000001.mp4"])
    pq.write_table(pa.Table.from_pylist([{"url": "https://www.youtube.com/watch?v=Qw3rTy5uI7o", "key": "000000001",
                                          "status": "success"}]), d / "videos" / "00000.parquet")
    loaded = load_benchmark("lvbench", d, d / "videos")
    assert [s.id for s in loaded.samples] == ["101", "102"]
    assert Path(loaded.samples[0].video_path).name == "000000001.mp4"


def test_mlvu_dev_letters_tasks_and_generation_skipped(tmp_path, clip):
    d = bench_dir(tmp_path, "mlvu", clip, ["video/1_plotQA/movie_a_12.mp4", "video/4_count/count_7.mp4"])
    loaded = load_benchmark("mlvu", d)
    assert [s.id for s in loaded.samples] == ["1_plotQA-0", "4_count-0"]
    a, c = loaded.samples
    assert a.answer == "C" and a.question.endswith("C. a key\nD. a map") and a.extras["task"] == "plotQA"
    assert c.answer == "C" and c.extras["task"] == "count"
    assert loaded.missing_videos == ["1_plotQA-1"]
    assert loaded.skipped == {"generation task (no candidates)": 1}


def test_mlvu_answer_not_a_candidate(tmp_path, clip):
    d = bench_dir(tmp_path, "mlvu", clip)
    (d / "json" / "4_count.json").write_text(json.dumps([{"video": "x.mp4", "duration": 1, "question": "Q?",
                                                          "candidates": ["1", "2"], "answer": "7",
                                                          "question_type": "count"}]))
    with pytest.raises(BenchmarkError, match="4_count.json row 0.*not one of the candidates"):
        load_benchmark("mlvu", d)


def test_mmvu_mcq_by_default_and_open_ended_on_request(tmp_path, clip):
    d = bench_dir(tmp_path, "mmvu", clip, ["videos/Chemistry/4.mp4", "videos/Computer_Science/4.mp4"])
    mc = load_benchmark("mmvu", d)
    assert [s.id for s in mc.samples] == ["validation_0"]
    s = mc.samples[0]
    assert s.answer == "B" and "E. Bromothymol blue" in s.question and s.extras["subject"] == "Chemistry"
    assert Path(s.video_path) == d / "videos" / "Chemistry" / "4.mp4"  # not Computer_Science/4.mp4
    assert mc.missing_videos == ["validation_2"] and mc.skipped == {"open-ended (use mmvu_all)": 1}
    both = load_benchmark("mmvu_all", d)
    oe = [s for s in both.samples if s.question_type == "oe"][0]
    assert oe.answer == "Quicksort" and oe.options == []
    assert oe.question == "Which sorting algorithm is animated in the video?"


def test_charades_sta_txt(tmp_path, clip):
    d = bench_dir(tmp_path, "charades", clip, ["Charades_v1_480/3MSZA.mp4"])
    loaded = load_benchmark("charades", d)
    a, b = loaded.samples
    assert a.question_type == "tvg" and a.answer == "[24.3, 30.4]" and a.extras["span"] == [24.3, 30.4]
    assert '"person turn a light on"' in a.question and b.answer == "[0, 6.9]"
    assert loaded.missing_videos == ["AB12C#3"]
    (d / "charades_sta_test.txt").write_text("3MSZA 24.3##no end time\n")
    with pytest.raises(BenchmarkError, match="line 1"):
        load_benchmark("charades", d)


def test_synthvt_rl_rows(tmp_path, clip):
    d = bench_dir(tmp_path, "synthvt", clip, ["videos/test_00000.mp4"])
    loaded = load_benchmark("synthvt", d)
    mcq, tvg, oe = loaded.samples
    assert [s.question_type for s in loaded.samples] == ["mcq", "tvg", "oe"]
    assert mcq.id == "test_00000-q0" and mcq.answer == "B" and mcq.options[1] == "B. blue"
    assert "<video>" not in mcq.question and mcq.question.startswith("What colour was the square?")
    assert tvg.answer == "[12, 18.5]" and oe.extras["task"] == "name"
    assert Path(mcq.video_path) == d / "videos" / "test_00000.mp4"


def test_clear_errors_for_bad_input(tmp_path):
    with pytest.raises(BenchmarkError, match="unknown benchmark"):
        load_benchmark("imagenet", tmp_path)
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_benchmark("lvbench", tmp_path / "nowhere")
    with pytest.raises(BenchmarkError, match="lvb_val.json"):
        load_benchmark("longvideobench", tmp_path)
    with pytest.raises(BenchmarkError, match="video directory"):
        load_benchmark("charades", FIX / "charades", tmp_path / "no-videos")
    (tmp_path / "lvb_val.json").write_text("{not json")
    with pytest.raises(BenchmarkError, match="not valid JSON"):
        load_benchmark("longvideobench", tmp_path)


def test_video_finder_extensions_and_ambiguity(tmp_path, clip):
    for rel in ("a/x.mp4", "b/x.mp4", "c/only.mkv"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, tmp_path / rel)
    f = VideoFinder([tmp_path])
    assert f.find("a/x") == tmp_path / "a" / "x.mp4"
    assert f.find("x.mp4") is None  # two files named x.mp4: never guess
    assert f.find("only") == tmp_path / "c" / "only.mkv"  # unique name anywhere below the root


@pytest.mark.parametrize("opts, want", [
    (["(A) one", "(B) two"], ["A. one", "B. two"]),
    (["A. one", "B) two"], ["A. one", "B. two"]),
    (["one", "two"], ["A. one", "B. two"]),
])
def test_mcq_text(opts, want):
    q, got = mcq_text(" Which? ", opts)
    assert got == want and q == "Which?\n" + "\n".join(want)
