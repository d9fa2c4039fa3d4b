"""`paravt ask` as a user runs it: live output, trace, timeline, and one-line errors (exit 2).

The model is the ScriptedBackend (patched in for `make_backend`), so these tests are fast and
check what is printed; tests/test_cli.py runs `ask` on the real tiny model."""

import json
import time

import pytest
from typer.testing import CliRunner

import paravt.ask as ask_mod
from paravt import protocol as P
from paravt.agent import Episode, EpisodeConfig, run_episode_sync
from paravt.backends.scripted import ScriptedBackend
from paravt.procs import free_port
from videotools import make_test_video

runner = CliRunner()
THINK = "The red shape is not in the overview; two windows may hold it.</think>\n"  # after the forced "<think>\n"
TURN1 = THINK + P.format_tool_call(5, 15) + "\n" + P.format_tool_call(30, 40)
ANSWER = "The second window shows the circle.</think><answer>B</answer>"


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return make_test_video(tmp_path_factory.mktemp("ask") / "v.mp4", seconds=50, fps=2, gop=10)


@pytest.fixture
def scripted(monkeypatch):
    """Patch `make_backend` to hand out a ScriptedBackend; records what it was asked for."""
    made = []

    def fake(model, *, api_key=None, console=None, timeout_s=None):
        b = ScriptedBackend([TURN1, ANSWER], sub=lambda r: f"A red circle moves ({len(r.messages[0].images())} frames).")
        b.timeout_s = timeout_s
        made.append((model, api_key, b))
        return b

    monkeypatch.setattr(ask_mod, "make_backend", fake)
    return made


def invoke(*args):
    from paravt.cli import app

    return runner.invoke(app, ["ask", *map(str, args)])


def one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_ask_prints_the_episode_live_and_writes_trace_and_timeline(video, scripted, tmp_path):
    trace, png = tmp_path / "out" / "trace.json", tmp_path / "out" / "timeline.png"
    r = invoke(video, "Which shape was red?\nA. square\nB. circle", "--model", "some/model", "--frames", "8",
               "--json", trace, "--timeline", png, "--api-key", "k3y", "--temperature", "0.5")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "overview: 8 frames over 50.0 s" in out
    assert "two windows may hold it" in out  # the think
    assert "2 crop(s) dispatched at once: 5–15 s, 30–40 s" in out
    assert "sub-agent 1 (5.0–15.0 s" in out and "sub-agent 2 (30.0–40.0 s" in out
    assert out.count("A red circle moves (10 frames)") == 2
    assert "answer" in out and "B" in out.split("answer")[-1]
    assert out.index("think") < out.index("dispatched") < out.index("sub-agent 1") < out.rindex("answer")
    assert scripted[0][:2] == ("some/model", "k3y")
    ep = Episode.from_dict(json.loads(trace.read_text()))
    assert ep.answer == "B" and ep.config.mode == "parallel" and ep.config.temperature == 0.5
    assert [c.status for c in ep.turns[0].calls] == ["ok", "ok"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.parametrize("tool_calls", ["text", "native"])
def test_ask_tool_calls_reach_the_main_agents_requests(video, scripted, tmp_path, tool_calls):
    """--tool-calls says how the backend sends the tool and reads the calls (main turns only: a
    sub-agent has no tool); the episode and its trace are the same either way."""
    trace = tmp_path / "t.json"
    r = invoke(video, "Q?", "--frames", "4", "--json", trace, "--tool-calls", tool_calls)
    assert r.exit_code == 0, r.output
    reqs = scripted[0][2].requests
    assert {q.tool_calls for q in reqs if q.role == "main"} == {tool_calls}
    assert {q.tool_calls for q in reqs if q.role == "sub"} == {"text"}
    ep = json.loads(trace.read_text())
    assert ep["config"]["tool_calls"] == tool_calls and [c["status"] for c in ep["turns"][0]["calls"]] == ["ok", "ok"]


@pytest.mark.parametrize("mode", ["parallel", "sequential", "inline", "none"])
def test_ask_modes(video, scripted, tmp_path, mode):
    trace = tmp_path / "t.json"
    r = invoke(video, "Q?", "--mode", mode, "--frames", "4", "--json", trace, "--max-turns", "3",
               "--max-parallel", "1" if mode == "parallel" else "5")
    assert r.exit_code == 0, r.output
    ep = json.loads(trace.read_text())
    statuses = [c["status"] for t in ep["turns"] for c in t["calls"]]
    subagents = [c for t in ep["turns"] for c in t["calls"] if c["generation"]]
    if mode == "none":
        assert statuses == [] and len(ep["turns"]) == 1
    elif mode == "inline":
        assert statuses == ["ok", "ok"] and subagents == []
    else:  # sequential: one call per turn; parallel with --max-parallel 1: the same cut
        assert statuses == ["ok", "skipped"] and len(subagents) == 1
        assert ("one call per turn" if mode == "sequential" else "at most 1 calls") in r.stdout


def test_prompt_profile_and_timeout_options(video, scripted, tmp_path):
    from paravt import protocol as P

    trace = tmp_path / "t.json"
    r = invoke(video, "Q?\nA. x\nB. y", "--prompts", "official", "--timeout", "42", "--frames", "4", "--json", trace)
    assert r.exit_code == 0, r.output
    b = scripted[-1][2]
    system = b.requests[0].messages[0].text()
    assert system.startswith("# Tools") and '"video_path"' in system  # the release's tool declaration
    sub = [q for q in b.requests if q.role == "sub"][0].messages[0].text()
    assert sub.startswith("You are analyzing a video segment from")
    assert b.timeout_s == 42 and json.loads(trace.read_text())["config"]["prompts"] == "official"
    one_line_error(invoke(video, "Q?", "--prompts", "mine"), "prompts")
    assert P.PROMPT_PROFILES == ("paravt", "official")


def test_missing_video_fails_before_any_model_loads(scripted, tmp_path):
    one_line_error(invoke(tmp_path / "nope.mp4", "Q?"), "no such file")
    assert scripted == []


def test_corrupt_video_is_a_clear_error(scripted, tmp_path):
    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 500)
    one_line_error(invoke(bad, "Q?"), "not a readable video")
    assert scripted == []


