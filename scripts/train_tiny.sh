#!/usr/bin/env bash
# Reproduces the shipped tiny models from nothing, on CPU: SynthVT-mini data, cold-start SFT (captions,
# then oracle trajectories) shipped as src/paravt/assets/tiny-paravt-sft, then PARA-GRPO from it
# (scripts/rl_proof.py) shipped as src/paravt/assets/tiny-paravt, the default model.
# Every step resumes when rerun. About 3 hours on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PARAVT=${PARAVT:-.venv/bin/paravt}
PY=${PY:-.venv/bin/python}

# 1. data: 2000 training questions (1000 videos) with 16 caption rows per video, and 300
#    held-out test questions
[ -f data/mini_train/captions.parquet ] || $PARAVT synth --preset mini --out data/mini_train --n 2000 --split train --seed 0 --captions 16
[ -f data/mini_test/rl.parquet ] || $PARAVT synth --preset mini --out data/mini_test --n 300 --split test --seed 0

# 2. SFT (vision tower frozen): frame captions, then oracle trajectories, then two continuations
#    of the trajectory stage. 2b is where the model learned to copy the colour it read into
#    "So the answer is: <colour>" (teacher-forced 2/30 at 800 steps, 25/30 at +500); the shipped
#    run did 2b on an H100 (add -o device=cuda; ~0.8 s/step there, ~1.6 s/step on 2 CPU cores).
#    Stage 3 is 400 more steps, run after the oracle began writing "<answer> magenta" (the token
#    the think ends on) instead of "<answer>magenta"; the shipped stages 2 and 2b saw the old
#    form, a rerun of this script trains every stage on the new one.
$PARAVT train sft --config src/paravt/configs/sft_tiny_captions.yaml
$PARAVT train sft --config src/paravt/configs/sft_tiny.yaml
$PARAVT train sft --config src/paravt/configs/sft_tiny.yaml -o model=runs/sft_tiny/checkpoint -o out=runs/sft_tiny_2b \
  -o steps=1600 -o stop_at=500 -o lr=3e-4
$PARAVT train sft --config src/paravt/configs/sft_tiny.yaml -o model=runs/sft_tiny_2b/checkpoint -o out=runs/sft_tiny_s3 \
  -o steps=400 -o lr=3e-4

# 3. ship the last SFT stage without optimizer state as the SFT start (tiny-paravt-sft)
ship() {  # ship SRC DEST: a checkpoint's model files, without optimizer or trainer state
  mkdir -p "$2"
  for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json \
           chat_template.jinja preprocessor_config.json video_preprocessor_config.json; do
    [ -f "$1/$f" ] && cp "$1/$f" "$2/"
  done
  echo "shipped $(du -sh "$2" | cut -f1) to $2"
}
ship "${SHIP_FROM:-runs/sft_tiny_s3/checkpoint}" src/paravt/assets/tiny-paravt-sft

# 4. PARA-GRPO (300 steps) and the release's vanilla GRPO from it, with their held-out evaluation
#    (docs/rl.md); the PARA-GRPO checkpoint is the default model (tiny-paravt). About 80 min a run
#    on one CPU thread; the two run at once.
[ -f data/mini_test/rl.parquet ] || $PARAVT synth --preset mini --out data/mini_test --n 300 --split test --seed 0
$PY scripts/rl_proof.py --start src/paravt/assets/tiny-paravt-sft --steps 300 --limit 200
ship runs/rl_proof/rl/para_token/checkpoint src/paravt/assets/tiny-paravt
