"""Where a gain is: SynthVT's eval summary splits the score by `needs_event` (event questions against the
background-colour controls), and scripts/paired_gain.py gives the paired bootstrap gain of one run over
another, overall and per group."""

import subprocess
import sys
from pathlib import Path

import pytest

from paravt.agent import EpisodeConfig
from paravt.backends.scripted import ScriptedBackend
from paravt.eval.benchmarks import load_benchmark
from paravt.eval.metrics import paired_gain
from paravt.eval.runner import run_eval

ROOT = Path(__file__).resolve().parents[1]
CFG = EpisodeConfig(frames=4, max_turns=2, max_new_tokens=64)


def test_paired_gain_known_answers():
    base = {str(i): float(i % 2) for i in range(100)}
    assert paired_gain(base, base) == (0.0, 0.0, 0.0, 100)
    assert paired_gain(base, {i: 1.0 for i in base})[0] == pytest.approx(0.5)
    mean, lo, hi, n = paired_gain(base, {i: 1.0 for i in base})
    assert lo < mean < hi and n == 100 and 0.38 < lo and hi < 0.62  # ±~0.1 at n = 100, p = 0.5
    assert paired_gain(base, {i: 1.0 for i in base}) == (mean, lo, hi, n)  # seeded
    assert paired_gain({"a": 1.0}, {"b": 1.0})[3] == 0  # no question in common


def _answers(colour: str):
    """A scripted model answering every question with one colour, without cropping."""
    return ScriptedBackend(lambda req: f"<think>The video shows {colour}.</think><answer>{colour}</answer>", sub="-")


@pytest.fixture(scope="module")
def two_runs(mini_split, tmp_path_factory):
    samples = load_benchmark("synthvt", mini_split).samples
    out = tmp_path_factory.mktemp("runs")
    truth = {s.id: s.answer for s in samples}
    control = next(s for s in samples if not s.extras["needs_event"])
    runs = {}
    for name, colour in (("base", "nothing"), ("new", control.answer)):
        runs[name] = (out / name, run_eval(samples, _answers(colour), CFG, out / name, concurrency=2))
    return samples, truth, runs


def test_the_synthvt_summary_splits_by_needs_event(two_runs):
    samples, truth, runs = two_runs
    out, summary = runs["new"]
    split = summary["by_needs_event"]
    assert set(split) == {"True", "False"}
    assert split["True"]["n"] + split["False"]["n"] == len(samples)
    assert split["True"]["n"] == sum(bool(s.extras["needs_event"]) for s in samples)
    assert "## needs event" in (out / "summary.md").read_text()


def test_paired_gain_script_gives_each_half(two_runs):
    samples, truth, runs = two_runs
    r = subprocess.run([sys.executable, "scripts/paired_gain.py", str(runs["base"][0]), str(runs["new"][0]),
                        "--by", "needs_event"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = {row.split("|")[1].strip(): row for row in r.stdout.splitlines()[2:]}
    assert list(lines) == ["all", "needs_event = False", "needs_event = True"]
    for label, half in (("needs_event = False", "False"), ("needs_event = True", "True")):
        cells = [c.strip() for c in lines[label].split("|")[1:-1]]
        want = runs["new"][1]["by_needs_event"][half]
        base = runs["base"][1]["by_needs_event"][half]
        assert int(cells[1]) == want["n"] and float(cells[3]) == pytest.approx(want["score"], abs=0.05)
        assert float(cells[4].split()[0]) == pytest.approx(want["score"] - base["score"], abs=0.05)
