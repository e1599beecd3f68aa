"""Process-level tests of jr.evaluate: SIGKILL mid-run then resume, and two jax.distributed
processes on localhost (two CPU devices each) against one process. Workers: evaluate_worker.py.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust import _checkpoint
from tests import evaluate_worker

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup():
  return evaluate_worker.setup()


def worker(*args: str) -> subprocess.Popen:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.Popen([sys.executable, "-m", "tests.evaluate_worker", *args], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def evaluate(setup, data, **kwargs):
  logits_fn, _, _, attacks, eps, key = setup
  return jr.evaluate(logits_fn, data, attacks=attacks, epsilons=eps, key=key,
                     batch_size=evaluate_worker.BATCH_SIZE, progress=False, keep_per_example=True,
                     unroll=evaluate_worker.UNROLL, **kwargs)


def test_sigkill_mid_run_then_resume_equals_uninterrupted(setup, tmp_path):
  ckpt, out = tmp_path / "run.ckpt", tmp_path / "out"
  proc = worker("slow", str(ckpt), str(out))
  _, x, y, *_ = setup
  x, y = np.concatenate([x] * 6), np.concatenate([y] * 6)  # the worker's data
  # While the worker starts and compiles: the uninterrupted run (its loader is slow enough,
  # 0.5 s a batch, that the worker is still mid-run afterwards).
  uninterrupted = evaluate(setup, (x, y))
  deadline, position = time.monotonic() + 120, 0
  try:
    while position < 3:  # poll the checkpoint until the run has made progress
      if proc.poll() is not None:
        pytest.fail(f"worker ended before it could be killed:\n{proc.stdout.read()}")
      if time.monotonic() > deadline:
        pytest.fail("no checkpoint progress within 120 s")
      loaded = _checkpoint.load(ckpt) if ckpt.exists() else None
      position = loaded[0]["state"]["position"] if loaded else 0
      time.sleep(0.02)
  finally:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
  assert proc.returncode == -signal.SIGKILL
  killed_at = _checkpoint.load(ckpt)[0]["state"]["position"]
  batches = -(-len(x) // evaluate_worker.BATCH_SIZE)
  assert 3 <= killed_at < batches and not (out / "report.json").exists()

  resumed = evaluate(setup, evaluate_worker.batches(x, y, evaluate_worker.BATCH_SIZE),
                     checkpoint=ckpt)
  assert resumed.timing["examples_evaluated"] == len(x) - killed_at * evaluate_worker.BATCH_SIZE
  assert resumed == uninterrupted
  assert resumed.num_examples == len(x)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_with_checkpoints_equal_one(setup, tmp_path):
  port = free_port()
  procs = [worker("process", str(i), str(port), str(tmp_path)) for i in range(2)]
  _, x, y, *_ = setup
  reference = evaluate(setup, (x, y))  # one process, one device, no interruption
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=180)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, text in zip(procs, outputs):
    assert p.returncode == 0, text[-3000:]
  report = jr.Report.load(tmp_path)
  assert report == reference
  # The resumed run restarted from batch 2 (process 1's checkpoint), not 3 (process 0's).
  assert report.timing["examples_evaluated"] == len(x) - 2 * evaluate_worker.BATCH_SIZE
  np.testing.assert_array_equal(report.per_example["index"], np.arange(len(x)))
