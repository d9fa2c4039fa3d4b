"""`paravt app`: the HTTP API with a scripted model (upload limit, traversal, API key, the order of
the streamed events), then the real page in a real browser (Debian's chromium through Playwright)
against `paravt app` running the shipped model, checked on the DOM.

The browser tests are skipped, with the reason, where chromium or the playwright package is
missing (`make test` installs both where it can). `PARAVT_SCREENSHOT=docs/app.png pytest tests/test_app.py`
retakes the README's picture."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from servetools import Server, paravt_server

from paravt.agent import Episode
from paravt.app import AppError, AppSettings, create_app, resolve_media
from paravt.backends.scripted import ScriptedBackend

WINDOWS = [(0, 10), (10, 20), (20, 30)]


def crop_turn(windows) -> str:
    calls = "".join("<tool_call>" + json.dumps({"name": "crop_video", "arguments": {"start_time": s, "end_time": e}})
                    + "</tool_call>\n" for s, e in windows)
    return "The overview misses it.</think>\n" + calls


def scripted_main(req) -> str:
    """Crops on the first turn, answers once the summaries are back (stateless: an episode may be asked twice)."""
    return crop_turn(WINDOWS) if not any(m.role == "assistant" for m in req.messages) else \
        "The second window shows it.</think><answer>red</answer>"


def scripted(model):
    return ScriptedBackend(scripted_main, sub=lambda req: "A red circle at the lower left.")


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    from paravt.synth.render import make_spec, write_video

    return write_video(make_spec(1, min_len=30, max_len=32, n_events=(1, 1)), tmp_path_factory.mktemp("v") / "v.mp4")


def client(tmp_path, **settings) -> TestClient:
    app = create_app(AppSettings(**settings), backend_factory=scripted, upload_dir=tmp_path / "uploads")
    return TestClient(app)


def events_of(response) -> list[tuple[str, dict]]:
    out = []
    for block in response.text.split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((lines["event"], json.loads(lines["data"])))
    return out


# ---------------------------------------------------------------------------------------------- API


def test_events_stream_in_the_episodes_own_order(tmp_path, video):
    with client(tmp_path) as c:
        up = c.put("/api/upload", params={"name": "clip.mp4"}, content=video.read_bytes())
        assert up.status_code == 200 and up.json()["name"] == "clip.mp4" and 29 < up.json()["duration"] < 33
        r = c.post("/api/ask", json={"video": {"upload": up.json()["id"]}, "question": "What colour was the circle?",
                                     "frames": 4, "mode": "parallel"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = events_of(r)
    names = [n for n, _ in events]
    assert "thumbnails" in names and names.index("thumbnails") > names.index("overview")
    assert [n for n in names if n != "thumbnails"] == [
        "start", "loading_model", "model_ready", "overview",
        "turn_started", "think", "generated", "calls_dispatched", "subcall_finished", "subcall_finished",
        "subcall_finished", "tool_response",
        "turn_started", "think", "generated", "answer", "episode", "done"]
    got = dict(events)
    assert got["start"]["video"] == "clip.mp4" and got["start"]["question_type"] == "oe"
    assert got["start"]["config"]["frames"] == 4 and len(got["overview"]["times"]) == 4
    assert [(c["arguments"]["start_time"], c["arguments"]["end_time"]) for c in got["calls_dispatched"]["calls"]] \
        == WINDOWS
    finished = sorted((p["start"], p["end"]) for n, p in events if n == "subcall_finished")
    episode = got["episode"]
    assert episode["answer"] == "red" and episode["video"] == "clip.mp4"  # the name, not the server's path
    assert sorted((c["start"], c["end"]) for t in episode["turns"] for c in t["calls"]) == finished
    thumbs = got["thumbnails"]["thumbnails"]
    assert [t["t"] for t in thumbs] == got["overview"]["times"]
    assert thumbs[0]["src"].startswith("data:image/jpeg;base64,")
    ts = [p["t"] for n, p in events if n not in ("episode", "thumbnails")]
    assert ts == sorted(ts)  # seconds since the request, as the events happened
    with client(tmp_path) as c2:  # another app: no such episode
        assert c2.get(f"/api/episodes/{episode['id']}").status_code == 404
    assert Episode.from_dict(episode).answer == "red"  # the trace loads back as any paravt trace


def test_a_client_that_goes_away_cancels_its_episode(tmp_path, video):
    """Over a real uvicorn server (TestClient buffers a whole response): the page leaves while the
    sub-agents run (each batch would take 30 s), and the episode stops at once."""
    backend = ScriptedBackend(scripted_main, sub="slow", latency_s=lambda req: 30.0 if req.role == "sub" else 0.0)
    app = create_app(AppSettings(media_root=video.parent), backend_factory=lambda m: backend,
                     upload_dir=tmp_path / "u")
    with Server(app) as server:
        body = {"video": {"media": video.name}, "question": "Colour?", "frames": 4}
        with httpx.stream("POST", f"{server.url}/api/ask", json=body, timeout=20) as r:
            for line in r.iter_lines():
                if line == "event: calls_dispatched":
                    assert app.state.running["n"] == 1
                    break
        t0 = time.perf_counter()
        while app.state.running["n"] and time.perf_counter() - t0 < 10:
            time.sleep(0.02)
        assert app.state.running["n"] == 0 and time.perf_counter() - t0 < 5
        assert not app.state.finished  # it never finished
        assert [r.role for r in backend.requests] == ["main"]  # no sub-agent was answered, no second turn


def test_finished_episode_is_kept_and_a_model_is_loaded_once(tmp_path, video):
    made = []

    def factory(model):
        made.append(model)
        return scripted(model)

    app = create_app(AppSettings(media_root=video.parent), backend_factory=factory, upload_dir=tmp_path / "u")
    with TestClient(app) as c:
        for _ in range(2):
            events = events_of(c.post("/api/ask", json={"video": {"media": video.name}, "question": "Colour?",
                                                        "frames": 4}))
            episode = dict(events)["episode"]
            assert c.get(f"/api/episodes/{episode['id']}").json() == episode
        assert dict(events)["model_ready"]["cached"] is True
    assert made == [None]  # the default model, loaded once


def test_upload_over_the_limit_is_413_and_leaves_nothing(tmp_path):
    with client(tmp_path, max_upload_bytes=1000) as c:
        r = c.put("/api/upload", params={"name": "big.mp4"}, content=b"x" * 2000)
        assert r.status_code == 413 and "upload limit" in r.json()["error"] and "--max-upload-mb" in r.json()["error"]
        # no Content-Length (chunked): stopped while it streams in
        r = c.put("/api/upload", params={"name": "big.mp4"}, content=(b"x" * 400 for _ in range(5)))
        assert r.status_code == 413
    assert list((tmp_path / "uploads").iterdir()) == []


def test_an_upload_that_stalls_is_given_up_and_leaves_nothing(tmp_path):
    """Over a real uvicorn server and a raw socket: a client that sends part of its body, then
    nothing, gets a 408 once the gap passes `upload_idle_s`; the half-written file is removed."""
    import socket

    app = create_app(AppSettings(upload_idle_s=1.0), backend_factory=scripted, upload_dir=tmp_path / "u")
    with Server(app) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(b"PUT /api/upload?name=clip.mp4 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 100000\r\n\r\n" + b"x" * 1000)  # then nothing more
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            part = sock.recv(4096)
            if not part:
                break
            answer += part
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"the upload stalled: nothing arrived for 1 s" in answer
        assert [p for p in (tmp_path / "u").rglob("*") if p.is_file()] == []


def test_a_file_that_is_not_a_video_is_a_clear_400(tmp_path, video):
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video" * 10)
    with client(tmp_path, media_root=tmp_path / "media") as c:
        r = c.put("/api/upload", params={"name": "holiday.mp4"}, content=b"this is text, not a video" * 10)
        assert r.status_code == 400
        msg = r.json()["error"]
        assert msg.startswith("holiday.mp4 is not a video paravt can read") and str(tmp_path) not in msg
        r = c.post("/api/ask", json={"video": {"media": "broken.mp4"}, "question": "Q?"})
        assert r.status_code == 400 and r.json()["error"].startswith("broken.mp4 is not a video paravt can read")
        assert str(tmp_path) not in r.json()["error"]
    assert list((tmp_path / "uploads").iterdir()) == []


def test_paths_outside_the_media_root_are_refused(tmp_path, video):
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    shutil.copy(video, root / "sub" / "ok.mp4")
    shutil.copy(video, tmp_path / "secret.mp4")
    (root / "link.mp4").symlink_to(tmp_path / "secret.mp4")  # a link out of the root
    (root / "notes.txt").write_text("not a video")
    assert resolve_media(root, "sub/ok.mp4") == (root / "sub" / "ok.mp4").resolve()
    with client(tmp_path, media_root=root) as c:
        assert c.get("/api/media").json()["files"] == ["sub/ok.mp4"]
        for bad in ["../secret.mp4", "sub/../../secret.mp4", str(tmp_path / "secret.mp4"), "/etc/passwd", "link.mp4",
                    "..\\secret.mp4"]:
            r = c.post("/api/ask", json={"video": {"media": bad}, "question": "Q?"})
            assert r.status_code == 403 and "outside the media root" in r.json()["error"], bad
        assert c.post("/api/ask", json={"video": {"media": "sub/none.mp4"}, "question": "Q?"}).status_code == 404
    with client(tmp_path) as c:  # no --media-root: no server path can be named at all
        r = c.post("/api/ask", json={"video": {"media": "sub/ok.mp4"}, "question": "Q?"})
        assert r.status_code == 403 and "--media-root" in r.json()["error"]
        assert c.get("/api/media").json()["files"] == []
    with pytest.raises(AppError):
        resolve_media(root, "sub/../../secret.mp4")


def test_api_key_is_required_on_the_api_not_on_the_page(tmp_path):
    with client(tmp_path, api_key="s3cret") as c:
        assert c.get("/api/info").status_code == 401
        assert c.get("/api/info", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.put("/api/upload", content=b"x").status_code == 401
        assert c.post("/api/ask", json={}).status_code == 401
        info = c.get("/api/info", headers={"Authorization": "Bearer s3cret"})
        assert info.status_code == 200 and info.json()["modes"] == ["parallel", "sequential", "inline", "none"]
        page = c.get("/")
        assert page.status_code == 200 and "assets/episode.js" in page.text  # the report's own episode view
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"
        assert c.get("/assets/episode.js").text.startswith("/*")
        assert c.get("/assets/..%2Fapp.py").status_code == 404


def test_requests_refused_before_any_episode(tmp_path, video):
    with client(tmp_path, media_root=video.parent) as c:
        ok = {"video": {"media": video.name}, "question": "Q?"}
        assert c.post("/api/ask", content=json.dumps(ok)).status_code == 415  # not JSON: no cross-site form post
        assert c.post("/api/ask", json={**ok, "mode": "both"}).status_code == 400
        assert "frames" in c.post("/api/ask", json={**ok, "frames": 0}).json()["error"]
        assert c.post("/api/ask", json={**ok, "question": " "}).json()["error"] == "the question is empty"
        assert c.post("/api/ask", json={"video": {"upload": "nope"}, "question": "Q?"}).status_code == 404
    app = create_app(AppSettings(loopback_hosts_only=True), backend_factory=scripted, upload_dir=tmp_path / "u2")
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        assert c.get("/api/info").status_code == 200
        assert c.get("/api/info", headers={"host": "evil.example:8080"}).status_code == 421  # DNS rebinding


def test_a_model_that_cannot_load_is_an_error_event(tmp_path, video):
    from paravt.models import ModelLoadError

    def factory(model):
        raise ModelLoadError(f"model path {model!r} does not exist")

    app = create_app(AppSettings(media_root=video.parent), backend_factory=factory, upload_dir=tmp_path / "u")
    with TestClient(app) as c:
        events = events_of(c.post("/api/ask", json={"video": {"media": video.name}, "question": "Q?",
                                                    "model": "/no/such/model"}))
    assert [n for n, _ in events] == ["start", "loading_model", "error", "done"]
    assert "does not exist" in dict(events)["error"]["message"]


# ---------------------------------------------------------------------------------------------- the real page


KEY = "test-key-123"


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """`paravt app` as a user starts it (the shipped model, an API key), on a free loopback port."""
    work = tmp_path_factory.mktemp("app")
    env = {k: v for k, v in os.environ.items() if k not in ("PARAVT_MODEL", "PARAVT_API_KEY")}
    (work / "tmp").mkdir()
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(work / "tmp"))  # where its uploads go
    with paravt_server("app", "--api-key", KEY, "--max-upload-mb", "1", "--frames", "16", env=env, ready="/",
                       cwd=work, log=work / "server.log") as (url, _):
        yield url, work
    assert list((work / "tmp").glob("paravt-app-*")) == []  # the uploads went with the app


@pytest.fixture(scope="module")
def synth_video(tmp_path_factory):
    """A SynthVT-mini video (64 px, 60-80 s, one short event), as `paravt demo` makes it."""
    from paravt.demo import DEMO_SEED
    from paravt.synth.dataset import MINI_TASK
    from paravt.synth.render import make_spec, write_video

    spec = make_spec(DEMO_SEED, min_len=MINI_TASK["min_len"], max_len=MINI_TASK["max_len"],
                     n_events=MINI_TASK["n_events"], event_len=(MINI_TASK["event_min"], MINI_TASK["event_max"]))
    return write_video(spec, tmp_path_factory.mktemp("synth") / "synth_2.mp4"), spec


# records, as the page changes, whether crop windows were on it before the answer was, and
# whether a window was ever drawn while its sub-agent was still running
WATCH = """
window.__seen = {cropBeforeAnswer: false, running: false};
new MutationObserver(() => {
  const crops = document.querySelectorAll('#episode rect.pv-crop');
  const answer = document.querySelector('#episode .pv-answer');
  if (crops.length && answer && answer.textContent === 'running...') window.__seen.cropBeforeAnswer = true;
  if (document.querySelector('#episode rect.pv-crop[data-status=running]')) window.__seen.running = true;
}).observe(document, {subtree: true, childList: true});
"""


def open_app(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.add_init_script(WATCH)
    page.goto(url)
    return page


def test_the_page_shows_a_live_episode_of_the_shipped_model(browser, app_server, synth_video, tmp_path):
    url, _ = app_server
    video, spec = synth_video
    event = spec.events[0]
    page = open_app(browser, f"{url}/?key={KEY}")
    assert "key" not in page.url  # taken into the key field, out of the address bar
    page.wait_for_function("() => document.querySelectorAll('#mode option').length === 4")
    assert page.input_value("#frames") == "16"  # the app's --frames
    assert page.is_disabled("#src-media")  # no --media-root
    page.set_input_files("#file", str(video))
    page.fill("#question", f"What colour was the {event.shape}? Answer with one word.")
    page.fill("#frames", "4")
    page.click("#ask")
    page.wait_for_selector("body[data-state=done]", timeout=180_000)

    episode_id = page.get_attribute("body", "data-episode")
    trace = httpx.get(f"{url}/api/episodes/{episode_id}", headers={"Authorization": f"Bearer {KEY}"}).json()
    want = sorted((t["index"], c["index"], c["start"], c["end"], c["status"]) for t in trace["turns"]
                  for c in t["calls"] if c["start"] is not None)
    assert want, "the shipped model crops at K = 4"
    got = page.eval_on_selector_all("#episode rect.pv-crop", "rs => rs.map(r => [+r.dataset.turn, +r.dataset.index, "
                                    "+r.dataset.start, +r.dataset.end, r.dataset.status])")
    assert sorted(tuple(g) for g in got) == want
    assert page.inner_text("#episode .pv-answer") == trace["answer"]
    summaries = page.eval_on_selector_all("#episode .pv-call .pv-summary", "ds => ds.map(d => d.textContent)")
    assert summaries == [c["response"] for t in trace["turns"] for c in t["calls"] if c["status"] == "ok"]
    ticks = page.eval_on_selector_all("#episode line.pv-ov-tick", "ls => ls.map(l => +l.dataset.t)")
    assert ticks == trace["overview_times"] and len(ticks) == 4
    assert page.eval_on_selector_all("#episode image.pv-thumb", "is => is.map(i => +i.dataset.t)") == ticks
    seen = page.evaluate("window.__seen")
    assert seen["cropBeforeAnswer"], "crop windows appeared before the answer, as the events came"
    assert seen["running"], "a window was drawn when dispatched, before its sub-agent finished"
    order = page.eval_on_selector_all("#events li", "ls => ls.map(l => l.dataset.event)")
    assert order.index("calls_dispatched") < order.index("subcall_finished") < order.index("answer") < \
        order.index("episode") < order.index("done")
    assert "trace JSON" in page.inner_text("#status")

    shot = tmp_path / "app.png"  # look at it: the README's docs/app.png is this picture
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("PARAVT_SCREENSHOT"):  # PARAVT_SCREENSHOT=docs/app.png pytest tests/test_app.py
        shutil.copy(shot, os.environ["PARAVT_SCREENSHOT"])
    assert shot.stat().st_size > 20000
    assert page.errors == []
    page.close()


def test_the_page_says_what_is_wrong(browser, app_server, tmp_path):
    """No key, a file that is not a video, a file over the upload limit: each a clear line in the page."""
    url, _ = app_server
    page = open_app(browser, url + "/")
    page.wait_for_selector("#error:not([hidden])")
    assert "needs its API key" in page.inner_text("#error")
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")
    page.wait_for_function("() => document.querySelectorAll('#mode option').length === 4")
    assert page.is_hidden("#error")

    (tmp_path / "notes.mp4").write_text("these are my notes, not a video\n" * 20)
    page.set_input_files("#file", str(tmp_path / "notes.mp4"))
    page.fill("#question", "What happens?")
    page.click("#ask")
    page.wait_for_selector("body[data-state=error]")
    assert page.inner_text("#error").startswith("notes.mp4 is not a video paravt can read")
    # asking blurs the key field, a change event: the form's reload must not take the episode's line away
    page.dispatch_event("#key", "change")
    page.evaluate("() => fetch('/api/info', {headers: {Authorization: 'Bearer ' + document.getElementById('key').value}})")
    assert page.inner_text("#error").startswith("notes.mp4 is not a video paravt can read")

    (tmp_path / "big.mp4").write_bytes(b"\0" * (1024 * 1024 + 1))  # the app runs with --max-upload-mb 1
    page.set_input_files("#file", str(tmp_path / "big.mp4"))
    page.click("#ask")
    page.wait_for_function("() => document.getElementById('error').textContent.includes('upload limit')")
    assert "--max-upload-mb" in page.inner_text("#error")
    # the browser logs each refused request (401, 400) as a failed resource; nothing else went wrong
    assert [e for e in page.errors if not e.startswith("Failed to load resource")] == []
    page.close()

    # the server's own 413, past the page's check
    r = httpx.put(f"{url}/api/upload", params={"name": "big.mp4"}, content=(tmp_path / "big.mp4").read_bytes(),
                  headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and "upload limit of 1 MB" in r.json()["error"]
