"""Writing a SynthVT split: videos, RL parquet, SFT oracle rows, annotations, visibility table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paravt.synth.oracle import make_trajectory, to_sft_rows
from paravt.synth.questions import make_questions, visible_events
from paravt.synth.render import VideoSpec, make_spec, write_video

SPLITS = {"train": 1, "test": 2, "val": 3}
K_VALUES = (4, 8, 16, 32, 64)


@dataclass
class SynthConfig:
    n: int = 500  # questions
    seed: int = 0
    split: str = "train"
    min_len: float = 60.0
    max_len: float = 600.0
    fps: int = 2
    size: int = 64
    per_video: int = 5
    event_min: float = 1.0
    event_max: float = 8.0
    oracle_k: tuple[int, ...] = K_VALUES  # overview budgets the oracle trajectories are written for

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        if not 0 < self.min_len <= self.max_len:
            raise ValueError("need 0 < min_len <= max_len")
        if self.max_len < self.event_max + 4:
            raise ValueError("videos must be longer than the longest event plus 4 s")


def video_seed(seed: int, split: str, index: int) -> int:
    """Independent streams per (seed, split, index): train and test never share a video."""
    return int(np.random.SeedSequence([seed, SPLITS[split], index]).generate_state(1)[0])


def build_split(out: str | Path, cfg: SynthConfig, progress=None) -> dict:
    """Write (or finish writing) a split under `out`. Returns the visibility table."""
    from paravt.video import VideoReader

    out = Path(out)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    rl_rows, sft_rows, annotations, questions = [], [], [], []
    visible_counts = {k: [0, 0] for k in K_VALUES}
    i = 0
    task = progress.add_task(f"SynthVT {cfg.split}", total=cfg.n) if progress else None
    while len(questions) < cfg.n:
        vseed = video_seed(cfg.seed, cfg.split, i)
        vid = f"{cfg.split}_{i:05d}"
        spec = make_spec(vseed, min_len=cfg.min_len, max_len=cfg.max_len, fps=cfg.fps, size=cfg.size,
                         event_len=(cfg.event_min, cfg.event_max))
        rel = f"videos/{vid}.mp4"
        path = out / rel
        reader = _valid(path)
        if reader is None:  # resumable: a finished video is kept, a missing or broken one rewritten
            write_video(spec, path)
            reader = VideoReader(path)
        rng = np.random.default_rng(vseed)
        qs = make_questions(spec, vid, rng, cfg.per_video)[: cfg.n - len(questions)]
        overviews = {k: [f for f in _overview_times(reader, k)] for k in sorted(set(K_VALUES) | set(cfg.oracle_k))}
        for q in qs:
            if q.needs_event:
                for k in K_VALUES:
                    vis = all(any(s <= t < e for t in overviews[k]) for s, e in q.evidence)
                    visible_counts[k][0] += int(vis)
                    visible_counts[k][1] += 1
            extra = {"id": q.id, "answer": q.answer, "question_type": q.question_type, "kind": q.kind,
                     "options": q.options, "evidence": q.evidence, "needs_event": q.needs_event, "video_id": vid,
                     "duration": spec.duration}
            rl_rows.append({"prompt": [{"role": "user", "content": "<video>\n" + q.question}],
                            "videos": [{"video": rel}], "extra_info": json.dumps(extra, sort_keys=True)})
            k = int(cfg.oracle_k[int(rng.integers(len(cfg.oracle_k)))])
            traj = make_trajectory(spec, q, overviews[k], rng)
            sft_rows += to_sft_rows(traj, q, rel, spec.duration)
            questions.append(q)
        annotations.append({"video_id": vid, "video": rel, **spec.to_dict(),
                            "visible_at_k": {k: [e.name for e in visible_events(spec, overviews[k])] for k in K_VALUES}})
        reader.close()
        if progress:
            progress.update(task, completed=len(questions))
        i += 1
    _write_parquet(out / "rl.parquet", rl_rows)
    _write_parquet(out / "sft.parquet", [{**r, "messages": json.dumps(r["messages"])} for r in sft_rows])
    with open(out / "annotations.jsonl", "w") as f:
        for a in annotations:
            f.write(json.dumps(a, sort_keys=True) + "\n")
    table = {k: (v[0] / v[1] if v[1] else 0.0) for k, v in visible_counts.items()}
    (out / "visibility.json").write_text(json.dumps({"split": cfg.split, "n_event_questions": visible_counts[4][1],
                                                     "visible_fraction": table}, indent=1))
    return table


def _overview_times(reader, k: int) -> list[float]:
    """Real timestamps of the frames VideoReader.overview returns (decoded, not computed)."""
    return [f.timestamp for f in reader.overview(k)]


def _valid(path: Path):
    from paravt.video import VideoError, VideoReader

    if not path.exists():
        return None
    try:
        return VideoReader(path)
    except VideoError:
        return None


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_suffix(".part")
    pq.write_table(pa.Table.from_pylist(rows), tmp, compression="zstd")
    tmp.replace(path)


def load_sft_rows(path: str | Path) -> list[dict]:
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    for r in rows:
        if isinstance(r["messages"], str):
            r["messages"] = json.loads(r["messages"])
    return rows


def load_annotations(path: str | Path) -> dict[str, VideoSpec]:
    out = {}
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        out[d["video_id"]] = VideoSpec.from_dict({k: d[k] for k in ("seed", "duration", "fps", "size", "scenes", "events")})
    return out


def synth_command(out: str, n: int, seed: int, split: str, min_len: float, max_len: float, size: int, fps: int) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    cfg = SynthConfig(n=n, seed=seed, split=split, min_len=min_len, max_len=max_len, size=size, fps=fps)
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        table = build_split(out, cfg, progress)
    t = Table(title=f"SynthVT {split}: event questions whose evidence is visible in K uniform overview frames")
    t.add_column("K")
    t.add_column("visible")
    for k, v in table.items():
        t.add_row(str(k), f"{v:.1%}")
    console.print(t)
    console.print(f"wrote {out}/rl.parquet, sft.parquet, annotations.jsonl, videos/")
