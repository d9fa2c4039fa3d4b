"""Benchmark loaders (the splits of the paper's Table 1, and SynthVT): each reads a benchmark's own
published annotation files from a local directory, exactly as distributed (Hugging Face Hub or the
authors' repositories), and yields `Sample`s. The comment above each loader names the file and its
fields and where that schema comes from. Nothing is downloaded here.

A sample whose video file is absent is reported (id and where it was looked for) and skipped,
never paired with another sample's file of the same name; a malformed annotation row is a
`BenchmarkError` that names the file and the row.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from paravt.protocol.options import LETTERS, split_marker
from paravt.subtitles import Subtitles, load_lvb_subtitles, load_srt

VIDEO_EXTS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v")


class BenchmarkError(ValueError):
    """Annotation files missing or not in the benchmark's published format."""


@dataclass
class Sample:
    id: str
    bench: str
    video_path: str
    question: str  # for mcq the options follow as "A. ..." lines
    answer: str  # mcq: a letter ("@": none, see _mlvu_letter); tvg: "[s, e]" seconds; oe: the reference text
    question_type: str  # mcq | tvg | oe
    options: list[str] = field(default_factory=list)  # "A. ..." strings (mcq)
    subtitles: Subtitles | None = None  # timed cues and the benchmark's protocol for showing them
    extras: dict = field(default_factory=dict)  # duration class, task, subject, ... (for breakdowns)

    @property
    def video(self) -> str:  # older name of video_path
        return self.video_path

    @video.setter
    def video(self, value: str) -> None:
        self.video_path = value

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MissingVideo:
    id: str
    looked_for: str  # the file (or name) that was not found


@dataclass
class Loaded:
    bench: str
    samples: list[Sample]
    missing: list[MissingVideo] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (rows outside the split's protocol)
    notes: dict[str, int] = field(default_factory=dict)  # reason -> count (rows kept, but read specially)

    @property
    def missing_videos(self) -> list[str]:
        return [m.id for m in self.missing]


# ----------------------------------------------------------------------------------------------
# shared helpers


def mcq_text(question: str, options: list[str]) -> tuple[str, list[str]]:
    """The question followed by one "A. option" line per option (letters added where absent)."""
    opts = []
    for i, o in enumerate(options):
        o = str(o).strip()
        marked = split_marker(o)
        opts.append(f"{marked[0]}. {marked[1]}" if marked else f"{LETTERS[i]}. {o}")
    return question.strip() + "\n" + "\n".join(opts), opts


def _check_letter(answer: str, options: list[str], where: str) -> str:
    a = str(answer).strip().strip("()").strip().upper()
    if len(a) != 1 or a not in LETTERS[: len(options)]:
        raise BenchmarkError(f"{where}: answer {answer!r} is not one of the {len(options)} option letters")
    return a


def _lettered(candidates: list) -> list[str]:
    """Letters by position, whatever a candidate's text starts with ("D.C." stays a text)."""
    return [f"{LETTERS[i]}. {c}" for i, c in enumerate(candidates)]


def _count(tally: dict[str, int], reason: str) -> None:
    tally[reason] = tally.get(reason, 0) + 1


SUBTITLE_OUT = "its subtitle file is named outside the subtitle folder (an absolute path or `..`)"


def _inside(name: str) -> bool:
    """Whether a file name a row gives stays in the folder it is looked for in (docs/data.md): a
    subtitle file is read at load time, before any media root could hold it."""
    path = Path(name.replace("\\", "/"))
    return not path.is_absolute() and ".." not in path.parts


class VideoFinder:
    """Finds a sample's video under the user's video directories.

    `find` tries only the sample's own relative paths (with the usual extensions) under each
    root. `find_by_name` also accepts a file of that name anywhere below the roots when exactly
    one exists: a convenience for flat or re-nested folders, safe only where the benchmark's file
    names are unique ids (YouTube ids, Charades ids). MMVU (0.mp4, 1.mp4 in every subject) and
    MLVU (the same names in several task folders) must not use it: a sample whose own file is
    absent would silently run on another sample's video."""

    def __init__(self, roots: Iterable[Path], max_depth: int = 3):
        self.roots = [Path(r) for r in roots]
        self.max_depth = max_depth
        self._index: dict[str, list[Path]] | None = None

    def find(self, *rel_paths: str) -> Path | None:
        for root in self.roots:
            for n in (n for n in rel_paths if n):
                p = root / n
                if p.is_file():
                    return p
                if p.suffix.lower() not in VIDEO_EXTS:
                    for ext in VIDEO_EXTS:
                        q = root / (n + ext)
                        if q.is_file():
                            return q
        return None

    def find_by_name(self, name: str) -> Path | None:
        """The only file named `name` (any video extension) below the roots, else None."""
        name = Path(name).name
        key = Path(name).stem if Path(name).suffix.lower() in VIDEO_EXTS else name
        hits = self._stems().get(key, [])
        return hits[0] if len(hits) == 1 else None

    def _stems(self) -> dict[str, list[Path]]:
        if self._index is None:
            self._index = {}
            seen: set[Path] = set()
            for root in self.roots:
                if not root.is_dir():
                    continue
                base = len(root.parts)
                for dirpath, dirnames, filenames in os.walk(root):
                    if len(Path(dirpath).parts) - base >= self.max_depth:
                        dirnames[:] = []
                    for f in filenames:
                        p = Path(dirpath) / f
                        if p.suffix.lower() in VIDEO_EXTS and p not in seen:
                            seen.add(p)
                            self._index.setdefault(p.stem, []).append(p)
        return self._index

    def expected(self, name: str) -> str:
        return str((self.roots[0] if self.roots else Path(".")) / name)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchmarkError(f"annotation file {path} not found") from None
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"{path} is not valid JSON: {e}") from None


