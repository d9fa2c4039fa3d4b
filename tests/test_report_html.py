"""`paravt eval report --html`: a real eval run of the shipped model on SynthVT-mini, rendered in a
real browser (Debian's chromium driven by Playwright), checked on the DOM after its scripts ran.

Skipped, with the reason, where chromium or the playwright package is missing (`make test` installs
both). The unit tests at the top need no browser."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from paravt import DEFAULT_MODEL
from paravt.eval.report import wilson_interval
from paravt.report.html import embed_json

N = 8


# ---------------------------------------------------------------------------------------------- no browser


def test_embedded_json_cannot_close_its_script_element():
    data = {"text": "</script><script>alert(1)</script><!-- & \u2028", "n": float("nan")}
    out = embed_json(data)
    assert "<" not in out and ">" not in out and "&" not in out
    assert json.loads(out) == {"text": data["text"], "n": None}


def test_wilson_interval():
    lo, hi = wilson_interval(5 / 8, 8)
    assert (round(lo, 3), round(hi, 3)) == (0.306, 0.863)
    assert wilson_interval(0.0, 10)[0] == 0.0 and wilson_interval(1.0, 10)[1] == 1.0
    assert wilson_interval(0.5, 0) == (0.0, 1.0)


def test_truth_spans_and_what_counts_as_correct():
    from paravt.report.data import is_correct, truth_spans

    charades = {"id": "3MSZA#1", "question_type": "tvg", "answer": "[24.3, 30.4]", "extras": {"span": [24.3, 30.4]}}
    assert truth_spans(charades, {}) == [[24.3, 30.4]]  # Charades' ground-truth span
    assert truth_spans({"id": "x", "question_type": "tvg", "answer": "[3, 9]", "extras": {}}, {}) == [[3.0, 9.0]]
    assert truth_spans({"id": "s", "question_type": "oe", "extras": {}}, {"s": {"evidence": [[1, 2]]}}) == [[1.0, 2.0]]
    assert truth_spans({"id": "m", "question_type": "mcq", "extras": {}}, {}) == []
    assert is_correct({"question_type": "mcq", "score": 1.0}) and not is_correct({"question_type": "oe", "score": 0.67})
    assert is_correct({"question_type": "tvg", "score": 0.5})
    assert not is_correct({"question_type": "tvg", "score": 0.49})
    assert not is_correct({"question_type": "mcq", "score": 1.0, "error": "BackendError: gone"})


def test_thumbnails_only_from_the_episodes_own_video(tmp_path):
    """A file found under the video's name but of another length is another video: no thumbnails
    of it. The right one gives small JPEGs, cut once (a rerun reuses them)."""
    from paravt.report.thumbs import extract
    from paravt.synth.render import make_spec, write_video
    from paravt.video import VideoReader

    video = write_video(make_spec(3, min_len=20, max_len=24), tmp_path / "v.mp4").resolve()
    duration = VideoReader(video).duration
    made = extract({video: {2.0, 10.5}}, tmp_path / "thumbs", durations={video: duration})
    assert sorted(t for _, t in made.made) == [2.0, 10.5] and not made.failed
    names = sorted(n for n, _, _ in made.made.values())
    assert all((tmp_path / "thumbs" / n).read_bytes()[:2] == b"\xff\xd8" for n in names)  # JPEG
    assert sorted(n for n, _, _ in extract({video: {2.0, 10.5}}, tmp_path / "thumbs").made.values()) == names
    wrong = extract({video: {1.0}}, tmp_path / "other", durations={video: duration + 30})
    assert not wrong.made and "not the same video" in wrong.failed[video]


# ---------------------------------------------------------------------------------------------- a real run


def _cli(*args: str, cwd: Path) -> None:
    """`paravt ARGS` run from `cwd`, in this process (a fresh one's imports cost the suite ~6 s), on a
    thread of its own: the browser's sync API holds this thread's event loop."""
    from concurrent.futures import ThreadPoolExecutor

    from typer.testing import CliRunner

    from paravt.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        with ThreadPoolExecutor(1) as pool:
            r = pool.submit(CliRunner().invoke, app, list(args)).result()
    finally:
        os.chdir(here)
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A SynthVT-mini split and an eval of the shipped model on it, made as a user makes them (in
    the folder they work in, so the run records relative paths)."""
    work = tmp_path_factory.mktemp("report")
    _cli("synth", "--preset", "mini", "--out", "data", "--n", str(N), "--split", "test", "--seed", "0", cwd=work)
    _cli("eval", "run", "--bench", "synthvt", "--data", "data", "--model", str(DEFAULT_MODEL), "--frames", "4",
         "--limit", str(N), "--out", "runs/k4", cwd=work)
    return work / "runs" / "k4"


def rows_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def evidence_of(split: Path) -> dict[str, list]:
    from paravt.data import load_rl_rows

    return {s.id: s.extra["evidence"] for s in load_rl_rows(split / "rl.parquet")}


def open_page(browser, url: str, width: int = 1400):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: page.errors.append(f"failed to load {r.url}"))
    page.goto(url)
    page.wait_for_selector("html[data-ready]")
    return page


