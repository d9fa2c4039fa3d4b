#!/usr/bin/env bash
# Reproduces the shipped tiny model (src/paravt/assets/tiny-paravt) from nothing, on CPU:
# SynthVT-mini data, two-stage cold-start SFT, then the PARA-GRPO runs and ablations and their
# evaluation (scripts/paradox.py), then copies the shipped checkpoint into the package.
# Every step resumes when rerun. About 2 hours on 2 CPU cores.
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

# 3. PARA-GRPO and the four ablations from the same SFT checkpoint, then the K x mode grid
#    (the shipped figures: on a 16-core H100 machine with --jobs 16 --set device=cuda, 13 min)
$PY scripts/paradox.py --sft runs/sft_tiny/checkpoint --train data/mini_train --test data/mini_test \
  --out runs/paradox --docs docs --steps 60 "$@"

# 4. ship the last SFT stage without optimizer state (no RL run beat its SFT start on the test
#    split; see docs/paradox.md)
src=${SHIP_FROM:-runs/sft_tiny_s3/checkpoint}
dest=src/paravt/assets/tiny-paravt
mkdir -p "$dest"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json \
         chat_template.jinja preprocessor_config.json video_preprocessor_config.json; do
  [ -f "$src/$f" ] && cp "$src/$f" "$dest/"
done
echo "shipped $(du -sh "$dest" | cut -f1) to $dest"
