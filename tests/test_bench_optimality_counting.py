"""The peers' propagation counter of ``benchmarks/bench_optimality.py`` (``counted_port``).

AttackBench counts a peer's forward and backward propagations through a model wrapper; the
benchmark counts rows instead of calls (a call on part of the batch costs part). By hand on a
tiny PyTorch model: every forward call adds its batch size, with or without gradient; every
backward pass through the logits adds the rows of the logits once (``backward``,
``autograd.grad``, and a graph differentiated twice with ``retain_graph`` counts twice), a
forward with gradient that is never differentiated adds no backward; the logits and the input
gradients are the bare model's, bitwise.
"""

from __future__ import annotations

import sys
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_optimality import counted_port, propagations_of_port  # noqa: E402


def test_counted_port_counts_rows_by_hand():
  torch.manual_seed(0)
  bare = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
  counted = counted_port(bare)
  x = torch.randn(8, 6)
  with torch.no_grad():  # 8 rows, no backward
    np.testing.assert_array_equal(counted(x).numpy(), bare(x).numpy())
  counted(x[:3])  # gradient mode on, x needs none: 3 rows, no backward possible
  assert (counted.forward_rows, counted.backward_rows) == (11, 0)

  grads = []
  for model in (bare, counted):
    v = x[:4].clone().requires_grad_(True)
    out = model(v)  # 4 rows
    out[:, 0].sum().backward(retain_graph=True)  # one backward: 4 rows
    first = v.grad.clone()
    (g,) = torch.autograd.grad(out[:, 1].sum(), v)  # a second backward of the same graph
    model(v)  # a forward with gradient, never differentiated: no backward
    grads.append((first.numpy(), g.numpy()))
  for a, b in zip(*grads):
    np.testing.assert_array_equal(a, b)
  assert (counted.forward_rows, counted.backward_rows) == (11 + 4 + 4, 4 + 4)
  assert (counted.forward_calls, counted.backward_calls) == (4, 2)

  row = propagations_of_port(counted, 4)
  assert (row["forward_mean"], row["backward_mean"]) == (19 / 4, 2.0)
