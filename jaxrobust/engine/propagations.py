r"""Propagation accounting: per example, the forward and backward passes an attack spends on it,
and a per-example cap on them (AttackBench's budget).

**Counting.** An attack kernel (``init``, ``num_steps`` ``step``\ s, ``finalize``) treats rows
independently, so what one call of ``init``, ``step`` or ``finalize`` spends on one row is a
fixed number, measured once while tracing (:func:`measure`): each phase is traced to a jaxpr
with ``logits_fn`` wrapped by :func:`jaxrobust.metrics.model_evaluations.instrument`, whose hooks
leave a marker per call and per backward pass, and the markers' rows are added up
(a ``scan`` multiplies its body's by its length; the markers under ``vmap`` are one per mapped
row). A call without gradient is one **forward** propagation per row; a differentiated call is
one forward, and every backward pass through it (a ``jax.vjp`` pullback applied ``K`` times
counts ``K``) one **backward** propagation per row. Shape queries (``jax.eval_shape``) leave no
marker. The engine counts the steps each row actually ran (:class:`Metered`: a per-row counter
that early exit freezes with the rest of the row's state), so for a row :math:`i` the attack
was run on

.. math::  F_i = f_\text{init} + s_i f_\text{step} + f_\text{fin}, \qquad
           K_i = b_\text{init} + s_i b_\text{step} + b_\text{fin},

with :math:`s_i` its steps, and :math:`F_i = K_i = 0` for a row it was not run on
(misclassified, ``eps = 0``, broken by an earlier member of a suite). These are what the
algorithm spends on the example, whatever the batch, its order, the chunks of compaction and
their padding rows (which are computed but are no example's cost). A model call inside a
fixed-length loop (a ``scan``, a ``fori_loop`` with static bounds) counts its trip count times
(Brendel-Bethge's start: FMN and FAB runs and a bisection). A phase whose cost cannot be fixed
this way (a model call inside a ``cond`` whose branches differ, or inside a ``while_loop``)
makes the attack uncountable: :func:`measure` returns ``None`` and no counts are reported,
unless the attack counts its steps' propagations itself (:class:`jaxrobust._types.Meter`, as
:func:`jaxrobust.attacks.min_norm_search` does: each search step adds, per row it searched on,
what its inner run spent, :math:`f_\text{init} + s f_\text{step} + f_\text{fin}` for the
:math:`s` steps that row ran under the inner early exit, and one forward for checking the point;
rows not searching, frozen by the inner or the outer early exit, add nothing). Then
:math:`F_i = f_\text{init} + F^\text{steps}_i + f_\text{fin}` with the attack's own count of
its steps (likewise :math:`K_i`). An attack whose ``init`` too calls the model a data-dependent
number of times (Brendel-Bethge started by a ``min_norm_search``) counts ``init`` as well
(``Meter.counts_init``): ``init`` is then traced for its shapes only, :math:`f_\text{init} = 0`,
and :math:`F_i = F^\text{init+steps}_i + f_\text{fin}`. ``jr.run``'s own clean diagnosis and final re-scoring
(:mod:`jaxrobust.engine.scoring`) and a suite's checks are not the attack's and are not counted
(AttackBench does not count its own evaluation either).

**The cap.** With a cap :math:`c_i` on :math:`F_i + K_i`, row :math:`i` runs at most

.. math::  s_i^{\max} = \min\Bigl(T, \Bigl\lfloor \frac{c_i - p_\text{init} - p_\text{fin}}
           {p_\text{step}} \Bigr\rfloor\Bigr)

steps (:math:`p = f + b`, :math:`T` = ``num_steps``); past it the row is frozen like a row early
exit is done with, and ``finalize`` returns the best point found within the cap. A row whose cap
is below :math:`p_\text{init} + p_\text{fin}` is not attacked (``x_adv = x``). AttackBench's
model instead answers a query past the budget with a constant output and a zero gradient, and
counts the best point among the queries it answered; on an attack that keeps its best point
(every attack here does) that is the same result, except that AttackBench also spends a budget
left over that is smaller than a whole step (a forward without its backward), which here is
left unspent, so :math:`F_i + K_i \le c_i` always. An attack that counts its own steps gets
the allowance :math:`c_i - p_\text{init} - p_\text{fin}` (``Meter.cap``) and stops each row
within it itself: ``min_norm_search`` runs a search step on a row only while what is left
covers its inner run's ``init`` and ``finalize`` and the check, and stops that run's steps
within what is left (a run cut short that fails does not raise the lower end of the bracket).
A cap at least a row's uncapped count changes nothing there either (no run is cut short).

References:
  Cinà, Rony, Pintor, Demetrio, Demontis, Biggio, Ben Ayed & Roli, *AttackBench: Evaluating
  Gradient-based Attacks for Adversarial Examples*, AAAI 2025 (a per-sample budget of forward
  and backward propagations).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _jaxpr_walk
from jaxrobust._batch import rows_like
from jaxrobust._types import Attack, Budget, as_budget
from jaxrobust.metrics.model_evaluations import instrument

Array = jax.Array

_FORWARD, _GRADIENT, _BACKWARD = 3, 5, 7
"""Widths of the ``uint8`` marker rows, which tell the three kinds of marker apart."""


class Cost(NamedTuple):
  """Propagations one call of a phase spends per row."""

  forward: int
  backward: int

  @property
  def total(self) -> int:
    return self.forward + self.backward


class Costs(NamedTuple):
  """The per-row cost of an attack's three phases (:func:`measure`).

  Examples:
    >>> costs = Costs(Cost(0, 0), Cost(1, 1), Cost(1, 0))  # PGD: a gradient per step, a last score
    >>> costs.fixed.total, costs.step.total
    (1, 2)
  """

  init: Cost
  step: Cost
  finalize: Cost

  @property
  def fixed(self) -> Cost:
    """What ``init`` and ``finalize`` spend together."""
    return Cost(self.init.forward + self.finalize.forward,
                self.init.backward + self.finalize.backward)


class Metered(NamedTuple):
  """An attack state with the steps each row ran (moved and frozen with the row's state).

  ``limit`` (``[B]`` int32) caps the steps (``None``: no cap).
  """

  state: Any
  steps: Array  # [B] int32
  limit: Optional[Array] = None  # [B] int32


def _marker(width: int) -> Callable[..., None]:
  def mark(*values: Array) -> None:
    v = values[-1]  # the logits (the cotangent of a backward pass): one marker per iteration
    rows = jax.lax.stop_gradient(v.reshape(v.shape[:1] + (-1,))[:, :1])
    jax.debug.callback(lambda _: None, jnp.broadcast_to((rows * 0).astype(jnp.uint8),
                                                        (v.shape[0], width)))
  return mark


class _Varies(Exception):
  """A model call whose number depends on the data (inside a ``while_loop`` or a ``cond``)."""


def _rows(jaxpr: Any) -> np.ndarray:
  """``[forward, gradient-forward, backward]`` marker rows of a jaxpr, nested ones included."""
  total = np.zeros(3, np.int64)
  for eqn in _jaxpr_walk.open_jaxpr(jaxpr)[0].eqns:
    name = eqn.primitive.name
    subs = _jaxpr_walk.sub_jaxprs(eqn.params)
    if name == "debug_callback":
      avals = [v.aval for v in eqn.invars]
      if (len(avals) == 1 and avals[0].dtype == jnp.uint8 and avals[0].ndim == 2
          and avals[0].shape[1] in (_FORWARD, _GRADIENT, _BACKWARD)):
        total[(_FORWARD, _GRADIENT, _BACKWARD).index(avals[0].shape[1])] += avals[0].shape[0]
    elif name == "scan":
      total += eqn.params["length"] * sum((_rows(s) for s in subs), np.zeros(3, np.int64))
    elif name == "cond":
      branches = [tuple(_rows(s)) for s in subs]
      if len(set(branches)) > 1:
        raise _Varies(name)
      total += np.asarray(branches[0])
    elif name == "while":
      if any(_rows(s).any() for s in subs):
        raise _Varies(name)
    else:
      for s in subs:
        total += _rows(s)
  return total


def _cost(fn: Callable[..., Any], args: tuple, batch: int) -> tuple[Cost, Any]:
  """``fn``'s per-row :class:`Cost` on ``args`` and the shapes of its outputs (one trace)."""
  closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
  rows = _rows(closed)
  if np.any(rows % batch):
    raise _Varies("rows")
  forward, gradient, backward = (int(r) // batch for r in rows)
  return Cost(forward + gradient, backward), shapes


def measure(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
            budget: Budget, keys: Array, target: Array | None) -> Costs | None:
  """The per-row :class:`Costs` of a kernel attack on these inputs (traced, never run), or
  ``None`` where they depend on the data (see the module) or ``attack`` is a suite.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> x, y = jnp.full((4, 2), 0.5), jnp.zeros(4, jnp.int32)
    >>> costs = measure(jr.attacks.pgd("linf", steps=10), lambda x: x @ jnp.eye(2), x, y,
    ...                 jr.Budget(0.1), jax.random.split(jax.random.key(0), 4), None)
    >>> tuple(costs.init), tuple(costs.step), tuple(costs.finalize)
    ((0, 0), (1, 1), (1, 0))
  """
  if attack.suite is not None or attack.drive is not None:
    return None
  marked = instrument(logits_fn, forward=_marker(_FORWARD), gradient=_marker(_GRADIENT),
                      backward=_marker(_BACKWARD))
  budget = as_budget(budget)
  batch = x.shape[0]
  try:
    # init's trace also gives the state's shapes, on which step and finalize are traced.
    init_args = (x, y, budget, keys, target)
    if attack.meter is not None and attack.meter.counts_init:  # spent covers init: shapes only
      init, state = Cost(0, 0), jax.eval_shape(lambda *a: attack.init(logits_fn, *a), *init_args)
    else:
      init, state = _cost(lambda *a: attack.init(marked, *a), init_args, batch)
    if attack.meter is not None:  # it counts its steps itself (spent): only init and finalize
      if attack.meter.spent(state) is None:  # (on the state's shapes) it cannot count them
        return None
      step = Cost(0, 0)
    else:
      step, _ = _cost(lambda *a: attack.step(marked, *a), (state, x, y, budget, target), batch)
    finalize, _ = _cost(lambda *a: attack.finalize(marked, *a), (state, x, y, budget, target),
                        batch)
  except _Varies:
    return None
  return Costs(init, step, finalize)


def check_cap(max_propagations: Any) -> None:
  """A ``ValueError`` for a cap that is not ``None``, a non-negative int or an int array (values
  checked where concrete).

  Examples:
    >>> check_cap(2000); check_cap(None)
    >>> check_cap(-1)
    Traceback (most recent call last):
    ...
    ValueError: max_propagations must be >= 0 everywhere, got min -1.
    >>> check_cap(1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: max_propagations must be None, an int or an int array ...
  """
  if max_propagations is None:
    return
  dtype = getattr(max_propagations, "dtype", None)
  is_int = (isinstance(max_propagations, (int, np.integer))
            if dtype is None else jnp.issubdtype(dtype, jnp.integer))
  if isinstance(max_propagations, (bool, np.bool_)) or not is_int:
    raise ValueError("max_propagations must be None, an int or an int array (forward plus "
                     f"backward propagations per example), got {max_propagations!r}.")
  try:
    low = int(np.min(np.asarray(max_propagations)))
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return
  if low < 0:
    raise ValueError(f"max_propagations must be >= 0 everywhere, got min {low}.")


def step_limit(costs: Costs, cap: Array, num_steps: int) -> tuple[Array, Array]:
  """``(limit, affordable)``: per row the most steps within ``cap`` (``[B]`` int32) and whether
  the cap covers ``init`` and ``finalize`` at all (``[B]`` bool; rows that are not are not
  attacked).

  Examples:
    >>> import jax.numpy as jnp
    >>> costs = Costs(Cost(0, 0), Cost(1, 1), Cost(1, 0))
    >>> limit, ok = step_limit(costs, jnp.array([0, 1, 8, 100]), 10)
    >>> limit.tolist(), ok.tolist()
    ([0, 0, 3, 10], [False, True, True, True])
  """
  cap = jnp.asarray(cap).astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
  left = cap - costs.fixed.total
  per_step = costs.step.total
  steps = left // per_step if per_step else jnp.full_like(left, num_steps)
  return jnp.clip(steps, 0, num_steps).astype(jnp.int32), left >= 0


def limits(attack: Attack, costs: Costs, cap: Array) -> tuple[Array, Array]:
  """``(limit, affordable)`` per row under ``cap`` (``[B]``): for a kernel the engine meters, the
  steps allowed (:func:`step_limit`); for one with a :class:`~jaxrobust._types.Meter`, the
  propagations left for its steps once ``init`` and ``finalize`` are paid (``>= 0``).

  Examples:
    >>> import jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> costs = Costs(Cost(0, 0), Cost(0, 0), Cost(1, 0))
    >>> search = jr.attacks.min_norm_search(jr.attacks.pgd(steps=3))  # it counts itself
    >>> limit, ok = limits(search, costs, jnp.array([0, 1, 30]))
    >>> limit.tolist(), ok.tolist()
    ([0, 0, 29], [False, True, True])
  """
  if attack.meter is None:
    return step_limit(costs, cap, attack.num_steps)
  left = jnp.asarray(cap).astype(jnp.int32) - costs.fixed.total
  return jnp.maximum(left, 0), left >= 0


def spent(costs: Costs, tally: Array, todo: Array) -> dict:
  """``{"forward": [B], "backward": [B]}`` int32: the propagations of rows whose run reported
  ``tally`` (:func:`tally`: the steps, or ``[B, 2]`` what a self-counting attack's steps spent;
  rows outside ``todo``: 0)."""
  if tally.ndim == 2:  # an attack with a Meter: its own (forward, backward) of the steps
    count = lambda fixed, column: jnp.where(todo, fixed + tally[:, column].astype(jnp.int32), 0)
    return {"forward": count(costs.fixed.forward, 0).astype(jnp.int32),
            "backward": count(costs.fixed.backward, 1).astype(jnp.int32)}
  count = lambda fixed, per: jnp.where(todo, fixed + tally.astype(jnp.int32) * per, 0)
  return {"forward": count(costs.fixed.forward, costs.step.forward).astype(jnp.int32),
          "backward": count(costs.fixed.backward, costs.step.backward).astype(jnp.int32)}


def exhausted(state: Metered) -> Array | None:
  """``[B]`` bool rows that ran every step their cap allows (``None`` without a cap)."""
  return None if state.limit is None else state.steps >= state.limit


def start(state: Any, x: Array, limit: Array | None, attack: Attack | None = None) -> Metered:
  """The :class:`Metered` state of ``init``'s ``state`` on rows ``x``: no step run yet.

  For an ``attack`` with a :class:`~jaxrobust._types.Meter`, ``limit`` is the propagations
  allowed for its steps (:func:`limits`), handed to the attack's own state (``meter.cap``).
  """
  if attack is not None and attack.meter is not None:
    if limit is not None:
      state = attack.meter.cap(state, limit)
    limit = None  # the attack stops itself
  # From a slice of x: the counter carries x's batch sharding, and under shard_map x's varying
  # manual axes (a loop carry must keep its type).
  return Metered(state, rows_like(x, 0, jnp.int32), limit)


def tally(attack: Attack, metered: Metered) -> Array:
  """What a metered run reports per row (:func:`spent` reads it): the steps run (``[B]``), or,
  for an attack with a :class:`~jaxrobust._types.Meter`, the ``[B, 2]`` (forward, backward) its
  steps spent."""
  if attack.meter is None:
    return metered.steps
  return jnp.stack([jnp.asarray(c, jnp.int32) for c in attack.meter.spent(metered.state)], -1)


def no_tally(attack: Attack, rows: Array) -> Array:
  """:func:`tally` of rows (``[B]``, any dtype) that ran no step."""
  zeros = jnp.zeros_like(rows, jnp.int32)
  return zeros if attack.meter is None else jnp.stack([zeros, zeros], -1)


def metered_kernel(attack: Attack, freeze: Callable[[Array, Any, Any], Any]) -> Attack:
  """``attack``'s ``step`` and ``done`` on :class:`Metered` states (its ``init`` and
  ``finalize`` are the engine's: :func:`start`, then ``finalize`` of ``state.state``).

  A step counts itself on every row it runs on (the engine freezes, counter included, the rows
  that are done); with a ``limit``, rows that ran their allowed steps are frozen by ``freeze``
  (:func:`jaxrobust.engine.early_exit.freeze`) and are done.
  """

  def step(logits_fn, metered: Metered, x, y, budget, target=None) -> Metered:
    new = attack.step(logits_fn, metered.state, x, y, budget, target)
    capped = exhausted(metered)
    if capped is None:
      return metered._replace(state=new, steps=metered.steps + 1)
    return metered._replace(state=freeze(capped, metered.state, new),
                            steps=metered.steps + (~capped).astype(jnp.int32))

  def done(metered: Metered) -> Array:
    capped = exhausted(metered)
    if attack.done is None:
      return capped
    return attack.done(metered.state) if capped is None else attack.done(metered.state) | capped

  has_done = attack.done is not None
  return attack._replace(step=step, done=done if has_done else None)