def _find_file(data: Path, *patterns: str) -> Path:
    """The first file matching a pattern, at the top of `data` or below it (or `data` itself)."""
    if data.is_file():
        return data
    for pat in patterns:
        hits = sorted(data.glob(pat)) or sorted(data.glob("**/" + pat))
        if hits:
            return hits[0]
    raise BenchmarkError(f"none of {', '.join(patterns)} found under {data}")


# ----------------------------------------------------------------------------------------------
# loaders. Each is `loader(data, finder, out) -> Iterator[Sample]`; it counts rows it leaves out
# in out.skipped and rows it keeps but reads specially in out.notes.

Loader = Callable[[Path, VideoFinder, Loaded], Iterator[Sample]]

VIDEOMME_FIELDS = ("video_id", "duration", "domain", "sub_category", "url", "videoID", "question_id", "task_type",
                   "question", "options", "answer")
VIDEOMME_ACCEPTED = ("the HF parquet (videomme/test-00000-of-00001.parquet), or a JSON export of its rows "
                     "(.json: a list of rows; .jsonl: one row per line) with fields " + ", ".join(VIDEOMME_FIELDS))


def _videomme_file(data: Path) -> Path:
    """The annotation file: `data` itself, or the parquet below it, else a .jsonl/.json at its top."""
    if data.is_file():
        if data.suffix.lower() in (".parquet", ".json", ".jsonl"):
            return data
        raise BenchmarkError(f"{data} is not a Video-MME annotation file; accepted: {VIDEOMME_ACCEPTED}")
    for pat in ("videomme/test-*.parquet", "test-*.parquet", "*.parquet"):
        hits = sorted(data.glob(pat)) or sorted(data.glob("**/" + pat))
        if hits:
            return hits[0]
    hits = sorted(data.glob("*.jsonl")) or sorted(data.glob("*.json"))
    if hits:
        return hits[0]
    raise BenchmarkError(f"no Video-MME annotation file under {data}; accepted: {VIDEOMME_ACCEPTED}")


def _videomme_rows(path: Path) -> list:
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix.lower() == ".jsonl":
        rows = []
        for ln, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise BenchmarkError(f"{path} line {ln} is not JSON ({e}); accepted: {VIDEOMME_ACCEPTED}") from None
        return rows
    rows = _read_json(path)
    if not isinstance(rows, list):
        raise BenchmarkError(f"{path} holds a {type(rows).__name__}, not a list of rows; accepted: {VIDEOMME_ACCEPTED}")
    return rows


