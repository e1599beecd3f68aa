r"""The Brendel-Bethge attack (BB; Brendel et al., NeurIPS 2019): a minimum-norm attack that walks
along the decision boundary towards the clean point, under L2, Linf and L1.

BB starts from an adversarial point and never leaves the boundary's neighbourhood. Per example:

1. **Start.** Inner minimum-norm attacks (``init_attack``; by default DDN (L2 only), FMN, FAB and
   ``min_norm_search(apgd)`` in the same norm, at their defaults, the search's L2 and L1
   ``rtol`` 0.01: :data:`START_RTOL`) are run without a bound; the smallest of their points,
   re-checked by the model, is the start :math:`x_s`. A bisection of
   ``binary_search_steps`` steps on the path from the clean point :math:`x_0` to :math:`x_s` (L2 and
   L1: the segment :math:`x_0 + \tau (x_s - x_0)`; Linf: the perturbation clipped to
   :math:`\pm\tau \|x_s - x_0\|_\infty`, whose Linf norm is :math:`\tau \|x_s - x_0\|_\infty`)
   moves it to the boundary: the smallest :math:`\tau` found adversarial. Every adversarial point
   on the way is scored, so the result is never worse than the start. Where the inner attack found
   nothing, BB starts at :math:`x_0` itself (its steps then move towards the boundary within the
   trust region, a gradient attack of their own).
2. **Steps** :math:`k = 0, \dots, K - 1`. At the iterate :math:`x_k`, one forward and one
   backward pass give the logit difference :math:`\ell = z_y - \max_{j \ne y} z_j` (targeted:
   :math:`\max_{j \ne t} z_j - z_t`; adversarial iff :math:`\ell < 0`) and its gradient
   :math:`g`, averaged into the boundary normal :math:`b_k = (1 - m)\, g + m\, b_{k-1}`
   (:math:`b_0 = g`; momentum :math:`m`). The linearised model reaches
   :math:`\ell + b^\top\delta`; the step aims at

   .. math:: c = -\omega\,\ell \ \ (\ell > 0), \qquad c = -(2 - \omega)\,\ell \ \ (\ell \le 0),

   with the overshoot :math:`\omega` (1.1: a non-adversarial iterate is carried 10% beyond the
   boundary, an adversarial one pulled back to 10% of its depth), and solves

   .. math::
      \min_\delta\ \|x_0 - x_k - \delta\|_p \quad\text{s.t.}\quad b_k^\top\delta = c,\
      l \le x_k + \delta \le u,\ \|\delta\|_2 \le r_k,

   exactly (L2: nested 1-D searches on the Lagrange multipliers; Linf: a bisection on the Linf
   distance of L2 problems in a shrunken box; L1: the linear programme without the trust region,
   a fractional knapsack over the coordinates in decreasing :math:`|b_i|`, and where that step is
   longer than :math:`r_k` a search on the soft threshold :math:`t = 1/(2\mu)` of the
   regularised problem :math:`\|x_0 - x_k - \delta\|_1 + \mu\|\delta\|_2^2` on the plane; see
   :mod:`jaxrobust.attacks._boundary_steps`), or,
   where the plane cannot be reached inside the box and the trust region, takes the largest step
   towards it. Then :math:`x_{k+1} = \operatorname{clip}(x_k + \delta)`.
3. **Trust region.** :math:`r_k = \eta_k\, D\,(u - l)` with :math:`D` the number of input
   elements of one example and :math:`\eta_k = \eta\,\gamma^{\lfloor (k + 2) / I \rfloor}`,
   :math:`I = \max(1, \lfloor K / n \rfloor)` (``lr``, ``lr_decay`` and ``lr_num_decay``).

Every iterate is scored (the last one by ``finalize``) and the adversarial one of smallest norm
returned, as for every minimum-norm attack of the library (:class:`MinNormBest`).

Defaults are those of the paper and of Foolbox 3.3's ``L2BrendelBethgeAttack`` /
``LinfinityBrendelBethgeAttack`` / ``L1BrendelBethgeAttack`` (``steps=1000``, ``lr=1e-3``, ``lr_decay=0.5``,
``lr_num_decay=20``, ``momentum=0.8``, ``overshoot=1.1``, ``binary_search_steps=10``). Where this
implementation departs from Foolbox's:

* **The start.** Foolbox starts from a blended-uniform-noise line search by default; here from the
  smallest point of DDN (L2), FMN, FAB and ``min_norm_search(apgd)``. BB is a local method: on a
  ReLU network the linearised problem has many local optima (a start where the direction to
  :math:`x_0` is normal to the boundary, the clipped coordinates aside, does not move), so the
  answer is only as good as the basin of its start. On the digits MLP, BB from FMN's points alone
  ended where FMN did (median L2 0.4950), from FAB's at 0.4676, from the best of FMN and FAB at
  0.4676 and 3-8% lower on the CNN and k-WTA models than from either alone. In L1, adding
  ``min_norm_search(apgd("l1"))`` to FMN and FAB raised BB's optimality
  (``benchmarks/bench_optimality.py``, n=100) on the k-WTA MLP from 0.880 to 0.969 and on the PGD-AT
  CNN from 0.921 to 0.998 (median L1 1.352 to 1.108 and 1.230 to 1.203; ``benchmarks/RESULTS.md``,
  "Brendel-Bethge L1"). In Linf and L2 it raised BB's optimality on the k-WTA MLP from 0.8406 to
  0.9745 (Linf; median 0.1129 to 0.0864) and from 0.9411 to 0.9768 (L2), on the PGD-AT MLP (Linf)
  from 0.9781 to 0.9984, and lowered it on no model ("Brendel-Bethge Linf/L2 start"). It is not
  better on every point: from a better start BB can end in a worse basin (7 of 96 k-WTA Linf
  points end higher, by up to 33%). Any minimum-norm attack, or a sequence of them, can be given
  as ``init_attack``.
* **The trust region** is per example: Foolbox multiplies ``lr`` by the number of elements of the
  whole batch (``prod(x.shape)``), so its trust region grows with the batch size; here :math:`D`
  is one example's (Foolbox's radius at batch size :math:`B` is this one's at ``lr * B``).
* **The L2 step** is the exact solution of the trust-region problem; Foolbox's active-set solver
  fixes a coordinate at the box once it leaves it and never frees it again. The Linf step is the
  same search as Foolbox's (on :math:`\epsilon`, with an L2 problem inside). The L1 step solves
  the same dual as Foolbox's (multipliers :math:`\lambda` of the plane and :math:`\mu` of the
  trust region), by nested 1-D searches instead of a box-constrained BFGS, and needs no
  touch-up: the plane search meets the plane.
* **The L1 path.** Foolbox bisects on a soft-thresholded path (the coordinates of
  :math:`x_s - x_0` above a falling threshold); here on the segment, whose L1 norm grows linearly
  in :math:`\tau`, as for L2.
* **The search on the path** scores every adversarial midpoint (Foolbox keeps only the last).

The search never looks at ``budget.eps``: the start is the unbounded inner attack's, and a finite
eps only filters the returned point; a row is ``done`` once its smallest adversarial point lies
inside a finite eps-ball (at ``eps = inf`` never).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._batch import expand, fold_in, is_success, like_batch, rows_finite, rows_like
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget, Meter
from jaxrobust._validation import check_bool, check_number, check_positive_int
from jaxrobust.attacks import _boundary_steps
from jaxrobust.attacks._apgd import apgd
from jaxrobust.attacks._ddn import ddn
from jaxrobust.attacks._fab import fab
from jaxrobust.attacks._fmn import fmn
from jaxrobust.attacks._min_norm_search import min_norm_search
from jaxrobust.attacks._common import (MinNormBest, loss_grad_logits, smallest_inside,
                                       unpack_budget)
from jaxrobust.engine import attack_loop, propagations

Array = jax.Array

NORMS = ("l2", "linf", "l1")
START_RTOL = {"l2": 0.01, "l1": 0.01}
"""The ``rtol`` of the default start's ``min_norm_search`` in L2 and L1 (the search's default
before it became 0.001; Linf: the default). On the digits zoo (``bench_optimality.py``, n=100)
BB from the 0.001 search's points fell in L1 on the k-WTA MLP from 0.9696 to 0.9609 and on the
plain CNN from 0.9998 to 0.9997, in L2 on the PGD-AT CNN from 0.9987 to 0.9984 (starts in worse
basins; it rose on most other models); in Linf it rose or stayed equal on all eight (CCAT-like MLP
0.9865 to 0.9978) (``benchmarks/RESULTS.md``, "CCAT-like gaps")."""
_TAG = 0xB8  # folded into the per-example keys for the inner attack's run
# The inner attack runs as one dense scan inside ``init``: no canonical convolutions (the outer
# run makes them canonical).
_INNER_OPTIONS = RunOptions(canonical=False, score_skipped_rows=False)


class BBState(NamedTuple):
  """The ``lax.scan`` carry of Brendel-Bethge."""

  x_adv: Array  # [B, ...] work dtype: the current iterate x_k, inside the box.
  normal: Array  # [B, ...] work dtype: the boundary normal b_{k-1} (momentum average).
  best: MinNormBest  # smallest adversarial point seen (start and path included), per example.
  k: Array  # [] int32: steps done.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (``inf``: no bound).
  # [B] int32: the propagations init and the steps spent per row, where BB counts them itself
  # (a start with a Meter, see _counts_itself; None otherwise, or where a start is uncountable).
  forward: Array | None = None
  backward: Array | None = None


class _Config(NamedTuple):
  """The static configuration, chosen by :func:`brendel_bethge`."""

  norm: str
  steps: int
  lr: float
  lr_decay: float
  interval: int  # steps between two decays of the trust region
  momentum: float
  overshoot: float
  binary_search_steps: int
  init_attacks: tuple[Attack, ...]
  difference: Callable[..., Array]  # the logit difference, negative iff adversarial
  counts: bool = False  # BB counts its own propagations (init included): see _counts_itself


def _difference(logits: Array, labels: Array) -> Array:
  r""":math:`z_y - \max_{j \ne y} z_j`: negative exactly when the point is adversarial."""
  return -losses_lib.margin(logits, labels)


def _difference_to_target(logits: Array, labels: Array, target: Array) -> Array:
  r""":math:`\max_{j \ne t} z_j - z_t`: negative exactly when the target is the prediction."""
  return -losses_lib.targeted_margin(logits, labels, target)


def _on_path(norm: str, x: Array, start: Array, tau: Array) -> Array:
  """The point at ``tau`` in ``[0, 1]`` of the path from ``x`` (0) to ``start`` (1), whose norm
  grows linearly in ``tau``."""
  delta = start - x
  if norm in ("l2", "l1"):
    return x + expand(tau, x.ndim) * delta
  reach = expand(tau * projections.norm(delta, "linf"), x.ndim)
  return x + jnp.clip(delta, -reach, reach)


def _counts_itself(init_attacks: tuple[Attack, ...]) -> bool:
  """Whether BB counts its propagations itself (:class:`jaxrobust.Meter` with ``counts_init``):
  where a start counts its own (``min_norm_search``), whose model calls depend on the data, so
  the engine cannot measure BB's ``init`` by tracing it."""
  return any(attack.meter is not None for attack in init_attacks)


