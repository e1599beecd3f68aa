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
# Steps, in the order of what issue #26 still lacks on a GPU after two leases (RESULTS.md, "An
# NVIDIA H200" and "An NVIDIA H200, second lease"), each with its own limit (seconds); the script
# stops starting steps at 570 s (TOTAL), so the call ends inside its 600 s:
#   env          30   the GPU, the driver, jax and torch versions
#   evaluate    200   bench_scale.py --device-preset --sections evaluate: jr.evaluate streaming
#                     WRN-16-4 through AutoAttack fast, 2048 images (checkpointed, stopped after
#                     one batch and resumed), then 10,000 to the end (the second lease reached
#                     9216 in its 145 s)
#   resnet_bf16 100   ResNet-50 PGD-10 in bfloat16 (the second lease's step stopped before the
#                     full-cost jaxrobust program)
#   memory      150   PGD-10 on WRN-28-10, float32, full cost, twice with JAX's persistent
#                     compilation cache: the first run fills it, the second loads the compiled
#                     programs without tuning convolutions, so its allocator peak is the
#                     programs' own (with autotuning off, the raw gradients took 200 s: second
#                     lease); torch's peak beside it
# and, only while time is left:
#   per_step    100   PGD-30 on WRN-28-10, float32, full cost: with the memory step's PGD-10, the
#                     cost of one more step against one raw input gradient (the issue's "per-step
#                     overhead"), apart from the per-call clean diagnosis and scoring
#   early_exit   45   digits PGD-20 curves: the GPU default against dense and dense-eps0
#   resnet      150   ResNet-50 in float32 (measured in the second lease)
# SCALE_EXTRA (default empty) is appended to every bench_scale command: a CPU dry run of this
# script passes small sizes there. STEPS (default empty: all of them) names the steps to run, e.g.
# STEPS="env per_step early_exit" for a second call with what the first one had no time left for (a
# lease allows 10 minutes per call and 15 in all; a second call made within 30 s of the first's
# end finds the machine warm and pays no start).
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
step evaluate 200 "$PY" benchmarks/bench_scale.py --device-preset --sections evaluate \
  --budget 195 --section-timeout 195 --out "$OUT/evaluate.json" $EXTRA
step resnet_bf16 100 "$PY" benchmarks/bench_scale.py --device-preset --sections resnet \
  --resnet-dtypes bfloat16 --budget 95 --out "$OUT/resnet_bf16.json" $EXTRA
CACHE=$(mktemp -d)
step memory 150 env JAX_COMPILATION_CACHE_DIR="$CACHE" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1 bash -c "for run in fill cached; do echo \"== \$run\"; \
  $PY benchmarks/bench_scale.py --device-preset --sections pgd --dtypes float32 --programs \
  full-cost --repeats 1 --rows none --budget 70 --out $OUT/memory_\$run.json $EXTRA; done"
optional per_step 100 "$PY" benchmarks/bench_scale.py --device-preset --sections pgd \
  --dtypes float32 --programs full-cost --steps 30 --rows none --budget 95 \
  --out "$OUT/per_step.json" $EXTRA
optional early_exit 45 "$PY" benchmarks/bench_early_exit.py --attacks pgd \
  --schedules dense,default,dense-eps0 --repeats 5
optional resnet 150 "$PY" benchmarks/bench_scale.py --device-preset --sections resnet \
  --resnet-dtypes float32 --budget 145 --out "$OUT/resnet.json" $EXTRA
for f in evaluate resnet_bf16 memory per_step resnet; do
  tail -n 12 "$OUT/$f.txt" 2>/dev/null
done
tail -n 15 "$OUT/early_exit.txt" 2>/dev/null
echo "total $((SECONDS - BEGIN)) s"
# At most 8 files come back from $OUT: everything in one archive, the step logs beside it.
tar czf /tmp/device_run.tgz -C "$OUT" . && mv /tmp/device_run.tgz "$OUT/device_run.tgz" \
  && find "$OUT" -name '*.json' -delete
