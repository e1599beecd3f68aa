"""A curve's schedule on a GPU (``RunOptions.for_curve``) and the model cost it reads
(``jaxrobust._cost.model_flops``).

* ``model_flops`` against closed forms: a convolution, a batched matrix product, a nested call,
  a scan over layers, a cond, a while loop.
* ``for_curve``: a latency-bound curve at the default schedule on a GPU runs dense with every
  eps vectorised; a CPU or TPU, a non-default option, a suite, a capped run and a curve above
  the threshold keep their options.
* End to end, with ``jax.default_backend`` answering "gpu" while the curve is traced (this
  machine has no GPU; the choice is made while tracing, so the program is the GPU's): the flags
  are the ground truth's and the default CPU curve's, and the rows through the model are exactly
  the dense vectorised curve's; ``jr.evaluate`` (one device, an 8-device mesh) chooses it inside
  its step and counts exactly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import jaxrobust as jr
from jaxrobust import _options
from jaxrobust._options import RunOptions
from jaxrobust._cost import model_flops
from tests.models import linear_logits, linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py


def test_model_flops_of_a_convolution_is_two_per_multiply_add():
  kernel = jnp.ones((3, 3, 2, 4))  # HWIO
  conv = lambda x: jax.lax.conv_general_dilated(x, kernel, (2, 2), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
  x = jnp.ones((5, 8, 8, 2))
  # Output 5 x 4 x 4 x 4; each element a dot product over 3 * 3 * 2 inputs.
  assert model_flops(conv, x) == 2 * (5 * 4 * 4 * 4) * (3 * 3 * 2)


def test_model_flops_counts_batched_products_and_nested_calls_once():
  w = jnp.ones((6, 3, 7))
  inner = jax.jit(lambda v: jnp.einsum("bij,bjk->bik", v, w))
  x = jnp.ones((6, 2, 3))
  # Output 6 x 2 x 7, contracted over 3; then one operation per element of the tanh.
  assert model_flops(lambda v: jnp.tanh(inner(v)), x) == 2 * (6 * 2 * 7) * 3 + 6 * 2 * 7


def test_model_flops_prices_a_scan_per_iteration_a_cond_by_its_costliest_branch():
  """A model that loops over its layers with ``lax.scan`` costs its body times the length (the
  count taken before it, once per loop, was 4x too low here); a ``cond`` costs its costlier
  branch; a ``while`` loop, whose trip count is data, its body once."""
  layers = jnp.ones((4, 3, 3))
  x = jnp.ones((5, 3))
  layer = 2 * 5 * 3 * 3 + 5 * 3  # the product, then the tanh

  def scanned(v):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), v, layers)[0]

  assert model_flops(scanned, x) == 4 * layer
  w = layers[0]
  branches = lambda v: jax.lax.cond(v[0, 0] > 0, lambda h: jnp.tanh(h @ w), lambda h: -h, v)
  # The predicate (cond takes it as an int32 index), then the costlier branch.
  predicate = model_flops(lambda v: (v[0, 0] > 0).astype(jnp.int32), x)
  assert model_flops(branches, x) == predicate + layer
  looped = lambda v: jax.lax.while_loop(lambda h: h[0, 0] < 10.0,
                                        lambda h: jnp.tanh(h @ w) + 1.0, v)
  body = layer + 5 * 3  # the product, the tanh and the + 1
  condition = model_flops(lambda v: v[0, 0] < 10.0, x)
  assert model_flops(looped, x) == condition + body


def _small():
  x, w = jnp.ones((540, 64)), jnp.ones((64, 10))
  return (lambda v: v @ w), x


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_no_change_off_a_gpu(backend):
  logits_fn, x = _small()
  assert RunOptions().for_curve(jr.attacks.pgd(), logits_fn, x, 8, capped=False,
                                backend=backend) == RunOptions()


@pytest.mark.parametrize("options", [RunOptions(early_exit=False), RunOptions(chunk_size=64),
                                     RunOptions(unroll=2), RunOptions(unroll=True),
                                     RunOptions(eps_batch_size=2)])
def test_an_option_given_other_than_its_default_is_kept(options):
  logits_fn, x = _small()
  assert options.for_curve(jr.attacks.pgd(), logits_fn, x, 8, capped=False,
                           backend="gpu") == options


def test_suites_capped_runs_randomized_models_minimum_norm_and_large_curves_are_kept():
  logits_fn, x = _small()
  for attack, capped in ((jr.attacks.auto_attack("linf", version="fast"), False),
                         (jr.attacks.pgd(), True),
                         (jr.attacks.pgd()._replace(samples=4), False),
                         (jr.attacks.fmn("linf"), False)):
    assert RunOptions().for_curve(attack, logits_fn, x, 8, capped=capped,
                                  backend="gpu") == RunOptions()
  # 2 * 540 * 4096 * 4096 per eps: 18 GFLOP, over the threshold at one eps already.
  w = jnp.ones((4096, 4096))
  big = jnp.ones((540, 4096))
  assert 2 * 540 * 4096 * 4096 > _options.LATENCY_BOUND_FLOPS
  assert RunOptions().for_curve(jr.attacks.pgd(), lambda v: v @ w, big, 1, capped=False,
                                backend="gpu") == RunOptions()
  gpu = RunOptions().for_curve(jr.attacks.pgd(), logits_fn, x, 8, capped=False, backend="gpu")
  assert (gpu.early_exit, gpu.eps_batch_size, gpu.chunk_size, gpu.unroll) == (False, 0, None, 1)


def test_a_latency_bound_curve_on_a_gpu_has_the_dense_flags_and_rows(monkeypatch):
  batch, steps = 48, 30
  model = random_linear(0, 8, 3)
  rng = np.random.default_rng(1)
  x = rng.uniform(0.45, 0.55, size=(batch, 8)).astype(np.float32)
  y = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  distance = model.min_distance(x, y, "linf")
  # Below every point's distance, between them, above every one.
  grid = jnp.array([0.5 * distance.min(), float(np.median(distance)), 20 * distance.max()],
                   jnp.float32)
  counted, counter = jr.metrics.count_evaluations(lambda v, wb: linear_logits(wb, v))
  attack = jr.attacks.pgd("linf", steps=steps)

  def curve(options):
    fn = jax.jit(lambda wb, x, y, eps, key: jr.robustness_curve(
        attack, lambda v: counted(v, wb), x, y, eps, key, **options))
    counter.reset()
    result = fn(model.weights(), jnp.asarray(x), jnp.asarray(y), grid, jax.random.key(0))
    jax.effects_barrier()
    return np.asarray(result.robust), (counter.gradient, counter.forward)

  cpu_flags, cpu_rows = curve({})
  dense_flags, dense_rows = curve(dict(early_exit=False, eps_batch_size=0))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  gpu_flags, gpu_rows = curve({})
  # Ground truth at the outer eps; at the middle one PGD need not find every point within reach,
  # but the three schedules run the same trajectories, so they must agree there too.
  truth = distance[None, :] > np.asarray(grid)[[0, 2], None]
  assert truth[0].all() and not truth[1].any()
  for flags in (cpu_flags, dense_flags, gpu_flags):
    np.testing.assert_array_equal(flags[[0, 2]], truth)
  assert 0 < cpu_flags[1].sum() < batch
  np.testing.assert_array_equal(dense_flags, cpu_flags)
  np.testing.assert_array_equal(gpu_flags, cpu_flags)
  assert gpu_rows == dense_rows
  # Early exit spared rows on the CPU (every point breaks at the last eps at its first update).
  assert cpu_rows[0] < dense_rows[0] == batch * (1 + 3 * steps)


@pytest.mark.parametrize("shard_map", [None, False, True])
def test_evaluate_with_the_gpu_schedule_gives_the_closed_form_counts(monkeypatch, shard_map):
  """``jr.evaluate`` (one device; an Explicit 8-device mesh with and without its ``shard_map``
  path) traced as on a GPU: the schedule is chosen inside its step and the counts are exact."""
  if shard_map is not None and len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  model = random_linear(5, 12, 2)
  x, y, dist = linear_points(model, 6, 40, (3, 4), "linf")
  # Budgets halfway between the widest-spaced consecutive distances: no point lies near an eps.
  d = np.sort(dist[(dist > 0.005) & (dist < 0.15)])
  widest = np.sort(np.argsort(np.diff(d))[-3:])
  eps = ((d[widest] + d[widest + 1]) / 2).astype(np.float32)
  assert np.min(np.abs(dist[None, :] - eps[:, None])) > 1e-4  # no point sits on an eps
  chosen = []
  for_curve = RunOptions.for_curve

  def spy(self, *args, **kwargs):
    chosen.append(for_curve(self, *args, **kwargs))
    return chosen[-1]

  monkeypatch.setattr(RunOptions, "for_curve", spy)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  mesh = None if shard_map is None else jax.make_mesh((8,), ("data",),
                                                      axis_types=(AxisType.Explicit,))
  # The weights are arguments of jr.evaluate's step (a partial); a new function, so that it
  # compiles a new step, under the patch.
  def logits(wb, v):
    return linear_logits(wb, v)

  report = jr.evaluate(functools.partial(logits, model.weights()), (x, y),
                       attacks={"fgsm": jr.attacks.fgsm("linf")}, epsilons=eps,
                       key=jax.random.key(0), batch_size=16, progress=False, mesh=mesh,
                       **({} if shard_map is None else {"use_shard_map": shard_map}))
  assert chosen and all((o.early_exit, o.eps_batch_size) == (False, 0) for o in chosen)
  # Two classes, Linf: FGSM reaches the optimal corner, so it breaks exactly the points within eps.
  expected = (dist[None, :] > eps[:, None]).sum(axis=1)
  assert 0 < expected[-1] < expected[0] < len(x)  # the grid is informative
  np.testing.assert_array_equal(report.attacks["fgsm"].robust_count, expected)
