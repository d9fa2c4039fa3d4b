"""The shipped RL model's row can be rerun with the command the docs give: scripts/rl_proof.py's PARA-GRPO
run is the command the model card records (grpo_tiny.yaml, `-o seed=2`, 300 steps from tiny-paravt-sft),
and its evaluation is the card's. Nothing is trained here: the script prints its commands."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "src/paravt/assets/tiny-paravt/README.md"
RL_DOC = ROOT / "docs/rl.md"


def _documented_rl_proof() -> list[str]:
    """The rl_proof.py line of docs/rl.md's "Reproduce" block, as argv."""
    lines = [ln for ln in RL_DOC.read_text().splitlines() if ln.startswith("python scripts/rl_proof.py")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[2:]


def _commands(args: list[str]) -> list[list[str]]:
    r = subprocess.run([sys.executable, "scripts/rl_proof.py", *args, "--stage", "commands"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [shlex.split(line) for line in r.stdout.splitlines()]


def _card_command(prefix: str) -> list[str]:
    """The card's indented command that starts with `prefix`, its continuation lines joined."""
    text = CARD.read_text().replace("\\\n", " ")
    found = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(prefix)]
    assert len(found) == 1, found
    return shlex.split(found[0])


def test_the_documented_command_trains_the_shipped_model_as_its_card_says():
    cmds = _commands(_documented_rl_proof())
    para = [c for c in cmds if c[:3] == ["paravt", "train", "grpo"] and "out=runs/rl_proof/rl/para_token" in c]
    assert len(para) == 1, cmds
    card = _card_command("paravt train grpo")
    assert para[0] == card
    assert "seed=2" in card and "steps=300" in card and "model=src/paravt/assets/tiny-paravt-sft" in card
    # the training data the card names is the docs' (paravt synth ... mini_train ... --seed 0)
    synth = "paravt synth --preset mini --out data/mini_train --n 2000 --split train --seed 0"
    assert synth in CARD.read_text() and synth in RL_DOC.read_text()


def test_the_cards_evaluation_is_rl_proofs():
    cmds = _commands(_documented_rl_proof())
    start = [c for c in cmds if c[:3] == ["paravt", "eval", "run"] and "src/paravt/assets/tiny-paravt-sft" in c]
    assert {c[c.index("--frames") + 1] for c in start} == {"4", "16", "64"}
    card = re.sub(r"\s+", " ", CARD.read_text().split("`paravt eval run", 1)[1].split("`", 1)[0])
    card_cmd = shlex.split("paravt eval run" + card)
    for c in start:
        k = c[c.index("--frames") + 1]
        i = c.index("--out")
        want = [a.replace("tiny-paravt-sft", "tiny-paravt") for a in c[:i] + c[i + 2:]]  # the card names no --out
        assert want == [k if a == "K" else a for a in card_cmd]


def test_the_generated_page_names_each_runs_overrides():
    """docs/rl.md's block said "overrides none" while the PARA-GRPO run had `-o seed=2`."""
    block = RL_DOC.read_text().split("<!-- rl_proof:begin -->", 1)[1]
    assert "PARA-GRPO `-o seed=2`" in block and "overrides none" not in block
