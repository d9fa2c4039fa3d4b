"""The shipped tiny checkpoint (src/paravt/assets/tiny-paravt): it loads through the same path
as a hub model, `paravt demo` runs it end to end, and on fresh SynthVT-mini videos it sees the
event's colour (greedy decoding, so the figures are deterministic on a given platform) - and,
a known defect kept visible as a strict xfail, does not yet answer above chance."""

import json

import pytest
from typer.testing import CliRunner

from paravt.ask import DEFAULT_MODEL
from paravt.synth.oracle import stated_answer

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


@pytest.fixture(scope="module")
def fresh_eval(tmp_path_factory):
    """The shipped model on 40 fresh SynthVT-mini questions (20 colour questions, 20 controls), K=64."""
    from paravt.cli import app

    tmp = tmp_path_factory.mktemp("shipped")
    data, out = tmp / "val", tmp / "eval"
    r = runner.invoke(app, ["synth", "--preset", "mini", "--out", str(data), "--n", "40", "--split", "val", "--seed", "11"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["eval", "run", "--bench", "synthvt", "--data", str(data), "--model", str(DEFAULT_MODEL),
                            "--frames", "64", "--out", str(out), "--concurrency", "8", "--max-new-tokens", "256"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return json.loads((out / "summary.json").read_text()), rows


@pytest.mark.slow
def test_shipped_model_reads_the_colour_in_its_reasoning(fresh_eval):
    """Perception works: with 64 overview frames the model's think names the event's colour far
    above the 1-in-8 chance (measured: 16 of 20 on the test split)."""
    summary, rows = fresh_eval
    assert summary["n"] == 40 and summary["errors"] == 0
    colour = [r for r in rows if r["question_type"] == "oe"]
    right = sum(stated_answer(" ".join(t["generation"]["text"] for t in r["episode"]["turns"])) == r["answer"]
                for r in colour)
    assert len(colour) >= 15 and right / len(colour) >= 0.4, (right, len(colour))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known defect: the colour named in the think is not copied into <answer> "
                   "(a different BPE token without its leading space); accuracy is at chance. See the model card.")
def test_shipped_model_answers_above_chance(fresh_eval):
    summary, _ = fresh_eval
    assert summary["accuracy"] >= 35.0, summary  # chance on this mix is ~19%