def open_page_plain(browser, url: str):
    page = browser.new_page(viewport={"width": 1000, "height": 800})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("() => !!(window.paravt && window.paravt.renderEpisode)")
    return page


def visible_ids(page) -> list[str]:
    return page.eval_on_selector_all("#rp-samples tbody tr.rp-row", "rs => rs.map(r => r.dataset.id)")


def test_report_of_a_real_run(browser, run_dir, tmp_path):
    from paravt.cli import app
    from typer.testing import CliRunner

    html = tmp_path / "out" / "report.html"
    r = CliRunner().invoke(app, ["eval", "report", str(run_dir), "--html", str(html)])
    assert r.exit_code == 0, r.output
    rows = rows_of(run_dir)
    assert len(rows) == N
    files = html.parent / "report_files"
    assert {"episode.js", "episode.css", "report.js", "report.css"} <= {p.name for p in files.iterdir()}
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html.read_text())  # nothing from a network

    page = open_page(browser, html.as_uri())
    assert sorted(visible_ids(page)) == sorted(r["id"] for r in rows)
    card = page.inner_text(".rp-run")
    assert "95 % interval" in card and "Wilson, n = 8" in card and "synthvt" in card
    # crops asked and run, labelled alike on the card and in the rows (the card once gave the calls asked as
    # "crops 2.25 a sample" while each row gave the calls run)
    asked, ran = (sum(r[k] for r in rows) / N for k in ("n_calls", "n_executed"))
    assert f"asked {asked:.2f} · run {ran:.2f} a sample" in card, card
    assert page.inner_text("th[data-sort=crops]").startswith("crops run / asked")
    cells = page.eval_on_selector_all("#rp-samples tbody tr.rp-row",
                                      "rs => rs.map(r => [r.dataset.id, r.querySelector('td.rp-col-crops').textContent])")
    assert dict(cells) == {r["id"]: f"{r['n_executed']} / {r['n_calls']}" for r in rows}

    # "wrong only" shows exactly the rows results.jsonl scores below full marks (open-ended F1 < 1)
    wrong = sorted(r["id"] for r in rows if r["error"] or r["score"] < 1)
    page.check("#f-wrong")
    assert sorted(visible_ids(page)) == wrong
    assert page.inner_text("#f-count").startswith(f"{len(wrong)} of {N}")
    page.uncheck("#f-wrong")
    page.select_option("#f-kind", "colour_oe")
    assert sorted(visible_ids(page)) == sorted(r["id"] for r in rows if r["extras"]["task"] == "colour_oe")
    page.select_option("#f-kind", "")
    page.click("th[data-sort=time]")
    times = {r["id"]: r["latency_s"] for r in rows}
    assert [times[i] for i in visible_ids(page)] == sorted(times.values())

    # the episode view of a sample that cropped: its windows drawn where the row's calls were
    row = next(r for r in rows if r["n_executed"] > 0)
    page.click(f"tr.rp-row[data-id='{row['id']}']")
    view = page.wait_for_selector("tr.rp-detail .pv-episode")
    want = sorted((t["index"], c["index"], c["start"], c["end"]) for t in row["episode"]["turns"]
                  for c in t["calls"] if c["start"] is not None)
    got = view.eval_on_selector_all("rect.pv-crop", "rs => rs.map(r => [+r.dataset.turn, +r.dataset.index, +r.dataset"
                                    ".start, +r.dataset.end, +r.getAttribute('x'), +r.getAttribute('width')])")
    assert sorted(tuple(g[:4]) for g in got) == want
    axis = view.eval_on_selector("svg.pv-timeline line.pv-axis", "l => [+l.getAttribute('x1'), +l.getAttribute('x2')]")
    per_s = (axis[1] - axis[0]) / row["episode"]["duration"]
    for _, _, start, end, x, w in got:  # drawn at its start and as long as its window, on the video's axis
        assert abs(x - (axis[0] + start * per_s)) < 0.5 and abs(w - max(2.0, (end - start) * per_s)) < 0.5
    truth = view.eval_on_selector_all("rect.pv-truth", "rs => rs.map(r => [+r.dataset.start, +r.dataset.end])")
    assert truth == evidence_of(run_dir.parent.parent / "data")[row["id"]]  # SynthVT's event span
    thumbs = view.eval_on_selector_all("image.pv-thumb", "is => is.map(i => [+i.dataset.t, i.getAttribute('href')])")
    assert [t for t, _ in thumbs] == row["episode"]["overview_times"]
    assert all((html.parent / src).is_file() for _, src in thumbs)
    summaries = view.eval_on_selector_all(".pv-call .pv-summary", "ds => ds.map(d => d.textContent)")
    assert summaries == [c["response"] for t in row["episode"]["turns"] for c in t["calls"] if c["status"] == "ok"]
    assert view.query_selector(".pv-think") and row["prediction"] in view.query_selector(".pv-answer").inner_text()
    shot = tmp_path / "report.png"  # look at it: the README's docs/report.png is this picture
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("PARAVT_SCREENSHOT"):  # PARAVT_SCREENSHOT=docs/report.png pytest tests/test_report_html.py
        shutil.copy(shot, os.environ["PARAVT_SCREENSHOT"])
    assert shot.stat().st_size > 20000
    page.click("tr.rp-detail details[data-key=t0p] > summary")  # the prompt text, images as placeholders
    assert "[image " in page.inner_text("tr.rp-detail details[data-key=t0p]")
    assert page.errors == []
    page.close()