# Video-MME (lmms-lab/Video-MME on the HF Hub): videomme/test-00000-of-00001.parquet with string
# columns video_id ("001"), duration ("short" | "medium" | "long"), domain, sub_category, url,
# videoID (the YouTube id), question_id ("001-1"), task_type, question, options (list of "A. ..."
# strings) and answer ("A".."D"), per the dataset card's `dataset_info.features`. Mirrors export the
# same rows as JSON (a list; e.g. plnguyen2908/Video-MME-viz data/video_mme.json) or JSON lines
# (showlab/livecc's videomme.jsonl); all three are read. Subtitles are subtitle/{videoID}.srt
# (subtitle.zip; YouTube captions, each cue wrapped in <font color="white" size=".72c">), kept at
# the sampled frames as lmms-eval's videomme_w_subtitle does (paravt.subtitles); not every video
# has them. Videos are data/{videoID}.mp4 (videos_chunked_*.zip); videoID is unique, so a flat or
# re-nested folder is searched by name too. Verified against EvolvingLMMs-Lab/lmms-eval
# lmms_eval/tasks/videomme/utils.py and the rows of the JSON export named above.
def _videomme(data: Path, finder: VideoFinder, out: Loaded, subtitles: bool) -> Iterator[Sample]:
    path = _videomme_file(data)
    base = data if data.is_dir() else data.parent
    sub_dirs = [d for d in (base / "subtitle", base / "subtitles", base.parent / "subtitle", base) if d.is_dir()]
    subs: dict[str, Subtitles | None] = {}
    for i, r in enumerate(_videomme_rows(path)):
        where = f"{path} row {i}"
        absent = [k for k in ("videoID", "question_id", "question", "options", "answer")
                  if not isinstance(r, dict) or k not in r]
        if absent:
            raise BenchmarkError(f"{where}: not a Video-MME row (no {', '.join(absent)}); "
                                 f"accepted: {VIDEOMME_ACCEPTED}")
        try:
            q, opts = mcq_text(r["question"], list(r["options"]))
            vid = str(r["videoID"])
        except TypeError as e:
            raise BenchmarkError(f"{where}: not a Video-MME row ({type(e).__name__}: {e})") from None
        answer = _check_letter(r["answer"], opts, where)
        sub = None
        if subtitles:
            if not _inside(f"{vid}.srt"):
                _count(out.skipped, SUBTITLE_OUT)
                continue
            if vid not in subs:
                subs[vid] = next((t for d in sub_dirs if (t := load_srt(d / f"{vid}.srt"))), None)
            sub = subs[vid]
        video = finder.find(vid, f"data/{vid}") or finder.find_by_name(vid)
        yield Sample(id=str(r["question_id"]), bench="videomme_sub" if subtitles else "videomme",
                     video_path=str(video or finder.expected(vid + ".mp4")), question=q, answer=answer,
                     question_type="mcq", options=opts, subtitles=sub,
                     extras={"duration": r.get("duration"), "task": r.get("task_type"), "domain": r.get("domain"),
                             "sub_category": r.get("sub_category"), "video_id": r.get("video_id"),
                             **({"has_subtitles": sub is not None} if subtitles else {})})


def _lvb_candidates(r: dict) -> list:
    """`candidates` (lvb_val.json), or option0..option4 padded with "N/A" (the Hub's parquet, as
    lmms-eval's longvideobench task reads it)."""
    if "candidates" in r:
        return list(r["candidates"])
    return [r[f"option{i}"] for i in range(5) if r.get(f"option{i}") not in (None, "N/A")]


def _lvb_subtitles(dirs: list[Path], name: str, offset: float, duration: float, where: str) -> Subtitles | None:
    try:
        return next((t for d in dirs if name and (t := load_lvb_subtitles(d / name, offset, duration))), None)
    except ValueError as e:
        raise BenchmarkError(f"{where}: subtitle file {e}") from None


