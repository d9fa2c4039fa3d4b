"""The shipped tiny checkpoint (src/paravt/assets/tiny-paravt): it loads through the same path
as a hub model, `paravt demo` runs it end to end, and on fresh SynthVT-mini videos it answers
well above chance (greedy decoding, so the score is deterministic on a given platform)."""

import json

import pytest
from typer.testing import CliRunner

from paravt.ask import DEFAULT_MODEL

runner = CliRunner()
pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="no shipped checkpoint")


def test_shipped_checkpoint_is_small_and_loads():
    from paravt.models import load_model

    size = sum(p.stat().st_size for p in DEFAULT_MODEL.iterdir())
    assert size < 20 * 2**20, f"{size / 2**20:.1f} MB"
    model, processor = load_model(str(DEFAULT_MODEL), device="cpu")
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert processor.tokenizer.convert_tokens_to_ids("<tool_call>") != processor.tokenizer.unk_token_id


@pytest.mark.slow
def test_demo_runs_the_shipped_model(tmp_path):
    from paravt.cli import app

    r = runner.invoke(app, ["demo", "--out", str(tmp_path), "--seed", "7"])
    assert r.exit_code == 0, r.output
    assert "answer" in r.output and list(tmp_path.glob("timeline_*.png"))


@pytest.mark.slow
def test_shipped_model_beats_chance_on_fresh_videos(tmp_path):
    """Uniform chance on this mix is ~17% and the best constant answer per question kind ~23%
    (measured on the 300-question test split); the threshold leaves room below the measured score."""
    from paravt.cli import app

    data, out = tmp_path / "val", tmp_path / "eval"
    r = runner.invoke(app, ["synth", "--preset", "mini", "--out", str(data), "--n", "40", "--split", "val", "--seed", "11"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["eval", "run", "--bench", "synthvt", "--data", str(data), "--model", str(DEFAULT_MODEL),
                            "--frames", "16", "--out", str(out), "--concurrency", "8", "--max-new-tokens", "256"])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 40 and summary["errors"] == 0
    assert summary["accuracy"] >= SHIPPED_MIN_ACCURACY, summary


SHIPPED_MIN_ACCURACY = 30.0  # percent; see the model card for the measured figures