def test_a_sample_link_opens_its_sample_and_a_wrong_one_says_so(browser, run_dir, tmp_path):
    """`#sample=RUN/ID` in the address opens that sample; a link cut or mistyped (not valid percent-
    encoding, or naming no sample of the report) still gives the whole page, with one line saying the
    link opened nothing."""
    from urllib.parse import quote

    from paravt.report import build_report

    build_report([run_dir], tmp_path / "r.html", max_thumbs=0)
    rid = rows_of(run_dir)[0]["id"]
    for link, says in [("%E0%A4%A", "is not a valid one"), ("0/" + quote("nobody's <b>id</b>"), "holds no sample"),
                       ("0/" + quote(rid, safe=""), None)]:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.errors = []
        page.on("pageerror", lambda e, page=page: page.errors.append(str(e)))
        page.goto((tmp_path / "r.html").as_uri() + "#sample=" + link)
        page.wait_for_selector("html[data-ready]", timeout=10000)
        assert len(visible_ids(page)) == N and page.errors == [], link
        note = page.query_selector(".rp-linknote")
        opened = page.eval_on_selector_all("tr.rp-detail", "ds => ds.map(d => d.dataset.key)")
        if says is None:
            assert note is None and opened == ["0/" + rid]
        else:
            assert says in note.inner_text() and "no sample opened" in note.inner_text() and opened == []
            assert page.query_selector(".rp-linknote b") is None  # the link's text is shown as text
        page.close()


def test_report_of_two_runs_and_without_videos(browser, run_dir, tmp_path, monkeypatch):
    """Two runs side by side; copies of a run moved away from their videos and split still give a
    page, with a note and no thumbnails."""
    from paravt.report import build_report

    monkeypatch.chdir(tmp_path)  # relative paths are also looked for from here: nothing to find

    moved = tmp_path / "a" / "b"
    shutil.copytree(run_dir, moved / "k4")
    shutil.copytree(run_dir, moved / "k4_copy")
    made = build_report([moved / "k4", moved / "k4_copy"], tmp_path / "two.html")
    assert made["thumbnails"] == 0 and any("videos were not found" in n for n in made["notes"])
    page = open_page(browser, (tmp_path / "two.html").as_uri())
    assert len(visible_ids(page)) == 2 * N
    assert "videos were not found" in page.inner_text(".rp-notes")
    assert page.query_selector("#rp-compare") is not None
    rid = rows_of(run_dir)[0]["id"]
    page.click(f"tr.rp-row[data-id='{rid}'][data-run='0']")
    page.wait_for_selector("tr.rp-detail .pv-episode")
    slots = page.eval_on_selector_all("tr.rp-detail .rp-slot", "ss => ss.map(s => +s.dataset.run)")
    assert slots == [0, 1]  # the same question in each run, side by side
    assert page.query_selector("image.pv-thumb") is None
    assert "video" in page.inner_text("tr.rp-detail .pv-note")
    assert page.errors == []
    page.close()