# LongVideoBench (longvideobench/LongVideoBench): lvb_val.json, a list of objects with keys video_id,
# question, question_wo_referring_query, candidates (list of str), correct_choice (int index),
# position, topic_category, question_category, level, id, video_path ("{video_id}.mp4" under
# videos/), subtitle_path ("{video_id}_en.json" under subtitles/), duration_group (15 | 60 | 600 |
# 3600), starting_timestamp_for_subtitles (where the clip starts on the source video's subtitle
# track), duration, view_count, type -- as read by the authors' longvideobench/longvideobench_dataset.py,
# which asks `question` with "A. ..." options and interleaves the subtitles with the frames by time
# (paravt.subtitles); checked on the rows of lvb_val.json as stored in lwpyh/answer-entropy-zoom.
# The Hub's validation-*.parquet has option0..option4 instead of candidates (lmms-eval
# lmms_eval/tasks/longvideobench/utils.py). Video ids are unique, so videos are also found by name.
def _longvideobench(data: Path, finder: VideoFinder, out: Loaded) -> Iterator[Sample]:
    path = _find_file(data, "lvb_val.json", "validation-*.parquet")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        rows = _read_json(path)
    base = path.parent
    sub_dirs = [d for d in (base / "subtitles", base) if d.is_dir()]
    subs: dict[tuple, Subtitles | None] = {}
    for i, r in enumerate(rows):
        where = f"{path} row {i}"
        try:
            q, opts = mcq_text(r["question"], _lettered(_lvb_candidates(r)))
            choice = int(r["correct_choice"])
            rel = r.get("video_path") or f"{r['video_id']}.mp4"
            sid = str(r["id"])
            key = (r.get("subtitle_path") or "", float(r.get("starting_timestamp_for_subtitles") or 0),
                   float(r.get("duration") or 0))
        except (KeyError, TypeError, ValueError) as e:
            raise BenchmarkError(f"{where}: not a LongVideoBench row ({type(e).__name__}: {e})") from None
        if not 0 <= choice < len(opts):
            raise BenchmarkError(f"{where}: correct_choice {choice} outside the {len(opts)} candidates")
        if not _inside(key[0]):
            _count(out.skipped, SUBTITLE_OUT)
            continue
        if key not in subs:  # several questions share a video's subtitle file: read it once
            subs[key] = _lvb_subtitles(sub_dirs, *key, where)
        if subs[key] is None:
            _count(out.notes, "subtitle file missing (question asked without subtitles)")
        video = finder.find(rel, f"videos/{rel}") or finder.find_by_name(rel)
        yield Sample(id=sid, bench="longvideobench", video_path=str(video or finder.expected(rel)), question=q,
                     answer=LETTERS[choice], question_type="mcq", options=opts, subtitles=subs[key],
                     extras={"duration": None if r.get("duration_group") is None else str(r["duration_group"]),
                             "task": r.get("question_category"),
                             "topic": r.get("topic_category"), "level": r.get("level"),
                             "duration_s": r.get("duration"), "has_subtitles": subs[key] is not None})


def _video2dataset_map(roots: list[Path]) -> dict[str, Path]:
    """YouTube key -> file for videos fetched with video2dataset, the route THUDM/LVBench's
    scripts/download.sh takes: shards NNNNN/ named by its own keys, with NNNNN.parquet holding
    each file's `url` and `key`."""
    out: dict[str, Path] = {}
    for root in roots:
        for shard in sorted(root.glob("*.parquet")) if root.is_dir() else []:
            try:
                import pyarrow.parquet as pq

                t = pq.read_table(shard, columns=["url", "key"]).to_pylist()
            except Exception:  # noqa: BLE001 - not a video2dataset shard table: ignore it
                continue
            for r in t:
                if r.get("url") and r.get("key"):
                    out[str(r["url"]).split("v=")[-1].split("&")[0]] = root / shard.stem / f"{r['key']}.mp4"
    return out


