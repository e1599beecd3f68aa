"""Subprocess worker for tests/test_distributed.py: the shared evaluation setup and two modes.

``python -m tests.evaluate_worker slow <checkpoint> <out_dir>`` runs the setup with a checkpoint
over a deliberately slow data loader (so a test can SIGKILL it mid-run).

``python -m tests.evaluate_worker process <id> <port> <out_dir>`` is one of two processes of a
``jax.distributed`` run on localhost, two CPU devices each; each process feeds its own shard of
every global batch, with a checkpoint: an interrupted run, one process's checkpoint a batch
behind, then a resumed run; process 0 saves the report.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np

NUM_EXAMPLES = 37
BATCH_SIZE = 8
EPSILONS = (0.03, 0.08, 0.15)
SEED = 3
UNROLL = True  # compiles faster than a rolled 3-step loop on XLA:CPU
CALLS: list = []


@functools.cache
def setup():
  """``(logits_fn, x, y, attacks, epsilons, key)``: a tiny MLP, 37 examples, PGD-3 and FGSM.

  Cached, so that every test in one process shares the same objects and jr.evaluate's compiled
  step. Callers must not modify the arrays.
  """
  import jax
  import jax.numpy as jnp

  import jaxrobust as jr
  from tests.models import mlp

  model = mlp(SEED, 12, 16, 4)

  def logits_fn(x):
    CALLS.append(None)  # Python calls happen only while tracing: counts traces
    return model(x)

  rng = np.random.default_rng(SEED)
  x = rng.uniform(0.0, 1.0, (NUM_EXAMPLES, 3, 4)).astype(np.float32)
  y = np.argmax(np.asarray(logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  y[::6] = (y[::6] + 1) % 4  # some clean errors
  attacks = {"pgd": jr.attacks.pgd("linf", steps=3), "fgsm": jr.attacks.fgsm("linf")}
  return logits_fn, x, y, attacks, np.asarray(EPSILONS, np.float32), jax.random.key(SEED)


def batches(x, y, batch_size, delay=0.0):
  for start in range(0, len(x), batch_size):
    if delay:
      time.sleep(delay)
    yield x[start:start + batch_size].copy(), y[start:start + batch_size].copy()


def slow(checkpoint: str, out_dir: str) -> None:
  import jaxrobust as jr

  logits_fn, x, y, attacks, eps, key = setup()
  # Repeat the data so the run lasts long enough to be killed mid-way.
  x, y = np.concatenate([x] * 6), np.concatenate([y] * 6)
  report = jr.evaluate(logits_fn, batches(x, y, BATCH_SIZE, delay=0.5), attacks=attacks,
                       epsilons=eps, key=key, batch_size=BATCH_SIZE, checkpoint=checkpoint,
                       progress=False, keep_per_example=True, unroll=UNROLL)
  report.save(out_dir)


def process(process_id: int, port: int, out_dir: str) -> None:
  import jax
  from jax.experimental import multihost_utils

  from jaxrobust import _checkpoint

  jax.config.update("jax_num_cpu_devices", 2)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                             process_id=process_id)
  import jaxrobust as jr

  checkpoint = f"{out_dir}/run.ckpt"
  logits_fn, x, y, attacks, eps, key = setup()
  mesh = jax.make_mesh((jax.device_count(),), ("batch",))
  local = BATCH_SIZE // jax.process_count()

  def shard(crash_after=None):  # rows [b * B + p * B/P, b * B + (p + 1) * B/P) of global batch b
    for i, start in enumerate(range(0, len(x), BATCH_SIZE)):
      if i == crash_after:
        raise RuntimeError("simulated crash")
      lo = start + process_id * local
      yield x[lo:lo + local].copy(), y[lo:lo + local].copy()

  def run(data):
    return jr.evaluate(logits_fn, data, attacks=attacks, epsilons=eps, key=key,
                       batch_size=BATCH_SIZE, mesh=mesh, progress=False, keep_per_example=True,
                       unroll=UNROLL, checkpoint=checkpoint)

  # Both processes stop after 3 batches; then process 1's last checkpoint write is undone, as if
  # it had been killed just before it: the resumed run must roll process 0 back one batch.
  try:
    run(shard(crash_after=3))
  except RuntimeError:
    pass
  if process_id == 1:
    path = f"{checkpoint}.process1of2"
    header, arrays = _checkpoint.load(path)
    header.update(header["previous"], previous=None)
    _checkpoint.save(path, header, {k[len("previous."):]: v for k, v in arrays.items()
                                    if k.startswith("previous.")})
  multihost_utils.sync_global_devices("rolled back")
  report = run(shard())
  if process_id == 0:
    report.save(out_dir)
  jax.distributed.shutdown()


if __name__ == "__main__":
  mode = sys.argv[1]
  if mode == "slow":
    slow(sys.argv[2], sys.argv[3])
  elif mode == "process":
    process(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
  else:
    raise SystemExit(f"unknown mode {mode!r}")
