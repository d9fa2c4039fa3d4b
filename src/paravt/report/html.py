"""Writes the report page: `report.html` with its data embedded as JSON, and `report_files/`
beside it holding the scripts, styles and thumbnails. Plain HTML, vanilla JS and CSS, no build
step and no network: a page opened from disk cannot fetch() its data or import ES modules, so the
data is inline and the scripts are classic <script src> files."""

from __future__ import annotations

import json
import math
import time
from html import escape
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from paravt.eval.report import ReportError, io_errors, load_run
from paravt.report.data import (Interner, find_path, load_rows, run_entry, sample_entry, search_bases,
                                synthvt_annotations)
from paravt.report.thumbs import DEFAULT_MAX_THUMBS, extract, pick_times

ASSETS = ("episode.js", "episode.css", "report.js", "report.css")  # in paravt/report/assets, copied beside the page
DATA_ID = "paravt-report-data"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="{assets}/episode.css">
<link rel="stylesheet" href="{assets}/report.css">
</head>
<body>
<noscript><p>This report draws itself with JavaScript (no network needed): enable it to see the runs.</p></noscript>
<main id="paravt-report"></main>
<script type="application/json" id="{data_id}">{data}</script>
<script src="{assets}/episode.js"></script>
<script src="{assets}/report.js"></script>
</body>
</html>
"""


def assets_dir(html: Path) -> Path:
    """The folder beside the page that holds what it loads: `report.html` -> `report_files/`."""
    return html.with_name(html.stem + "_files")


def finite(x):
    """NaN and infinities as null: a browser's JSON.parse rejects the NaN that json.dumps writes (the
    report's embedded data and the app's events alike)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def embed_json(data) -> str:
    """JSON that is safe inside <script type="application/json">: a model's text may contain
    `</script>` or `<!--`, which would end or corrupt the element, so every <, > and & is written
    as its \\u escape (the same string to JSON.parse); U+2028/2029 too, for older parsers."""
    text = json.dumps(finite(data), ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def copy_assets(dest: Path) -> None:
    """The page's scripts and styles, from the installed package, into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    src = resources.files("paravt.report") / "assets"
    for name in ASSETS:
        (dest / name).write_bytes((src / name).read_bytes())


def render_page(data: dict, assets: str, title: str) -> str:
    """The page itself; `assets` is the folder's name relative to the page."""
    href = quote(assets)
    return PAGE.format(title=escape(title), assets=escape(href), data_id=DATA_ID, data=embed_json(data))


def build_report(dirs: list[str | Path], html: str | Path, *, videos: list[str | Path] | None = None,
                 max_thumbs: int = DEFAULT_MAX_THUMBS, progress: bool = False) -> dict:
    """Write the HTML report of eval run directories `dirs` to `html` (and its `_files` folder).

    videos: folders to look for the runs' videos in, when they moved since the eval (by relative
    path, then by file name). max_thumbs: overview thumbnails per episode (0: none). Returns what
    was written: {"html", "assets", "samples", "thumbnails", "notes"}; notes say what is missing
    (videos, a SynthVT split), never a failure. Raises ReportError for a run that cannot be read or
    a page that cannot be written."""
    if not dirs:
        raise ReportError("give at least one run directory")
    html = Path(html)
    dest = assets_dir(html)
    roots = [Path(v) for v in videos or []]
    runs = [load_run(d) for d in dirs]
    _unique_labels(runs)
    notes: list[str] = []
    per_run = []  # (run, rows, annotations, [(video or None, times)])
    wanted: dict[Path, set[float]] = {}
    durations: dict[Path, float] = {}
    for run in runs:
        rows = load_rows(run)
        bases = search_bases(run.path, roots)
        annotations: dict[str, dict] = {}
        if (run.summary.get("bench") or run.manifest.get("bench")) == "synthvt":
            annotations, note = synthvt_annotations(run, bases, roots)
            notes += [note] if note else []
        located = []
        for row in rows:
            ep = row.get("episode") or {}
            video = find_path(row.get("video_path") or ep.get("video"), bases, roots) if ep else None
            times = pick_times(list(ep.get("overview_times") or []), max_thumbs) if video else []
            if video and times:
                wanted.setdefault(video, set()).update(times)
                if isinstance(ep.get("duration"), (int, float)):
                    durations[video] = float(ep["duration"])
            located.append((video, times))
        missing = [r.get("video_path") for r, (v, _) in zip(rows, located) if r.get("episode") and v is None]
        if missing and max_thumbs > 0:
            notes.append(f"{run.label}: {len(missing)} of {len(rows)} samples' videos were not found (first: "
                         f"{missing[0]}), so they have no thumbnails; --videos DIR says where they are now")
        per_run.append((run, rows, annotations, located))

    with io_errors(dest):
        copy_assets(dest)
        thumbs = extract(wanted, dest / "thumbs", progress, durations) if max_thumbs > 0 and wanted else None
    if thumbs is not None and thumbs.failed:
        first = next(iter(thumbs.failed.items()))
        notes.append(f"{len(thumbs.failed)} video(s) could not be read for thumbnails (first: {first[1]})")

    interner = Interner()
    samples = []
    for i, (run, rows, annotations, located) in enumerate(per_run):
        for row, (video, times) in zip(rows, located):
            got = thumbs.for_episode(video, times, f"{dest.name}/thumbs") if thumbs and video else None
            entry = sample_entry(i, run, row, annotations, interner, got or None)
            if row.get("episode") and not got:
                entry["note"] = _thumb_note(row, video, max_thumbs, thumbs)
            samples.append(entry)
    title = "paravt eval report · " + " vs ".join(r.label for r in runs)
    data = {"title": title, "generated": time.strftime("%Y-%m-%d %H:%M"), "runs": [
        run_entry(run, rows) for run, rows, _, _ in per_run], "samples": samples, "texts": interner.texts,
        "notes": notes, "max_thumbs": max_thumbs}
    with io_errors(html):
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(render_page(data, dest.name, title), encoding="utf-8")
    return {"html": html, "assets": dest, "samples": len(samples),
            "thumbnails": len(thumbs.made) if thumbs else 0, "notes": notes}


def _thumb_note(row: dict, video: Path | None, max_thumbs: int, thumbs) -> str:
    if max_thumbs <= 0:
        return "no thumbnails (--thumbs 0)"
    if str(row.get("video_path") or "").startswith(("http://", "https://")):
        return "no thumbnails: the video is a URL (the report reads local files only)"
    if video is None:
        return f"no thumbnails: the video ({row.get('video_path')}) was not found"
    if thumbs is not None and video in thumbs.failed:
        return f"no thumbnails: the video could not be read ({thumbs.failed[video]})"
    return "no thumbnails"


def _unique_labels(runs) -> None:
    """Two runs named alike (runs/a/eval, runs/b/eval) get their parent folder in the label."""
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.label] = seen.get(r.label, 0) + 1
    for r in runs:
        if seen[r.label] > 1:
            r.label = f"{r.path.parent.name}/{r.label}"
    for i, r in enumerate(runs):
        if sum(x.label == r.label for x in runs) > 1:
            r.label = f"{r.label} #{i + 1}"