def test_bad_options_are_clear_errors(video, scripted):
    one_line_error(invoke(video, "Q?", "--mode", "telepathy"), "mode")
    one_line_error(invoke(video, "Q?", "--question-type", "essay"), "question-type")
    one_line_error(invoke(video, "Q?", "--max-parallel", "0"), "max_parallel")


def test_unreadable_model_path_is_a_clear_error(video, tmp_path):
    one_line_error(invoke(video, "Q?", "--model", tmp_path / "no-such-model"), "does not exist")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    r = invoke(video, "Q?", "--model", empty)
    assert r.exit_code == 2 and r.stderr.startswith("error:"), r.output


def test_server_down_is_a_clear_error(video):
    port = free_port()
    t = time.perf_counter()
    r = invoke(video, "Q?", "--model", f"http://127.0.0.1:{port}", "--frames", "4")
    one_line_error(r, f"127.0.0.1:{port}")
    assert time.perf_counter() - t < 60


def test_make_backend_choices(monkeypatch, tmp_path):
    import paravt.backends.hf as hf
    import paravt.models as models
    import paravt.models.tiny as tiny
    from paravt.backends.openai import OpenAIBackend

    made = []
    monkeypatch.setattr(hf, "HFBackend", lambda m, p: made.append((m, p)) or "hf-backend")
    monkeypatch.setattr(models, "load_model", lambda path: ("model@" + path, "proc"))
    monkeypatch.setattr(tiny, "build_tiny", lambda: ("untrained", "proc"))
    monkeypatch.delenv("PARAVT_MODEL", raising=False)
    monkeypatch.setattr(ask_mod, "DEFAULT_MODEL", tmp_path / "absent")

    url = ask_mod.make_backend("http://127.0.0.1:9/v1", api_key="x")
    assert isinstance(url, OpenAIBackend)
    assert ask_mod.make_backend("org/checkpoint") == "hf-backend" and made[-1][0] == "model@org/checkpoint"

    from rich.console import Console

    console = Console(record=True, width=200)
    ask_mod.make_backend(None, console=console)
    assert made[-1][0] == "untrained" and "untrained tiny" in console.export_text()

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "config.json").write_text("{}")
    monkeypatch.setattr(ask_mod, "DEFAULT_MODEL", shipped)
    console = Console(record=True, width=400)
    ask_mod.make_backend(None, console=console)
    assert made[-1][0] == f"model@{shipped}"
    # the toy is named as such, before it runs, with the way to a real model
    note = console.export_text()
    assert "synthetic" in note and "--model Qwen/Qwen3-VL-8B-Instruct" in note and "http://" in note
    console = Console(record=True, width=400)
    ask_mod.make_backend(str(shipped), console=console)
    assert "synthetic" not in console.export_text()  # asked for by name: no note
    monkeypatch.setenv("PARAVT_MODEL", "env/model")
    ask_mod.make_backend(None)
    assert made[-1][0] == "model@env/model"


