#!/usr/bin/env bash
# The GPU figures of docs/gpu.md in one run (<= 9 minutes on one H100/H200, every step's cut-off
# included): 8B decode at episode shapes (main agents at K = 64, ~8 k tokens, batch 1/32; sub-agents,
# 10-frame crops, batch 5/40) per decode path against the roofline of the bytes a step must read, and
# at the first round's short prompts; profiles of decode calls and of a packed update, broken down by
# category and phase (prof/, and a table); the 8B PARA-GRPO update with each of its switches alone and
# all together (bench_switches.py: tokens/s, MFU, peak memory, equal to the baseline or not), on a GRPO
# group's layout (--group-prompts: the rollouts share their prompt); episodes per minute (a batch of 8B
# episodes, K = 64, 5 crops, every model call real, parallel vs sequential); the parallel episode with
# 1..5 crops; then docs/gpu.md's section, its targets table last.
# No PyAV, FastAPI or openai needed. `benchmarks/gpu.sh cpu` runs the same steps with the tiny
# architecture on the CPU (minutes), so a lent GPU's minutes go to measuring, not debugging.
#
#   benchmarks/gpu.sh            # on the GPU machine; results in ${OUT:-gpu_out}/ and docs/gpu.md
#   benchmarks/gpu.sh cpu        # a dry run here: gpu_out/, its table in gpu_out/gpu_cpu.md
#
# Wheels in .whl/ (transformers 5.24 and liger-kernel, docs/gpu.md) are installed into a folder of
# their own first, ahead of the image's packages.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-gpu}
out=${OUT:-gpu_out}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# the default mode writes docs/gpu.md: never from a machine without a GPU (a failed run's table would
# replace the measured one); `gpu.sh cpu` writes under $out only
if [ "$mode" != cpu ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu.sh: no CUDA device here, so nothing is measured and docs/gpu.md is left as it is (benchmarks/gpu.sh cpu: a dry run on the CPU)" >&2
  exit 2
fi
# the wheels of .whl/ (above); the dry run installs them under $out, so it writes nowhere else
site=/tmp/paravt_site
[ "$mode" = cpu ] && site=$out/site
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:$site"
fi
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | tee "$out/machine.txt"
if [ "$mode" = cpu ]; then
  arch=tiny; dev=cpu; doc=$out/gpu_cpu.md
  dec=(--tokens 16 --batches 1,4 --decodes eager,static --shape-decodes static,static-bucket
       --main-frames 8 --main-side 64 --main-context 900 --main-batches 1,4 --sub-frames 2 --sub-side 64
       --sub-batches 2,5 --other-main-batches 1,4 --other-sub-batches 5 --profile-batches 1,4 --prefill-side 64
       --prefill-frames 8)
  upd=(--rollouts 2 --group-prompts --frames 4 --subs 1 --turn-tokens 64 --summary-tokens 32 --sub-tokens 32
       --system-tokens 100 --token-budget 4096)
  eps=(--episodes 2 --frames 4 --crops 2 --sub-tokens 8 --decode static)
  epi=(--repeats 1 --frames 4 --sub-tokens 8 --decode static --modes parallel,sequential)
  limits=(300 300 300 300)
else
  arch=8b; dev=cuda; doc=docs/gpu.md
  # the episode shapes on the default path (live KV) and the first round's (whole bucket), then the
  # short prompts on the default path; eager, the 64-frame prefill and transformers' generate were
  # measured in the first round (docs/gpu.md) and are left out for time, and so is static-compiled
  # (inductor: a minute of compiling a bucket at 8B for 10 % at batch 1); add them back with
  # --decodes eager,static-graphs,static-compiled --prefill-frames 64; main batch 8, and the bucket path
  # at main batch 1, are left out for the update's switches (add them back with --main-batches 1,8,32
  # --other-main-batches 1,32)
  dec=(--tokens 64 --shape-decodes static-graphs,static-graphs-bucket --main-batches 1,32 --sub-batches 5,40
       --other-main-batches 32 --other-sub-batches 40 --profile-batches 1,32
       --batches 1,32 --decodes static-graphs --prefill-frames 0)
  # a GRPO group's two rollouts at K = 64 (their ~4.4 k-token prompt shared in one pass of <= 16 k tokens),
  # main sequences only (the recipe leaves sub-agents out of the loss), bf16 master weights to fit one GPU;
  # the trainer's kl_mode (reward: the reference's forward once, before the update, timed with it)
  upd=(--dtype bf16 --rollouts 2 --group-prompts --subs 0 --token-budget 16384)
  eps=(--episodes 8 --frames 64 --crops 5 --sub-tokens 128 --decode static-graphs)
  epi=(--frames 64 --sub-tokens 16 --repeats 1 --decode static-graphs --modes parallel,sequential)
  # seconds a step may run: 160 + 200 + 90 + 55 = 505 s, the rest of 9 minutes for the start and the report
  limits=(160 200 90 55)
fi
step() {  # name, timeout, command...: each step's log and exit status; one failing step does not stop the rest
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  echo "${PIPESTATUS[0]}" > "$out/$name.rc"
}
start=$SECONDS
step decode "${limits[0]}" "$py" benchmarks/bench_decode.py --arch "$arch" --device "$dev" "${dec[@]}" --json "$out/decode.json" --profile "$out/prof"
step update "${limits[1]}" "$py" benchmarks/bench_switches.py --arch "$arch" --device "$dev" "${upd[@]}" --json "$out/update.json" --profile "$out/prof"
step episodes "${limits[2]}" "$py" benchmarks/bench_episodes.py --arch "$arch" --device "$dev" "${eps[@]}" --json "$out/episodes.json"
step episode "${limits[3]}" "$py" benchmarks/bench_episode.py --arch "$arch" --device "$dev" "${epi[@]}" --json "$out/episode.json"
echo "== steps took $((SECONDS - start)) s"
"$py" benchmarks/gpu_report.py "$out" --doc "$doc"