# LVBench (THUDM/LVBench): video_info.meta.jsonl, one JSON object per video with key (YouTube id),
# type (video category), video_info, and qa: a list of {uid, question (the stem, then one
# "(A) ..." line per option), answer ("A".."D"), question_type (list of categories such as
# "key information retrieval", "temporal grounding"), time_reference ("00:15-00:19")} -- as read by
# the authors' lvbench/metrics/compute_accuracy.py and scripts/save_video_txt.py (the file itself is
# only on the HF Hub; one real QA is quoted in Philip-2000/MyLm MyLm/LmBenches/QA.py). Accuracy per
# category counts a question in each of its categories, as the official script does. Keys are
# unique YouTube ids, so videos are also found by name, or through a video2dataset shard table.
def _lvbench(data: Path, finder: VideoFinder, out: Loaded) -> Iterator[Sample]:
    path = _find_file(data, "video_info.meta.jsonl", "*.jsonl")
    v2d = _video2dataset_map(finder.roots)
    for ln, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {ln}"
        try:
            v = json.loads(line)
            key, qas = str(v["key"]), v["qa"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BenchmarkError(f"{where}: not an LVBench video line ({type(e).__name__}: {e})") from None
        video = finder.find(key, f"videos/{key}", f"all_videos/{key}")
        if video is None and key in v2d and v2d[key].is_file():
            video = v2d[key]
        video = video or finder.find_by_name(key)
        for j, qa in enumerate(qas):
            try:
                text = qa["question"]
                opts = re.findall(r"^\s*\(([A-J])\)\s*(.*?)\s*$", text, flags=re.M)
                stem = re.split(r"\n\s*\([A-J]\)", text, maxsplit=1)[0]
                q, options = mcq_text(stem, [f"{a}. {b}" for a, b in opts])
                uid = str(qa["uid"])
                answer = _check_letter(qa["answer"], options, f"{where} qa {j}")
            except (KeyError, TypeError) as e:
                raise BenchmarkError(f"{where} qa {j}: not an LVBench question ({type(e).__name__}: {e})") from None
            if not opts:
                raise BenchmarkError(f"{where} qa {j}: no '(A) ...' option lines in the question")
            cats = qa.get("question_type") or []
            yield Sample(id=uid, bench="lvbench", video_path=str(video or finder.expected(key + ".mp4")), question=q,
                         answer=answer, question_type="mcq", options=options,
                         extras={"task": list(cats) if isinstance(cats, list) else [str(cats)],
                                 "video_type": v.get("type"), "time_reference": qa.get("time_reference")})


MLVU_NO_ANSWER = "@"  # the official letter for an answer outside the candidates: chr(ord("A") - 1)


def _mlvu_letter(candidates: list, answer, notes: dict[str, int]) -> str:
    """The official choice_bench.py `qa_template`: the letter of the LAST candidate equal to the
    answer (its loop never breaks), "@" when none is (then no prediction can match)."""
    hits = [i for i, c in enumerate(candidates) if c == answer]
    if not hits:
        _count(notes, "answer not among the candidates: kept, scored wrong (as the official script)")
        return MLVU_NO_ANSWER
    if len(hits) > 1:
        _count(notes, "answer repeated among the candidates: the last one's letter (as the official script)")
    return LETTERS[hits[-1]]


# MLVU dev (JUNJIE99/MLVU data/*.json, the same files as MLVU/MVLU's MLVU/json/ on the HF Hub):
# {1_plotQA, 2_needle, 3_ego, 4_count, 5_order, 6_anomaly_reco, 7_topic_reasoning, 8_sub_scene,
# 9_summary}.json, each a list of {video, duration, question, candidates (4 str), answer (the text
# of the right candidate), question_type}; 8 and 9 have no candidates. Read as the authors'
# evaluation/multiple_choice_evaluation/choice_bench.py does: "(A) candidate" options, the answer
# text mapped to a letter by `_mlvu_letter` -- rows whose answer is no candidate (2_needle rows 34
# and 338) stay in, scored wrong, and a repeated answer candidate takes the last letter. 8 and 9
# are generation tasks outside the multiple-choice dev score: skipped and counted. The same file
# name recurs in several task folders (ego_11.mp4 in 3_ego and 7_topic_reasoning, not the same
# file), so a video is looked for only in its own task's folder: MLVU/video/{stem}/ as on the Hub,
# or video/{task}/ (count, ego, needle, ...) as choice_bench.py names them. The official dev figure
# (M-Avg) is the mean of the per-task accuracies: metrics reports it.
def _mlvu(data: Path, finder: VideoFinder, out: Loaded) -> Iterator[Sample]:
    root = data / "MLVU" if (data / "MLVU" / "json").is_dir() else data
    files = sorted((root / "json").glob("*.json")) or sorted(root.glob("*.json"))
    if not files:
        raise BenchmarkError(f"no MLVU json files under {root}/json")
    for f in files:
        rows = _read_json(f)
        if not isinstance(rows, list):
            raise BenchmarkError(f"{f}: expected a list of questions")
        task_dir = f.stem.split("_", 1)[-1]  # 2_needle -> needle
        for i, r in enumerate(rows):
            where = f"{f} row {i}"
            if not r.get("candidates"):
                _count(out.skipped, "generation task (no candidates)")
                continue
            try:
                cands = list(r["candidates"])
                q, opts = mcq_text(r["question"], _lettered(cands))
                answer = _mlvu_letter(cands, r["answer"], out.notes)
                name = r["video"]
            except (KeyError, TypeError) as e:
                raise BenchmarkError(f"{where}: not an MLVU row ({type(e).__name__}: {e})") from None
            own = [f"{d}/{name}" for d in (f.stem, task_dir)]
            video = finder.find(*own, *(f"video/{o}" for o in own), *(f"MLVU/video/{o}" for o in own))
            yield Sample(id=f"{f.stem}-{i}", bench="mlvu", video_path=str(video or finder.expected(own[0])),
                         question=q, answer=answer, question_type="mcq", options=opts,
                         extras={"task": r.get("question_type") or f.stem, "duration_s": r.get("duration"),
                                 "answer_text": r["answer"],
                                 **({"answer_not_in_candidates": True} if answer == MLVU_NO_ANSWER else {})})


# MMVU validation (yale-nlp/MMVU, data/validation.json): a list of {id, video (URL ending in
# videos/{Subject}/{n}.mp4), youtube_url, question_type ("multiple-choice" | "open-ended"), metadata
# {subject, textbook, knowledge, rationale}, question, choices ({"A": ..., "E": ...}, all values ""
# for open-ended), answer (a letter, or the reference text for open-ended)}; checked on that file.
# `mmvu` is the multiple-choice part (MCQ accuracy, the paper's MMVU figure); `mmvu_all` adds the
# open-ended questions, scored by the open-ended metric of RewardConfig (token F1 by default, not the authors'
# GPT judge). Every subject folder has its own 0.mp4, 1.mp4, ..., so a video is looked for only at
# its own Subject/n.mp4 path, never by file name.
def _mmvu(data: Path, finder: VideoFinder, out: Loaded, include_oe: bool) -> Iterator[Sample]:
    path = _find_file(data, "validation.json")
    rows = _read_json(path)
    if not isinstance(rows, list):
        raise BenchmarkError(f"{path}: expected a list of questions")
    bench = "mmvu_all" if include_oe else "mmvu"
    for i, r in enumerate(rows):
        where = f"{path} row {i}"
        try:
            url, qtype, sid = str(r["video"]), r["question_type"], str(r["id"])
            choices = {k: str(v) for k, v in (r.get("choices") or {}).items() if str(v).strip()}
            question, answer = r["question"], str(r["answer"])
        except (KeyError, TypeError, AttributeError) as e:
            raise BenchmarkError(f"{where}: not an MMVU row ({type(e).__name__}: {e})") from None
        rel = url.split("/videos/", 1)[1] if "/videos/" in url else Path(url).name
        video = finder.find(rel, f"videos/{rel}")
        subject = (r.get("metadata") or {}).get("subject")
        vp = str(video or finder.expected(rel))
        if qtype == "multiple-choice":
            if not choices:
                raise BenchmarkError(f"{where}: multiple-choice question without choices")
            q, opts = mcq_text(question, [f"{k}. {choices[k]}" for k in sorted(choices)])
            yield Sample(id=sid, bench=bench, video_path=vp, question=q, answer=_check_letter(answer, opts, where),
                         question_type="mcq", options=opts, extras={"subject": subject})
        elif qtype == "open-ended":
            if not include_oe:
                _count(out.skipped, "open-ended (use mmvu_all)")
                continue
            yield Sample(id=sid, bench=bench, video_path=vp, question=question, answer=answer, question_type="oe",
                         extras={"subject": subject})
        else:
            raise BenchmarkError(f"{where}: unknown question_type {qtype!r}")


# Charades-STA test (Gao et al. 2017; charades_sta_test.txt as distributed with the TALL code and
# mirrored by grounding repos, checked on microsoft/VideoX MS-2D-TAN/data/Charades-STA/): one query
# per line, "VIDEO_ID START END##sentence", times in seconds, 3720 lines; videos are
# Charades_v1_480/{VIDEO_ID}.mp4. Charades ids are unique, so videos are also found by name.
def _charades(data: Path, finder: VideoFinder, out: Loaded) -> Iterator[Sample]:
    path = _find_file(data, "charades_sta_test.txt")
    for ln, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        head, sep, sentence = line.partition("##")
        parts = head.split()
        try:
            if not sep or len(parts) != 3:
                raise ValueError("expected 'VIDEO_ID START END##sentence'")
            vid, s, e = parts[0], float(parts[1]), float(parts[2])
        except ValueError as err:
            raise BenchmarkError(f"{path} line {ln}: {err}: {line!r}") from None
        query = sentence.strip().rstrip(".")
        video = finder.find(vid, f"Charades_v1_480/{vid}") or finder.find_by_name(vid)
        yield Sample(id=f"{vid}#{ln}", bench="charades", video_path=str(video or finder.expected(vid + ".mp4")),
                     question=f'When does this happen in the video: "{query}"?', answer=f"[{s:g}, {e:g}]",
                     question_type="tvg", extras={"query": query, "span": [s, e]})


# SynthVT (paravt synth): ParaVT-Parquet RL rows, read by the shared paravt.data.load_rl_rows;
# video paths in the rows are relative to the split directory (or to --videos when given).
def _synthvt(data: Path, finder: VideoFinder, out: Loaded) -> Iterator[Sample]:
    from paravt.data import DataError, load_rl_rows

    path = data if data.is_file() else data / "rl.parquet"
    if not path.is_file():
        raise BenchmarkError(f"no SynthVT rl.parquet at {path} (write a split with `paravt synth`)")
    video_root = finder.roots[0] if finder.roots and finder.roots[0] != data else path.parent
    try:
        rows = load_rl_rows(path, video_root)
    except DataError as e:
        raise BenchmarkError(str(e)) from None
    for s in rows:
        opts = [str(o) for o in s.extra.get("options") or []]
        yield Sample(id=s.id, bench="synthvt", video_path=s.video, question=s.question, answer=s.answer,
                     question_type=s.question_type, options=opts,
                     extras={"task": s.extra.get("kind"), "needs_event": s.extra.get("needs_event"),
                             "duration_s": s.extra.get("duration")})


@dataclass(frozen=True)
class Benchmark:
    name: str
    loader: Loader
    description: str
    breakdowns: tuple[str, ...]  # extras keys the summary breaks the score down by
    headline: str  # the summary metric the paper reports for it


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("videomme", lambda d, f, o: _videomme(d, f, o, subtitles=False), "Video-MME test, without subtitles",
              ("duration", "task", "domain"), "accuracy"),
    Benchmark("videomme_sub", lambda d, f, o: _videomme(d, f, o, subtitles=True), "Video-MME test, with subtitles",
              ("duration", "task", "domain"), "accuracy"),
    Benchmark("longvideobench", _longvideobench, "LongVideoBench validation, subtitles interleaved",
              ("duration", "task"), "accuracy"),
    Benchmark("lvbench", _lvbench, "LVBench", ("task",), "accuracy"),
    Benchmark("mlvu", _mlvu, "MLVU dev, multiple choice (M-Avg)", ("task",), "task_mean_accuracy"),
    Benchmark("mmvu", lambda d, f, o: _mmvu(d, f, o, include_oe=False), "MMVU validation, multiple choice",
              ("subject",), "accuracy"),
    Benchmark("mmvu_all", lambda d, f, o: _mmvu(d, f, o, include_oe=True), "MMVU validation, MC + open-ended",
              ("subject", "question_type"), "accuracy"),
    Benchmark("charades", _charades, "Charades-STA test (temporal grounding)", (), "miou"),
    Benchmark("synthvt", _synthvt, "SynthVT split (paravt synth)", ("task", "question_type", "needs_event"), "score"),
]}


