"""Tests of jr.training: the robust training losses against independent transcriptions of their
references, every point attacked, Flax NNX and linen models, one trace per train step,
data-parallel steps, robust counts, and short training runs on the digits.

Compiles are shared: one jitted program evaluates every loss and its hand-written formula on the
small MLP (module fixture ``core``), the digits models are trained once per module.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxrobust as jr
from jaxrobust import training

FAST = {"xla_backend_optimization_level": 0}  # these tests are compile-bound
B, D, H, C = 24, 8, 16, 3
EPS = 0.1


def mlp_apply(params, x):
  hidden = jnp.maximum(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"][None], 0.0)
  return hidden @ params["w2"] + params["b2"][None]


def mlp_params(seed, dim=D, hidden=H, classes=C):
  rng = np.random.default_rng(seed)
  return {"w1": jnp.asarray(rng.normal(size=(dim, hidden)) * 2 / np.sqrt(dim), jnp.float32),
          "b1": jnp.asarray(rng.normal(size=hidden) * 0.1, jnp.float32),
          "w2": jnp.asarray(rng.normal(size=(hidden, classes)) / np.sqrt(hidden), jnp.float32),
          "b2": jnp.asarray(rng.normal(size=classes) * 0.1, jnp.float32)}


def ce(logits, y):
  """Mean cross-entropy, written here (not jr.losses) so the references are independent."""
  log_p = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(log_p, y[:, None], axis=1))


def kl_rows(logits_p, logits_q):
  log_p, log_q = jax.nn.log_softmax(logits_p, axis=-1), jax.nn.log_softmax(logits_q, axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def trades_formula(z_clean, z_adv, y, beta, detach_clean=False):
  target = jax.lax.stop_gradient(z_clean) if detach_clean else z_clean
  return ce(z_clean, y) + beta * jnp.sum(kl_rows(target, z_adv)) / y.shape[0]


def mart_formula(z_clean, z_adv, y, beta, xp=jnp):
  """YisenWang/MART mart.py's outer loss, transcribed line by line (argsort rule included); runs
  in JAX (for gradients) or NumPy float64 (``xp=np``)."""
  def softmax(z):
    e = xp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

  rows = xp.arange(y.shape[0])
  adv_probs = softmax(z_adv)
  top2 = xp.argsort(adv_probs, axis=1)[:, -2:]
  new_y = xp.where(top2[:, -1] == y, top2[:, -2], top2[:, -1])
  log_adv = z_adv - z_adv.max(axis=1, keepdims=True)
  log_adv = log_adv - xp.log(xp.exp(log_adv).sum(axis=1, keepdims=True))
  loss_adv = -xp.mean(log_adv[rows, y]) - xp.mean(xp.log(1.0001 - adv_probs + 1e-12)[rows, new_y])
  nat_probs = softmax(z_clean)
  true_probs = nat_probs[rows, y]
  kl = xp.sum(nat_probs * (xp.log(nat_probs) - xp.log(adv_probs + 1e-12)), axis=1)
  return loss_adv + beta * (1.0 / y.shape[0]) * xp.sum(kl * (1.0000001 - true_probs))


def ibp_formula(params, x, y, eps, kappa):
  """Gowal et al.'s loss for the two-layer MLP by hand: interval arithmetic through the first
  layer and ReLU, the margin z_y - z_j merged into the last layer."""
  lower, upper = jnp.clip(x - eps, 0.0, 1.0), jnp.clip(x + eps, 0.0, 1.0)
  mid, rad = (lower + upper) / 2, (upper - lower) / 2
  h_mid = mid @ params["w1"] + params["b1"][None]
  h_rad = rad @ jnp.abs(params["w1"])
  h_lo, h_hi = jnp.maximum(h_mid - h_rad, 0.0), jnp.maximum(h_mid + h_rad, 0.0)
  w2_y = params["w2"].T[y]  # [B, H]
  spec = w2_y[:, :, None] - params["w2"][None]  # [B, H, C]: rows of z_y - z_j
  bias = params["b2"][y][:, None] - params["b2"][None]
  centre = jnp.einsum("bh,bhc->bc", (h_lo + h_hi) / 2, spec)
  spread = jnp.einsum("bh,bhc->bc", (h_hi - h_lo) / 2, jnp.abs(spec))
  margin_lower = centre - spread + bias
  z_hat = jnp.where(jax.nn.one_hot(y, C) > 0, 0.0, -margin_lower)
  return kappa * ce(mlp_apply(params, x), y) + (1 - kappa) * ce(z_hat, y)


def all_losses(params, x, y, eps, key):
  """Every loss with its gradient, and the hand-written formula's gradient at the loss's own
  (stop-gradient) adversarial points: one program for most of the tests."""
  model = lambda p: functools.partial(mlp_apply, p)
  budget = jr.Budget(eps)
  pgd = jr.attacks.pgd("linf", steps=10)
  runs = {
      "adversarial": lambda p: training.adversarial_loss(model(p), x, y, budget, key),
      "trades": lambda p: training.trades_loss(model(p), x, y, budget, key),
      "trades_l2": lambda p: training.trades_loss(model(p), x, y, jr.Budget(4 * eps), key,
                                                  norm="l2"),
      "trades_beta0": lambda p: training.trades_loss(model(p), x, y, budget, key, beta=0.0),
      "mart": lambda p: training.mart_loss(model(p), x, y, budget, key),
      "mart_pgd": lambda p: training.mart_loss(model(p), x, y, budget, key, attack=pgd),
      "ibp": lambda p: training.ibp_loss(model(p), x, y, budget, kappa=0.25),
      "ibp_eps0": lambda p: training.ibp_loss(model(p), x, y, jr.Budget(0.0 * eps)),
  }
  out = {}
  for name, run in runs.items():
    (loss, aux), grad = jax.value_and_grad(run, has_aux=True)(params)
    out[name] = {"loss": loss, "aux": aux, "grad": grad}
  formulas = {
      "adversarial": lambda p, xa: ce(mlp_apply(p, xa), y),
      "trades": lambda p, xa: trades_formula(mlp_apply(p, x), mlp_apply(p, xa), y, 6.0),
      "trades_l2": lambda p, xa: trades_formula(mlp_apply(p, x), mlp_apply(p, xa), y, 6.0),
      "trades_detached": lambda p, xa: trades_formula(mlp_apply(p, x), mlp_apply(p, xa), y, 6.0,
                                                      detach_clean=True),
      "mart": lambda p, xa: mart_formula(mlp_apply(p, x), mlp_apply(p, xa), y, 6.0),
      "mart_pgd": lambda p, xa: mart_formula(mlp_apply(p, x), mlp_apply(p, xa), y, 6.0),
  }
  for name, formula in formulas.items():
    source = "trades" if name == "trades_detached" else name
    value, grad = jax.value_and_grad(formula)(params, out[source]["aux"].x_adv)
    out[name + "_formula"] = {"loss": value, "grad": grad}
  value, grad = jax.value_and_grad(ibp_formula)(params, x, y, eps, 0.25)
  out["ibp_formula"] = {"loss": value, "grad": grad}
  out["clean_ce"] = jax.value_and_grad(lambda p: ce(mlp_apply(p, x), y))(params)
  out["run_x_adv"] = jr.run(pgd, model(params), x, y, budget, key).x_adv
  return out


@functools.lru_cache(maxsize=None)
def all_losses_fn():
  return jax.jit(all_losses, compiler_options=FAST)


@pytest.fixture(scope="module")
def problem():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0.0, 1.0, size=(B, D)), jnp.float32)
  y = jnp.asarray(rng.integers(0, C, size=B), jnp.int32)
  return mlp_params(1), x, y


@pytest.fixture(scope="module")
def core(problem):
  params, x, y = problem
  return jax.device_get(all_losses_fn()(params, x, y, jnp.float32(EPS), jax.random.key(7)))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["adversarial", "trades", "trades_l2", "mart", "mart_pgd"])
def test_gradient_is_the_formula_gradient_at_the_fixed_adversarial_points(core, problem, name):
  params, x, _ = problem
  aux = core[name]["aux"]
  assert_trees_close(core[name]["loss"], core[name + "_formula"]["loss"])
  assert_trees_close(core[name]["grad"], core[name + "_formula"]["grad"])
  # x_adv is inside the box and the ball, and finite.
  x_adv = np.asarray(aux.x_adv)
  assert np.all((x_adv >= 0) & (x_adv <= 1))
  size = (np.abs(x_adv - np.asarray(x)).max(1) if name != "trades_l2"
          else np.linalg.norm(x_adv - np.asarray(x), axis=1))
  assert np.all(size <= (4 * EPS if name == "trades_l2" else EPS) * (1 + 1e-5))
  np.testing.assert_allclose(aux.logits_adv, mlp_apply(params, aux.x_adv), rtol=1e-5, atol=1e-6)


def test_ibp_gradient_equals_hand_written_bounds(core):
  assert_trees_close(core["ibp"]["loss"], core["ibp_formula"]["loss"])
  assert_trees_close(core["ibp"]["grad"], core["ibp_formula"]["grad"], rtol=1e-4, atol=1e-5)


def test_trades_beta_zero_is_clean_training_and_the_clean_branch_carries_gradient(core):
  value, grad = core["clean_ce"]
  assert_trees_close(core["trades_beta0"]["loss"], value)
  assert_trees_close(core["trades_beta0"]["grad"], grad)
  aux = core["trades"]["aux"]
  kl = np.asarray(kl_rows(aux.logits_clean, aux.logits_adv))
  assert np.all(kl >= 0) and kl.mean() > 1e-3
  np.testing.assert_allclose(core["trades"]["loss"], value + 6.0 * kl.mean(), rtol=1e-5)
  # The reference differentiates through p(x) too: stopping it changes the gradient.
  detached = core["trades_detached_formula"]["grad"]
  gap = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for a, b in zip(jax.tree.leaves(core["trades"]["grad"]), jax.tree.leaves(detached)))
  assert gap > 1e-3


def test_every_point_is_attacked_in_training_unlike_evaluation(core, problem):
  params, x, y = problem
  clean_wrong = np.asarray(jnp.argmax(mlp_apply(params, x), axis=1) != y)
  assert clean_wrong.mean() > 0.5  # an untrained model: most points misclassified
  # jr.run (evaluation) leaves the misclassified points where they are...
  run_moved = np.any(np.asarray(core["run_x_adv"]) != np.asarray(x), axis=1)
  assert not np.any(run_moved[clean_wrong])
  # ...training moves every point, and the loss exceeds the clean loss.
  for name in ("adversarial", "trades", "mart", "mart_pgd"):
    moved = np.any(np.asarray(core[name]["aux"].x_adv) != np.asarray(x), axis=1)
    assert moved.all(), name
  assert core["adversarial"]["loss"] > core["clean_ce"][0] + 0.1
  assert core["mart_pgd"]["loss"] > core["clean_ce"][0]


def test_ibp_is_clean_at_eps_zero_and_an_upper_bound_inside_the_ball(core, problem):
  params, x, y = problem
  np.testing.assert_allclose(core["ibp_eps0"]["loss"], core["clean_ce"][0], rtol=1e-5)
  z_hat = core["ibp"]["aux"].logits_adv
  worst = np.asarray(jax.nn.logsumexp(z_hat, axis=1))  # CE(z_hat, y), z_hat_y = 0
  # Points of the box: PGD's (attacking every point) and random ones.
  rng = np.random.default_rng(3)
  lower, upper = np.clip(np.asarray(x) - EPS, 0, 1), np.clip(np.asarray(x) + EPS, 0, 1)
  points = [core["adversarial"]["aux"].x_adv, lower, upper]
  points += [rng.uniform(lower, upper).astype(np.float32) for _ in range(8)]
  clean = np.asarray(optax.softmax_cross_entropy_with_integer_labels(mlp_apply(params, x), y))
  for point in points:
    at_point = np.asarray(optax.softmax_cross_entropy_with_integer_labels(
        mlp_apply(params, jnp.asarray(point)), y))
    assert np.all(worst >= at_point - 1e-5)
    assert core["ibp"]["loss"] >= 0.25 * clean.mean() + 0.75 * at_point.mean() - 1e-5


def linear_model(seed, dim=6, classes=4):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(dim, classes)).astype(np.float32)


def reference_inner_loop(x, start, w, gradient, eps, step, steps):
  """The TRADES/MART reference inner loop in NumPy float64 from a given start: sign steps,
  min/max into the ball, clamp into [0, 1]; the last iterate."""
  x_adv = start.astype(np.float64)
  for _ in range(steps):
    x_adv = x_adv + step * np.sign(gradient(x_adv))
    x_adv = np.clip(np.minimum(np.maximum(x_adv, x - eps), x + eps), 0.0, 1.0)
  return x_adv


def np_softmax(z):
  e = np.exp(z - z.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def test_trades_and_mart_match_numpy_transcriptions_of_the_references():
  w = linear_model(2)
  rng = np.random.default_rng(4)
  x = rng.uniform(0.2, 0.8, size=(16, 6)).astype(np.float32)
  y = rng.integers(0, 4, size=16).astype(np.int32)
  keys = jax.random.split(jax.random.key(5), 16)
  eps = 0.05
  noise = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (6,)))(keys), np.float64)
  start = np.clip(np.clip(x + 0.001 * noise, x - eps, x + eps), 0.0, 1.0)
  logits_fn = lambda v: v @ jnp.asarray(w)
  xd, wd = x.astype(np.float64), w.astype(np.float64)
  p = np_softmax(xd @ wd)
  onehot = np.eye(4)[y]
  fns = jax.jit(lambda x, y, keys: (  # unrolled loops (the CPU option) compute the same
      training.trades_loss(logits_fn, x, y, jr.Budget(eps), keys, beta=2.0, unroll=True),
      training.mart_loss(logits_fn, x, y, jr.Budget(eps), keys, beta=3.0)),
      compiler_options=FAST)
  (trades, trades_aux), (mart, mart_aux) = fns(jnp.asarray(x), jnp.asarray(y), keys)
  # TRADES: the gradient of KL(p(x) || p(x')) for logits x' W is (q - p) W^T.
  kl_grad = lambda v: (np_softmax(v @ wd) - p) @ wd.T
  x_trades = reference_inner_loop(xd, start, wd, kl_grad, eps, eps * 7 / 31, 10)
  np.testing.assert_allclose(trades_aux.x_adv, x_trades, atol=1e-6)
  q = np_softmax(x_trades @ wd)
  kl = np.sum(p * (np.log(p) - np.log(q)), axis=1)
  want = -np.mean(np.log(p[np.arange(16), y])) + 2.0 * np.sum(kl) / 16
  np.testing.assert_allclose(trades, want, rtol=1e-5)
  # MART: cross-entropy ascent, gradient (q - onehot(y)) W^T.
  ce_grad = lambda v: (np_softmax(v @ wd) - onehot) @ wd.T
  x_mart = reference_inner_loop(xd, start, wd, ce_grad, eps, eps * 7 / 31, 10)
  np.testing.assert_allclose(mart_aux.x_adv, x_mart, atol=1e-6)
  np.testing.assert_allclose(mart, mart_formula(xd @ wd, x_mart @ wd, y, 3.0, xp=np), rtol=1e-5)


def test_mart_terms_match_numpy_reference_on_fixed_logits():
  rng = np.random.default_rng(6)
  z_clean = rng.normal(size=(32, 5)) * 3
  z_adv = rng.normal(size=(32, 5)) * 3
  y = np.argmax(z_adv, axis=1)  # the top class is the label: y' is the second most likely
  y[::2] = rng.integers(0, 5, size=16)  # and any label on every other row
  terms = jax.jit(training._mart.mart_terms, compiler_options=FAST)
  boosted, weighted_kl = terms(jnp.asarray(z_clean, jnp.float32), jnp.asarray(z_adv, jnp.float32),
                               jnp.asarray(y, jnp.int32))
  want = mart_formula(z_clean, z_adv, y, 0.0, xp=np)
  np.testing.assert_allclose(boosted, want, rtol=2e-5)
  np.testing.assert_allclose(weighted_kl, mart_formula(z_clean, z_adv, y, 1.0, xp=np) - want,
                             rtol=2e-5)


def test_a_jitted_train_step_traces_once_across_batches_epochs_eps_and_keys(problem):
  params, x, y = problem
  optimizer = optax.sgd(0.1)
  traces = []

  @functools.partial(jax.jit, compiler_options=FAST)
  def train_step(params, opt_state, x, y, eps, key):
    traces.append(None)  # runs once per trace
    loss_fn = lambda p: training.trades_loss(functools.partial(mlp_apply, p), x, y,
                                             jr.Budget(eps), key, beta=1.0)
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  losses = []
  for epoch in range(3):
    for batch in range(2):
      eps = jnp.float32(0.02 * (2 * epoch + batch + 1))  # a ramp, as data
      key = jax.random.fold_in(jax.random.key(epoch), batch)
      rows = slice(12 * batch, 12 * batch + 12)
      params, opt_state, loss = train_step(params, opt_state, x[rows], y[rows], eps, key)
      losses.append(float(loss))
  assert len(traces) == 1
  assert np.all(np.isfinite(losses))


def nnx_model(dropout: float = 0.0):
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.dense1 = nnx.Linear(D, H, rngs=rngs)
      self.norm = nnx.BatchNorm(H, momentum=0.5, rngs=rngs)
      self.drop = nnx.Dropout(dropout, rngs=rngs)
      self.dense2 = nnx.Linear(H, C, rngs=rngs)

    def __call__(self, x):
      return self.dense2(self.drop(nnx.relu(self.norm(self.dense1(x)))))

  return Net(nnx.Rngs(0, dropout=1))


def batch_stats(model):
  from flax import nnx

  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))


def test_nnx_train_step_updates_batchnorm_from_the_outer_passes_only(problem):
  from flax import nnx

  _, x, y = problem
  budget, key = jr.Budget(EPS), jax.random.key(2)
  madry, trades = nnx_model(), nnx_model()
  madry_ref, trades_ref = nnx.clone(madry), nnx.clone(trades)
  optimizers = [nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param) for m in (madry, trades)]

  # NNX's functional form under jax.jit (which takes compiler options); the next test uses
  # nnx.jit.
  graphdef, state = nnx.split((madry, trades, optimizers))

  @functools.partial(jax.jit, compiler_options=FAST)
  def train_step(state):
    madry, trades, optimizers = nnx.merge(graphdef, state)
    out = []
    for model, optimizer, loss in zip(
        (madry, trades), optimizers, (training.adversarial_loss, training.trades_loss)):
      (value, aux), grads = nnx.value_and_grad(
          lambda m: loss(m, x, y, budget, key), has_aux=True)(model)
      optimizer.update(model, grads)
      out.append((value, aux))
    return nnx.state((madry, trades, optimizers)), out

  state, ((madry_loss, madry_aux), (trades_loss, trades_aux)) = train_step(state)
  nnx.update((madry, trades, optimizers), state)
  assert np.isfinite(madry_loss) and np.isfinite(trades_loss)
  before = batch_stats(madry_ref)
  # The same statistics as plain train-mode forward passes on the outer inputs: x_adv (Madry);
  # x, then x_adv (TRADES). Ten attack steps, had they counted, would have moved them further.
  madry_ref(madry_aux.x_adv)
  trades_ref(x)
  trades_ref(trades_aux.x_adv)
  for model, reference in ((madry, madry_ref), (trades, trades_ref)):
    assert_trees_close(batch_stats(model), batch_stats(reference), rtol=1e-5, atol=1e-6)
    assert not np.allclose(batch_stats(model)["norm"]["mean"], before["norm"]["mean"])


def test_nnx_attack_mode_is_the_users_and_dropout_draws_only_in_outer_passes(problem):
  from flax import nnx

  _, x, y = problem
  budget, key = jr.Budget(EPS), jax.random.key(3)
  frozen_stats, viewed = nnx_model(dropout=0.3), nnx_model(dropout=0.3)
  frozen_stats.eval()
  counts_before = int(nnx.state(viewed, nnx.RngCount)["drop"]["rngs"]["count"][...])
  stats_before = batch_stats(frozen_stats)

  @nnx.jit
  def losses(frozen_stats, viewed):
    grad = lambda m, **kw: nnx.value_and_grad(
        lambda m: training.trades_loss(m, x, y, budget, key, **kw), has_aux=True)(m)[0]
    # eval mode everywhere: no statistic moves, no dropout.
    eval_loss, eval_aux = grad(frozen_stats)

    # Two steps of a loop under nnx.scan, in train mode with the attack on an eval-mode view
    # (the usual recipe).
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def two_steps(model, step):
      eval_view = nnx.view(model, deterministic=True, use_running_average=True)
      return model, grad(model, attack_logits_fn=eval_view)[1]

    _, train_aux = two_steps(viewed, jnp.arange(2))
    return eval_aux, train_aux

  eval_aux, train_aux = losses(frozen_stats, viewed)
  assert_trees_close(batch_stats(frozen_stats), stats_before, rtol=0, atol=0)
  np.testing.assert_allclose(eval_aux.logits_clean, frozen_stats(x), rtol=1e-6)
  # Same weights, same key: the attack on the eval view found the eval-mode model's points...
  np.testing.assert_array_equal(train_aux.x_adv[0], eval_aux.x_adv)
  # ...while the outer passes ran in train mode: dropout drew twice per step (x, x_adv), the
  # attack's ten steps never, and the statistics moved (so the second attack saw new ones).
  counts_after = int(nnx.state(viewed, nnx.RngCount)["drop"]["rngs"]["count"][...])
  assert counts_after == counts_before + 4
  assert not np.allclose(batch_stats(viewed)["norm"]["mean"], stats_before["norm"]["mean"])
  assert not np.allclose(train_aux.logits_clean[0], eval_aux.logits_clean)
  assert not np.array_equal(train_aux.x_adv[1], eval_aux.x_adv)


def test_linen_model_trains_through_partial_apply(problem):
  import flax.linen as nn

  _, x, y = problem

  class Net(nn.Module):
    @nn.compact
    def __call__(self, v):
      return nn.Dense(C)(nn.relu(nn.Dense(H)(v)))

  net = Net()
  variables = net.init(jax.random.key(0), x)
  optimizer = optax.sgd(0.5)

  @functools.partial(jax.jit, compiler_options=FAST)
  def train_step(variables, opt_state, key):
    loss_fn = lambda v: training.mart_loss(functools.partial(net.apply, v), x, y, jr.Budget(EPS),
                                           key)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables)
    updates, opt_state = optimizer.update(grads, opt_state, variables)
    return optax.apply_updates(variables, updates), opt_state, loss

  opt_state = optimizer.init(variables)
  losses = []
  for step in range(4):
    variables, opt_state, loss = train_step(variables, opt_state, jax.random.key(step))
    losses.append(float(loss))
  assert losses[-1] < losses[0]


def four_losses(params, x, y, eps, key):
  """The four losses (as ``core`` computes them) with gradients, for sharding and vmap."""
  budget = jr.Budget(eps)
  runs = {"adversarial": lambda p: training.adversarial_loss(p, x, y, budget, key),
          "trades": lambda p: training.trades_loss(p, x, y, budget, key),
          "mart": lambda p: training.mart_loss(p, x, y, budget, key),
          "ibp": lambda p: training.ibp_loss(p, x, y, budget, kappa=0.25)}
  out = {}
  for name, run in runs.items():
    (loss, aux), grad = jax.value_and_grad(
        lambda p: run(functools.partial(mlp_apply, p)), has_aux=True)(params)
    out[name] = {"loss": loss, "x_adv": aux.x_adv, "grad": grad}
  return out


def assert_matches_core(out, core, rtol=1e-5, atol=1e-6):
  for name in ("adversarial", "trades", "mart", "ibp"):
    want = {"loss": core[name]["loss"], "x_adv": core[name]["aux"].x_adv,
            "grad": core[name]["grad"]}
    assert_trees_close(out[name], want, rtol=rtol, atol=atol)


def test_data_parallel_step_on_an_explicit_mesh_equals_the_one_device_step(core, problem):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  if jax.__version__ == "0.10.0":  # the one release the install allows that cannot
    pytest.skip("jax 0.10.0 cannot differentiate a matmul contracting an Explicit batch axis "
                "(the MLP's weight gradient: ShardingTypeError, JAX's own; 0.10.1 can)")
  params, x, y = problem
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  batch = NamedSharding(mesh, P("batch"))
  with jax.set_mesh(mesh):
    xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)
    out = jax.jit(four_losses, compiler_options=FAST)(params, xs, ys, jnp.float32(EPS),
                                                      jax.random.key(7))
    assert out["trades"]["x_adv"].sharding.spec[0] == "batch"
  assert_matches_core(jax.device_get(out), core)


def test_vmap_over_stacked_models_on_an_auto_mesh_equals_each_model_on_one_device(core, problem):
  params, x, y = problem
  other = mlp_params(9)
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, other)
  step = jax.jit(jax.vmap(four_losses, in_axes=(0, None, None, None, None)),
                 compiler_options=FAST)
  if len(jax.devices()) >= 8:  # the batch sharded over an Auto mesh axis, the models stacked
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(mesh):
      batch = NamedSharding(mesh, P("batch"))
      vmapped = step(stacked, jax.device_put(x, batch), jax.device_put(y, batch),
                     jnp.float32(EPS), jax.random.key(7))
  else:
    vmapped = step(stacked, x, y, jnp.float32(EPS), jax.random.key(7))
  first = jax.tree.map(lambda a: a[0], vmapped)
  second = jax.tree.map(lambda a: a[1], vmapped)
  assert_matches_core(first, core)
  assert_matches_core(second, all_losses_fn()(other, x, y, jnp.float32(EPS), jax.random.key(7)))


@functools.lru_cache(maxsize=None)
def counts_fn(params_seed: int):
  params = mlp_params(params_seed)
  return jax.jit(lambda x, y, keys, mask: training.robust_counts(
      functools.partial(mlp_apply, params), x, y, jr.Budget(EPS), keys, mask=mask),
                 compiler_options=FAST)


def test_robust_counts_merge_across_steps_and_devices(core, problem):
  params, x, y = problem
  # The per-example keys a single key stands for, so that core's jr.run is the reference.
  index = jnp.arange(B, dtype=jnp.uint32)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(index)
  step = counts_fn(1)
  everything = step(x, y, keys, jnp.ones(B, bool))
  # Clean and robust accuracy as jr.run (evaluation semantics) gives them.
  correct = np.asarray(jnp.argmax(mlp_apply(params, x), axis=1) == y)
  robust = correct & np.asarray(jnp.argmax(mlp_apply(params, core["run_x_adv"]), axis=1) == y)
  assert int(everything.n) == B and int(everything.clean_correct) == correct.sum()
  assert int(everything.robust) == robust.sum()
  assert 0 < int(everything.robust) < int(everything.clean_correct)
  # Two padded steps, each counting half of the rows, merge into the whole.
  first = jnp.arange(B) < B // 2
  halves = [step(x, y, keys, first), step(x, y, keys, ~first)]
  merged = halves[0].merge(halves[1])
  assert int(halves[0].n) == B // 2
  assert int(halves[0].robust) == robust[:B // 2].sum()
  for name in ("n", "clean_correct", "robust", "success"):
    assert int(getattr(merged, name)) == int(getattr(everything, name)), name
  logged = {k: float(v) for k, v in merged.compute().items()}
  assert logged["robust_accuracy"] == int(everything.robust) / B
  if len(jax.devices()) >= 8:
    mesh = jax.make_mesh((8,), ("batch",))
    per_device = jax.jit(jax.shard_map(
        lambda x, y, keys: training.robust_counts(functools.partial(mlp_apply, params), x, y,
                                                  jr.Budget(EPS), keys).psum("batch"),
        mesh=mesh, in_specs=P("batch"), out_specs=P()), compiler_options=FAST)
    rows = NamedSharding(mesh, P("batch"))
    total = per_device(*(jax.device_put(a, rows) for a in (x, y, keys)))
    for name in ("n", "clean_correct", "robust", "success"):
      assert int(getattr(total, name)) == int(getattr(everything, name)), name
    # One key inside shard_map (the README's eval step): it stands for fold_in(key, local row) on
    # every device. Early exit's loop carries those keys beside the device's rows (this crashed:
    # replicated keys in a carry that varies over the manual axis).
    one_key = jax.jit(jax.shard_map(
        lambda x, y, key: training.robust_counts(functools.partial(mlp_apply, params), x, y,
                                                 jr.Budget(EPS), key).psum("batch"),
        mesh=mesh, in_specs=(P("batch"), P("batch"), P()), out_specs=P()), compiler_options=FAST)
    local_keys = keys[jnp.arange(B) % (B // 8)]
    single = one_key(*(jax.device_put(a, rows) for a in (x, y)), jax.random.key(7))
    want = per_device(*(jax.device_put(a, rows) for a in (x, y, local_keys)))
    for name in ("n", "clean_correct", "robust", "success"):
      assert int(getattr(single, name)) == int(getattr(want, name)), name


def test_bad_hyperparameters_and_attacks_are_refused(problem):
  params, x, y = problem
  model, budget, key = functools.partial(mlp_apply, params), jr.Budget(EPS), jax.random.key(0)
  for bad, match in [
      (lambda: training.trades_loss(model, x, y, budget, key, beta=-1.0), "beta"),
      (lambda: training.mart_loss(model, x, y, budget, key, beta=float("nan")), "beta"),
      (lambda: training.trades_loss(model, x, y, budget, key, steps=0), "steps"),
      (lambda: training.trades_loss(model, x, y, budget, key, step_size=0.0), "step_size"),
      (lambda: training.trades_loss(model, x, y, budget, key, norm="l1"), "norm"),
      (lambda: training.ibp_loss(model, x, y, budget, kappa=1.5), "kappa"),
      (lambda: training.ibp_loss(model, x, y, budget, kappa=-0.1), "kappa"),
      (lambda: training.ibp_loss(model, x, y, budget, norm="l2"), "norm"),
      (lambda: training.adversarial_loss(model, x, y, budget, key,
                                         attack=jr.attacks.fmn("linf")), "minimum-norm"),
      (lambda: training.adversarial_loss(model, x, y, budget, key,
                                         attack=jr.attacks.deepfool()), "minimum-norm"),
      (lambda: training.adversarial_loss(
          model, x, y, budget, key, attack=jr.attacks.pgd("linf", targeted=True)), "targeted"),
      (lambda: training.mart_loss(
          model, x, y, budget, key, attack=jr.attacks.pgd("linf", targeted=True)), "targeted"),
      (lambda: training.adversarial_loss(
          model, x, y, budget, key, attack=jr.attacks.eot(jr.attacks.pgd("linf"), 4)),
       "randomized"),
      (lambda: training.robust_counts(
          model, x, y, budget, key, attack=jr.attacks.pgd("linf", targeted=True)), "targeted"),
      (lambda: training.adversarial_loss(model, x, y[:3], budget, key), "Batch sizes"),
      (lambda: training.trades_loss(model, 255 * x, y, budget, key), "box"),
  ]:
    with pytest.raises(ValueError, match=match):
      bad()
  # A budget in 0-255 units: the message does not point to an option the losses do not have.
  for loss in (lambda b: training.adversarial_loss(model, x, y, b, key),
               lambda b: training.ibp_loss(model, x, y, b),
               lambda b: training.robust_counts(model, x, y, b, key)):
    with pytest.raises(ValueError, match="0-255 units") as caught:
      loss(jr.Budget(8.0))
    assert "take no allow_large_eps" in str(caught.value)
    assert "Pass allow_large_eps=True" not in str(caught.value)


def test_non_finite_logits_give_a_non_finite_loss_and_finite_points(problem):
  params, x, y = problem
  # NaN logits wherever the first feature is below 0.5 (a log of a negative number).
  broken = lambda v: mlp_apply(params, v) + 0.0 * jnp.log(v[:, :1] - 0.5)
  fn = jax.jit(lambda x, y, key: [
      loss(broken, x, y, jr.Budget(EPS), key) for loss in (training.adversarial_loss,
                                                           training.trades_loss)]
      + [training.ibp_loss(broken, x, y, jr.Budget(EPS))], compiler_options=FAST)
  healthy = np.asarray(x[:, 0] > 0.5 + EPS)  # their whole ball is finite
  assert 0 < healthy.sum() < B
  for loss, aux in fn(x, y, jax.random.key(0)):
    assert np.isnan(float(loss))  # the optimiser sees it (optax.apply_if_finite skips it)
    assert np.all(np.isfinite(np.asarray(aux.x_adv)))
    assert np.isfinite(np.asarray(aux.logits_adv)[healthy]).all()


DIGITS_HIDDEN, DIGITS_EPOCHS, DIGITS_BATCH = 128, 8, 128


def train_digits(kind: str, x_train, y_train):
  """A one-hidden-layer MLP trained on the digits with Adam: plainly, with PGD-AT (eps 0.2,
  PGD-5 attacking every point), or with IBP (eps ramped from 0 to 0.1 over the first 60% of the
  epochs, kappa 0.5)."""
  pgd = jr.attacks.pgd("linf", steps=5)
  optimizer = optax.adam(1e-2)

  def loss_fn(params, x, y, eps, key):
    model = functools.partial(mlp_apply, params)
    if kind == "plain":
      return ce(model(x), y)
    if kind == "pgd":
      return training.adversarial_loss(model, x, y, jr.Budget(eps), key, attack=pgd)[0]
    return training.ibp_loss(model, x, y, jr.Budget(eps))[0]

  def step(state, batch):
    params, opt_state = state
    grads = jax.grad(loss_fn)(params, *batch)
    # optax's Adam computes decay ** count (Python float ** int32), refused by strict promotion.
    with jax.numpy_dtype_promotion("standard"):
      updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  @functools.partial(jax.jit, compiler_options=FAST)
  def epoch(state, x_train, y_train, eps, key):  # the data are arguments, not constants
    order_key, attack_key = jax.random.split(key)
    batches = x_train.shape[0] // DIGITS_BATCH
    order = jax.random.permutation(order_key, x_train.shape[0])[:batches * DIGITS_BATCH]
    xs = x_train[order].reshape(batches, DIGITS_BATCH, -1)
    ys = y_train[order].reshape(batches, DIGITS_BATCH)
    data = (xs, ys, jnp.broadcast_to(eps, (batches,)), jax.random.split(attack_key, batches))
    return jax.lax.scan(step, state, data)[0]

  params = mlp_params(0, dim=64, hidden=DIGITS_HIDDEN, classes=10)
  state = (params, optimizer.init(params))
  for index in range(DIGITS_EPOCHS):
    ramp = min(1.0, (index + 1) / (0.6 * DIGITS_EPOCHS))
    eps = {"plain": 0.0, "pgd": 0.2, "ibp": 0.1 * ramp}[kind]
    state = epoch(state, x_train, y_train, jnp.float32(eps), jax.random.key(index))
  return state[0]


@pytest.fixture(scope="module")
def digits_results():
  pytest.importorskip("sklearn")
  from jaxrobust.demo.data import load_digits

  x_train, y_train, x_test, y_test = load_digits()
  x_train, x_test = (jnp.asarray(a.reshape(len(a), -1)) for a in (x_train, x_test))
  y_train, y_test = jnp.asarray(y_train), jnp.asarray(y_test)

  @functools.partial(jax.jit, compiler_options=FAST)
  def evaluate(params, x_test, y_test):  # the data are arguments, not constants
    model = functools.partial(mlp_apply, params)
    counts = training.robust_counts(model, x_test, y_test, jr.Budget(0.2), jax.random.key(0))
    certificate = jr.certify.certify_bounds(model, x_test, y_test, jr.Budget(0.05))
    certified = jnp.mean((certificate.prediction == y_test) & (certificate.radius >= 0.05))
    return counts.compute(), certified

  results = {}
  for kind in ("plain", "pgd", "ibp"):
    metrics, certified = evaluate(train_digits(kind, x_train, y_train), x_test, y_test)
    results[kind] = {k: float(v) for k, v in metrics.items()} | {"certified": float(certified)}
  return results


def test_pgd_adversarial_training_on_digits_raises_robust_accuracy(digits_results):
  plain, pgd = digits_results["plain"], digits_results["pgd"]
  assert plain["accuracy"] > 0.9 and pgd["accuracy"] > 0.7
  assert pgd["robust_accuracy"] >= plain["robust_accuracy"] + 0.20


def test_ibp_training_on_digits_gives_certified_accuracy(digits_results):
  plain, ibp = digits_results["plain"], digits_results["ibp"]
  assert ibp["accuracy"] > 0.8
  assert ibp["certified"] >= 0.5 and plain["certified"] <= 0.25
  assert ibp["certified"] >= plain["certified"] + 0.3
