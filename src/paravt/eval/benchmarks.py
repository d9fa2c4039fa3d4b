"""Benchmark loaders: each reads the benchmark's own published annotation files from a local
directory (as distributed on the Hugging Face Hub / the authors' repositories) and yields
`Sample`s. Field names follow those files; the notes above each loader say which file.
A sample whose video is missing is counted and skipped, never fatal."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

LETTERS = "ABCDEFGHIJ"


@dataclass
class Sample:
    id: str
    bench: str
    video: str
    question: str  # options included as "A. ..." lines for mcq
    answer: str  # a letter for mcq, "[s, e]" for tvg, text for oe
    question_type: str  # mcq | tvg | oe
    options: list[str] = field(default_factory=list)
    subtitles: str | None = None
    extras: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Loaded:
    samples: list[Sample]
    missing_videos: list[str]  # sample ids whose video file is absent


class BenchmarkError(ValueError):
    pass


def _options_text(question: str, options: list[str]) -> tuple[str, list[str]]:
    opts = []
    for i, o in enumerate(options):
        o = str(o).strip()
        opts.append(o if re.match(r"^[A-J][.)]\s", o) else f"{LETTERS[i]}. {o}")
    return question.strip() + "\n" + "\n".join(opts), opts


def _find_video(videos: Path, *names: str) -> Path | None:
    for n in names:
        if not n:
            continue
        p = videos / n
        if p.exists():
            return p
        for ext in (".mp4", ".mkv", ".webm", ".avi", ".mov"):
            q = videos / (n + ext)
            if q.exists():
                return q
    return None


def _read_json(path: Path):
    if not path.exists():
        raise BenchmarkError(f"annotation file {path} not found")
    return json.loads(path.read_text())


def _srt_text(path: Path) -> str | None:
    """Plain subtitle text from an .srt file (indices and time codes dropped)."""
    if not path.exists():
        return None
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        s = line.strip()
        if not s or s.isdigit() or "-->" in s:
            continue
        lines.append(re.sub(r"<[^>]+>", "", s))
    return " ".join(lines) or None


# ---- Video-MME: lmms-lab/Video-MME, videomme/test-*.parquet -----------------------------------
# columns: video_id, duration (short|medium|long), domain, sub_category, url, videoID, question_id,
# task_type, question, options (["A. ...", ...]), answer ("A"); subtitles in subtitle/{videoID}.srt
def load_videomme(data: Path, videos: Path, subtitles: bool = False) -> Iterator[tuple[Sample, bool]]:
    import pyarrow.parquet as pq

    files = sorted(data.glob("**/test*.parquet")) or sorted(data.glob("**/*.parquet"))
    if not files:
        raise BenchmarkError(f"no Video-MME parquet under {data}")
    for f in files:
        for r in pq.read_table(f).to_pylist():
            q, opts = _options_text(r["question"], list(r["options"]))
            vid = _find_video(videos, r["videoID"], r.get("video_id", ""))
            sub = _srt_text(data / "subtitle" / f"{r['videoID']}.srt") if subtitles else None
            yield Sample(id=str(r["question_id"]), bench="videomme_sub" if subtitles else "videomme",
                         video=str(vid or videos / r["videoID"]), question=q, answer=str(r["answer"]).strip(),
                         question_type="mcq", options=opts, subtitles=sub,
                         extras={"duration": r.get("duration"), "domain": r.get("domain"),
                                 "task": r.get("task_type"), "sub_category": r.get("sub_category")}), vid is not None


# ---- LongVideoBench: longvideobench/LongVideoBench, lvb_val.json --------------------------------
# keys: id, video_id, video_path, question, candidates [..], correct_choice (int), duration_group,
# question_category, topic_category, subtitle_path, starting_timestamp_for_subtitles, duration
def load_longvideobench(data: Path, videos: Path) -> Iterator[tuple[Sample, bool]]:
    for r in _read_json(data / "lvb_val.json"):
        q, opts = _options_text(r["question"], r["candidates"])
        vid = _find_video(videos, r.get("video_path", ""), r.get("video_id", ""))
        yield Sample(id=str(r["id"]), bench="longvideobench", video=str(vid or videos / r.get("video_path", "")),
                     question=q, answer=LETTERS[int(r["correct_choice"])], question_type="mcq", options=opts,
                     extras={"duration_group": r.get("duration_group"), "task": r.get("question_category"),
                             "topic": r.get("topic_category")}), vid is not None


# ---- LVBench: THUDM/LVBench, video_info.meta.jsonl ------------------------------------------------
# one line per video: {key, type, qa: [{uid, question ("...\n(A) ...\n(B) ..."), answer, question_type,
# time_reference}], video_info}
def load_lvbench(data: Path, videos: Path) -> Iterator[tuple[Sample, bool]]:
    path = data / "video_info.meta.jsonl"
    if not path.exists():
        raise BenchmarkError(f"annotation file {path} not found")
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        v = json.loads(line)
        vid = _find_video(videos, v["key"])
        for qa in v["qa"]:
            text = qa["question"]
            opts = re.findall(r"^\(([A-D])\)\s*(.*)$", text, flags=re.M)
            stem = re.split(r"\n\([A-D]\)", text)[0]
            q, options = _options_text(stem, [f"{a}. {b}" for a, b in opts]) if opts else (text, [])
            yield Sample(id=str(qa["uid"]), bench="lvbench", video=str(vid or videos / v["key"]), question=q,
                         answer=str(qa["answer"]).strip("() "), question_type="mcq", options=options,
                         extras={"task": ",".join(qa.get("question_type") or []), "video_type": v.get("type")}), \
                vid is not None


# ---- MLVU dev: MLVU/MVLU, json/{1_plotQA,...}.json --------------------------------------------------
# each file a list of {video, duration, question, candidates, answer (text of the right candidate),
# question_type}; videos under video/{task folder}/
def load_mlvu(data: Path, videos: Path) -> Iterator[tuple[Sample, bool]]:
    files = sorted((data / "json").glob("*.json")) or sorted(data.glob("*.json"))
    if not files:
        raise BenchmarkError(f"no MLVU json files under {data}/json")
    for f in files:
        task_dir = f.stem
        for i, r in enumerate(_read_json(f)):
            if "candidates" not in r:
                continue  # generation tasks are not part of the multiple-choice dev split
            q, opts = _options_text(r["question"], r["candidates"])
            answer = LETTERS[list(r["candidates"]).index(r["answer"])]
            vid = _find_video(videos / task_dir, r["video"]) or _find_video(videos, r["video"])
            yield Sample(id=f"{task_dir}-{i}", bench="mlvu", video=str(vid or videos / task_dir / r["video"]),
                         question=q, answer=answer, question_type="mcq", options=opts,
                         extras={"task": r.get("question_type", task_dir), "duration_s": r.get("duration")}), \
                vid is not None


# ---- MMVU validation: yale-nlp/MMVU, validation.json -------------------------------------------------
# list of {id, question, choices ({"A": ..} or {}), answer, question_type (multiple-choice|open-ended),
# video (URL ending in videos/{subject}/{n}.mp4), metadata {subject, ...}}
def load_mmvu(data: Path, videos: Path) -> Iterator[tuple[Sample, bool]]:
    for r in _read_json(data / "validation.json"):
        rel = r["video"].split("/videos/")[-1] if "/videos/" in r["video"] else Path(r["video"]).name
        vid = _find_video(videos, rel, Path(rel).name)
        meta = r.get("metadata") or {}
        if r.get("question_type") == "multiple-choice" and r.get("choices"):
            keys = sorted(r["choices"])
            q, opts = _options_text(r["question"], [f"{k}. {r['choices'][k]}" for k in keys])
            yield Sample(id=str(r["id"]), bench="mmvu", video=str(vid or videos / rel), question=q,
                         answer=str(r["answer"]).strip(), question_type="mcq", options=opts,
                         extras={"subject": meta.get("subject")}), vid is not None
        else:
            yield Sample(id=str(r["id"]), bench="mmvu", video=str(vid or videos / rel), question=r["question"],
                         answer=str(r["answer"]), question_type="oe", extras={"subject": meta.get("subject")}), \
                vid is not None


# ---- Charades-STA test: charades_sta_test.txt, lines "VID START END##sentence" -----------------------
def load_charades(data: Path, videos: Path) -> Iterator[tuple[Sample, bool]]:
    path = data / "charades_sta_test.txt"
    if not path.exists():
        raise BenchmarkError(f"annotation file {path} not found")
    for i, line in enumerate(path.read_text().splitlines()):
        if "##" not in line:
            continue
        head, sentence = line.split("##", 1)
        vid_id, s, e = head.split()
        vid = _find_video(videos, vid_id)
        q = f'When does this happen in the video: "{sentence.strip().rstrip(".")}"?'
        yield Sample(id=f"{vid_id}-{i}", bench="charades", video=str(vid or videos / vid_id), question=q,
                     answer=f"[{float(s):g}, {float(e):g}]", question_type="tvg",
                     extras={"query": sentence.strip()}), vid is not None


# ---- SynthVT: ParaVT-Parquet RL rows (paravt synth) --------------------------------------------------
def load_synth(data: Path, videos: Path | None) -> Iterator[tuple[Sample, bool]]:
    from paravt.data import load_rl_rows

    path = data / "rl.parquet" if data.is_dir() else data
    for s in load_rl_rows(path, videos or path.parent):
        yield Sample(id=s.id, bench="synthvt", video=s.video, question=s.question, answer=s.answer,
                     question_type=s.question_type, options=list(s.extra.get("options") or []),
                     extras={"task": s.extra.get("kind"), "needs_event": s.extra.get("needs_event")}), \
            Path(s.video).exists()


LOADERS: dict[str, Callable] = {
    "videomme": lambda d, v: load_videomme(d, v, subtitles=False),
    "videomme_sub": lambda d, v: load_videomme(d, v, subtitles=True),
    "longvideobench": load_longvideobench,
    "lvbench": load_lvbench,
    "mlvu": load_mlvu,
    "mmvu": load_mmvu,
    "charades": load_charades,
    "synthvt": load_synth,
}


def load_benchmark(name: str, data: str | Path, videos: str | Path | None = None) -> Loaded:
    if name not in LOADERS:
        raise BenchmarkError(f"unknown benchmark {name!r}; choose from {', '.join(LOADERS)}")
    data = Path(data)
    videos = Path(videos) if videos else data
    samples, missing = [], []
    for sample, present in LOADERS[name](data, videos):
        (samples if present else missing).append(sample if present else sample.id)
    return Loaded(samples=samples, missing_videos=missing)
