"""What the report page shows, gathered from eval run directories: per run its settings, score
with a 95 % interval and rates; per (run, sample) the table's columns and the episode trace;
where the evidence was (SynthVT's annotations, Charades' ground-truth span); where each sample's
video is now. Nothing here decodes video (thumbs.py does) or writes HTML (html.py does)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from paravt.eval.metrics import headline
from paravt.eval.report import Run, wilson_interval
from paravt.eval.results import RESULTS, latest_rows, read_results

CORRECT_IOU = 0.5  # a grounding answer counts as right from this IoU on (R@0.5)
INTERN_MIN_CHARS = 120  # prompt texts at least this long are stored once per page (see Interner)


def is_correct(row: dict) -> bool:
    """Right in the table's "correct" column and the "wrong only" filter: full marks for multiple
    choice and open-ended answers (letter match; F1 or exact match of 1), IoU >= 0.5 for grounding
    (R@0.5, the usual cut); an error row is wrong. Partial scores stay visible in the score column,
    so a near miss is not hidden behind the cross."""
    if row.get("error"):
        return False
    score = float(row.get("score") or 0.0)
    if row.get("question_type") == "tvg":
        return score >= CORRECT_IOU
    return score >= 1.0 - 1e-9


def kind_of(row: dict) -> str:
    """The question kind the table filters by: the benchmark's task (SynthVT's question kind,
    Video-MME's task type), else the question type."""
    task = (row.get("extras") or {}).get("task")
    if isinstance(task, list):
        task = ", ".join(map(str, task))
    return str(task) if task else str(row.get("question_type") or "?")


def search_bases(run_dir: Path, roots: list[Path]) -> list[Path]:
    """Folders a relative path written by an eval may be relative to: the eval ran in some folder
    the report does not know, most often the current one or the one holding the runs."""
    bases = [Path.cwd(), run_dir, run_dir.parent, run_dir.parent.parent, *roots]
    out: list[Path] = []
    for b in bases:
        if b not in out:
            out.append(b)
    return out


def find_path(written: str | None, bases: list[Path], roots: list[Path] = (),
              accept: Callable[[Path], bool] = Path.is_file) -> Path | None:
    """Where a file the eval named is now: as written when absolute, else under each base; then by
    its name under each --videos root (a folder of videos moved as a whole). `accept` says what
    counts as found, so that a same-named folder elsewhere is not taken for it."""
    if not written or written.startswith(("http://", "https://")):
        return None
    p = Path(written)
    tries = [p] if p.is_absolute() else [b / p for b in bases]
    tries += [r / p.name for r in roots] + [r / "videos" / p.name for r in roots]
    return next((t.resolve() for t in tries if accept(t)), None)


def _is_split(p: Path) -> bool:
    return (p / "rl.parquet").is_file() or (p.is_file() and p.suffix == ".parquet")


def synthvt_annotations(run: Run, bases: list[Path], roots: list[Path]) -> tuple[dict[str, dict], str | None]:
    """{sample id: its SynthVT annotation (evidence spans, question...)} from the split the run
    read (the manifest's data path), and a note when the split cannot be found: eval rows keep
    only the question kind, the evidence spans are in the split's rl.parquet."""
    from paravt.data import DataError, load_rl_rows

    data = (run.manifest.get("info") or {}).get("data")
    where = find_path(data, bases, accept=_is_split)
    if where is not None and where.is_dir():
        where = where / "rl.parquet"
    if where is None:
        return {}, f"{run.label}: the SynthVT split ({data or 'not named in manifest.json'}) was not found, so " \
                   "the event's true span is not drawn"
    try:
        rows = load_rl_rows(where)
    except DataError as e:
        return {}, f"{run.label}: {e}"
    return {s.id: {"evidence": s.extra.get("evidence") or [], "question": s.question} for s in rows}, None


def truth_spans(row: dict, annotations: dict[str, dict]) -> list[list[float]]:
    """Where the evidence is, in seconds, when the benchmark knows it: SynthVT's annotated event
    (or scene) spans, Charades' ground-truth span, or a grounding answer's span."""
    ann = annotations.get(str(row.get("id")))
    if ann and ann.get("evidence"):
        return [[float(s), float(e)] for s, e in ann["evidence"]]
    span = (row.get("extras") or {}).get("span")
    if isinstance(span, (list, tuple)) and len(span) == 2:
        return [[float(span[0]), float(span[1])]]
    if row.get("question_type") == "tvg":
        from paravt.rewards import parse_span

        got = parse_span(row.get("answer"))
        return [list(got)] if got else []
    return []


