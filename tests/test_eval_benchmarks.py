"""Benchmark loaders against excerpts of the benchmarks' real annotation files (tests/fixtures/eval/,
sources in its README.md), with real (tiny) video files placed where the archives unpack them."""

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.eval.benchmarks import BENCHMARKS, BenchmarkError, VideoFinder, load_benchmark, mcq_text
from paravt.eval.metrics import score_prediction
from paravt.subtitles import Subtitles, for_frames
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


def by_id(loaded):
    return {s.id: s for s in loaded.samples}


def test_every_benchmark_has_a_fixture_test():
    assert set(BENCHMARKS) == {"videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu", "mmvu_all",
                               "charades", "synthvt"}


# ----------------------------------------------------------------------------------------------
# Video-MME


VMME_VIDEOS = ["data/fFjv93ACGo8.mp4", "data/ZCFkWDdmXG8.mp4", "data/Ry2dJuJ-9UE.mp4"]


def test_videomme_parquet_real_rows_and_videos_in_data(tmp_path, clip):
    d = bench_dir(tmp_path, "videomme", clip, VMME_VIDEOS)
    schema = pq.read_schema(d / "videomme" / "test-00000-of-00001.parquet")
    assert schema.field("options").type == pa.list_(pa.string()) and schema.field("answer").type == pa.string()
    loaded = load_benchmark("videomme", d)
    assert [s.id for s in loaded.samples] == ["001-1", "001-2", "001-3", "336-1", "658-2"]
    assert [(m.id, Path(m.looked_for).name) for m in loaded.missing] == [("002-1", "N1cdUjctpG8.mp4")]
    s = loaded.samples[0]
    assert s.question == ("When demonstrating the Germany modern Christmas tree is initially decorated with apples, "
                          "candles and berries, which kind of the decoration has the largest number?\nA. Apples.\n"
                          "B. Candles.\nC. Berries.\nD. The three kinds are of the same number.")
    assert s.answer == "C" and s.question_type == "mcq" and len(s.options) == 4 and s.subtitles is None
    assert s.extras["duration"] == "short" and s.extras["task"] == "Counting Problem" and s.extras["video_id"] == "001"
    assert Path(s.video_path) == d / "data" / "fFjv93ACGo8.mp4"
    assert [(x.extras["duration"], x.answer) for x in loaded.samples[3:]] == [("medium", "B"), ("long", "B")]


def _fields(loaded):
    return [(s.id, s.question, s.answer, s.options, s.extras) for s in loaded.samples]


