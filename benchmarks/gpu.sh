#!/usr/bin/env bash
# The GPU figures of docs/gpu.md in one run (<= 9 minutes on one H100/H200): 8B decode against the
# measured memory-bandwidth limit, the 8B PARA-GRPO update (packed and padded: MFU, tokens/s, peak
# memory), and the 8B parallel episode, with profiles of a decode call and a packed update (prof/);
# then the table in docs/gpu.md. No PyAV, FastAPI or openai
# needed. `benchmarks/gpu.sh cpu` runs the same steps with the tiny architecture on the CPU (minutes),
# so a lent GPU's minutes go to measuring, not debugging.
#
#   benchmarks/gpu.sh            # on the GPU machine; results in ${OUT:-gpu_out}/ and docs/gpu.md
#   benchmarks/gpu.sh cpu        # a dry run here: gpu_out/, its table in gpu_out/gpu_cpu.md
#
# Wheels in .whl/ (say transformers, for the version the figures should be measured with) are
# installed into a folder of their own first, ahead of the image's packages.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-gpu}
out=${OUT:-gpu_out}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/paravt_site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/paravt_site"
fi
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# the default mode writes docs/gpu.md: never from a machine without a GPU (a failed run's table would
# replace the measured one); `gpu.sh cpu` writes under $out only
if [ "$mode" != cpu ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu.sh: no CUDA device here, so nothing is measured and docs/gpu.md is left as it is (benchmarks/gpu.sh cpu: a dry run on the CPU)" >&2
  exit 2
fi
mkdir -p "$out"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | tee "$out/machine.txt"
if [ "$mode" = cpu ]; then
  arch=tiny; dev=cpu; doc=$out/gpu_cpu.md
  dec=(--batches 1,8 --tokens 32 --prefill-side 64 --decodes eager,static,static-compiled)
  upd=(--rollouts 2 --frames 4 --subs 1 --turn-tokens 64 --summary-tokens 32 --sub-tokens 32 --system-tokens 100)
  epi=(--repeats 1 --frames 4 --sub-tokens 8 --decode static)
else
  arch=8b; dev=cuda; doc=docs/gpu.md
  # static-compiled (inductor) is left out: a minute of compiling a bucket at 8B for 10 % at batch 1
  # in the first H200 run (docs/gpu.md); add it to --decodes to measure it again
  dec=(--tokens 64 --batches 1,32,8,64 --eager-batches 1,32 --decodes eager,static-graphs)
  upd=(--dtype bf16 --rollouts 4); epi=(--frames 64 --sub-tokens 16 --repeats 1 --decode static-graphs)
fi
step() {  # name, timeout, command...: each step's log and exit status; one failing step does not stop the rest
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  echo "${PIPESTATUS[0]}" > "$out/$name.rc"
}
step decode 200 "$py" benchmarks/bench_decode.py --arch "$arch" --device "$dev" "${dec[@]}" --json "$out/decode.json" --profile "$out/prof"
step update 220 "$py" benchmarks/bench_update.py --arch "$arch" --device "$dev" --packing both "${upd[@]}" --json "$out/update.json" --profile "$out/prof"
step episode 90 "$py" benchmarks/bench_episode.py --arch "$arch" --device "$dev" "${epi[@]}" --json "$out/episode.json"
"$py" benchmarks/gpu_report.py "$out" --doc "$doc"
