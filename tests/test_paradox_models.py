"""The paradox testbed's shipped checkpoints (src/paravt/assets/paradox-base, paradox-cold; their model
cards and docs/paradox.md): small, loadable, and each holding the habit it was built for, seen through
`paravt eval run` on fresh paradox-preset videos. The base writes the prior's layout (no think block,
answers without tags): it parses when it may begin its turn itself (--no-think-prefix) and breaks under
the forced think prefix; the cold start writes paravt's think block and parallel crop calls and crops
even at K = 64, where the overview already shows the event (the precondition of the paradox)."""

import json

import pytest
from typer.testing import CliRunner

from paravt import DEFAULT_MODEL

runner = CliRunner()
BASE, COLD = DEFAULT_MODEL.parent / "paradox-base", DEFAULT_MODEL.parent / "paradox-cold"
pytestmark = pytest.mark.skipif(not (COLD / "config.json").exists(), reason="no shipped paradox checkpoints")


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """Four fresh paradox-preset questions on videos no training run saw."""
    from paravt.cli import app

    data = tmp_path_factory.mktemp("paradox") / "val"
    r = runner.invoke(app, ["synth", "--preset", "paradox", "--out", str(data), "--n", "4", "--split", "val",
                            "--seed", "11"])
    assert r.exit_code == 0, r.output
    return data


def _eval(split, out, model, frames: int, *flags: str) -> list[dict]:
    from paravt.cli import app

    r = runner.invoke(app, ["eval", "run", "--bench", "synthvt", "--data", str(split), "--model", str(model),
                            "--frames", str(frames), "--out", str(out), "--concurrency", "4",
                            "--max-new-tokens", "320", "--limit", "4", *flags])
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def test_the_checkpoints_are_small_and_load():
    from paravt.models import load_model

    for path in (BASE, COLD):
        size = sum(p.stat().st_size for p in path.iterdir())
        assert size < 8 * 2**20, f"{path.name}: {size / 2**20:.1f} MB"
        assert (path / "README.md").exists(), f"{path.name} has no model card"
        model, _ = load_model(str(path), device="cpu")
        assert type(model).__name__ == "Qwen3VLForConditionalGeneration"


@pytest.mark.slow
def test_the_base_holds_the_prior_and_breaks_under_the_think_prefix(split, tmp_path):
    own = _eval(split, tmp_path / "own", BASE, 16, "--no-think-prefix")
    assert all(r["episode"]["config"]["think_prefix"] is False for r in own)
    first = [r["episode"]["turns"][0]["generation"] for r in own]
    assert all(g["prefix"] == "" and "<think>" not in g["text"] for g in first), first
    assert sum(r["n_problems"] == 0 for r in own) >= 3, [g["text"] for g in first]
    # answers in its own layout: a sentence, not paravt's tagged answer
    assert not any("<answer>" in t["generation"]["text"] for r in own for t in r["episode"]["turns"])
    forced = _eval(split, tmp_path / "forced", BASE, 16)
    assert sum(r["n_problems"] > 0 for r in forced) >= 3, [r["episode"]["turns"][0]["generation"]["text"]
                                                           for r in forced]


@pytest.mark.slow
def test_the_cold_start_crops_in_parallel_where_the_overview_suffices(split, tmp_path):
    rows = _eval(split, tmp_path / "cold", COLD, 64)
    first = [r["episode"]["turns"][0]["generation"]["text"] for r in rows]
    assert all(t.count("</think>") == 1 for t in first), first
    parsed = [r for r in rows if r["n_problems"] == 0]
    assert len(parsed) >= 3, first
    assert sum(r["n_calls"] >= 2 for r in parsed) >= 3, [r["n_calls"] for r in rows]
