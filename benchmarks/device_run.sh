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
# Steps and limits (seconds), 575 in all:
#   env          10   the GPU, the driver, jax and torch versions
#   partition    35   early exit's row partition against two argsorts (bench_partition.py)
#   early exit   90   digits PGD-20 curves: early exit and cross-eps skipping against dense
#                     (the issue's "costs more than it saves on tiny GPU problems")
#   scale       440   bench_scale.py --device-preset: WRN-28-10 PGD-10 float32/bfloat16 against
#                     torchattacks, AutoAttack on WRN-16-4 against the reference, the compile of
#                     the WRN-28-10 AutoAttack curve, ResNet-50; float32 units first, each killed
#                     after 150 s, none started with under 30 s of its 420 s budget left
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jaxrobust_device}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/.peers${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PYTHON:-python3}

step() {  # step NAME SECONDS COMMAND...: run with a limit, output to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "[$(date +%T)] $name (limit ${limit} s)"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local status=$?  # 124: the step ran out of time
  echo "[$(date +%T)] $name: exit $status"
}

step env 10 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  $PY -c 'import jax, torch; print(\"jax\", jax.__version__, jax.devices()); \
print(\"torch\", torch.__version__, torch.cuda.get_device_name(0))'; \
  $PY -c 'import torchattacks; print(\"torchattacks\", torchattacks.__version__)'; \
  ls .aa/autoattack/autoattack.py"
step partition 35 "$PY" benchmarks/bench_partition.py --batch 540 4096 65536 --iterations 200
step early_exit 90 "$PY" benchmarks/bench_early_exit.py --attacks pgd --schedules dense,default \
  --repeats 5
step scale 440 "$PY" benchmarks/bench_scale.py --device-preset --autoattack-path .aa --budget 420 \
  --out "$OUT/scale.json"
tail -n 40 "$OUT/scale.txt"
