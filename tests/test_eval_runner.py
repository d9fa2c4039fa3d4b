"""The eval runner over real (small) SynthVT videos with a scripted model: rows are on disk as they
finish, a killed or interrupted run resumes to the same summary as an uninterrupted one,
settings cannot be mixed, several backends are used at once, failures are counted not fatal."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paravt.agent import EpisodeConfig
from paravt.backends.base import BackendError
from paravt.backends.scripted import ScriptedBackend
from paravt.eval.benchmarks import MissingVideo, load_benchmark
from paravt.eval.runner import EvalAborted, ManifestMismatch, read_results, run_eval
from paravt.procs import free_port

CFG = EpisodeConfig(frames=4, max_turns=2, max_new_tokens=64)


def script(req):
    """A deterministic 'model': calls two crops on some questions, then answers from the question."""
    q = req.messages[1].text()
    first_turn = len(req.messages) == 2
    if first_turn and len(q) % 3 == 0:
        return ('<think>I should look closer.</think>'
                '<tool_call>{"name": "crop_video", "arguments": {"start_time": 0, "end_time": 8}}</tool_call>'
                '<tool_call>{"name": "crop_video", "arguments": {"start_time": 8, "end_time": 16}}</tool_call>')
    if "When does" in q:
        return "<think>It shows up early.</think><answer>10 - 20</answer>"
    if "Answer with a short phrase" in q:
        return "<think>A colour and a shape.</think><answer>red circle</answer>"
    return f"<think>Guessing.</think><answer>{'ABCD'[len(q) % 4]}</answer>"


def make_backend(latency_s: float = 0.0) -> ScriptedBackend:
    return ScriptedBackend(script, sub="A red circle moves from left to right.", latency_s=latency_s)


QUESTIONS = [  # (question, type, answer, options)
    ("What colour was the square?", "mcq", "B", ["A. red", "B. blue", "C. green", "D. white"]),
    ("Which shape appeared first in the video?", "mcq", "A", ["A. circle", "B. square", "C. star", "D. ring"]),
    ("When does the red circle appear?", "tvg", "[10, 18]", []),
    ("How many shapes crossed the frame?", "mcq", "C", ["A. 1", "B. 2", "C. 3", "D. 4"]),
    ("What coloured shape appeared at the top left of the frame?", "oe", "red circle", []),
    ("When does the blue square appear?", "tvg", "[2, 6.5]", []),
    ("Which shape appeared in green?", "mcq", "D", ["A. circle", "B. square", "C. star", "D. triangle"]),
    ("What is shown last?", "oe", "a white ring", []),
]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """A SynthVT-format split (ParaVT-Parquet RL rows) over three real small videos."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from videotools import make_test_video

    d = tmp_path_factory.mktemp("split")
    (d / "videos").mkdir()
    for v, secs in enumerate((24, 30, 36)):
        make_test_video(d / "videos" / f"v{v}.mp4", seconds=secs, fps=2, size=(48, 64))
    rows = []
    for i, (q, qtype, answer, options) in enumerate(QUESTIONS):
        text = q + ("\n" + "\n".join(options) if options else "")
        extra = {"id": f"s{i}", "answer": answer, "question_type": qtype, "options": options, "kind": qtype}
        rows.append({"prompt": [{"role": "user", "content": "<video>\n" + text}],
                     "videos": [{"video": f"videos/v{i % 3}.mp4"}], "extra_info": json.dumps(extra)})
    pq.write_table(pa.Table.from_pylist(rows), d / "rl.parquet")
    return d


@pytest.fixture(scope="module")
def samples(split):
    return load_benchmark("synthvt", split).samples