def default_video_roots(data: Path) -> list[Path]:
    """Where videos usually sit relative to an annotation directory (as the archives unpack)."""
    cands = [data, data / "data", data / "videos", data / "video", data / "all_videos", data / "MLVU" / "video",
             data / "Charades_v1_480"]
    return [c for c in cands if c.is_dir()] or [data]


def load_benchmark(name: str, data: str | Path, videos: str | Path | None = None) -> Loaded:
    """All samples of a benchmark whose video is present, plus the ones whose video is not."""
    if name not in BENCHMARKS:
        raise BenchmarkError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    data = Path(data).expanduser()
    if not data.exists():
        raise BenchmarkError(f"data path {data} does not exist")
    if videos is not None and not Path(videos).expanduser().is_dir():
        raise BenchmarkError(f"video directory {videos} does not exist")
    base = data if data.is_dir() else data.parent
    roots = [Path(videos).expanduser()] if videos is not None else default_video_roots(base)
    finder = VideoFinder(roots)
    out = Loaded(bench=name, samples=[])
    seen: set[str] = set()
    for s in BENCHMARKS[name].loader(data, finder, out):
        if s.id in seen:
            raise BenchmarkError(f"{name}: duplicate sample id {s.id!r}")
        seen.add(s.id)
        if Path(s.video_path).is_file():
            out.samples.append(s)
        else:
            out.missing.append(MissingVideo(s.id, s.video_path))
    return out