def _start(config: _Config, logits_fn, x, y, keys, target, lower,
           upper) -> tuple[MinNormBest, tuple[Array, Array] | None]:
  """The smallest adversarial point of the inner attacks' (each run at ``eps = inf`` on keys of
  its own, re-checked by the model); ``norm = inf`` where none found one. With
  ``config.counts``, also the propagations spent per row (each start's ``init``, steps and
  ``finalize``, as :func:`jaxrobust.run` counts them, and one forward for its check), or
  ``None`` where a start cannot be counted."""
  best = MinNormBest.empty(x)
  unbounded = jnp.full_like(best.norm, jnp.inf)
  spent = (rows_like(x, 0, jnp.int32),) * 2 if config.counts else None
  for index, attack in enumerate(config.init_attacks):
    keys_of = fold_in(keys, _TAG + index)
    costs = None
    if spent is not None:
      costs = propagations.measure(attack, logits_fn, x, y, Budget(unbounded, lower, upper),
                                   keys_of, target)
      spent = None if costs is None else spent
    inner = attack_loop.attack_rows(attack, logits_fn, lower, upper, _INNER_OPTIONS,
                                    meter=costs is not None)
    point = inner(x, y, unbounded, keys_of, target)
    if costs is not None:
      point, tally = point
      used = propagations.spent(costs, tally, jnp.ones_like(unbounded, bool))
      spent = (spent[0] + used["forward"] + 1, spent[1] + used["backward"])
    point = jnp.clip(point.astype(x.dtype), lower, upper)
    found = is_success(logits_fn(point), y, target) & rows_finite(point)
    best = best.update(point, projections.norm(point - x, config.norm), found)
  return best, spent


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> BBState:
  x, limit, lower, upper = unpack_budget(x, budget)
  limit = like_batch(limit, x)
  best, spent = _start(config, logits_fn, x, y, keys, target, lower, upper)
  start, found = best.x, jnp.isfinite(best.norm)
  size = lambda point: projections.norm(point - x, config.norm)

  def bisect(_, carry):
    low, high, best = carry
    tau = (low + high) / 2
    point = _on_path(config.norm, x, start, tau)
    adversarial = found & is_success(logits_fn(point), y, target)
    return (jnp.where(adversarial, low, tau), jnp.where(adversarial, tau, high),
            best.update(point, size(point), adversarial))

  zero = jnp.zeros_like(limit)
  _, high, best = jax.lax.fori_loop(0, config.binary_search_steps, bisect,
                                    (zero, jnp.ones_like(limit), best))
  x_start = jnp.where(expand(found, x.ndim), _on_path(config.norm, x, start, high), x)
  forward = backward = None
  if spent is not None:  # the bisection: one forward per step
    forward, backward = spent[0] + config.binary_search_steps, spent[1]
  return BBState(x_adv=x_start, normal=jnp.zeros_like(x), best=best, k=jnp.zeros((), jnp.int32),
                 limit=limit, forward=forward, backward=backward)