@pytest.fixture(scope="module")
def full(samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, run_eval(samples, make_backend(), CFG, out, concurrency=3)


def timeless(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not k.startswith("latency")}


def by_id(out: Path) -> dict:
    return {r["id"]: (r["prediction"], r["score"], r["n_calls"]) for r in read_results(out / "results.jsonl")}


def test_uninterrupted_run(full, samples):
    out, s = full
    rows = read_results(out / "results.jsonl")
    assert len(rows) == len(samples) == s["n"] and s["errors"] == 0 and s["pending"] == 0
    assert {r["question_type"] for r in rows} >= {"mcq", "tvg"}
    assert s["mean_tool_calls"] > 0 and 0 < s["tool_usage_rate"] < 100 and "miou" in s and "by_task" in s
    called = next(r for r in rows if r["n_calls"])
    ep = called["episode"]
    assert called["n_executed"] == 2 and len(ep["turns"]) == 2 and len(ep["turns"][0]["calls"]) == 2
    assert "token_ids" not in ep["turns"][0]["generation"]  # id lists are left out of traces by default
    assert called["prompt_tokens"] > 0 and called["main_visual_tokens"] > 0
    for name in ("manifest.json", "summary.json", "summary.md", "missing_videos.jsonl"):
        assert (out / name).is_file()
    assert json.loads((out / "summary.json").read_text())["n"] == len(samples)


def test_rows_reach_disk_before_the_next_sample_runs(samples, tmp_path):
    out = tmp_path / "r"
    seen = []

    def watching(req):
        if len(req.messages) == 2:  # an episode's first model call
            p = out / "results.jsonl"
            seen.append(len(p.read_text().splitlines()) if p.exists() else 0)
        return script(req)

    run_eval(samples[:5], ScriptedBackend(watching), CFG, out, concurrency=1)
    assert seen == [0, 1, 2, 3, 4]


def test_stopped_and_torn_run_resumes_to_the_same_summary(full, samples, tmp_path):
    out = tmp_path / "part"
    run_eval(samples, make_backend(), CFG, out, concurrency=3, stop_after=3)
    assert len(read_results(out / "results.jsonl")) == 3
    with open(out / "results.jsonl", "a") as f:  # killed in the middle of a write
        f.write('{"id": "' + samples[-1].id + '", "score": 1.0, "predic')
    resumed = run_eval(samples, make_backend(), CFG, out, concurrency=3)
    rows = read_results(out / "results.jsonl")
    assert len(rows) == len(samples) and len({r["id"] for r in rows}) == len(samples)
    assert timeless(resumed) == timeless(full[1])
    assert by_id(out) == by_id(full[0])


class Interrupting:
    """Wraps a backend; the n-th main-agent call presses Ctrl-C (a real SIGINT: asyncio.run cancels
    the run's task, and raises KeyboardInterrupt once it has wound down)."""

    name = "interrupting"

    def __init__(self, inner, n):
        self.inner, self.n, self.calls = inner, n, 0

    async def generate(self, requests):
        if requests[0].role == "main":
            self.calls += 1
            if self.calls == self.n:
                signal.raise_signal(signal.SIGINT)
        return await self.inner.generate(requests)

    async def aclose(self):
        return None


def open_files_under(folder: Path) -> list[str]:
    """The files under `folder` that this process holds open (Linux)."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own fd, gone
            pass
    return [p for p in paths if p.startswith(str(folder.resolve()) + os.sep)]


def test_ctrl_c_loses_nothing(full, samples, tmp_path):
    """Ctrl-C at a terminal: the run winds down at once (its files closed, its folder's lock
    released), every finished sample is kept, and a rerun finishes the run."""
    # Python's own Ctrl-C handler, as at a terminal (whatever handler this process holds comes back after)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    out = tmp_path / "int"
    try:
        with pytest.raises(KeyboardInterrupt):
            run_eval(samples, Interrupting(make_backend(), 6), CFG, out, concurrency=2)
    finally:
        signal.signal(signal.SIGINT, old)
    if os.path.isdir("/proc/self/fd"):  # closed when the run ended, not when its coroutine is collected
        assert not open_files_under(out)
    kept = read_results(out / "results.jsonl")
    assert 1 <= len(kept) < len(samples)
    resumed = run_eval(samples, make_backend(), CFG, out, concurrency=2)
    assert timeless(resumed) == timeless(full[1]) and by_id(out) == by_id(full[0])


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_eval_runner import CFG, make_backend
from paravt.eval.benchmarks import load_benchmark
from paravt.eval.runner import run_eval
run_eval(load_benchmark("synthvt", {split!r}).samples, make_backend(latency_s=0.15), CFG, {out!r}, concurrency=2)
"""


def test_sigkill_midway_then_rerun_gives_the_same_summary(full, split, samples, tmp_path):
    out = tmp_path / "killed"
    code = KILL_SCRIPT.format(tests=str(Path(__file__).parent), split=str(split), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = out / "results.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_bytes().splitlines()) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(read_results(results, repair=False)) < len(samples)
    resumed = run_eval(samples, make_backend(), CFG, out, concurrency=3)
    assert timeless(resumed) == timeless(full[1]) and by_id(out) == by_id(full[0])


def test_manifest_refuses_other_settings_unless_forced(samples, tmp_path):
    out = tmp_path / "m"
    run_eval(samples[:2], make_backend(), CFG, out, model="ckpt-a")
    with pytest.raises(ManifestMismatch) as e:
        run_eval(samples[:2], make_backend(), EpisodeConfig(frames=8, max_turns=2), out, model="ckpt-a")
    assert "episode.frames: 4 then, 8 now" in str(e.value) and "episode.max_new_tokens: 64 then, 2048 now" in str(e.value)
    assert "max_turns" not in str(e.value) and "episode.mode" not in str(e.value)  # only what changed is named
    with pytest.raises(ManifestMismatch, match="model: 'ckpt-a' then, 'ckpt-b' now"):
        run_eval(samples[:2], make_backend(), CFG, out, model="ckpt-b")
    s = run_eval(samples[:3], make_backend(), CFG, out, model="ckpt-a")  # a larger limit is the same run
    assert s["n"] == 3
    run_eval(samples[:3], make_backend(), EpisodeConfig(frames=8, max_turns=2), out, model="ckpt-a", force=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["episode"]["frames"] == 8 and manifest["info"]["forced_over"]["episode"]["frames"] == 4
    # a manifest of an earlier version, written before an episode setting existed, resumes
    m = json.loads((out / "manifest.json").read_text())
    del m["episode"]["on_bad_call"]
    (out / "manifest.json").write_text(json.dumps(m))
    assert run_eval(samples[:3], make_backend(), EpisodeConfig(frames=8, max_turns=2), out, model="ckpt-a")["n"] == 3
    # a directory with a manifest but no result yet: nothing to mix, so other settings are allowed
    run_eval(samples[:2], make_backend(), CFG, tmp_path / "empty", limit=0)
    s = run_eval(samples[:2], make_backend(), EpisodeConfig(frames=8, max_turns=2), tmp_path / "empty")
    assert s["n"] == 2 and json.loads((tmp_path / "empty" / "manifest.json").read_text())["episode"]["frames"] == 8


def test_limit_takes_the_first_samples(samples, tmp_path):
    s = run_eval(samples, make_backend(), CFG, tmp_path / "l", limit=3)
    assert s["n"] == 3 and {r["id"] for r in read_results(tmp_path / "l" / "results.jsonl")} == \
        {x.id for x in samples[:3]}


def test_error_rows_are_counted_then_retried(samples, tmp_path):
    bad = samples[1].id
    out = tmp_path / "e"
    flaky = ScriptedBackend(script, fail_sub=lambda req: True)  # every sub-agent fails: local, not an error row

    def main(req):
        if samples[1].question.splitlines()[0] in req.messages[1].text():
            raise BackendError("server said 503")
        return script(req)

    s = run_eval(samples[:4], ScriptedBackend(main), CFG, out)
    assert s["errors"] == 1 and s["n"] == 4
    row = next(r for r in read_results(out / "results.jsonl") if r["id"] == bad)
    assert row["error"].startswith("BackendError") and row["score"] == 0.0
    s = run_eval(samples[:4], make_backend(), CFG, out, retry_errors=False)
    assert s["errors"] == 1
    s = run_eval(samples[:4], make_backend(), CFG, out)  # default: failed samples are run again
    assert s["errors"] == 0 and len(read_results(out / "results.jsonl")) == 5
    s2 = run_eval(samples[:4], flaky, CFG, tmp_path / "subfail")
    assert s2["errors"] == 0  # a failing sub-agent is a tool error inside the episode, not a failed sample


def test_dead_backend_aborts_instead_of_failing_every_sample(samples, tmp_path):
    def dead(req):
        raise BackendError("connection refused")

    with pytest.raises(EvalAborted, match="3 samples in a row"):
        run_eval(samples, ScriptedBackend(dead), CFG, tmp_path / "d", concurrency=1, max_consecutive_backend_errors=3)
    assert len(read_results(tmp_path / "d" / "results.jsonl")) == 3


def test_missing_and_broken_videos(samples, tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    xs = [samples[0], type(samples[1])(**{**samples[1].to_dict(), "video_path": str(broken)})]
    missing = [MissingVideo("gone-1", str(tmp_path / "gone.mp4"))]
    s = run_eval(xs, make_backend(), CFG, tmp_path / "mv", missing=missing)
    assert s["n"] == 2 and s["errors"] == 1 and s["missing_videos"] == 1
    listed = json.loads((tmp_path / "mv" / "missing_videos.jsonl").read_text())
    assert listed == {"id": "gone-1", "looked_for": str(tmp_path / "gone.mp4")}
    err = next(r for r in read_results(tmp_path / "mv" / "results.jsonl") if r["error"])
    assert err["error"].startswith("VideoError")


def test_several_backends_are_used_at_once(samples, tmp_path):
    a, b = make_backend(latency_s=0.05), make_backend(latency_s=0.05)
    s = run_eval(samples, [a, b], CFG, tmp_path / "two", concurrency=4)
    assert s["n"] == len(samples) and s["errors"] == 0
    rows = read_results(tmp_path / "two" / "results.jsonl")
    assert {r["backend"] for r in rows} == {0, 1}
    assert sum(1 for r in a.requests if r.role == "main") > 0 and sum(1 for r in b.requests if r.role == "main") > 0

    made = []

    class Closing(ScriptedBackend):
        closed = False

        async def aclose(self):
            self.closed = True

    def factory():
        made.extend([Closing(script), Closing(script)])
        return made

    run_eval(samples[:2], factory, CFG, tmp_path / "factory")
    assert len(made) == 2 and all(m.closed for m in made)


def test_read_results_repairs_only_the_tail(tmp_path):
    p = tmp_path / "results.jsonl"
    p.write_text('{"id": "a"}\n{garbage}\n{"id": "b"}\n{"id": "c", "x"')
    assert [r["id"] for r in read_results(p)] == ["a", "b"]  # garbled middle line skipped, not fatal
    assert p.read_text().endswith('{"id": "b"}\n')
    p.write_text('{"id": "a"}\n{"id": "b"}')  # complete JSON, newline lost
    assert [r["id"] for r in read_results(p)] == ["a", "b"]
    assert p.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_bad_arguments(samples, tmp_path):
    with pytest.raises(ValueError, match="concurrency"):
        run_eval(samples, make_backend(), CFG, tmp_path / "x", concurrency=0)
    with pytest.raises(ValueError, match="no backend"):
        run_eval(samples, [], CFG, tmp_path / "y")


class SlowOn:
    """A backend that stalls on one question (a hung server or decoder)."""

    name = "slow"

    def __init__(self, inner, needle):
        self.inner, self.needle = inner, needle

    async def generate(self, requests):
        import asyncio

        if self.needle in requests[0].messages[-1].text():
            await asyncio.sleep(600)
        return await self.inner.generate(requests)

    async def aclose(self):
        return None


def test_a_stalled_sample_times_out_and_the_run_goes_on(samples, tmp_path):
    needle = samples[2].question.splitlines()[0]
    t = time.perf_counter()
    # a timeout the healthy samples meet on a loaded machine; the stalled one would take 600 s
    s = run_eval(samples[:4], SlowOn(make_backend(), needle), CFG, tmp_path / "t", concurrency=2, sample_timeout_s=4.0)
    assert time.perf_counter() - t < 60
    assert s["n"] == 4 and s["errors"] == 1
    row = next(r for r in read_results(tmp_path / "t" / "results.jsonl") if r["error"])
    assert row["id"] == samples[2].id and row["error"].startswith("TimeoutError")


def test_cli_run_resume_report_and_errors(split, tmp_path, monkeypatch):
    """`paravt eval run ...` and the issue's `paravt eval --bench ...` spelling, on a scripted model."""
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app

    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: make_backend())
    cli = CliRunner()
    base = ["--bench", "synthvt", "--data", str(split), "--frames", "4", "--max-turns", "2", "--max-new-tokens", "64"]
    r = cli.invoke(app, ["eval", "run", *base, "--out", str(tmp_path / "par"), "--limit", "3"])
    assert r.exit_code == 0, r.output
    assert len(read_results(tmp_path / "par" / "results.jsonl")) == 3 and "score" in r.output
    r = cli.invoke(app, ["eval", *base, "--out", str(tmp_path / "par")])  # resume, the spelling
    assert r.exit_code == 0, r.output
    assert len(read_results(tmp_path / "par" / "results.jsonl")) == 8
    r = cli.invoke(app, ["eval", *base, "--mode", "none", "--out", str(tmp_path / "par")])
    assert r.exit_code == 2 and "other settings" in r.output
    r = cli.invoke(app, ["eval", "run", *base, "--mode", "none", "--out", str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    png, md = tmp_path / "cmp.png", tmp_path / "cmp.md"
    r = cli.invoke(app, ["eval", "report", str(tmp_path / "par"), str(tmp_path / "none"), "--plot", str(png),
                         "--md", str(md)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 5000 and "par (parallel)" in md.read_text() and "none" in md.read_text()
    monkeypatch.chdir(tmp_path)  # without --plot, no picture appears in the current folder
    before = set(tmp_path.iterdir())
    r = cli.invoke(app, ["eval", "report", str(tmp_path / "par"), str(tmp_path / "none")])
    assert r.exit_code == 0 and "par (parallel)" in r.output and set(tmp_path.iterdir()) == before
    r = cli.invoke(app, ["eval", "report", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "summary.json" in r.output
    r = cli.invoke(app, ["eval", "run", "--bench", "imagenet", "--data", str(split), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown benchmark" in r.output
    r = cli.invoke(app, ["eval", "--bench", "synthvt", "--data", str(split)])
    assert r.exit_code == 2 and "required" in r.output


# ----------------------------------------------------------------------------------------------
# a run directory that cannot be written: one clear line, nothing lost, a resume finishes the run


FULL_DISK_SCRIPT = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
import paravt.eval.commands as commands
from test_eval_runner import make_backend
commands.make_backends = lambda *a, **k: make_backend()
from paravt.cli import app
app(["eval", "--bench", "synthvt", "--data", {split!r}, "--out", {out!r}, "--frames", "4", "--max-turns", "2",
     "--max-new-tokens", "64"])
"""


def run_cli_with_file_limit(split, out: Path, limit: int) -> subprocess.CompletedProcess:
    code = FULL_DISK_SCRIPT.format(tests=str(Path(__file__).parent), split=str(split), out=str(out), limit=limit)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_disk_full_midway_is_one_line_then_a_resume_finishes_the_run(full, split, samples, tmp_path):
    """The disk fills after a few rows (a file-size limit: writes fail with EFBIG): the eval ends with
    one line naming the file, exit 2, no traceback and no crash of the decoders still at work; every
    row written is intact, and a rerun with room finishes with the uninterrupted run's results."""
    out = tmp_path / "fills"
    r = run_cli_with_file_limit(split, out, 7000)  # the manifest fits, about two rows do
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert r.stderr.strip().splitlines() == [f"error: {out / 'results.jsonl'}: File too large"], r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    data = (out / "results.jsonl").read_bytes()
    assert data.endswith(b"\n"), "a torn row was left behind"
    kept = read_results(out / "results.jsonl", repair=False)
    assert 1 <= len(kept) < len(samples) and not (out / "summary.json").exists()
    r = run_cli_with_file_limit(split, out, -1)  # space freed (no limit): the same command resumes
    assert r.returncode == 0, r.stderr[-3000:]
    assert timeless(json.loads((out / "summary.json").read_text())) == timeless(full[1])
    assert by_id(out) == by_id(full[0])


def test_no_room_for_the_summary_is_one_line_and_keeps_every_row(full, split, samples, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app

    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: make_backend())
    out = tmp_path / "nosummary"
    out.mkdir()
    (out / "summary.json").symlink_to("/dev/full")  # every write to it: ENOSPC (never read by a run)
    args = ["eval", "--bench", "synthvt", "--data", str(split), "--out", str(out), "--frames", "4", "--max-turns", "2",
            "--max-new-tokens", "64"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines()
              if line.startswith("error") or "Error" in line or "Traceback" in line]
    assert errors == [f"error: {out / 'summary.json'}: No space left on device"], r.output
    assert by_id(out) == by_id(full[0])  # all rows were written before the summary
    (out / "summary.json").unlink()  # space freed
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert timeless(json.loads((out / "summary.json").read_text())) == timeless(full[1])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_run_directory_is_one_line(split, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app

    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: make_backend())
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        r = CliRunner().invoke(app, ["eval", "--bench", "synthvt", "--data", str(split), "--out", str(out),
                                     "--frames", "4", "--max-turns", "2", "--max-new-tokens", "64"])
    finally:
        out.chmod(0o755)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines()
              if line.startswith("error") or "Error" in line or "Traceback" in line]
    assert errors == [f"error: {out / 'manifest.json'}: Permission denied"], r.output


def test_report_output_errors_are_one_line(full, tmp_path):
    from typer.testing import CliRunner

    from paravt.cli import app

    run = str(full[0])
    cases = [(["--plot", str(tmp_path / "no" / "dir" / "p.png")], f"{tmp_path / 'no' / 'dir' / 'p.png'}: "
              "No such file or directory"),
             (["--plot", str(tmp_path / "p.png"), "--md", "/dev/full"], "/dev/full: No space left on device")]
    for flags, want in cases:
        r = CliRunner().invoke(app, ["eval", "report", run, *flags])
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines() == [f"error: {want}"], r.output
    bad = tmp_path / "torn"
    bad.mkdir()
    (bad / "summary.json").write_text('{"n": 3, "sco')
    r = CliRunner().invoke(app, ["eval", "report", str(bad), "--plot", str(tmp_path / "q.png")])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        f"error: {bad / 'summary.json'}: not valid JSON (rerun the eval to rewrite it)"], r.output


# ----------------------------------------------------------------------------------------------
# a model server that is not there: checked before the run, named in each row, a failed run exits 1


class DyingServer:
    """An OpenAI-compatible server on loopback that lists its model (the check before the run
    passes), then dies at the first chat request: that connection is dropped and the port closed,
    so the client's retries are refused until the episode's deadline passes."""

    def __init__(self):
        import http.server
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                outer.die()
                self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._lock = threading.Lock()
        self._dead = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def die(self):
        import threading

        with self._lock:
            if self._dead:
                return
            self._dead = True

        def stop():
            self.server.shutdown()
            self.server.server_close()  # the port is closed: connections are refused

        threading.Thread(target=stop, daemon=True).start()


def test_a_dead_server_fails_the_run_before_anything_is_written(samples, tmp_path):
    from paravt.backends.openai import OpenAIBackend

    url = f"http://127.0.0.1:{free_port()}"
    want = f"model server unreachable: {url}: cannot connect (Connection refused)"
    with pytest.raises(BackendError) as e:
        run_eval(samples[:2], OpenAIBackend(url, timeout_s=60.0), CFG, tmp_path / "dead")
    assert str(e.value) == want and not (tmp_path / "dead").exists()


def test_a_server_gone_midway_is_named_in_each_row(samples, tmp_path):
    """The rows say the connection was refused, not only that the episode's deadline passed."""
    from paravt.backends.openai import OpenAIBackend

    server = DyingServer()
    out = tmp_path / "dies"
    s = run_eval(samples[:3], OpenAIBackend(server.url, timeout_s=2.0), CFG, out, concurrency=3)
    assert s["n"] == 3 and s["errors"] == 3
    cause = f"BackendError: model server unreachable: {server.url}: cannot connect (Connection refused)"
    rows = read_results(out / "results.jsonl")
    assert [r["error"] for r in rows] == [cause] * 3
    assert all(r["error_detail"].startswith("BackendError: ") for r in rows)  # what the episode saw
    assert s["error_causes"] == {cause: 3}


def test_cli_a_dead_server_is_one_line_and_writes_nothing(split, tmp_path):
    from typer.testing import CliRunner

    from paravt.cli import app

    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "dead"
    r = CliRunner().invoke(app, ["eval", "--bench", "synthvt", "--data", str(split), "--model", url, "--timeout", "2",
                                 "--frames", "4", "--limit", "2", "--out", str(out)])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == [f"error: model server unreachable: {url}: cannot connect (Connection refused)"], r.output
    assert not out.exists()


def test_cli_nothing_evaluated_or_too_many_errors_exit_non_zero(full, split, tmp_path, monkeypatch):
    """--limit 0 is refused; a run whose error rate passes --max-error-rate ends with the count and
    the most common causes and exits 1, keeping its rows; a rerun retries them."""
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app

    def down(req):
        raise BackendError("server said 503")

    backend = {"b": ScriptedBackend(down)}
    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: backend["b"])
    out = tmp_path / "gate"
    base = ["eval", "--bench", "synthvt", "--data", str(split), "--frames", "4", "--max-turns", "2",
            "--max-new-tokens", "64", "--out", str(out)]
    r = CliRunner().invoke(app, base + ["--limit", "0"])
    assert r.exit_code == 2 and "--limit must be >= 1, got 0 (0 evaluates nothing)" in r.output, r.output
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    i = lines.index("8 of 8 samples failed (100.0%); most common causes:")
    assert lines[i + 1] == "  8 x BackendError: server said 503"
    assert lines[-1] == (f"error: 8 of 8 samples failed (100.0%), more than --max-error-rate 0.5; the rows are in "
                         f"{out}/results.jsonl (rerun the same command to retry the failed samples)")
    assert len(read_results(out / "results.jsonl")) == 8
    r = CliRunner().invoke(app, base + ["--max-error-rate", "1", "--no-retry-errors"])
    assert r.exit_code == 0, r.output  # the same rows pass a looser gate
    backend["b"] = make_backend()
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0 and "failed" not in r.output, r.output
    assert timeless(json.loads((out / "summary.json").read_text())) == timeless(full[1])


def test_a_resume_after_the_data_changed_reruns_the_changed_samples(split, tmp_path):
    """An answer corrected in rl.parquet after a run: the rerun scores that sample again (and says
    how many it redid) instead of keeping the stale row; a video replaced in place counts too."""
    import shutil

    import pyarrow.parquet as pq

    data = tmp_path / "data"
    shutil.copytree(split, data)
    out = tmp_path / "r"
    first = run_eval(load_benchmark("synthvt", data).samples, make_backend(), CFG, out, concurrency=2)
    assert first["inputs_changed"] == 0
    rows = pq.read_table(data / "rl.parquet").to_pylist()
    extra = json.loads(rows[0]["extra_info"])
    extra["answer"] = "D" if extra["answer"] != "D" else "A"
    rows[0]["extra_info"] = json.dumps(extra)
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), data / "rl.parquet")
    calls = []

    def counting(req):
        calls.append(1)
        return script(req)

    again = run_eval(load_benchmark("synthvt", data).samples, ScriptedBackend(counting, sub="A red circle."), CFG, out)
    assert again["inputs_changed"] == 1 and calls  # only the changed sample ran
    latest = {r["id"]: r for r in read_results(out / "results.jsonl")}
    assert latest["s0"]["answer"] == extra["answer"]
    assert again["n"] == first["n"]
    # a video replaced in place (same path, new bytes): the samples over it run again
    v = data / "videos" / "v1.mp4"
    v.write_bytes(v.read_bytes() + b"\0")
    third = run_eval(load_benchmark("synthvt", data).samples, make_backend(), CFG, out)
    assert third["inputs_changed"] == sum(1 for i in range(len(QUESTIONS)) if i % 3 == 1)
    assert run_eval(load_benchmark("synthvt", data).samples, make_backend(), CFG, out)["inputs_changed"] == 0


def test_two_runs_on_one_out_folder_are_refused(samples, split, tmp_path, monkeypatch):
    """The second run is refused, and `paravt eval` refuses it before the model loads (minutes at 8B)."""
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app
    from paravt.eval.run_dir import RunDirBusy

    loads = []
    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: loads.append(1) or make_backend())

    out = tmp_path / "r"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from paravt.eval.run_dir import RunLock; l = RunLock(sys.argv[2]).acquire(); "
                               "print('held', flush=True); time.sleep(60)", str(Path(__file__).parents[1] / "src"),
                               str(out)], stdout=subprocess.PIPE, text=True)
    try:  # another process is writing there
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"in use by another paravt eval \\(pid {holder.pid}\\)"):
            run_eval(samples[:2], make_backend(), CFG, out)
        r = CliRunner().invoke(app, ["eval", "--bench", "synthvt", "--data", str(split), "--out", str(out),
                                     "--frames", "4", "--max-turns", "2", "--max-new-tokens", "64", "--limit", "2"])
        assert r.exit_code == 2 and "in use by another paravt eval" in r.output and not loads, r.output
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text()
    assert run_eval(samples[:2], make_backend(), CFG, out)["n"] == 2  # free again
    for _ in range(2):  # a folder a finished run left its lock file in: taken early, then by the run, then freed
        r = CliRunner().invoke(app, ["eval", "--bench", "synthvt", "--data", str(split), "--out", str(tmp_path / "r2"),
                                     "--frames", "4", "--max-turns", "2", "--max-new-tokens", "64", "--limit", "2"])
        assert r.exit_code == 0, r.output
    assert loads == [1, 1] and (tmp_path / "r2" / ".lock").exists()


# ----------------------------------------------------------------------------------------------
# --media-root: a data file from elsewhere opens only videos under the root


def _rows_naming(d: Path, names: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": f"<video>\nWhat colour was square {i}?\nA. red\nB. blue"}],
             "videos": [{"video": n}], "extra_info": json.dumps({"id": f"r{i}", "answer": "B", "question_type": "mcq",
                                                                 "options": ["A. red", "B. blue"]})}
            for i, n in enumerate(names)]
    pq.write_table(pa.Table.from_pylist(rows), d / "rl.parquet")


def test_a_media_root_holds_every_row_to_it(split, tmp_path, monkeypatch):
    """A data file whose rows name a video outside --media-root (an absolute path, `..`, a link out of
    the root): each of those samples is an error row that names the path, no episode of theirs reaches
    the model, and the row under the root is scored; a root no row is under is refused before the model
    loads."""
    from typer.testing import CliRunner

    import paravt.eval.commands as commands
    from paravt.cli import app

    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (root / "videos").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "videos" / "ok.mp4").write_bytes((split / "videos" / "v0.mp4").read_bytes())
    secret = elsewhere / "secret.mp4"
    secret.write_bytes((split / "videos" / "v1.mp4").read_bytes())
    (root / "videos" / "link.mp4").symlink_to(secret)
    _rows_naming(root, ["videos/ok.mp4", str(secret), "../elsewhere/secret.mp4", "videos/link.mp4"])
    backends = []
    monkeypatch.setattr(commands, "make_backends", lambda *a, **k: backends.append(make_backend()) or backends[-1])
    base = ["eval", "--bench", "synthvt", "--data", str(root), "--frames", "4", "--max-turns", "2",
            "--max-new-tokens", "64", "--max-error-rate", "1"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "held"), "--media-root", str(root)])
    assert r.exit_code == 0, r.output
    assert "2 sample(s) name a video outside --media-root" in " ".join(r.output.split())
    rows = {row["id"]: row for row in read_results(tmp_path / "held" / "results.jsonl")}
    assert rows["r0"]["error"] is None and rows["r0"]["n_turns"] >= 1
    for i in ("r1", "r2", "r3"):
        assert rows[i]["error"] == (f"VideoError: {rows[i]['video_path']} is outside --media-root {root}: a data "
                                    "row may name only files under it"), rows[i]
    asked = {q for req in backends[0].requests for m in req.messages for q in re.findall(r"square \d", m.text())}
    assert asked == {"square 0"}  # the model saw one sample's episode: the one under the root
    summary = json.loads((tmp_path / "held" / "summary.json").read_text())
    assert summary["errors"] == 3 and len(summary["error_causes"]) == 1  # one cause, named once

    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "none"), "--media-root", str(elsewhere / "..")
                                 + "/nowhere"])
    assert r.exit_code == 2 and "--media-root" in r.output and "not a folder" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "none"), "--media-root", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no sample's video is under --media-root" in " ".join(r.output.split())
    assert len(backends) == 1 and not (tmp_path / "none").exists()  # refused before the model loaded
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "none"), "--videos", str(split / "videos"),
                                 "--media-root", str(root)])
    assert r.exit_code == 2 and "is outside --media-root" in " ".join(r.output.split()) and len(backends) == 1