def test_videomme_json_export_is_accepted(tmp_path, clip):
    """The same rows as a JSON list (as mirrors export the parquet), as JSON lines, or named directly."""
    ref = load_benchmark("videomme", bench_dir(tmp_path, "videomme", clip, VMME_VIDEOS))
    d = bench_dir(tmp_path, "videomme_export", clip, VMME_VIDEOS)
    assert _fields(load_benchmark("videomme", d)) == _fields(ref)
    assert _fields(load_benchmark("videomme", d / "video_mme.json")) == _fields(ref)
    rows = json.loads((d / "video_mme.json").read_text())
    (d / "video_mme.json").unlink()
    (d / "videomme.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _fields(load_benchmark("videomme", d)) == _fields(ref)


def test_videomme_unsupported_files_name_the_accepted_formats(tmp_path):
    (tmp_path / "videomme.csv").write_text("video_id,question\n")
    for data in (tmp_path / "videomme.csv", tmp_path):
        with pytest.raises(BenchmarkError, match=r"accepted: .*parquet.*\.json: a list of rows; \.jsonl"):
            load_benchmark("videomme", data)
    (tmp_path / "export.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(BenchmarkError, match="not a list of rows; accepted"):
        load_benchmark("videomme", tmp_path)
    (tmp_path / "export.json").write_text(json.dumps([{"question_id": "001-1", "question": "Q?"}]))
    with pytest.raises(BenchmarkError, match="row 0: not a Video-MME row .*videoID.*accepted"):
        load_benchmark("videomme", tmp_path)


def test_videomme_sub_keeps_the_subtitles_at_the_sampled_frames(tmp_path, clip):
    """lmms-eval's videomme_w_subtitle: only cues shown at a sampled frame, not the whole .srt."""
    d = bench_dir(tmp_path, "videomme", clip, VMME_VIDEOS)
    loaded = load_benchmark("videomme_sub", d, d / "data")
    s = by_id(loaded)["001-1"]
    assert s.bench == "videomme_sub" and s.extras["has_subtitles"] is True
    assert isinstance(s.subtitles, Subtitles) and s.subtitles.protocol == "at_frames"
    assert len(s.subtitles.cues) == 5 and s.subtitles.cues[3].text == "constructed caption three,"
    per_frame, block = for_frames(s.subtitles, [1.0, 5.0, 10.0, 30.0])
    assert per_frame == ["", "", "", ""]
    assert block == ("[Music]\nconstructed caption one\nconstructed caption two overlaps one\n"
                     "constructed caption three,")
    assert for_frames(s.subtitles, [2.5, 21.0]) == (["", ""], "constructed caption one\n"
                                                              "constructed caption four, after a gap")
    other = by_id(loaded)["336-1"]
    assert other.subtitles is None and other.extras["has_subtitles"] is False
    row = json.loads(json.dumps(s.to_dict()))  # samples serialise to JSON, subtitles included
    assert Subtitles.from_dict(row["subtitles"]) == s.subtitles
    assert load_benchmark("videomme", d).samples[0].subtitles is None


# ----------------------------------------------------------------------------------------------
# LongVideoBench


LVB_VIDEOS = ["videos/86CxyhFV9MI.mp4", "videos/QJ6sjg7SXOQ.mp4", "videos/uJgZo4KxoZw.mp4"]


def test_longvideobench_real_rows(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip, LVB_VIDEOS)
    loaded = load_benchmark("longvideobench", d)
    got = by_id(loaded)
    assert list(got) == ["86CxyhFV9MI_0", "86CxyhFV9MI_1", "QJ6sjg7SXOQ_0", "uJgZo4KxoZw_0"]
    assert loaded.missing_videos == ["p7YxwveUrjI_0"]
    a = got["86CxyhFV9MI_0"]
    assert a.answer == "B" and a.options[1] == ("B. run away countless times, i was just scared, i still and front "
                                                "of our crown, like a world of souls,")
    assert a.extras["duration"] == "600" and a.extras["task"] == "TOS" and a.extras["level"] == "L2-Relation"
    assert got["86CxyhFV9MI_1"].answer == "C"
    e = got["QJ6sjg7SXOQ_0"]
    assert e.answer == "E" and len(e.options) == 5 and e.options[4].endswith("while facing the camera")
    assert got["uJgZo4KxoZw_0"].answer == "D" and got["uJgZo4KxoZw_0"].extras["duration"] == "15"
    assert Path(a.video_path) == d / "videos" / "86CxyhFV9MI.mp4"


def test_longvideobench_subtitles_interleaved_by_time(tmp_path, clip):
    """The official insert_subtitles_into_frames: a cue after the last frame at or before its
    midpoint, kept only if a frame lies inside it (a cue under 1 s widened to ± 0.5 s), times
    re-based by starting_timestamp_for_subtitles."""
    d = bench_dir(tmp_path, "longvideobench", clip, LVB_VIDEOS + ["videos/p7YxwveUrjI.mp4"])
    loaded = load_benchmark("longvideobench", d)
    got = by_id(loaded)
    a = got["86CxyhFV9MI_0"].subtitles
    assert a.protocol == "interleaved" and got["86CxyhFV9MI_1"].subtitles is a  # one file, read once
    assert for_frames(a, [0, 2, 4, 6, 8]) == (
        ["", "promisc has come to an end,", "", "in and", "run away countless times, i was just scared, i still"], "")
    clip_subs = got["uJgZo4KxoZw_0"].subtitles  # a 13.97 s clip starting at 186 s of its source
    assert [(c.start, c.end) for c in clip_subs.cues][:2] == [(-36.0, -34.0), (-2.0, 1.0)]
    assert for_frames(clip_subs, [0, 3, 6, 9, 12]) == (
        ["constructed: across the clip start", "constructed: inside the clip", "", "", ""], "")
    assert got["QJ6sjg7SXOQ_0"].subtitles is None and got["QJ6sjg7SXOQ_0"].extras["has_subtitles"] is False
    assert loaded.notes == {"subtitle file missing (question asked without subtitles)": 2}


def test_a_subtitle_file_named_outside_its_folder_is_never_read(tmp_path, clip):
    """A row's subtitle_path (LongVideoBench) or videoID (Video-MME's `{videoID}.srt`) that leaves the
    subtitle folder: the row is left out and counted, the file it names is not read (docs/data.md)."""
    d = bench_dir(tmp_path, "longvideobench", clip, LVB_VIDEOS)
    secret = tmp_path / "secret_en.json"
    shutil.copy(d / "subtitles" / "86CxyhFV9MI_en.json", secret)
    rows = json.loads((d / "lvb_val.json").read_text())
    rows[0]["subtitle_path"], rows[1]["subtitle_path"] = "../../secret_en.json", str(secret)
    (d / "lvb_val.json").write_text(json.dumps(rows))
    loaded = load_benchmark("longvideobench", d)
    assert "86CxyhFV9MI_0" not in by_id(loaded) and "86CxyhFV9MI_1" not in by_id(loaded)
    assert loaded.skipped == {"its subtitle file is named outside the subtitle folder (an absolute path or `..`)": 2}
    assert sorted(by_id(loaded)) == ["QJ6sjg7SXOQ_0", "uJgZo4KxoZw_0"]

    v = bench_dir(tmp_path, "videomme", clip, VMME_VIDEOS)
    rows = pq.read_table(next(v.rglob("*.parquet"))).to_pylist()
    rows[0]["videoID"] = "../../secret"
    pq.write_table(pa.Table.from_pylist(rows), next(v.rglob("*.parquet")))
    (tmp_path / "secret.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\nnot to be read\n")
    loaded = load_benchmark("videomme_sub", v)
    assert str(rows[0]["question_id"]) not in {s.id for s in loaded.samples} | {m.id for m in loaded.missing}
    assert loaded.skipped == {"its subtitle file is named outside the subtitle folder (an absolute path or `..`)": 1}
    assert not any(s.subtitles and "not to be read" in str(s.subtitles.cues) for s in loaded.samples)


def test_longvideobench_repeated_candidates_keep_their_positions(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip, ["videos/p7YxwveUrjI.mp4"])
    s = by_id(load_benchmark("longvideobench", d))["p7YxwveUrjI_0"]
    assert s.answer == "A" and s.options[1][3:] == s.options[2][3:] and s.options[2].startswith("C. First, a Black")


def test_longvideobench_hub_parquet_option_columns(tmp_path, clip):
    """The Hub's validation parquet has option0..option4 ("N/A" when unused), not candidates."""
    row = json.loads((FIX / "longvideobench" / "lvb_val.json").read_text())[0]
    cands = row.pop("candidates")
    row.update({f"option{i}": (cands + ["N/A"])[i] for i in range(5)})
    (tmp_path / "videos").mkdir()
    shutil.copy(clip, tmp_path / "videos" / "86CxyhFV9MI.mp4")
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "validation-00000-of-00001.parquet")
    (s,) = load_benchmark("longvideobench", tmp_path).samples
    assert s.answer == "B" and len(s.options) == 4 and s.subtitles is None


def test_longvideobench_bad_choice_names_the_row(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip)
    rows = json.loads((d / "lvb_val.json").read_text())
    rows[1]["correct_choice"] = 9
    (d / "lvb_val.json").write_text(json.dumps(rows))
    with pytest.raises(BenchmarkError, match="row 1.*correct_choice 9"):
        load_benchmark("longvideobench", d)


# ----------------------------------------------------------------------------------------------
# LVBench


def test_lvbench_jsonl_options_and_categories(tmp_path, clip):
    d = bench_dir(tmp_path, "lvbench", clip, ["videos/Cm73ma6Ibcs.mp4", "videos/Qw3rTy5uI7o.mp4"])
    loaded = load_benchmark("lvbench", d)
    real, a, b = loaded.samples
    assert real.id == "55" and real.answer == "D" and real.options == ["A. 1636", "B. 1366", "C. 1363", "D. 1633"]
    assert real.question.startswith("What year appears in the opening caption of the video?\nA. 1636")
    assert real.extras == {"task": ["key information retrieval"], "video_type": "cartoon",
                           "time_reference": "00:15-00:19"}
    assert a.id == "101" and a.answer == "B"
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


# ----------------------------------------------------------------------------------------------
# MLVU


MLVU_VIDEOS = ["video/1_plotQA/movie101_66.mp4", "video/1_plotQA/movie101_89.mp4", "video/1_plotQA/en_tv_10.mp4",
               "video/2_needle/needle_29.mp4", "video/2_needle/needle_4.mp4", "video/2_needle/needle_104.mp4",
               "video/3_ego/ego_11.mp4", "video/4_count/count_126.mp4", "video/7_topic_reasoning/movie101_89.mp4",
               "video/7_topic_reasoning/ego_11.mp4"]


def test_mlvu_dev_loads_with_an_answer_outside_the_candidates(tmp_path, clip):
    """2_needle.json row 34's answer is none of its candidates: the official script keeps the
    question with the letter "@", which no prediction matches. Kept, scored wrong, counted."""
    d = bench_dir(tmp_path, "mlvu", clip, MLVU_VIDEOS)
    loaded = load_benchmark("mlvu", d)
    got = by_id(loaded)
    assert len(loaded.samples) == 10 and loaded.missing == []
    assert loaded.skipped == {"generation task (no candidates)": 1}
    bad = got["2_needle-1"]  # row 34 of the real file
    assert bad.answer == "@" and bad.extras["answer_text"] == "Catching a flying drone quadcopter"
    assert bad.extras["answer_not_in_candidates"] is True and bad.options[1] == "B. Catching the drone"
    for pred in ["A", "B", "C", "D", "(B) Catching the drone", "Catching a flying drone quadcopter", "@"]:
        assert score_prediction(pred, bad.answer, "mcq", options=bad.options, question=bad.question) == 0.0
    assert loaded.notes["answer not among the candidates: kept, scored wrong (as the official script)"] == 1
    assert got["2_needle-0"].answer == "D" and got["2_needle-2"].answer == "C"
    assert got["1_plotQA-0"].answer == "A" and got["1_plotQA-0"].question.endswith("C. Green\nD. Blue")
    assert got["4_count-0"].answer == "B" and got["4_count-0"].extras["task"] == "count"
    assert got["2_needle-1"].extras["task"] == "findNeedle"


def test_mlvu_repeated_answer_takes_the_last_letter_as_the_official_script(tmp_path, clip):
    d = bench_dir(tmp_path, "mlvu", clip, MLVU_VIDEOS)
    loaded = load_benchmark("mlvu", d)
    got = by_id(loaded)
    tv = got["1_plotQA-2"]  # candidates Excited, Scared, Excited, Nervous; answer Excited
    assert tv.answer == "C" and tv.options[0] == "A. Excited" and tv.options[2] == "C. Excited"
    assert got["7_topic_reasoning-1"].answer == "D"  # Living room, Lounge, Hall, Living room
    assert loaded.notes["answer repeated among the candidates: the last one's letter (as the official script)"] == 2


def test_mlvu_videos_only_from_their_own_task_folder(tmp_path, clip):
    """ego_11.mp4 is in 3_ego and in 7_topic_reasoning (different files); movie101_89.mp4 in
    1_plotQA, 7_topic_reasoning and 9_summary. A question never runs on another task's file."""
    d = bench_dir(tmp_path, "mlvu", clip, ["video/7_topic_reasoning/ego_11.mp4",
                                           "video/7_topic_reasoning/movie101_89.mp4"])
    loaded = load_benchmark("mlvu", d)
    assert [s.id for s in loaded.samples] == ["7_topic_reasoning-0", "7_topic_reasoning-1"]
    missing = {m.id: m.looked_for for m in loaded.missing}
    assert Path(missing["3_ego-0"]).parts[-2:] == ("3_ego", "ego_11.mp4")
    assert Path(missing["1_plotQA-1"]).parts[-2:] == ("1_plotQA", "movie101_89.mp4")
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(clip, flat / "ego_11.mp4")
    assert load_benchmark("mlvu", d, flat).samples == []  # a bare file name is no task's file
    official = tmp_path / "official"  # choice_bench.py's layout: video/{task}/ without the number
    (official / "ego").mkdir(parents=True)
    shutil.copy(clip, official / "ego" / "ego_11.mp4")
    assert [s.id for s in load_benchmark("mlvu", d, official).samples] == ["3_ego-0"]


# ----------------------------------------------------------------------------------------------
# MMVU


def test_mmvu_real_rows_mcq_by_default_and_open_ended_on_request(tmp_path, clip):
    d = bench_dir(tmp_path, "mmvu", clip, ["videos/Chemistry/0.mp4", "videos/Chemistry/1.mp4", "videos/Law/1.mp4",
                                           "videos/Art/1.mp4"])
    mc = load_benchmark("mmvu", d)
    got = by_id(mc)
    assert list(got) == ["validation_1", "validation_64", "validation_80", "validation_184"]
    assert [got[i].answer for i in got] == ["A", "B", "D", "E"]
    s = got["validation_1"]
    assert s.extras["subject"] == "Chemistry" and len(s.options) == 5 and s.question_type == "mcq"
    assert Path(got["validation_64"].video_path) == d / "videos" / "Chemistry" / "1.mp4"
    assert mc.skipped == {"open-ended (use mmvu_all)": 1}
    both = load_benchmark("mmvu_all", d)
    oe = by_id(both)["validation_63"]
    assert oe.question_type == "oe" and oe.answer == "Silver" and oe.options == []


def test_mmvu_never_runs_a_question_on_another_subjects_video(tmp_path, clip):
    """Every subject has its own 1.mp4: with only Art/1.mp4 present, Chemistry's and Law's
    questions on their 1.mp4 are missing, not run on Art's."""
    d = bench_dir(tmp_path, "mmvu", clip, ["videos/Art/1.mp4"])
    loaded = load_benchmark("mmvu_all", d)
    assert [s.id for s in loaded.samples] == ["validation_184"]
    missing = {m.id: Path(m.looked_for).parts[-2:] for m in loaded.missing}
    assert missing == {"validation_1": ("Chemistry", "0.mp4"), "validation_63": ("Chemistry", "1.mp4"),
                       "validation_64": ("Chemistry", "1.mp4"), "validation_80": ("Law", "1.mp4")}


# ----------------------------------------------------------------------------------------------
# Charades-STA, SynthVT, errors, helpers


def test_charades_sta_real_lines(tmp_path, clip):
    d = bench_dir(tmp_path, "charades", clip, ["Charades_v1_480/3MSZA.mp4", "Charades_v1_480/VXJS4.mp4"])
    loaded = load_benchmark("charades", d)
    assert [s.id for s in loaded.samples] == ["3MSZA#1", "3MSZA#2", "3MSZA#3", "3MSZA#4", "VXJS4#7", "VXJS4#8"]
    a = loaded.samples[0]
    assert a.question_type == "tvg" and a.answer == "[24.3, 30.4]" and a.extras["span"] == [24.3, 30.4]
    assert a.question == 'When does this happen in the video: "person turn a light on"?'
    assert loaded.samples[4].answer == "[0, 3.4]"
    assert loaded.missing_videos == ["AMT7R#5", "YVKIV#6", "GBD1Y#9", "GBD1Y#10", "KVXJ9#11", "KVXJ9#12"]
    flat = tmp_path / "flat" / "nested"  # Charades ids are unique: found by name below --videos
    flat.mkdir(parents=True)
    shutil.copy(clip, flat / "AMT7R.mp4")
    assert [s.id for s in load_benchmark("charades", d, flat.parent).samples] == ["AMT7R#5"]
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


def test_video_finder_own_paths_and_unique_names(tmp_path, clip):
    for rel in ("a/x.mp4", "b/x.mp4", "c/only.mkv"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, tmp_path / rel)
    f = VideoFinder([tmp_path])
    assert f.find("a/x") == tmp_path / "a" / "x.mp4"
    assert f.find("x.mp4") is None and f.find("only") is None  # own paths only
    assert f.find_by_name("x.mp4") is None  # two files named x.mp4: never guess
    assert f.find_by_name("only") == tmp_path / "c" / "only.mkv"  # unique name anywhere below the root


@pytest.mark.parametrize("opts, want", [
    (["(A) one", "(B) two"], ["A. one", "B. two"]),
    (["A. one", "B) two"], ["A. one", "B. two"]),
    (["one", "two"], ["A. one", "B. two"]),
])
def test_mcq_text(opts, want):
    q, got = mcq_text(" Which? ", opts)
    assert got == want and q == "Which?\n" + "\n".join(want)


def test_samples_serialise_to_json(tmp_path, clip):
    d = bench_dir(tmp_path, "longvideobench", clip, LVB_VIDEOS)
    for s in load_benchmark("longvideobench", d).samples:
        back = json.loads(json.dumps(s.to_dict()))
        assert back["id"] == s.id and (back["subtitles"] is None) == (s.subtitles is None)
        assert back == asdict(s)