def _step(config: _Config, logits_fn, state: BBState, x, y, budget: Budget,
          target=None) -> BBState:
  x, _, lower, upper = unpack_budget(x, budget)
  difference, grad, logits = loss_grad_logits(logits_fn, config.difference, state.x_adv, y,
                                              target)
  best = state.best.update(state.x_adv, projections.norm(state.x_adv - x, config.norm),
                           is_success(logits, y, target))
  grad = grad.astype(x.dtype)
  normal = jnp.where(state.k == 0, grad, (1 - config.momentum) * grad + config.momentum
                     * state.normal)
  difference = difference.astype(x.dtype)
  goal = jnp.where(difference > 0, -config.overshoot * difference,
                   -(2 - config.overshoot) * difference)
  goal = jnp.where(jnp.isfinite(goal), goal, 0.0)
  decays = ((state.k + 2) // config.interval).astype(x.dtype)
  size = math.prod(x.shape[1:])
  region = config.lr * jnp.power(jnp.asarray(config.lr_decay, x.dtype), decays) * size * (
      upper - lower)
  solve = {"l2": _boundary_steps.l2_step, "linf": _boundary_steps.linf_step,
           "l1": _boundary_steps.l1_step}[config.norm]
  flat = lambda a: a.reshape(a.shape[0], -1)
  delta = solve(flat(x), flat(state.x_adv), flat(normal), goal,
                jnp.broadcast_to(region, goal.shape), lower, upper)
  x_next = jnp.clip(state.x_adv + delta.reshape(x.shape), lower, upper)
  counted = lambda c: None if c is None else c + 1  # one forward and one backward per step
  return BBState(x_adv=x_next, normal=normal, best=best, k=state.k + 1, limit=state.limit,
                 forward=counted(state.forward), backward=counted(state.backward))


def _spent(state: BBState) -> tuple[Array, Array] | None:
  """What ``init`` and the steps spent per row (:class:`jaxrobust.Meter`, ``counts_init``)."""
  return None if state.forward is None else (state.forward, state.backward)


def _finalize(config: _Config, logits_fn, state: BBState, x, y, budget: Budget,
              target=None) -> Array:
  x, eps, _, _ = unpack_budget(x, budget)
  return smallest_inside(state.best, logits_fn, state.x_adv, x, y, target, eps, config.norm)


def _done(state: BBState) -> Array:
  """Rows whose smallest adversarial point already lies inside a finite eps-ball (see
  :meth:`MinNormBest.within`); at ``eps = inf`` none."""
  return state.best.within(state.limit)


def default_init_attack(norm: str, targeted: bool = False) -> tuple[Attack, ...]:
  """The starts tried when ``init_attack`` is ``None``: FMN, FAB and ``min_norm_search(apgd)``
  in the attack's norm, for L2 DDN first (targeted: FAB and APGD towards ``target=``, APGD with
  the cross-entropy), each at its defaults (the smallest adversarial point of theirs is the
  start), except that in L2 and L1 the search stops at ``rtol=0.01`` (:data:`START_RTOL`)."""
  inner = (apgd(norm, targeted=True, n_target_classes=None, loss="ce") if targeted
           else apgd(norm))
  search = (min_norm_search(inner, rtol=START_RTOL[norm]) if norm in START_RTOL
            else min_norm_search(inner))
  starts = (fmn(norm, targeted=targeted), fab(norm, targeted=targeted, n_target_classes=None),
            search)
  return ((ddn(targeted=targeted),) + starts) if norm == "l2" else starts


def _check_init_attacks(init_attack, targeted: bool) -> tuple[Attack, ...]:
  attacks = (init_attack,) if isinstance(init_attack, Attack) else tuple(init_attack)
  if not attacks:
    raise ValueError("init_attack must be an attack or a non-empty sequence of attacks.")
  for attack in attacks:
    _check_init_attack(attack, targeted)
  return attacks


def _check_init_attack(attack: Attack, targeted: bool) -> None:
  if not isinstance(attack, Attack):
    raise TypeError(f"init_attack must be a jr.Attack, got {type(attack).__name__}.")
  if attack.suite is not None or attack.drive is not None:
    raise ValueError(f"init_attack cannot be the suite {attack.name!r}: give a single attack.")
  if not attack.minimum_norm:
    raise ValueError(f"init_attack {attack.name!r} is a fixed-budget attack; brendel_bethge runs "
                     "it without a bound, so it must be a minimum-norm attack (fmn, ddn, fab, "
                     "deepfool, carlini_wagner_l2, min_norm_search(...)).")
  if attack.samples:
    raise ValueError(f"init_attack {attack.name!r} attacks a randomized model (jr.attacks.eot), "
                     "which brendel_bethge does not support.")
  if attack.targeted != targeted:
    raise ValueError(f"init_attack {attack.name!r} has targeted={attack.targeted}, the attack "
                     f"targeted={targeted}: they must agree.")


def brendel_bethge(norm: str = "l2", *, steps: int = 1000, lr: float = 1e-3,
                   lr_decay: float = 0.5, lr_num_decay: int = 20, momentum: float = 0.8,
                   overshoot: float = 1.1, binary_search_steps: int = 10,
                   init_attack: Union[Attack, Sequence[Attack], None] = None,
                   targeted: bool = False) -> Attack:
  r"""Brendel-Bethge: refine an adversarial start along the decision boundary (L2, Linf or L1).

  A minimum-norm attack (``minimum_norm=True``). ``init_attack`` (default: FMN, FAB and
  ``min_norm_search(apgd)`` in the attack's norm, and DDN for L2; see
  :func:`default_init_attack`) runs first, without a bound, inside ``init``; a bisection of
  ``binary_search_steps`` forward passes on the path from ``x`` to its point moves the start onto
  the boundary. Each of ``steps`` iterations then takes one forward and one backward pass at the
  iterate :math:`x_k`, averages the gradient of the logit difference
  :math:`\ell = z_y - \max_{j \ne y} z_j` into the boundary normal :math:`b_k` (``momentum``),
  and moves by the exact solution of

  .. math::
     \min_\delta\ \|x - x_k - \delta\|_p \quad\text{s.t.}\quad b_k^\top\delta = c,\
     l \le x_k + \delta \le u,\ \|\delta\|_2 \le r_k,

  with :math:`c = -\omega\ell` (not yet adversarial) or :math:`-(2 - \omega)\ell` (adversarial),
  :math:`\omega` the ``overshoot``, and the trust region
  :math:`r_k = \mathrm{lr}\cdot \mathrm{lr\_decay}^{\lfloor (k + 2)/I \rfloor} \cdot D\,(u - l)`,
  :math:`I = \lfloor \mathrm{steps} / \mathrm{lr\_num\_decay} \rfloor`, :math:`D` the number of
  input elements of one example; where the plane cannot be reached within the box and the trust
  region, the largest step towards it. The adversarial point of smallest norm seen (the start and
  the bisection's points included) is returned, so the result is never worse than the start. See
  :mod:`jaxrobust.attacks._brendel_bethge` for the algorithm and where it departs from Foolbox.

  ``budget.eps`` is an optional upper bound (``inf`` for none) that never changes the search: the
  smallest adversarial point found is returned if it lies in the eps-ball, and ``x`` otherwise
  (a failure, norm ``inf``). At a finite eps a row is ``done`` once such a point lies inside the
  ball (early exit stops it there); at ``eps = inf`` never. Points misclassified on the clean
  input are returned unchanged.

  Cost per example: the inner attacks' (``fmn`` and ``fab``: about 100 forward and backward
  passes each, ``ddn`` 100, ``min_norm_search(apgd)`` up to 20 runs of 100), plus
  ``binary_search_steps + 1`` forward passes, plus ``steps`` forward and backward passes, plus a
  trust-region solve per step (a few hundred elementwise passes over the input, no model call).
  :func:`jaxrobust.run` reports what each example spent (``info["propagations"]``): where a
  start counts its own propagations (``min_norm_search``, as in the default start), BB counts
  itself, ``init`` included (:class:`jaxrobust.Meter` with ``counts_init``): per start its count
  as :func:`jaxrobust.run` gives it and one forward checking its point, one forward per
  bisection step, one forward and one backward per step, one forward in ``finalize``; it then
  takes no ``max_propagations`` cap (the start's cost is known only once it has run).

  Args:
    norm: ``"l2"``, ``"linf"`` or ``"l1"``.
    steps: iterations (>= 1) along the boundary.
    lr: the initial trust region :math:`\eta > 0`, as a fraction of :math:`D\,(u - l)`.
    lr_decay: the factor :math:`\gamma \in (0, 1]` applied ``lr_num_decay`` times.
    lr_num_decay: how many times (>= 1) the trust region decays over ``steps``.
    momentum: the weight :math:`m \in [0, 1)` of the past boundary normal.
    overshoot: :math:`\omega \in [1, 2)`, how far beyond the linearised boundary a step aims.
    binary_search_steps: bisections (>= 0) on the path from ``x`` to the inner attack's point.
    init_attack: the minimum-norm attack that finds the start (run at ``eps = inf``), targeted
      as this attack is, or a sequence of them (the smallest point of theirs is the start);
      ``None``: :func:`default_init_attack` (``fmn``, ``fab`` and ``min_norm_search(apgd)`` in
      ``norm``, and ``ddn`` for L2).
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True``.

  Raises:
    ValueError: an unknown norm, an option out of range, or an ``init_attack`` that is not a
      single minimum-norm attack on a deterministic model targeted as this one.
    TypeError: ``init_attack`` is not a :class:`jaxrobust.Attack`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # L2 distance to the boundary: 0.1414
    >>> attack = jr.attacks.brendel_bethge("l2", steps=20)
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), round(float(result.norm[0]), 4)
    (True, 0.1414)
    >>> bool(run(0.14).success[0])  # no point within 0.14 is adversarial
    False
    >>> l1 = jr.attacks.brendel_bethge("l1", steps=20)  # L1: one coordinate moves by 0.2
    >>> result = jax.jit(lambda x, y: jr.run(l1, logits_fn, x, y, jr.Budget(jnp.inf),
    ...                                      jax.random.key(0)))(x, y)
    >>> bool(result.success[0]), round(float(result.norm[0]), 4)
    (True, 0.2)

  References:
    Brendel, Rauber, Kümmerer, Ustyuzhaninov & Bethge, "Accurate, reliable and fast robustness
    evaluation", NeurIPS 2019, arXiv:1907.01003.
  """
  if norm not in NORMS:
    raise ValueError(f"brendel_bethge supports the norms {NORMS}, got {norm!r}.")
  steps = check_positive_int("steps", steps)
  lr = check_number("lr", lr, low=0.0, low_open=True)
  lr_decay = check_number("lr_decay", lr_decay, low=0.0, high=1.0, low_open=True)
  lr_num_decay = check_positive_int("lr_num_decay", lr_num_decay)
  momentum = check_number("momentum", momentum, low=0.0, high=1.0, high_open=True)
  overshoot = check_number("overshoot", overshoot, low=1.0, high=2.0, high_open=True)
  binary_search_steps = check_positive_int("binary_search_steps", binary_search_steps, minimum=0)
  targeted = check_bool("targeted", targeted)
  if init_attack is None:
    init_attack = default_init_attack(norm, targeted)
  init_attacks = _check_init_attacks(init_attack, targeted)
  config = _Config(norm=norm, steps=steps, lr=lr, lr_decay=lr_decay,
                   interval=max(1, steps // lr_num_decay), momentum=momentum,
                   overshoot=overshoot, binary_search_steps=binary_search_steps,
                   init_attacks=init_attacks,
                   difference=_difference_to_target if targeted else _difference,
                   counts=_counts_itself(init_attacks))
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=steps, norm=norm,
                targeted=targeted, minimum_norm=True,
                name=f"brendel-bethge-{norm}-{steps}" + ("-targeted" if targeted else ""),
                done=_done,
                meter=Meter(spent=_spent, counts_init=True) if config.counts else None)
