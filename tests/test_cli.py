"""The command line as a user runs it (in-process through typer's runner, and one real subprocess)."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from paravt.cli import app
from paravt.synth.render import make_spec, write_video

runner = CliRunner()


@pytest.fixture(scope="module")
def synth_video(tmp_path_factory):
    return write_video(make_spec(1, min_len=60, max_len=90), tmp_path_factory.mktemp("v") / "synth.mp4")


def test_help_lists_commands():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("ask", "demo", "serve", "app", "synth", "eval", "train"):
        assert cmd in r.output


@pytest.mark.parametrize("mode", ["parallel", "sequential", "inline", "none"])
def test_ask_end_to_end_on_synth_video(tiny_dir, synth_video, tmp_path, mode):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    r = runner.invoke(app, ["ask", str(synth_video), "What colour was the circle?", "--model", str(tiny_dir),
                            "--mode", mode, "--frames", "8", "--max-new-tokens", "16", "--json", str(trace),
                            "--timeline", str(png), "--question-type", "oe"])
    assert r.exit_code == 0, r.output
    ep = json.loads(trace.read_text())
    assert ep["config"]["mode"] == mode and len(ep["overview_times"]) == 8
    assert png.stat().st_size > 1000


def test_ask_missing_video_is_a_clear_error(tiny_dir, tmp_path):
    r = runner.invoke(app, ["ask", str(tmp_path / "nope.mp4"), "Q?", "--model", str(tiny_dir)])
    assert r.exit_code == 2 and "no such file" in r.output


def test_ask_bad_model_path_is_a_clear_error(synth_video, tmp_path):
    r = runner.invoke(app, ["ask", str(synth_video), "Q?", "--model", str(tmp_path / "no-model")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_ask_dead_server_is_a_clear_error(synth_video):
    from paravt.procs import free_port

    port = free_port()
    r = subprocess.run([sys.executable, "-m", "paravt", "ask", str(synth_video), "Q?", "--model",
                        f"http://127.0.0.1:{port}", "--frames", "4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    # checked before the episode: the cause at once, not the client's retries ("after 5 tries")
    assert "model server unreachable" in r.stderr and "Connection refused" in r.stderr, r.stderr


def test_synth_command_validates(tmp_path):
    r = runner.invoke(app, ["synth", "--out", str(tmp_path), "--n", "3", "--split", "holdout"])
    assert r.exit_code == 2 and "split" in r.output


def test_eval_run_resume_and_report(tiny_dir, tmp_path):
    from paravt.synth.dataset import SynthConfig, build_split

    build_split(tmp_path / "s", SynthConfig(n=4, seed=2, split="test", min_len=60, max_len=80))
    base = ["eval", "--bench", "synthvt", "--data", str(tmp_path / "s"), "--model", str(tiny_dir), "--frames", "4",
            "--max-new-tokens", "8", "--concurrency", "2"]
    for mode in ("parallel", "none"):
        r = runner.invoke(app, base + ["--mode", mode, "--out", str(tmp_path / mode), "--limit", "2"])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, base + ["--mode", "parallel", "--out", str(tmp_path / "parallel")])  # resume: 2 more
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "parallel" / "results.jsonl").read_text().splitlines()) == 4
    r = runner.invoke(app, base + ["--mode", "inline", "--out", str(tmp_path / "parallel")])
    assert r.exit_code == 2 and "other settings" in r.output
    png = tmp_path / "cmp.png"
    r = runner.invoke(app, ["eval", "report", str(tmp_path / "parallel"), str(tmp_path / "none"), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 1000 and "parallel" in r.output


def test_eval_requires_arguments():
    r = runner.invoke(app, ["eval", "--bench", "synthvt"])
    assert r.exit_code == 2 and "--data and --out are required" in r.output


@pytest.mark.parametrize("args, said", [
    (["--bench", "synthvt", "--out", "runs/x"], "--data is required"),
    (["--data", "d", "--out", "runs/x"], "--bench is required"),
    (["--data", "d"], "--bench and --out are required"),
    ([], "--bench, --data and --out are required"),
])
def test_eval_names_the_missing_option(args, said):
    """It said "--bench, --data and --out are required" whichever one was missing."""
    r = runner.invoke(app, ["eval", "run", *args])
    assert r.exit_code == 2 and said in r.output, r.output


def test_eval_help_says_the_default_model_and_each_episode_option():
    r = runner.invoke(app, ["eval", "run", "--help"], env={"COLUMNS": "400"})
    text = " ".join(r.output.split())
    assert "the shipped tiny model" in text
    for option, words in (("--max-turns", "Main-agent generations"), ("--max-parallel", "Crop calls executed"),
                          ("--max-new-tokens", "New tokens per main-agent turn"), ("--api-key", "Bearer key")):
        assert words in text.split(option, 1)[1][:200], option


# --frames and the other episode sizes are checked before anything is loaded


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every loader of a model, video or benchmark fails the test if reached."""
    import paravt.ask
    import paravt.demo
    import paravt.eval.benchmarks
    import paravt.eval.commands
    import paravt.video

    def boom(*a, **k):
        raise AssertionError("loaded something before checking the arguments")

    monkeypatch.setattr(paravt.ask, "make_backend", boom)
    monkeypatch.setattr(paravt.eval.commands, "make_backends", boom)
    monkeypatch.setattr(paravt.eval.benchmarks, "load_benchmark", boom)
    monkeypatch.setattr(paravt.video, "VideoReader", boom)
    monkeypatch.setattr(paravt.demo, "demo", boom)