def test_timeline_of_an_episode_with_failures_and_inline_frames(video, tmp_path):
    import matplotlib.image as mpimg

    from paravt.timeline import draw_timeline

    turn = THINK + P.format_tool_call(5, 15) + P.format_tool_call(90, 99) + "<tool_call>{oops</tool_call>"
    for mode in ("parallel", "inline"):
        ep = run_episode_sync(ScriptedBackend([turn, ANSWER], sub="ok"), video, "Q?",
                              EpisodeConfig(frames=6, mode=mode))
        assert [c.status for c in ep.turns[0].calls] == ["ok", "error", "error"]
        png = draw_timeline(ep, tmp_path / f"{mode}.png")
        img = mpimg.imread(png)
        assert img.shape[1] == 1100 and img.shape[0] > 300  # 10 in wide at 110 dpi


@pytest.mark.parametrize("question, expected", [
    ("What colour was the circle?", "oe"),
    ("Which shape was red?\nA. square\nB. circle", "mcq"),
    ("Which shape was red?\n(A) square\n(B) circle", "mcq"),
    ("Which shape was red?\nA) square\nB) circle", "mcq"),
    ("Which shape appeared in red? A. circle B. square C. star D. cross", "mcq"),  # the README's, inline
    ("Was it Plan B. Then what?", "oe"),
])
def test_the_question_type_follows_the_question_unless_given(video, scripted, tmp_path, question, expected):
    """An open question used to get the letter prompt (mcq was the default) and a different answer."""
    trace = tmp_path / "t.json"
    r = invoke(video, question, "--json", trace)
    assert r.exit_code == 0, r.output
    assert f"question type: {expected}" in r.stdout
    assert json.loads(trace.read_text())["question_type"] == expected
    prompt = scripted[0][2].requests[0].messages[-1].text()
    assert prompt.endswith(P.answer_instruction(expected)), prompt
    r = invoke(video, question, "--question-type", "tvg", "--json", trace)
    assert r.exit_code == 0 and json.loads(trace.read_text())["question_type"] == "tvg"
    assert "question type:" not in r.stdout


def test_the_timeline_draws_the_true_span_when_known(video, scripted, tmp_path, monkeypatch):
    from paravt.timeline import draw_timeline

    ep = run_episode_sync(ScriptedBackend([TURN1, ANSWER], sub="ok"), video, "Which?\nA. a\nB. b", EpisodeConfig(frames=4))
    spans = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.axvspan
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan", lambda self, s, e, **k: spans.append((s, e)) or real(self, s, e, **k))
    draw_timeline(ep, tmp_path / "a.png")
    assert spans == []
    draw_timeline(ep, tmp_path / "b.png", truth=[(12.0, 14.5)])
    assert spans == [(12.0, 14.5)]
