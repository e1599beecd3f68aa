r"""Any fixed-budget attack as a minimum-norm attack: a per-example search on eps.

A fixed-budget attack :math:`A` answers "is there an adversarial point within :math:`\epsilon`?"
(and returns one). Run at a sequence of :math:`\epsilon` per example, it brackets the minimal
adversarial distance :math:`d^*` (the smallest norm of an adversarial perturbation inside the
box): the search keeps

.. math:: \ell < d^* \le h,

with :math:`\ell` the largest :math:`\epsilon` at which :math:`A` failed (0 at first) and
:math:`h` the norm of the smallest adversarial point found (:math:`\infty` at first); the
right-hand inequality always holds, the left-hand one for a complete :math:`A` (below). Every
search step runs :math:`A` once, in full (its own ``num_steps``), at the example's current
:math:`\epsilon`, then

* on success, :math:`h \leftarrow \min(h, \|x_{adv} - x\|_p)` and that point is kept if it is
  the smallest so far (the point found may lie well inside the ball, so :math:`h` can drop below
  :math:`\epsilon`);
* on failure, :math:`\ell \leftarrow \max(\ell, \epsilon)`,

and chooses the next :math:`\epsilon`:

.. math::
   \epsilon \leftarrow \begin{cases}
     \min(\gamma\,\ell,\ \bar\epsilon) & h = \infty \text{ (growth: nothing found yet)} \\
     h / \gamma & \ell = 0 \text{ (shrinking: nothing has failed yet)} \\
     (\ell + h) / 2 & \text{otherwise (bisection)}
   \end{cases}

from :math:`\epsilon_0 = \min(\epsilon_{init}, \bar\epsilon)`, with :math:`\gamma > 1` the growth
factor and :math:`\bar\epsilon` the cap: ``budget.eps``, ``max_eps`` and the largest norm the
box allows, :math:`\|\max(x - l, u - x)\|_p` (beyond it the ball holds the whole box), whichever
is smallest. An example's search is over once :math:`h \le (1 + r)\,\ell` (``rtol`` :math:`r`)
or :math:`A` failed at :math:`\bar\epsilon`; after that its state no longer changes.

AttackBench's search (Cinà et al. 2025) moves :math:`h` to the :math:`\epsilon` of a success;
here it moves to the norm of the point found, which is never larger and is often smaller (an
attack's point need not lie on the sphere), so the interval shrinks at least as fast.

The upper end is always sound: :math:`h` is the norm of a point verified adversarial by one more
forward pass, so :math:`d^* \le h` for the true minimal distance :math:`d^*`. The lower end is
sound when :math:`A` finds an adversarial point whenever its ball holds one (on a linear model,
PGD and APGD do, up to their convergence: see ``tests/test_min_norm_search.py``); then
:math:`\ell < d^*` and, once the search has stopped within ``search_steps``, the answer lies in
:math:`[d^*, (1 + r)\,d^*)`; an example still searching after ``search_steps`` returns its
current :math:`h`. A weaker
:math:`A` fails above :math:`d^*` and the answer is an overestimate, as any attack's is.

A randomized :math:`A` (a random start, Square's random windows) can fail at an
:math:`\epsilon` where another run would succeed; :math:`\ell` then rises to that
:math:`\epsilon` and the search never returns below it. On a model that masks its gradients this
is common: on the digits k-WTA model of ``benchmarks/bench_optimality.py``, the search of L2
Square on one image returned 0.18 to 0.50 over 8 keys. More independent runs per
:math:`\epsilon` make such a failure rarer: the wrapped attack's ``restarts`` (e.g.
``square(norm, queries=2500, restarts=2)``, the same 5000 queries as two runs, or
``apgd(..., restarts=2)``); see "The k-WTA ensemble gaps" in ``benchmarks/RESULTS.md``.

Each search step draws the inner attack's randomness from the example's key folded with the
step's index, so every run is fresh and the whole search is a deterministic function of the key.
Inside a step the inner attack runs with early exit (:mod:`jaxrobust.engine.early_exit`) on the
examples still searching: an example whose search is over, or on which the inner attack has
already succeeded, stops costing model evaluations (examples are moved together into chunks when
there are more than a chunk's worth); a step in which no example is searching costs nothing.

The search counts what each example's steps spend (:class:`jaxrobust._types.Meter`,
:mod:`jaxrobust.engine.propagations`): at step :math:`k`, on an example still searching, the
inner run's :math:`f_\text{init} + s_k f_\text{step} + f_\text{fin}` forwards (likewise
backwards) for the :math:`s_k` steps it ran before its early exit, and one forward checking its
point; an example not searching adds nothing (its rows may be computed, as padding is, but they
are no example's cost). Under a cap :math:`c` it runs step :math:`k` only while
:math:`c - \text{spent} \ge p_\text{init} + p_\text{fin} + 1`, and that run's steps
:math:`s_k \le \lfloor (c - \text{spent} - p_\text{init} - p_\text{fin} - 1) / p_\text{step}
\rfloor`.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._batch import fold_in, is_success, like_batch, rows_like
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget, Meter
from jaxrobust._validation import check_number, check_positive_int
from jaxrobust.attacks._common import MinNormBest, unpack_budget
from jaxrobust.engine import attack_loop, early_exit, propagations

Array = jax.Array

INIT_EPS = {"linf": 8 / 255, "l2": 0.5, "l1": 12.0}
"""The first eps per norm, for a box of width 1 (multiplied by ``upper - lower``): the common
image budgets (CIFAR-10's Linf 8/255 and L2 0.5, Croce & Hein's L1 12)."""

_TAG = 0x5EA7C  # folded into the per-example keys for the inner attack's runs

# How the inner attack runs inside a search step: early exit (for an attack that declares
# ``done``) in chunks of the backend's default size; no canonical convolutions (the outer run
# makes them canonical); only the rows attacked are scored.
_INNER_OPTIONS = RunOptions(canonical=False, score_skipped_rows=False)


class SearchState(NamedTuple):
  """The ``lax.scan`` carry of :func:`min_norm_search`."""

  lo: Array  # [B] work dtype: the largest eps at which the inner attack failed (0: none).
  best: MinNormBest  # the smallest adversarial point found; best.norm is h (inf: none yet).
  eps: Array  # [B] work dtype: the eps of the next inner run.
  cap: Array  # [B] work dtype: the largest eps the search tries.
  keys: Array  # [B] typed keys, tagged: inner run k uses fold_in(keys, k).
  k: Array  # [] int32: search steps done.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (inf: no bound).
  # [B] int32: the propagations the search steps spent per row (None: the wrapped attack's
  # cost per step cannot be measured, so neither can the search's).
  forward: Array | None = None
  backward: Array | None = None
  allowance: Array | None = None  # [B] int32 propagations the steps may spend (None: no cap)


class _Config(NamedTuple):
  """The static configuration, chosen by :func:`min_norm_search`."""

  inner: Attack
  run: Callable[..., Array]  # the inner attack's init/steps/finalize on rows (see _inner_runner)
  init_eps: float | None  # None: INIT_EPS[norm] * (upper - lower)
  factor: float
  rtol: float
  max_eps: float


def _inner_runner(inner: Attack) -> Callable[..., tuple[Array, Array]]:
  """``(logits_fn, x, y, eps, keys, target, frozen, limit, lower, upper) -> (x_adv, steps)``:
  one full run of ``inner`` on the rows not ``frozen`` (the others' output is unspecified), at
  most ``limit`` steps per row (``[B]`` int32, or ``None``), and the steps each row ran (0 on
  frozen rows), with early exit when it declares ``done``, else one dense scan (skipped when
  every row is frozen)."""
  if inner.done is not None and inner.num_steps > 0:
    def run(logits_fn, x, y, eps, keys, target, frozen, limit, lower, upper):
      x_adv, steps = early_exit.run_until_done(inner, logits_fn, x, y, eps, keys, target, frozen,
                                               limit, lower=lower, upper=upper,
                                               options=_INNER_OPTIONS, meter=True)
      return x_adv, jnp.where(frozen, 0, steps)
  else:
    def run(logits_fn, x, y, eps, keys, target, frozen, limit, lower, upper):
      rows = attack_loop.attack_rows(inner, logits_fn, lower, upper, _INNER_OPTIONS, meter=True)
      x_adv, steps = jax.lax.cond(jnp.any(~frozen), lambda: rows(x, y, eps, keys, target, limit),
                                  lambda: (x, jnp.zeros_like(frozen, jnp.int32)))
      return x_adv, jnp.where(frozen, 0, steps)
  return run


def _inner_costs(config: _Config, logits_fn, x, y, eps, keys, target, lower,
                 upper) -> propagations.Costs | None:
  """What one run of the wrapped attack spends per row (measured while tracing, never run), or
  ``None`` where its calls per step depend on the data."""
  return propagations.measure(config.inner, logits_fn, x, y, Budget(eps, lower, upper), keys,
                              target)


def _searching(config: _Config, state: SearchState) -> Array:
  """``[B]`` bool: the examples whose search goes on (not converged, not failed at the cap)."""
  hi = state.best.norm
  converged = hi <= (1 + config.rtol) * state.lo  # never with lo = 0, unless hi = 0
  exhausted = ~jnp.isfinite(hi) & (state.lo >= state.cap)
  return ~(converged | exhausted)


def _next_eps(config: _Config, lo: Array, hi: Array, cap: Array) -> Array:
  """Growth while nothing is found, shrinking while nothing has failed, then bisection."""
  grow = jnp.minimum(lo * config.factor, cap)
  shrink = jnp.where(lo > 0, (lo + hi) / 2, hi / config.factor)
  return jnp.where(jnp.isfinite(hi), shrink, grow)


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> SearchState:
  x, limit, lower, upper = unpack_budget(x, budget)
  limit = like_batch(limit, x)
  reach = projections.norm(jnp.maximum(x - lower, upper - x), config.inner.norm)
  cap = jnp.minimum(jnp.minimum(limit, jnp.asarray(config.max_eps, x.dtype)), reach)
  if config.init_eps is None:
    first = jnp.asarray(INIT_EPS[config.inner.norm], x.dtype) * (upper - lower)
  else:
    first = jnp.asarray(config.init_eps, x.dtype)
  eps = jnp.minimum(first, cap)
  keys = fold_in(keys, _TAG)
  counted = _inner_costs(config, logits_fn, x, y, eps, keys, target, lower, upper) is not None
  zeros = rows_like(x, 0, jnp.int32) if counted else None
  return SearchState(lo=rows_like(x, 0.0, x.dtype), best=MinNormBest.empty(x),
                     eps=eps, cap=cap, keys=keys, k=jnp.zeros((), jnp.int32), limit=limit,
                     forward=zeros, backward=zeros)


def _afford(costs: propagations.Costs | None, state: SearchState,
            num_steps: int) -> tuple[Array | None, Array | None]:
  """``(affordable, limit)`` under the state's allowance: the rows whose allowance left covers a
  run's ``init`` and ``finalize`` and the check of its point, and the wrapped attack's steps
  each may run (``(None, None)`` without a cap)."""
  if state.allowance is None or costs is None:
    return None, None
  left = state.allowance - state.forward - state.backward - (costs.fixed.total + 1)
  per_step = costs.step.total
  steps = left // per_step if per_step else jnp.full_like(left, num_steps)
  return left >= 0, jnp.clip(steps, 0, num_steps).astype(jnp.int32)


def _search_step(config: _Config, logits_fn, state: SearchState, searching: Array, limit,
                 costs: propagations.Costs | None, x, y, lower, upper, target) -> SearchState:
  """One full inner run at each searching example's eps, then the interval's update."""
  x_run, steps = config.run(logits_fn, x, y, state.eps, fold_in(state.keys, state.k), target,
                            ~searching, limit, lower, upper)
  x_run = jnp.clip(x_run.astype(x.dtype), lower, upper)
  size = projections.norm(x_run - x, config.inner.norm)
  # A non-finite point (or norm) is a failure: it can never become the answer.
  success = searching & is_success(logits_fn(x_run), y, target) & jnp.isfinite(size)
  best = state.best.update(x_run, size, success)
  failed = searching & ~success
  if limit is not None:  # a run the cap cut short proves nothing about its eps
    failed = failed & ~((steps >= limit) & (limit < config.inner.num_steps))
  lo = jnp.where(failed, jnp.maximum(state.lo, state.eps), state.lo)
  eps = jnp.where(searching, _next_eps(config, lo, best.norm, state.cap), state.eps)
  state = state._replace(lo=lo, best=best, eps=eps, k=state.k + 1)
  if state.forward is None:
    return state
  # Per searching row: the run's init, steps and finalize, and one forward for the check.
  count = lambda fixed, per, extra: jnp.where(searching, fixed + steps * per + extra, 0)
  return state._replace(
      forward=state.forward + count(costs.fixed.forward, costs.step.forward, 1),
      backward=state.backward + count(costs.fixed.backward, costs.step.backward, 0))


def _step(config: _Config, logits_fn, state: SearchState, x, y, budget: Budget,
          target=None) -> SearchState:
  x, _, lower, upper = unpack_budget(x, budget)
  costs = None
  if state.forward is not None:
    costs = _inner_costs(config, logits_fn, x, y, state.eps, fold_in(state.keys, state.k),
                         target, lower, upper)
  searching = _searching(config, state)
  affordable, limit = _afford(costs, state, config.inner.num_steps)
  if affordable is not None:  # a row whose allowance cannot pay for a run stops searching
    searching = searching & affordable
  # Once no example is searching, a step costs nothing (the count still advances).
  return jax.lax.cond(
      jnp.any(searching),
      lambda state: _search_step(config, logits_fn, state, searching, limit, costs, x, y, lower,
                                 upper, target),
      lambda state: state._replace(k=state.k + 1), state)


def _spent(state: SearchState) -> tuple[Array, Array] | None:
  """The propagations the search steps spent per row (:class:`jaxrobust._types.Meter`)."""
  return None if state.forward is None else (state.forward, state.backward)


def _cap(state: SearchState, allowance: Array) -> SearchState:
  """The state with ``allowance`` propagations per row for the search steps."""
  return state._replace(allowance=allowance.astype(jnp.int32))


def _finalize(config: _Config, logits_fn, state: SearchState, x, y, budget: Budget,
              target=None) -> Array:
  del config, logits_fn, x, y, budget, target
  return state.best.x  # x itself where nothing was found (MinNormBest.empty)


def _done(state: SearchState) -> Array:
  """Rows that hold an adversarial point while the budget's eps is finite.

  The search never tries an eps above the budget's, so every point it keeps lies in the ball,
  and ``finalize`` returns it or a smaller one: the verdict at this eps is final. At
  ``eps = inf`` no row is ever done (the interval keeps shrinking).
  """
  return jnp.isfinite(state.limit) & jnp.isfinite(state.best.norm)


def min_norm_search(attack: Attack, *, search_steps: int = 20, init_eps: float | None = None,
                    factor: float = 2.0, rtol: float = 0.001,
                    max_eps: float | None = None) -> Attack:
  r"""A fixed-budget attack as a minimum-norm attack: per-example growth, then bisection, on eps.

  For each example, ``search_steps`` times, ``attack`` runs in full at the example's current
  :math:`\epsilon`, and the interval :math:`\ell < d^* \le h` on the minimal adversarial distance
  is updated: a success lowers :math:`h` to the norm of the point found (kept if smallest), a
  failure raises :math:`\ell` to :math:`\epsilon`. The next :math:`\epsilon` is
  :math:`\gamma\ell` while nothing is found (growth, from ``init_eps``), :math:`h/\gamma` while
  nothing has failed, and :math:`(\ell + h)/2` once both ends are known (bisection), never above
  the cap :math:`\bar\epsilon` (the smallest of ``budget.eps``, ``max_eps`` and the largest norm
  the box allows). An example stops once :math:`h \le (1 + r)\,\ell` (``rtol``) or once the
  attack failed at the cap; after that it costs nothing. With an attack that finds an adversarial
  point whenever its ball holds one, :math:`\ell < d^*`, so the norm returned is within
  :math:`1 + r` of :math:`d^*` once the search has stopped (see
  :mod:`jaxrobust.attacks._min_norm_search`). A randomized attack that fails by chance raises
  :math:`\ell` above :math:`d^*` for the rest of the search: give it ``restarts`` where its runs
  vary much (gradient-masking models; see the module docstring). Growth or
  shrinking by :math:`\gamma = 2` takes :math:`\log_2` of the ratio between ``init_eps`` and
  :math:`d^*` steps, and bisection about :math:`\log_2(1/r)` more (10 at ``rtol=0.001``).

  The result is a minimum-norm attack (``minimum_norm=True``): :func:`jaxrobust.run` returns the
  smallest adversarial point found, with its norm as ``result.norm`` (:math:`\epsilon^*`), and
  ``x`` with norm ``inf`` where none was found; :func:`jaxrobust.curve_from_norms` turns the
  norms into a curve (:func:`jaxrobust.robustness_curve` does this for a minimum-norm attack). At
  a finite ``budget.eps`` the search never tries a larger eps, so its verdict there is at least
  the wrapped attack's at that eps; a row holding an adversarial point is then ``done`` (with
  early exit it stops there, and that point, not the smallest, is returned). At ``eps = inf``
  no row is ever done. Each run draws the wrapped attack's randomness from the example's key
  folded with the step's index.

  Cost: up to ``search_steps`` × ``attack.num_steps`` steps of the wrapped attack per example
  (e.g. 20 × 100 forward and backward passes for APGD), plus one forward pass per search step;
  examples whose search is over, or on which a run has already succeeded, stop costing
  (the wrapped attack runs with early exit inside each search step). ``num_steps`` of the
  returned attack is ``search_steps``. :func:`jaxrobust.run` reports what each example really
  spent (``info["propagations"]``): per search step on it, the wrapped attack's ``init`` and
  ``finalize`` and the steps that run took (a gradient step is a forward and a backward), and
  one forward for the check of its point; e.g. a failing PGD run of ``T`` steps costs
  ``T + 2`` forwards and ``T`` backwards. ``max_propagations`` caps that per example: a search
  step runs only while what is left pays a run's ``init``, ``finalize`` and check, and the run
  stops its steps within what is left (a run so cut short that fails does not raise
  :math:`\ell`); a cap at least the uncapped count changes nothing.

  Args:
    attack: a fixed-budget :class:`jaxrobust.Attack` (e.g. ``pgd``, ``apgd``, ``fgsm``,
      ``square``), untargeted or targeted; the search is as targeted as it is (pass ``target=``
      to :func:`jaxrobust.run` for a targeted one).
    search_steps: runs of ``attack`` per example (>= 1); the returned attack's ``num_steps``.
    init_eps: the first eps (> 0). ``None``: per norm, the common image budgets times the box
      width ``upper - lower``: Linf 8/255, L2 0.5, L1 12 (:data:`INIT_EPS`).
    factor: the growth and shrinking factor :math:`\gamma > 1`.
    rtol: the relative width :math:`r > 0` at which an example's search stops.
    max_eps: an upper bound on the eps tried (> 0) when ``budget.eps`` is larger or ``inf``;
      ``None``: no bound but the box's (the largest norm the box allows around the example).

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True``, the wrapped attack's norm and
    ``targeted``, and ``num_steps = search_steps``.

  Raises:
    TypeError: ``attack`` is not a :class:`jaxrobust.Attack`.
    ValueError: ``attack`` is already a minimum-norm attack, a suite (``ensemble``,
      ``auto_attack``) or an attack on a randomized model (``eot``); an option out of range.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # Linf distance to the boundary: 0.1
    >>> attack = jr.attacks.min_norm_search(jr.attacks.pgd("linf", steps=10))
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), bool(0.1 <= float(result.norm[0]) <= 0.1 * 1.01)
    (True, True)
    >>> bool(run(0.09).success[0])  # eps caps the search, and no point within 0.09 is adversarial
    False

  References:
    Cinà et al., "AttackBench: Evaluating Gradient-based Attacks for Adversarial Examples",
    AAAI 2025, arXiv:2404.19460 (fixed-budget attacks compared as minimum-norm ones through a
    per-sample search on eps: doubling, then bisection).
    Carlini & Wagner, "Towards Evaluating the Robustness of Neural Networks", IEEE Symposium on
    Security and Privacy 2017 (a per-example binary search over an attack's parameter).
  """
  if not isinstance(attack, Attack):
    raise TypeError(f"min_norm_search() wraps a jr.Attack, got {type(attack).__name__}.")
  if attack.minimum_norm:
    raise ValueError(f"{attack.name} is already a minimum-norm attack: run it directly; "
                     "min_norm_search() takes a fixed-budget attack (pgd, apgd, fgsm, square).")
  if attack.suite is not None or attack.drive is not None:
    raise ValueError(f"min_norm_search() cannot wrap the suite {attack.name!r}: wrap a single "
                     "fixed-budget attack (e.g. jr.attacks.apgd).")
  if attack.samples:
    raise ValueError(f"{attack.name} attacks a randomized logits_fn(x, keys) (jr.attacks.eot), "
                     "which min_norm_search() does not support.")
  search_steps = check_positive_int("search_steps", search_steps)
  if init_eps is not None:
    init_eps = check_number("init_eps", init_eps, low=0.0, low_open=True)
  factor = check_number("factor", factor, low=1.0, low_open=True)
  rtol = check_number("rtol", rtol, low=0.0, low_open=True)
  if max_eps is not None:
    max_eps = check_number("max_eps", max_eps, low=0.0, low_open=True)
  config = _Config(inner=attack, run=_inner_runner(attack), init_eps=init_eps, factor=factor,
                   rtol=rtol, max_eps=float("inf") if max_eps is None else max_eps)
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=search_steps,
                norm=attack.norm, targeted=attack.targeted, minimum_norm=True,
                name=f"min-norm-search-{search_steps}({attack.name})", done=_done,
                meter=Meter(spent=_spent, cap=_cap))