@dataclass
class Interner:
    """Long prompt texts (the system prompt, repeated by every sample and every turn) stored once:
    a message's content becomes an index into `texts`, which report.js puts back before the
    episode view sees it. Keeps a 1000-sample page at a few MB instead of tens."""

    texts: list[str] = field(default_factory=list)
    _index: dict[str, int] = field(default_factory=dict)

    def ref(self, text: str | None) -> str | int | None:
        """`text`, or its index in `texts` when it is long enough to be worth storing once."""
        if not isinstance(text, str) or len(text) < INTERN_MIN_CHARS:
            return text
        if text not in self._index:
            self._index[text] = len(self.texts)
            self.texts.append(text)
        return self._index[text]

    def generation(self, g: dict | None) -> dict | None:
        """A model call with its prompt messages' long contents replaced by their index."""
        if not g or not g.get("prompt"):
            return g
        return dict(g, prompt=[dict(m, content=self.ref(m.get("content"))) for m in g["prompt"]])


def page_episode(ep: dict, interner: Interner) -> dict:
    """A row's trace as the page stores it: prompt texts interned, each turn's `parsed.text` left
    out (it repeats the generation's prefix + text, which the view shows), and no thumbnails."""
    ep = dict(ep, turns=[dict(t) for t in ep.get("turns") or []])
    ep.pop("thumbnails", None)  # only the report's own (sample_entry): a row's could point the page anywhere
    for t in ep["turns"]:
        t["generation"] = interner.generation(t.get("generation"))
        t["calls"] = [dict(c, generation=interner.generation(c.get("generation"))) for c in t.get("calls") or []]
        if isinstance(t.get("parsed"), dict):
            t["parsed"] = {k: v for k, v in t["parsed"].items() if k != "text"}
    return ep


def load_rows(run: Run) -> list[dict]:
    """The newest row of every sample of a run, in the order they were first written."""
    return list(latest_rows(read_results(run.path / RESULTS, repair=False)).values())


def run_entry(run: Run, rows: list[dict]) -> dict:
    """One run's card: settings, the headline score with its 95 % Wilson interval, error and
    parse-problem rates, time, and the score breakdowns (from summary.json, as `eval` printed it)."""
    s, m = run.summary, run.manifest
    ep = m.get("episode") or {}
    metric, value = headline(s)
    n = int(s.get("n") or len(rows))
    lo, hi = wilson_interval(value / 100, n)
    lat = [float(r.get("latency_s") or 0.0) for r in rows if not r.get("error")]
    return {
        "label": run.label, "path": str(run.path), "bench": s.get("bench") or m.get("bench"),
        "model": m.get("model"), "mode": ep.get("mode"), "k": ep.get("frames"), "prompts": ep.get("prompts"),
        "max_turns": ep.get("max_turns"), "n": n, "metric": metric, "score": value, "ci": [100 * lo, 100 * hi],
        "errors": s.get("errors", 0), "error_rate": s.get("error_rate", 0.0),
        "parse_problem_rate": s.get("parse_problem_rate", 0.0), "mean_tool_calls": s.get("mean_tool_calls", 0.0),
        "mean_executed_calls": s.get("mean_executed_calls", 0.0), "tool_usage_rate": s.get("tool_usage_rate", 0.0),
        "mean_turns": s.get("mean_turns", 0.0), "latency_p50_s": s.get("latency_p50_s", 0.0),
        "latency_p90_s": s.get("latency_p90_s", 0.0), "time_s": sum(lat), "pending": s.get("pending", 0),
        "missing_videos": s.get("missing_videos", 0), "created": (m.get("info") or {}).get("created"),
        "breakdowns": {k[3:]: {g: d.get("score") for g, d in v.items()} for k, v in s.items()
                       if k.startswith("by_") and isinstance(v, dict)},
        "error_causes": s.get("error_causes") or {},
    }


def sample_entry(run_index: int, run: Run, row: dict, annotations: dict[str, dict], interner: Interner,
                 thumbnails: list[dict] | None) -> dict:
    """One table row and its episode view's data. The episode is the row's trace (token ids
    already dropped by the eval), with `truth` spans and `thumbnails` added for the view."""
    ep = row.get("episode")
    truth = truth_spans(row, annotations)
    question = (ep or {}).get("question") or (annotations.get(str(row["id"])) or {}).get("question") or ""
    k = ((ep or {}).get("config") or {}).get("frames") or (run.manifest.get("episode") or {}).get("frames")
    page_ep = None
    if ep:
        page_ep = page_episode(ep, interner)
        page_ep["truth"] = truth
        if thumbnails is not None:
            page_ep["thumbnails"] = thumbnails
    return {
        "run": run_index, "id": str(row["id"]), "question": question, "question_type": row.get("question_type"),
        "kind": kind_of(row), "k": k, "truth": row.get("answer"), "prediction": row.get("prediction"),
        "score": row.get("score"), "correct": is_correct(row), "crops": row.get("n_executed") or 0,
        "calls": row.get("n_calls") or 0, "turns": row.get("n_turns") or 0, "time": row.get("latency_s"),
        "error": row.get("error"), "video": row.get("video_path"), "truth_spans": truth, "episode": page_ep,
    }