BAD_SIZES = [(["--frames", "10001"], "frames must be <= 10000"), (["--frames", "0"], "frames must be >= 1"),
             (["--max-turns", "0"], "max_turns must be >= 1"), (["--max-parallel", "0"], "max_parallel must be >= 1"),
             (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
             (["--tool-calls", "xml"], "tool_calls must be text or native, got 'xml'")]


@pytest.mark.parametrize("flags,needle", BAD_SIZES, ids=[" ".join(f) for f, _ in BAD_SIZES])
def test_ask_and_eval_reject_bad_sizes_before_loading(nothing_loads, tmp_path, flags, needle):
    for args in (["ask", str(tmp_path / "v.mp4"), "Q?"],
                 ["eval", "--bench", "synthvt", "--data", str(tmp_path), "--out", str(tmp_path / "o")]):
        r = runner.invoke(app, args + flags)
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("frames,needle", [("10001", "frames must be <= 10000"), ("0", "frames must be >= 1")])
def test_demo_rejects_bad_frames_before_loading(nothing_loads, tmp_path, frames, needle):
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "d"), "--frames", frames])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [r.output.strip()] and needle in r.output
    assert not (tmp_path / "d").exists()


def test_episode_config_bounds_frames():
    from paravt.agent import MAX_FRAMES, EpisodeConfig

    assert MAX_FRAMES == 10000 and EpisodeConfig(frames=MAX_FRAMES).frames == MAX_FRAMES
    with pytest.raises(ValueError, match="frames must be <= 10000"):
        EpisodeConfig(frames=MAX_FRAMES + 1)


def test_synth_help_names_every_question_kind():
    from paravt.synth.questions import DEFAULT_KINDS, EVENT_KINDS

    r = runner.invoke(app, ["synth", "--help"], env={"COLUMNS": "400"})
    text = " ".join(r.output.split())
    listed = text.split("kinds to ask:")[1].split("The background")[0]
    assert [k for k in EVENT_KINDS if k in listed.replace(",", " ").split()] == list(EVENT_KINDS)
    assert "default mix" in listed and all(k in listed.split("(the default mix")[0] for k in DEFAULT_KINDS)


@pytest.mark.parametrize("flag", [["--size", "0"], ["--fps", "0"], ["--size", "33"]])
def test_synth_bad_frame_settings_write_nothing(tmp_path, flag):
    out = tmp_path / "split"
    r = runner.invoke(app, ["synth", "--out", str(out), "--n", "5", *flag])
    assert r.exit_code == 2 and "error:" in r.output
    assert not out.exists()


def test_a_commands_garbage_is_still_finalized_at_exit(tmp_path):
    """The CLI keeps the collector off what is alive at exit (`_freeze_at_exit`: ~1 CPU-s less at the end
    of a command that loaded a model); garbage the command left is still collected first, so finalizers
    that write something (a tempfile's removal, a writer's flush) run as before."""
    mark = tmp_path / "finalized"
    code = f"""
import sys
from paravt.cli import app

class Cycle:
    def __del__(self):
        open({str(mark)!r}, "w").close()

c = Cycle()
c.self = c  # unreachable only through the collector
del c
import gc
gc.disable()  # nothing collects it before the command ends
sys.argv = ["paravt", "version"]
app()
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert mark.exists()
