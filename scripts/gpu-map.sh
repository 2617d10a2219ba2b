#!/usr/bin/env bash
# The GPU page, reproduced on any host with a GPU and JAX (docs/gpu.md): narbench's latency map, AR greedy
# against PaDIR refine:T (T = 1, 2, 4, 10; k = 1 and 5) on random-weight models, 16-256 target tokens, each
# cell's roofline projection on the same device beside its measurement. It runs the most valuable cells first
# and stops starting new work when its time budget is spent; everything it writes is under OUT_DIR:
#
#   OUT_DIR/device.json         what JAX and the driver say of the device (kind, SMs, memory, driver)
#   OUT_DIR/results/speedmap/   one map folder per step (rows.jsonl, speedmap.md, crossover.png, env.json)
#   OUT_DIR/log/<step>.log      each step's output
#   OUT_DIR/gpu-map.tar.gz      all of the above in one file
#
# usage: scripts/gpu-map.sh OUT_DIR [BUDGET_SECONDS]        (default budget: 540 s)
#        REHEARSE=1 JAX_PLATFORMS=cpu scripts/gpu-map.sh OUT_DIR 300    (the same steps at tiny sizes, on a CPU)
#        DRY_RUN=1 scripts/gpu-map.sh OUT_DIR                             (print each step's narbench arguments)
#        RESUME=results/gpu-speedmap/RUN_ID scripts/gpu-map.sh OUT_DIR    (step 1 goes on with that unfinished map)
#        PYTHON=.venv/bin/python scripts/gpu-map.sh OUT_DIR               (the interpreter with JAX; default python3)
#
# Steps, in order of value: (1) paper size at batch 1 and 32; (2) small at batch 1, 8 and 32; (3) paper at
# batch 8. A step killed by the budget keeps every cell it finished (a map saves each cell whole), and running
# the script again with the same OUT_DIR resumes where it stopped. A fresh host (the next lease) goes on with a
# committed step-1 map through RESUME: narbench copies it under OUT_DIR and times only its missing cells, where
# this host has the same kind of GPU and CPU (else narbench refuses, its log says why, and step 1 starts a new
# map). narbench need not be installed: the script runs it from this checkout with the host's own JAX (it
# imports no TensorFlow on this path); tqdm, if missing, can be installed from a wheel in $WHEELS (pip install
# --no-index --find-links "$WHEELS" tqdm).
set -euo pipefail

out=${1:?usage: scripts/gpu-map.sh OUT_DIR [BUDGET_SECONDS]}
budget=${2:-540}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/log" "$out/results"
out=$(cd "$out" && pwd)
deadline=$(( $(date +%s) + budget ))
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export NARBENCH_DATA=${NARBENCH_DATA:-$out/data}     # machine peaks and JAX's compilation cache, kept with the run
py=${PYTHON:-python3}

if [ -n "${WHEELS:-}" ] && ! "$py" -c "import tqdm" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links "$WHEELS" tqdm
fi

# What the device is, before anything is timed (fails here, not half-way, if JAX cannot see it).
if [ "${DRY_RUN:-0}" != 1 ]; then
  "$py" - "$out/device.json" <<'PY'
import json, sys
try:
    import jax  # noqa: F401  (checked here, in the one interpreter start that records the device)
except ImportError:
    print(f"scripts/gpu-map.sh: {sys.executable} cannot import jax; name an interpreter that has JAX "
          "(PYTHON=.venv/bin/python) or install it (docs/gpu.md)", file=sys.stderr)
    sys.exit(2)
from bench.measure.env import capture
env = capture()
json.dump(env, open(sys.argv[1], "w"), indent=2, default=str)
driver = env.get('device_driver') or 'no driver line'
print(f"device: {env['platform']} {env['device_kind']} x{env['device_count']}; {driver}")
PY
fi

if [ "${REHEARSE:-0}" = 1 ]; then      # the same steps, tiny: the rehearsal on a CPU
  big=(--sizes tiny --lengths 8 16) small=(--sizes tiny --lengths 8 16)
  grid=(--iterations 1 4 --length-hyps 1 --cell-seconds 0.5 --min-calls 2 --max-calls 5)
  b_ends=(--batches 1 4) b_all=(--batches 1 2 4) b_mid=(--batches 2)
else
  big=(--sizes paper --lengths 16 32 64 128 256) small=(--sizes small --lengths 16 32 64 128 256)
  grid=(--iterations 1 2 4 10 --length-hyps 1 5 --cell-seconds 3 --min-calls 5 --max-calls 50)
  b_ends=(--batches 1 32) b_all=(--batches 1 8 32) b_mid=(--batches 8)
fi

rc=0       # the exit status of the last step that ran
step() {   # step NAME ARGS...: one latency map, stopped (its finished cells kept) when the budget runs out
  local name=$1; shift
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    echo "$name: skipped, the budget is spent" | tee -a "$out/log/steps.txt"
    return 0
  fi
  local start
  rc=0
  start=$(date +%s)
  if [ "${DRY_RUN:-0}" = 1 ]; then      # print each step's command instead (tests/bench/test_gpu_script.py)
    echo "latency --map $* ${grid[*]} --no-cost-model --out $out/results --no-progress"
    return 0
  fi
  timeout --signal=INT --kill-after=15 "$left" "$py" -m bench.cli latency --map "$@" "${grid[@]}" \
    --no-cost-model --out "$out/results" --no-progress > "$out/log/$name.log" 2>&1 || rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/log/steps.txt"
}

resume=()
[ -n "${RESUME:-}" ] && resume=(--resume-from "$(cd "$RESUME" && pwd)")
step 1-paper-b1-b32 "${big[@]}" "${b_ends[@]}" "${resume[@]}"
if [ "$rc" = 2 ] && grep -q "not comparable" "$out/log/1-paper-b1-b32.log"; then   # RESUME's map is another
  # machine's: a new map of step 1 instead
  step 1-paper-b1-b32-new "${big[@]}" "${b_ends[@]}"
fi
step 2-small "${small[@]}" "${b_all[@]}"
step 3-paper-b8 "${big[@]}" "${b_mid[@]}"

[ "${DRY_RUN:-0}" = 1 ] && exit 0
tar -C "$out" -czf "$out/gpu-map.tar.gz" device.json log results     # not the data root (caches), not itself
echo "results: $out/gpu-map.tar.gz"
