r"""Auto-PGD (APGD, APGD-T; Croce & Hein, 2020, 2021) under the Linf, L2 and L1 norms.

APGD is projected gradient ascent whose step size needs no tuning: it starts large and is halved,
per example, at data-independent checkpoints when the optimisation stalls. With :math:`P` the
projection onto the eps-ball around :math:`x` intersected with the box, :math:`\eta_k` the
per-example step size, :math:`d(g)` the steepest-ascent direction (:math:`\operatorname{sign}(g)`
for Linf, :math:`g / \|g\|_2` for L2) and :math:`\alpha = 0.75` (:math:`\alpha = 1` at the first
step of a run), one Linf/L2 iteration is the momentum step

.. math::
   z_{k+1} = P\big(x_k + \eta_k\, d(\nabla L(x_k))\big), \qquad
   x_{k+1} = P\big(x_k + \alpha (z_{k+1} - x_k) + (1 - \alpha)(x_k - x_{k-1})\big).

:math:`\eta_0 = 2\epsilon`. The checkpoints are :math:`w_j = \lceil p_j N \rceil` for ``N = steps``
with :math:`p_0 = 0`, :math:`p_1 = 0.22` and
:math:`p_{j+1} = p_j + \max(p_j - p_{j-1} - 0.03, 0.06)`; the reference implementation rounds
each length down, ``max(int(0.22 N), 1)`` then ``max(len - max(int(0.03 N), 1), max(int(0.06 N),
1))``, which gives 22, 41, 57, 70, 80, 87, 93, 99 for ``N = 100`` (see :func:`checkpoints`). At
:math:`w_j` an example halves its step size and restarts from its best-loss point
:math:`x_{\max}` if

1. at most :math:`\rho\,(w_j - w_{j-1})` of the steps since :math:`w_{j-1}` increased the loss
   (:math:`\rho = 0.75`; the first window compares the first iterate with the starting point, as
   in the paper), or
2. its step size was not halved at :math:`w_{j-1}` and its best loss did not improve since then.

On a restart from :math:`x_{\max}` the momentum of the next step is :math:`x_{\max} - x_{k-1}`, as
in the reference implementation.

L1 (l1-APGD, Croce & Hein, 2021) has no momentum and its own schedule. A step moves
:math:`\eta_k` of L1 mass evenly over the :math:`k_k` coordinates with the largest :math:`|g_i|`
(:math:`k_0 = \lceil 0.2 D \rceil`) and projects exactly onto the L1 ball intersected with the
box (:func:`jaxrobust.projections.project_l1_box`):
:math:`x_{k+1} = x + \Pi_{\epsilon,\,\text{box}}(x_k + \eta_k \operatorname{sign}(g_{\text{top}})
/ \|\operatorname{sign}(g_{\text{top}})\|_1 - x)`, with :math:`\eta_0 = \epsilon`. Every
``max(int(0.04 N), 1)`` iterations the support :math:`m` of :math:`x_{\max} - x` sets
:math:`k = \lceil m / 1.5 \rceil` (the reference's sparsity :math:`m / (1.5 D)`); if :math:`m`
fell below 0.95 of its value at the previous check the step size is reset to :math:`\epsilon` and
the iterate to :math:`x_{\max}`, otherwise the step size is divided by 1.5; it is kept in
:math:`[\epsilon / 10, \epsilon]`.

One addition to the reference (:func:`l1_fewer_coordinates`): a run whose best loss did not
improve since the previous check moves fewer coordinates from then on, :math:`k \leftarrow
\min(\lceil m / 1.5 \rceil, \lceil k / 1.5 \rceil, k - 1)`. Without it the attack stalls where
the loss is locally linear: each step adds the same mass to the :math:`k` moved coordinates and
the exact projection takes the same amount back from each, so an iterate spread evenly over
:math:`k` coordinates is a fixed point, :math:`x_{\max}` stops improving, its support stops
shrinking and :math:`k` stays (for :math:`m = 2`, :math:`\lceil 2 / 1.5 \rceil = 2` never
shrinks at all). Measured on two-class linear models with 64 inputs at 1.02 times the exact
minimal L1 distance (whose optimum moves one coordinate): 4% success with the reference's rule,
100% with the addition; a run that keeps improving is unchanged.

AutoAttack's ``use_largereps`` (``large_eps=True``, L1 only, as in the reference's
``decr_eps_pgd``): a run of :math:`N` updates is three stages of :math:`n_1 = n_2 =
\lceil 0.3 N \rceil` and :math:`n_3 = N - n_1 - n_2` updates at the radii
:math:`3\epsilon, 2\epsilon, \epsilon`. Each stage is a full l1-APGD run with its own
checkpoints (every ``max(int(0.04 n_s), 1)`` updates), step size and sparsity; the first starts
from the random start in the :math:`3\epsilon` ball, each next one from the previous stage's
best-loss point :math:`x_{\max}` projected onto the smaller ball and the box,
:math:`x + \Pi_{c_s\epsilon,\,\text{box}}(x_{\max} - x)`. Only the last stage (at
:math:`\epsilon`) is scored, so a run evaluates :math:`N + 3` points of which :math:`n_3 + 1`
count; the larger balls serve only to find a good region of the loss before shrinking.

Random starts follow the reference: Linf :math:`x + \epsilon\, t / \|t\|_\infty` with
:math:`t \sim U[-1, 1]^D`, L2 :math:`x + \epsilon\, t / \|t\|_2` with :math:`t \sim N(0, I)`
(both on the sphere), L1 the projection of :math:`t \sim N(0, I)` onto the L1 ball and the box;
then clipped to the box. A run is ``steps`` updates after its start, i.e. ``steps + 1`` loss and
gradient evaluations. Runs (``restarts``, and for APGD-T ``n_target_classes`` targets times
``restarts``) are laid end to end in one fixed-length scan; each starts afresh from a draw of the
example's own key folded with the run index, so run ``r`` is the same in every configuration that
has it. Every evaluated point of every run is scored (success first, then the loss) and the best
one is returned.

APGD-T (``targeted=True`` with ``n_target_classes = n``) is AutoAttack's untargeted attack made of
``n`` targeted runs: run ``k`` maximises the targeted loss towards the class with the
:math:`(k+2)`-th largest clean logit, and success is untargeted (:math:`\arg\max \ne y`).

MALT targeting (``targets="malt"``, Melamed, Yehudai & Shamir, 2024) ranks the classes instead by
the distance to their decision boundary that the model's linearisation at the clean input
predicts,

.. math::
   d_c = \frac{z_y(x) - z_c(x)}{\|\nabla_x z_y(x) - \nabla_x z_c(x)\|_*},

with :math:`\|\cdot\|_*` the dual of the attack norm (L1 for Linf, L2 for L2, Linf for L1): on a
linear model :math:`z = Wx + b` and without the box, :math:`d_c` is exactly the smallest
perturbation that makes :math:`z_c` reach :math:`z_y` (Hölder's inequality is tight), so the
targets are the nearest boundaries, while the logit rank ignores how steep each boundary is. Only
the ``malt_candidates`` classes with the largest clean logits (other than ``y``) are scored, as in
the paper (it scores the top 100 of ImageNet's classes); run ``k`` targets the class with the
:math:`(k+1)`-th smallest :math:`d_c`.

The step-size schedule and the per-norm steps (checkpoints, L1 sparsity, momentum and L1 updates)
are in :mod:`jaxrobust.attacks._apgd_schedule`, with the state and configuration they share; this
module holds the random starts, the targets of APGD-T and MALT, and the attack's
``init``/``step``/``finalize``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._batch import expand, fold_in, is_success, rows_like
from jaxrobust._types import Attack, Budget
from jaxrobust._options import default_chunk_size
from jaxrobust._validation import check_norm, check_number, check_positive_int, logits_shape
from jaxrobust.attacks._apgd_schedule import (INITIAL_STEP, APGDState, APGDConfig, l1_checkpoint,
                                               l1_update, momentum_checkpoint, momentum_update,
                                               checkpoints, l1_checkpoints, stages)
from jaxrobust.attacks._apgd_schedule import (  # noqa: F401 (re-exported, as before the split)
  l1_coordinates, l1_fewer_coordinates, l1_initial_coordinates)
from jaxrobust.attacks._common import (Best, Runs, apply_loss, l1_box_point, loss_grad_logits,
                                       score_last_iterate, unpack_budget)

Array = jax.Array


def _start(x: Array, keys: Array, eps: Array, lower: Array, upper: Array, norm: str,
           run: Array | int) -> Array:
  """A run's first point: the reference's random start, clipped to the box."""
  keys = fold_in(keys, run)
  shape = x.shape[1:]
  if norm == "linf":
    t = jax.vmap(lambda k: jax.random.uniform(k, shape, x.dtype, -1.0, 1.0))(keys)
    size = projections.norm(t, "linf")
  else:
    t = jax.vmap(lambda k: jax.random.normal(k, shape, x.dtype))(keys)
    size = projections.norm(t, "l2")
  if norm == "l1":
    delta = projections.project_l1_box(t, x, eps, lower, upper)
  else:
    delta = t * expand(eps / (size + 1e-12), x.ndim)
  return jnp.clip(x + delta, lower, upper)


def _required_classes(loss, targeted: bool) -> int:
  if not isinstance(loss, str):
    return 2
  table = losses_lib.MIN_CLASSES_TARGETED if targeted else losses_lib.MIN_CLASSES
  return table[loss]


def _check_classes(config: APGDConfig, num_classes: int) -> None:
  needed = _required_classes(config.loss, config.targeted)
  if num_classes < needed:
    raise ValueError(f"{config.name}: loss {config.loss_name!r} needs at least {needed} classes, "
                     f"the model has {num_classes}; use loss='ce' instead.")
  if config.multi and config.n_target_classes >= num_classes:
    raise ValueError(f"{config.name}: n_target_classes={config.n_target_classes} needs more than "
                     f"{config.n_target_classes} classes, the model has {num_classes}; use at "
                     f"most {num_classes - 1}.")


def _run_target(config: APGDConfig, state: APGDState, run_index: Array,
                target: Array | None) -> Array | None:
  """The target the loss drives towards in this run (APGD-T: by one-hot look-up)."""
  if not config.multi:
    return target
  group = run_index // config.restarts
  columns = jnp.arange(config.n_target_classes, dtype=jnp.int32).reshape(1, -1)
  # A product, not a select: the mask is replicated while the targets are batch-sharded.
  return jnp.sum(state.targets * (columns == group).astype(jnp.int32), axis=1)


def malt_distances(logits_fn, x: Array, y: Array, candidates: Array, norm: str) -> Array:
  r"""MALT's linear estimate of each candidate class's boundary distance at ``x``.

  :math:`d_c = (z_y - z_c) / \|\nabla z_y - \nabla z_c\|_*` (dual norm of ``norm``), ``[B, K]``
  for ``candidates`` ``[B, K]``. The gradients are one ``jax.grad`` per candidate: ``K``
  forward-and-backward rows per example, which is what a counting ``logits_fn``
  (:func:`jaxrobust.metrics.count_evaluations`) records. (One forward and ``K`` pullbacks of a
  shared ``jax.vjp`` would save the ``K - 1`` extra forwards but hide the ``K`` backward passes
  from the counter.) They are taken a few candidates at a time (``jax.lax.map`` with
  ``batch_size``): as many as fill the backend's efficient pass
  (:func:`jaxrobust._options.default_chunk_size` rows, 64 on CPU and 512 on accelerators), at
  least one, so a pass holds at most ``max(B, 64 or 512)`` rows' activations, where all ``K`` at
  once held ``K`` batches' (9 on CIFAR-10, 99 on ImageNet; figures in ``benchmarks/RESULTS.md``,
  "MALT's candidate gradients, a few candidates per pass"). A zero gradient difference gives
  :math:`d_c = +\infty` (never chosen first), a negative margin (already misclassified towards
  ``c``) a negative distance.

  Examples:
    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]])  # z = x @ w
    >>> x, y = jnp.array([[1.0, 0.5]]), jnp.array([0])  # z = (1, 0.5, 3)
    >>> malt_distances(lambda x: x @ w, x, y, jnp.array([[1, 2]]), "l2")  # 0.5/sqrt 2, -2/2
    Array([[ 0.35355338, -1.        ]], dtype=float32)
  """
  classes = jnp.arange(candidates.shape[1], dtype=jnp.int32)

  def margin_grad(k: Array, x: Array) -> tuple[Array, Array]:
    def margin(x):
      logits = logits_fn(x).astype(jnp.float32)
      candidate = jnp.sum(candidates * (classes == k).astype(jnp.int32)[None, :], axis=1)
      per_example = losses_lib.label_logit(logits, y) - losses_lib.label_logit(logits, candidate)
      return jnp.sum(per_example), per_example

    grad, per_example = jax.grad(margin, has_aux=True)(x)
    return per_example, grad.reshape(grad.shape[0], -1)

  def gap_and_steepness(k: Array) -> tuple[Array, Array]:
    gap, grad = margin_grad(k, x)
    return gap, projections.dual_norm(grad.astype(jnp.float32), norm)

  # Candidates per pass: as many as fill default_chunk_size() rows, at least one (see above).
  per_pass = max(1, min(candidates.shape[1], default_chunk_size() // max(x.shape[0], 1)))
  gaps, steepness = jax.lax.map(gap_and_steepness, classes, batch_size=per_pass)  # [K, B] each
  distances = jnp.where(steepness > 0, gaps / jnp.where(steepness > 0, steepness, 1.0), jnp.inf)
  return distances.T


def _malt_targets(config: APGDConfig, logits_fn, x: Array, y: Array, logits: Array) -> Array:
  """``[B, n_target_classes]``: the candidates with the smallest MALT distances, nearest first."""
  num_classes = logits.shape[-1]
  count = min(config.malt_candidates, num_classes - 1)
  others = jnp.where(losses_lib._label_mask(logits, y), -jnp.inf, logits.astype(jnp.float32))
  candidates = jax.lax.top_k(others, count)[1].astype(jnp.int32)  # [B, K]
  distances = malt_distances(logits_fn, x, y, candidates, config.norm)
  order = jax.lax.top_k(-distances, config.n_target_classes)[1]  # [B, n], nearest first
  # One-hot look-up, not a gather: the rows may be batch-sharded (see losses._label_mask).
  pick = order[:, :, None] == jnp.arange(count, dtype=order.dtype)[None, None, :]
  return jnp.sum(candidates[:, None, :] * pick.astype(jnp.int32), axis=2)


def _init(config: APGDConfig, logits_fn, x, y, budget: Budget, keys, target=None) -> APGDState:
  del target
  x, eps, lower, upper = unpack_budget(x, budget)
  if config.multi:
    logits = logits_fn(x)
    _check_classes(config, logits.shape[-1])
    if config.targets == "malt":
      targets = _malt_targets(config, logits_fn, x, y, logits)
    else:
      # Classes by decreasing clean logit; the target of group k is the (k + 2)-th.
      targets = jax.lax.top_k(logits, config.n_target_classes + 1)[1][:, 1:].astype(jnp.int32)
  else:
    _check_classes(config, logits_shape(logits_fn, x)[-1])
    targets = None
  x0 = _start(x, keys, eps * float(config.stages.factor[0]), lower, upper, config.norm, 0)
  # Losses are float32 whatever the input dtype (loss_grad_logits returns them so); sizes in
  # input units (the step size) follow x, which is float64 under jax_enable_x64.
  losses = rows_like(x0, 0.0, jnp.float32)
  counts = rows_like(x0, 0, jnp.int32)
  return APGDState(
      x_adv=x0, x_prev=x0, x_best=x0, grad_best=jnp.zeros_like(x0), loss_best=losses,
      loss_prev=losses, loss_best_at_check=losses, halved_at_check=rows_like(x0, False, bool),
      increases=counts, step_size=rows_like(x0, 0.0, x0.dtype), coordinates=counts,
      support_at_check=losses, best=Best.empty(x0), targets=targets, keys=keys,
      t=jnp.zeros((), jnp.int32))


def _step(config: APGDConfig, logits_fn, state: APGDState, x, y, budget: Budget,
          target=None) -> APGDState:
  x, eps, lower, upper = unpack_budget(x, budget)
  nd = x.ndim
  i = config.runs.index(state.t)  # 0: the run's start; k: the k-th update
  run_index = config.runs.run(state.t)
  loss_value, grad, logits = loss_grad_logits(logits_fn, config.loss_fn, state.x_adv, y,
                                              _run_target(config, state, run_index, target))
  best = state.best.update(state.x_adv, loss_value,
                           is_success(logits, y, None if config.multi else target))
  first = jnp.asarray(config.stages.first)[i]  # the run's (or with large_eps the stage's) start
  if config.large_eps:
    # Only the last stage (at eps) is scored: the earlier ones search the larger balls.
    best = jax.tree.map(lambda new, old: jnp.where(jnp.asarray(config.stages.scored)[i], new, old),
                        best, state.best)
    eps_run = eps
    eps = eps * jnp.asarray(config.stages.factor, eps.dtype)[i]

  # The run's own best-loss point (for the restarts from x_max) and the loss-increase count.
  improved = first | (loss_value > state.loss_best)
  x_best = jnp.where(expand(improved, nd), state.x_adv, state.x_best)
  grad_best = jnp.where(expand(improved, nd), grad, state.grad_best)
  loss_best = jnp.where(improved, loss_value, state.loss_best)
  increased = (loss_value > state.loss_prev).astype(jnp.int32)
  increases = jnp.where(first, 0, state.increases + increased)
  step_size = jnp.where(first, config.initial_step * eps, state.step_size)
  window = jnp.asarray(config.table)[i]
  checkpoint = config.checkpoint(config, state, x, eps, first, window > 0, window, loss_value,
                                 loss_best, x_best, increases, step_size)

  # Restart from the best-loss point where the schedule says so, then step.
  x_cur = jnp.where(expand(checkpoint.restart, nd), x_best, state.x_adv)
  g = jnp.where(expand(checkpoint.restart, nd), grad_best, grad)
  x_next = config.update(config, x, x_cur, state.x_prev, g, checkpoint, first, eps, lower, upper)
  if config.large_eps:
    # A stage's end: the next stage starts from this stage's best-loss point, projected onto
    # the next (smaller) ball and the box.
    def shrink():
      eps_next = eps_run * jnp.asarray(config.stages.next_factor, eps_run.dtype)[i]
      return l1_box_point(x_best - x, x, eps_next, lower, upper).astype(x_next.dtype)
    x_next = jax.lax.cond(jnp.asarray(config.stages.end)[i], shrink, lambda: x_next)
    eps = eps_run
  eps_start = eps * float(config.stages.factor[0])
  x_next = config.runs.next_start(
      state.t, x_next, lambda run: _start(x, state.keys, eps_start, lower, upper, config.norm, run))
  return APGDState(
      x_adv=x_next, x_prev=x_cur, x_best=x_best, grad_best=grad_best, loss_best=loss_best,
      loss_prev=loss_value, loss_best_at_check=checkpoint.loss_best_at_check,
      halved_at_check=checkpoint.halved_at_check, increases=checkpoint.increases,
      step_size=checkpoint.step_size, coordinates=checkpoint.coordinates,
      support_at_check=checkpoint.support_at_check, best=best, targets=state.targets,
      keys=state.keys, t=state.t + 1)


def _finalize(config: APGDConfig, logits_fn, state: APGDState, x, y, budget: Budget,
              target=None) -> Array:
  del x, budget
  loss_target = _run_target(config, state, config.runs.run(state.t), target)
  loss = lambda logits: apply_loss(config.loss_fn, logits, y, loss_target).astype(jnp.float32)
  return score_last_iterate(state.best, logits_fn, state.x_adv, y,
                            None if config.multi else target, loss).x


def _done(state: APGDState) -> Array:
  """Rows whose best point already succeeds (APGD-T: untargeted; targeted: towards ``target``):
  ``finalize`` keeps a successful best point (:meth:`Best.update` never trades success away)."""
  return state.best.success


def apgd(norm: str = "linf", *, loss: str | Callable[..., Array] | None = None,
         targeted: bool = False, n_target_classes: int | None = 9, steps: int = 100,
         restarts: int = 1, rho: float = 0.75, momentum: float = 0.75,
         targets: str = "logits", malt_candidates: int = 100, large_eps: bool = False) -> Attack:
  r"""Auto-PGD: step-size-free projected gradient ascent (AutoAttack's APGD and APGD-T).

  See the module docstring for the algorithm. In short, each run makes ``steps`` momentum
  steps of size :math:`\eta` (``2 eps`` at first for Linf/L2, ``eps`` for L1), halving
  :math:`\eta` per example at the checkpoints of :func:`checkpoints` when fewer than a fraction
  ``rho`` of the recent steps increased the loss or when neither :math:`\eta` nor the best loss
  changed since the previous checkpoint, and then restarting from the best-loss point; L1 uses the
  adaptive-sparsity step and the exact L1-box projection of l1-APGD. Every evaluated point is
  scored (success first, then loss) and the best one returned.

  Three modes:

  * ``targeted=False``: untargeted APGD (``loss="ce"`` by default; AutoAttack's APGD-CE and,
    with ``loss="dlr"``, APGD-DLR). ``restarts`` runs from independent random starts.
  * ``targeted=True`` with ``n_target_classes = n`` (AutoAttack's APGD-T, an untargeted attack):
    ``n`` groups of ``restarts`` runs, group ``k`` driving towards the class with the
    :math:`(k+2)`-th largest clean logit with the targeted loss (``loss="dlr"`` by default, the
    targeted DLR of :func:`jaxrobust.losses.targeted_dlr`; ``"ce"`` the targeted cross-entropy).
    Success is untargeted, :math:`\arg\max \ne y`, so a point broken towards any target stays
    broken. No ``target=`` is taken; ``n`` must be smaller than the number of classes. With
    ``targets="malt"`` the groups target instead the ``n`` classes nearest by MALT's linear
    estimate :math:`(z_y - z_c) / \|\nabla z_y - \nabla z_c\|_*` (:func:`malt_distances`),
    nearest first, among the ``malt_candidates`` largest clean logits; this costs one gradient
    row per candidate and example at ``init`` (``min(malt_candidates, C - 1)`` rows, e.g. 9 for
    10 classes, against the ``n * (steps + 1)`` rows of the runs).
  * ``targeted=True`` with ``n_target_classes=None``: an ordinary targeted attack; pass
    ``target=``; success is :math:`\arg\max = \text{target}`.

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    loss: ``"ce"``, ``"dlr"``, ``"margin"`` or a function (see :mod:`jaxrobust.losses`); default
      ``"ce"`` untargeted and ``"dlr"`` targeted. DLR needs 3 classes, targeted DLR 4.
    targeted: see the modes above.
    n_target_classes: number of target classes of APGD-T (``targeted=True`` only), or ``None``.
    steps: iterations per run (>= 1); AutoAttack uses 100.
    restarts: runs per target (or in total, untargeted), each from a fresh random start.
    rho: the fraction of loss-increasing steps below which the step size is halved (Linf/L2).
    momentum: the weight :math:`\alpha` of the new step against the previous one (Linf/L2).
    targets: APGD-T's target classes: ``"logits"`` (the clean logit rank, AutoAttack's rule) or
      ``"malt"`` (MALT's nearest boundaries, see above). Only with ``n_target_classes``.
    malt_candidates: how many classes (the largest clean logits other than the label) MALT
      scores; the paper's 100. Fewer save gradient rows at ``init`` on models with many classes.
    large_eps: AutoAttack's ``use_largereps`` (L1 only; its L1 ``standard`` suite sets it): each
      run is three stages at :math:`3\epsilon`, :math:`2\epsilon` and :math:`\epsilon` (see the
      module docstring); only the last stage's points are scored. ``steps >= 2``.

  Returns:
    A :class:`jaxrobust.Attack` for :func:`jaxrobust.run` or :func:`jaxrobust.robustness_curve`.

  Raises:
    ValueError: unknown norm or loss, ``steps``/``restarts``/``n_target_classes`` < 1, ``rho``
      outside (0, 1], ``momentum`` outside [0, 1], unknown ``targets``, ``targets="malt"``
      without APGD-T's ``n_target_classes``, ``malt_candidates`` < ``n_target_classes``,
      ``large_eps`` with a norm other than L1 or with ``steps`` < 2; at
      ``init``, too few classes for the loss or
      for ``n_target_classes``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust.attacks._apgd import apgd
    >>> w = jnp.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0]])  # three classes, logits z = x @ w
    >>> logits_fn = lambda x: x @ w
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # z = (0.2, -0.2, 0): Linf distance 0.1
    >>> attack = apgd("linf", steps=10)
    >>> attack.name
    'apgd-ce-linf-10x1'
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> bool(run(0.09).success[0]), bool(run(0.11).success[0])
    (False, True)
    >>> l1 = apgd("l1", steps=10, large_eps=True)  # L1 distance 0.2; stages at 3, 2, 1 eps
    >>> l1.name
    'apgd-ce-l1-10x1-large-eps'
    >>> run = jax.jit(lambda e: jr.run(l1, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> [(bool(r.success[0]), round(float(r.norm[0]), 2)) for r in (run(0.19), run(0.21))]
    [(False, 0.19), (True, 0.21)]

  References:
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020.
    Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image classifiers",
    ICML 2021.
    Melamed, Yehudai & Shamir, "MALT Powers Up Adversarial Attacks", NeurIPS 2024.
  """
  check_norm(norm)
  steps = check_positive_int("steps", steps)
  restarts = check_positive_int("restarts", restarts)
  multi = bool(targeted) and n_target_classes is not None
  if multi:
    n_target_classes = check_positive_int("n_target_classes", n_target_classes)
  rho = check_number("rho", rho, low=0.0, high=1.0, low_open=True)
  momentum = check_number("momentum", momentum, low=0.0, high=1.0)
  if targets not in ("logits", "malt"):
    raise ValueError(f"Unknown targets {targets!r}; supported: 'logits', 'malt'.")
  malt_candidates = check_positive_int("malt_candidates", malt_candidates)
  if targets == "malt":
    if not multi:
      raise ValueError("targets='malt' chooses APGD-T's target classes: pass targeted=True with "
                       "n_target_classes.")
    if malt_candidates < n_target_classes:
      raise ValueError(f"malt_candidates={malt_candidates} must be at least "
                       f"n_target_classes={n_target_classes}.")
  if loss is None:
    loss = "dlr" if targeted else "ce"
  loss_fn = losses_lib.resolve(loss, bool(targeted))
  loss_name = loss if isinstance(loss, str) else "custom"
  if multi:
    name = (f"apgd-t-{loss_name}-{norm}-{steps}x{n_target_classes}"
            + ("malt" if targets == "malt" else "") + "targets")
    if restarts > 1:
      name += f"x{restarts}"
  else:
    name = f"apgd-{loss_name}-{norm}-{steps}x{restarts}" + ("-targeted" if targeted else "")

  if large_eps and norm != "l1":
    raise ValueError(f"large_eps is AutoAttack's L1 schedule (use_largereps, L1 only); got "
                     f"norm={norm!r}.")
  large_eps = bool(large_eps)
  schedule = stages(steps, large_eps)
  if large_eps:
    name += "-large-eps"
  # A run is its stages end to end: sum(n_s) + (number of stages) evaluations.
  runs = Runs(len(schedule.factor) - 1, restarts * (n_target_classes if multi else 1))
  table = np.zeros(runs.period, np.int32)  # window length at each checkpoint, 0 elsewhere
  start = 0
  for n in schedule.lengths:
    if norm == "l1":
      marks, lengths = l1_checkpoints(n), None
    else:
      marks = checkpoints(n)
      lengths = np.diff((0,) + marks)
    for j, w in enumerate(marks):
      table[start + w] = 1 if lengths is None else lengths[j]
    start += n + 1
  config = APGDConfig(
      norm=norm, name=name, loss=loss, loss_name=loss_name, loss_fn=loss_fn,
      targeted=bool(targeted), multi=multi, n_target_classes=n_target_classes, targets=targets,
      malt_candidates=malt_candidates, restarts=restarts, runs=runs, table=table,
      initial_step=INITIAL_STEP[norm], rho=rho,
      momentum=momentum, checkpoint=l1_checkpoint if norm == "l1" else momentum_checkpoint,
      update=l1_update if norm == "l1" else momentum_update, stages=schedule)
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=runs.num_steps,
                norm=norm, targeted=bool(targeted) and not multi, minimum_norm=False, name=name,
                done=_done)
