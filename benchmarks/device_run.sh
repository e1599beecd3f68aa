#!/usr/bin/env bash
# Issue #26 on a lent accelerator: every GPU measurement in one command of at most 10 minutes.
#
# A lease is 15 minutes of device time, start-up included, so this is one call, prepared here at
# no device time. In the repository root:
#
#   git clone <a checkout of fra31/auto-attack> .aa            # the AutoAttack reference
#   python3 -m pip install --no-deps --target .peers torchattacks  # pure Python; torch is there
#
# then run it with the device tool's `run`: command `bash benchmarks/device_run.sh`,
# carry [".aa", ".peers"], timeout_s 600. The accelerator's image holds jax (CUDA), flax, optax,
# torch and scipy; jaxrobust runs from the checkout (PYTHONPATH), nothing is installed. Each step
# has its own time limit and writes its own file under $OUT, so a step that runs out of time
# loses only itself; afterwards record the figures in benchmarks/RESULTS.md with the device's name.
#
# Steps, in the order of what issue #26 still lacks on a GPU (the 2026-11-28 lease measured
# PGD-10 on WRN-28-10, AutoAttack on WRN-16-4, the WRN-28-10 compile and smoothing: RESULTS.md,
# "An NVIDIA H200"), each with its own limit (seconds); the script stops starting steps at 570 s
# (TOTAL), so the call ends inside its 600 s:
#   env          30   the GPU, the driver, jax and torch versions
#   early_exit   45   digits PGD-20 curves: the default (on a GPU now the dense run with every
#                     eps vectorised, RunOptions.for_curve) against dense and dense-eps0
#   resnet      150   bench_scale.py --device-preset --sections resnet (float32): ResNet-50 PGD-10
#   bounds      150   bench_scale.py --device-preset --sections certify --certify-units bounds:
#                     CROWN-IBP on WRN-16-4 in chunks, IBP on WRN-28-10
#   evaluate    150   bench_scale.py --device-preset --sections evaluate: jr.evaluate streaming
#                     WRN-16-4 through AutoAttack fast, resumed from a checkpoint
# and, only while time is left:
#   memory      100   PGD-10 on WRN-28-10, float32, full cost, with XLA's convolution autotuning
#                     off (XLA_FLAGS=--xla_gpu_autotune_level=0): the allocator's peak without
#                     compile-time scratch, beside torch's (its times are not the figures: no
#                     autotuning), and XLA's own peak estimate
#   smoothing   100   jr.certify.smoothing on WRN-16-4 at 125 draws per image and call (4,000
#                     rows per model call instead of the 32,000 whose first call compiled for 71 s
#                     in the first lease): compile time against throughput, beside the port
#   scale       100   PGD-10 on WRN-28-10 in float32 again, at the defaults
#   resnet_bf16 100   ResNet-50 in bfloat16.
# SCALE_EXTRA (default empty) is appended to every bench_scale command: a CPU dry run of this
# script passes small sizes there. STEPS (default empty: all of them) names the steps to run, e.g.
# STEPS="env memory smoothing scale" for a second call with what the first one had no time left
# for (a lease allows 10 minutes per call and 15 in all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jaxrobust_device}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/.peers${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TOTAL=${TOTAL:-570}
EXTRA=${SCALE_EXTRA:-}
BEGIN=$SECONDS

step() {  # step NAME SECONDS COMMAND...: run with a limit, output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  if [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]]; then return; fi
  local left=$((TOTAL - (SECONDS - BEGIN)))
  if (( left < 20 )); then echo "$name: skipped, ${left} s left"; return; fi
  (( limit > left )) && limit=$left
  echo "[$(date +%T)] $name (limit ${limit} s)"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local status=$?  # 124: the step ran out of time
  echo "[$(date +%T)] $name: exit $status"
}

optional() {  # optional NAME SECONDS COMMAND...: only when its whole limit is left
  if [[ -n "${STEPS:-}" && " $STEPS " != *" $1 "* ]]; then return; fi
  local left=$((TOTAL - (SECONDS - BEGIN)))
  if (( left < $2 )); then echo "$1: skipped, ${left} s left"; return; fi
  step "$@"
}

step env 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  $PY -c 'import jax, flax, torch; print(\"jax\", jax.__version__, jax.devices(), \"flax\", \
flax.__version__); print(\"torch\", torch.__version__, torch.cuda.get_device_name(0))'; \
  $PY -c 'import torchattacks; print(\"torchattacks\", torchattacks.__version__)'; \
  ls .aa/autoattack/autoattack.py"
step early_exit 45 "$PY" benchmarks/bench_early_exit.py --attacks pgd \
  --schedules dense,default,dense-eps0 --repeats 5
step resnet 150 "$PY" benchmarks/bench_scale.py --device-preset --sections resnet \
  --resnet-dtypes float32 --budget 145 --out "$OUT/resnet.json" $EXTRA
step bounds 150 "$PY" benchmarks/bench_scale.py --device-preset --sections certify \
  --certify-units bounds --budget 145 --out "$OUT/bounds.json" $EXTRA
step evaluate 150 "$PY" benchmarks/bench_scale.py --device-preset --sections evaluate \
  --budget 145 --out "$OUT/evaluate.json" $EXTRA
optional memory 100 env XLA_FLAGS=--xla_gpu_autotune_level=0 "$PY" benchmarks/bench_scale.py \
  --device-preset --sections pgd --dtypes float32 --programs full-cost --repeats 1 --rows none \
  --budget 95 --out "$OUT/memory.json" $EXTRA
optional smoothing 100 "$PY" benchmarks/bench_scale.py --device-preset --sections certify \
  --certify-units smoothing --smoothing-batch 125 --budget 95 --out "$OUT/smoothing.json" $EXTRA
optional scale 100 "$PY" benchmarks/bench_scale.py --device-preset --sections pgd \
  --dtypes float32 --budget 95 --out "$OUT/scale.json" $EXTRA
optional resnet_bf16 100 "$PY" benchmarks/bench_scale.py --device-preset --sections resnet \
  --resnet-dtypes bfloat16 --budget 95 --out "$OUT/resnet_bf16.json" $EXTRA
for f in resnet bounds evaluate memory smoothing scale; do
  tail -n 12 "$OUT/$f.txt" 2>/dev/null
done
tail -n 15 "$OUT/early_exit.txt" 2>/dev/null
echo "total $((SECONDS - BEGIN)) s"
# At most 8 files come back from $OUT: everything in one archive, the step logs beside it.
tar czf /tmp/device_run.tgz -C "$OUT" . && mv /tmp/device_run.tgz "$OUT/device_run.tgz" \
  && find "$OUT" -name '*.json' -delete