def test_episode_view_alone_grows_with_the_episode(browser, run_dir, tmp_path):
    """episode.js on a page of its own (as a live `ask` page would load it): an episode drawn while
    its calls run, then again when they finished; an opened prompt stays open."""
    from paravt.report.html import copy_assets

    copy_assets(tmp_path)
    (tmp_path / "live.html").write_text('<link rel="stylesheet" href="episode.css"><div id="v"></div>'
                                        '<script src="episode.js"></script>')
    row = next(r for r in rows_of(run_dir) if r["n_executed"] > 0)
    ep = row["episode"]
    first = dict(ep, answer=None, turns=[dict(ep["turns"][0], calls=[
        {"index": c["index"], "call": c["call"], "status": "running"} for c in ep["turns"][0]["calls"]])])
    page = open_page_plain(browser, (tmp_path / "live.html").as_uri())
    page.evaluate("ep => paravt.renderEpisode(document.getElementById('v'), ep, {live: true})", first)
    assert page.eval_on_selector_all("rect.pv-crop", "rs => rs.map(r => r.dataset.status)") == ["running"] * len(
        ep["turns"][0]["calls"])
    assert page.inner_text(".pv-answer") == "running..."
    page.click("details[data-key=t0p] > summary")
    page.evaluate("ep => paravt.renderEpisode(document.getElementById('v'), ep, {live: true})", ep)
    assert set(page.eval_on_selector_all("rect.pv-crop", "rs => rs.map(r => r.dataset.status)")) == {"ok"}
    assert len(page.query_selector_all(".pv-turn")) == len(ep["turns"])
    assert page.eval_on_selector("details[data-key=t0p]", "d => d.open") is True
    assert page.inner_text(".pv-answer") == ep["answer"]
    assert page.errors == []
    page.close()


def test_thumbnails_of_a_row_never_point_the_page_elsewhere(browser, run_dir, tmp_path):
    """A results row whose episode carries its own `thumbnails` (remote URLs): the report drops them
    (only the thumbnails it cut itself go in), and episode.js draws only data: images and files
    beside the page, whatever it is handed."""
    from paravt.report.data import Interner, page_episode
    from paravt.report.html import copy_assets

    row = next(r for r in rows_of(run_dir) if r["n_executed"] > 0)
    remote = [{"t": 1.0, "src": "https://attacker.example/pixel.png", "w": 8, "h": 8},
              {"t": 2.0, "src": "//attacker.example/p.png", "w": 8, "h": 8},
              {"t": 3.0, "src": "/etc/passwd", "w": 8, "h": 8}]
    assert "thumbnails" not in page_episode(dict(row["episode"], thumbnails=remote), Interner())
    copy_assets(tmp_path)
    (tmp_path / "live.html").write_text('<link rel="stylesheet" href="episode.css"><div id="v"></div>'
                                        '<script src="episode.js"></script>')
    dot = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
           "AAAABJRU5ErkJggg==")
    page = open_page_plain(browser, (tmp_path / "live.html").as_uri())
    requested = []
    page.on("request", lambda r: requested.append(r.url))
    ep = dict(row["episode"], thumbnails=remote + [{"t": 4.0, "src": dot, "w": 1, "h": 1}])
    page.evaluate("ep => paravt.renderEpisode(document.getElementById('v'), ep, {})", ep)
    srcs = page.eval_on_selector_all("image.pv-thumb", "xs => xs.map(x => x.getAttribute('href'))")
    assert srcs == [dot]
    assert not [u for u in requested if "attacker" in u or "passwd" in u]
    page.close()
