"""The core contract: budgets, attacks, their results and robustness curves.

An attack is a pair of pure functions, in the spirit of ``optax.GradientTransformation``: ``init``
builds a state (the ``lax.scan`` carry) and ``step`` advances it by one iteration. Both receive the
model function ``logits_fn`` and the data on every call; nothing is stored on the attack except
static configuration, fixed when its factory is called. Everything a user sweeps (eps, bounds,
keys) is data, so changing it never recompiles.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
LogitsFn = Callable[[Array], Array]
"""``logits_fn(x [B, ...]) -> logits [B, C]``; examples must be treated independently."""

NORMS = ("linf", "l2", "l1")


class Budget(NamedTuple):
  """The threat model: an eps-ball around each input, intersected with the box.

  Every field is data (traced under ``jit``): ``eps`` is a Python float, a scalar array or a
  per-example ``[B]`` array; ``lower`` and ``upper`` are scalars. The norm is the attack's, fixed
  when the attack is built.

  Attributes:
    eps: radius of the ball, in the units of ``x`` (``8/255`` for Linf on [0, 1] images).
    lower: smallest valid input value.
    upper: largest valid input value.

  Examples:
    >>> import jaxrobust as jr
    >>> jr.Budget(8 / 255)
    Budget(eps=0.03137254901960784, lower=0.0, upper=1.0)
  """

  eps: ArrayLike
  lower: ArrayLike = 0.0
  upper: ArrayLike = 1.0


def as_budget(budget: Any) -> Budget:
  """``budget`` as a :class:`Budget`: a ``Budget`` as is, a tuple or list ``(eps[, lower[,
  upper]])`` converted; anything else (a bare eps, most often) is a ``TypeError`` that shows how
  to write one.

  Examples:
    >>> as_budget((0.1, -1.0, 1.0))
    Budget(eps=0.1, lower=-1.0, upper=1.0)
    >>> as_budget(0.1)
    Traceback (most recent call last):
    ...
    TypeError: budget must be a jr.Budget(eps, lower=0.0, upper=1.0) or a tuple (eps, lower, upper); got float. Write jr.Budget(eps) for inputs in [0, 1].
  """
  if isinstance(budget, Budget):
    return budget
  if isinstance(budget, (tuple, list)) and 1 <= len(budget) <= 3:
    return Budget(*budget)
  raise TypeError("budget must be a jr.Budget(eps, lower=0.0, upper=1.0) or a tuple (eps, lower, "
                  f"upper); got {type(budget).__name__}. Write jr.Budget(eps) for inputs in "
                  "[0, 1].")


class Attack(NamedTuple):
  """A pure, jit-compatible attack: static configuration plus ``init``/``step``/``finalize``.

  ``jr.run`` drives it as::

      state = attack.init(logits_fn, x, y, budget, keys, target)
      state = lax.scan(lambda s, _: (attack.step(logits_fn, s, x, y, budget, target), None),
                       state, None, length=attack.num_steps)[0]
      x_adv = attack.finalize(logits_fn, state, x, y, budget, target)

  ``keys`` holds one PRNG key per example (``[B]``), so an example's randomness does not depend on
  its position in the batch. ``target`` is ``None`` for untargeted attacks. The state keeps one
  pytree type (structure, shapes and dtypes) through every step. The engine moves the state
  row by row (compaction, early exit): every leaf of rank 1 or more is per-row and leads with the
  batch ``B``, except the fields that a state NamedTuple names in a class attribute
  ``shared_fields = ("field", ...)`` (shared by all rows, whatever their shape); scalars (step
  counters) are shared. ``finalize`` returns the best
  point seen (for a fixed-budget attack, the first priority is success, then the loss), inside the
  box and the ball.

  Attributes:
    init: ``(logits_fn, x, y, budget, keys, target) -> state``.
    step: ``(logits_fn, state, x, y, budget, target) -> state``.
    finalize: ``(logits_fn, state, x, y, budget, target) -> x_adv``.
    num_steps: how many times ``step`` runs (a static Python int; 0 is allowed).
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    targeted: whether the attack needs ``target=`` and succeeds when ``argmax == target``.
    minimum_norm: ``True`` for attacks that search for the smallest adversarial perturbation
      (``budget.eps`` is then an optional upper bound and may be ``inf``).
    name: a human-readable description used in reports and error messages.
    drive: optional, superseded by ``suite`` (kept for attacks written against it): a function
      ``(logits_fn, x, y, budget, keys, target, todo, chunk_size) -> (x_adv, info)`` that
      :func:`jaxrobust.run` calls instead of the ``init``/``step`` loop, with ``todo`` (``[B]``
      bool) the rows to attack; ``info`` is a dict of arrays that ends up in
      :attr:`AttackResult.info`.
    samples: ``0`` for a deterministic model ``logits_fn(x)``; ``n > 0`` for an attack on a
      randomized model ``logits_fn(x, keys)`` (see :func:`jaxrobust.attacks.eot`), whose
      prediction is judged over ``n`` draws.
    config: the factory call that built the attack, as a JSON string (``None`` for attacks built
      by hand): ``{"factory": "pgd", "norm": "linf", "steps": 20, ...}`` with every default
      filled in (see :mod:`jaxrobust.attacks._config`); reports record it as the attack's full
      configuration.
    done: optional ``state -> [B] bool``, the rows whose search is over: the state already
      holds a point that ``finalize`` returns as adversarial (untargeted: ``argmax != y``;
      targeted: ``argmax == target``; APGD-T: ``argmax != y``). With early exit (the default of
      :func:`jaxrobust.run` and the curves) the engine freezes such rows (every per-row state
      leaf keeps its value; scalars, such as step counters, advance)
      and leaves the loop once every row is done, so a broken point stops costing model
      evaluations. ``None``: the attack always runs its ``num_steps``. Minimum-norm attacks
      (DeepFool, C&W, FMN, DDN, FAB) declare it for a finite eps (a row holding an adversarial
      point inside the ball: its smallest point can only shrink further), and at ``eps = inf``
      only with ``done_unbounded`` (otherwise the answer keeps shrinking there).
    suite: ``None`` for a single attack (a kernel: ``init``/``step``/``finalize``/``done``);
      for ensembles and AutoAttack a :class:`Suite`, whose members the engine runs one after
      another on the rows the earlier ones left robust (``init`` then runs the suite in one go,
      for a user's own scan; ``num_steps`` is 0).
    meter: optional :class:`Meter`, for a kernel whose ``step`` calls the model a number of
      times that depends on the data (:func:`jaxrobust.attacks.min_norm_search`): it counts its
      steps' propagations per row itself, and takes a per-row allowance for them
      (:mod:`jaxrobust.engine.propagations`). ``None``: the engine measures one step's cost
      while tracing and counts the steps.
    done_unbounded: a minimum-norm attack whose ``done`` may hold at ``eps = inf`` (a row whose
      state no later step changes: DeepFool once its iterate is adversarial), so early exit runs
      there too. ``False``: at ``eps = inf`` the engine runs a minimum-norm attack's plain scan.
  """

  init: Callable[..., Any]
  step: Callable[..., Any]
  finalize: Callable[..., Array]
  num_steps: int
  norm: str
  targeted: bool = False
  minimum_norm: bool = False
  name: str = "attack"
  drive: Optional[Callable[..., Any]] = None
  samples: int = 0
  config: Optional[str] = None
  done: Optional[Callable[[Any], Array]] = None
  suite: Optional["Suite"] = None
  meter: Optional["Meter"] = None
  done_unbounded: bool = False


class Meter(NamedTuple):
  """How a kernel that counts its own steps' propagations reports and caps them
  (:attr:`Attack.meter`; :mod:`jaxrobust.engine.propagations`).

  Attributes:
    spent: ``state -> (forward [B], backward [B])`` int32, the propagations the steps run so far
      spent on each row, or ``None`` where the attack cannot count them (no counts are then
      reported). ``init`` and ``finalize`` must call the model a fixed number of times: the
      engine measures and adds them.
    cap: ``(state, allowance [B] int32) -> state``, the state right after ``init`` with at most
      ``allowance`` propagations left for the steps of each row (frozen with the row's state):
      a row's steps then never spend more, and its ``spent`` stays ``<= allowance``. ``None``:
      the attack cannot be capped (``max_propagations`` is refused).
    counts_init: ``spent`` also covers ``init``'s propagations (for an ``init`` that calls the
      model a data-dependent number of times, e.g. Brendel-Bethge's start by a
      ``min_norm_search``); the engine then measures and adds ``finalize`` only.
  """

  spent: Callable[[Any], Any]
  cap: Optional[Callable[[Any, Array], Any]] = None
  counts_init: bool = False


class Suite(NamedTuple):
  """Attacks run one after another, each on the rows the earlier ones left robust, with checks.

  A point is broken as soon as one member succeeds on it: the per-example worst case over the
  members (:func:`jaxrobust.attacks.ensemble`, :func:`jaxrobust.attacks.auto_attack`). The
  engine runs the members with the run's options (early exit, compaction) and reports
  ``info["robust_after"]`` (``[M, B]``, the rows still robust after members ``1..m``) and the
  suite's checks.

  Attributes:
    members: ``num_classes -> sequence of Attack`` (a suite may choose its members, e.g. its
      number of targets, once the model's class count is known); one norm, one ``targeted``
      setting, one kind of model.
    checks: optional ``(logits_fn, x, y, budget, keys, target, todo, robust_after, members,
      active) -> {name: Check}`` (:class:`jaxrobust.metrics.checks.Check`: a flag and the count
      it is decided from), reported in ``info["flags"]`` and ``info["counts"]``; ``todo`` is the
      rows attacked, ``active`` the rows that are data rather than padding (``None``: all).
    check_input: optional ``x -> None`` raising for inputs a member cannot take, before any
      member is traced (so that the error speaks of the user's whole batch).
  """

  members: Callable[[int], Any]
  checks: Optional[Callable[..., Any]] = None
  check_input: Optional[Callable[[Array], None]] = None


class AttackResult(NamedTuple):
  r"""What ``jr.run`` returns; every field is recomputed from ``x_adv``.

  Attributes:
    x_adv: ``[B, ...]`` adversarial inputs of ``x``'s dtype, finite, inside the box exactly and
      inside the eps-ball (to float32 rounding of ``x + delta``). Points misclassified on the
      clean input get ``x``.
    success: ``[B]`` bool. Untargeted: ``argmax logits(x_adv) != y``; targeted:
      ``argmax == target`` (also on clean-misclassified points, which are returned unchanged).
      Non-finite logits never count as a correct prediction.
    norm: ``[B]`` the attack-norm size of ``x_adv - x`` (``inf`` where a minimum-norm attack found
      no adversarial point; 0 for clean-misclassified points).
    logits: ``[B, C]`` logits on ``x_adv`` (for a randomized model, their mean over the draws).
    info: a dict of extra arrays: ``flags`` (``[]`` bool reliability checks, see
      :func:`jaxrobust.run`) and ``counts`` (the counts behind them) for every attack; ensembles add
      ``robust_after [M, B]``, the per-member breakdown, and AutoAttack its own checks.
      ``propagations`` (``{"forward": [B], "backward": [B]}`` int32): per example, the forward
      and backward propagations through the model the attack spent on it,
      :math:`f_\text{init} + s_i f_\text{step} + f_\text{fin}` for the :math:`s_i` steps row
      :math:`i` ran (0 for rows not attacked; a gradient is one of each; suites sum their
      members; an attack with a :class:`Meter` counts its own steps), independent of batch,
      order and chunking; absent for attacks whose model calls per step depend on the data and
      that do not count them (:mod:`jaxrobust.engine.propagations`).
  """

  x_adv: Array
  success: Array
  norm: Array
  logits: Array
  info: Optional[dict] = None


class Curve(NamedTuple):
  """A robustness curve: robust accuracy as a function of the budget eps.

  Attributes:
    epsilons: ``[K]`` the budgets, as given.
    clean_accuracy: ``[]`` accuracy on the clean inputs.
    robust_accuracy: ``[K]`` fraction of points correct on clean input that no attack broke at
      this eps or any smaller one of the grid; non-increasing in eps.
    robust: ``[K, B]`` the per-example flags behind ``robust_accuracy``.
    auc: ``[]`` area under robust accuracy against eps, starting at ``(0, clean_accuracy)``,
      divided by the largest eps (so a perfectly robust model scores its clean accuracy).
    info: ``None``, or a dict: ``flags`` (``[]`` bool reliability checks over the grid, e.g.
      ``non_finite_gradients`` or AutoAttack's ``zero_gradients``), ``counts`` (the counts
      behind them, ``[K]`` per eps or ``[]``) and, for ensembles and suites, ``robust_after``
      ``[K, M, B]`` (the per-member breakdown); see :func:`jaxrobust.robustness_curve`.
  """

  epsilons: Array
  clean_accuracy: Array
  robust_accuracy: Array
  robust: Array
  auc: Array
  info: Optional[dict] = None


Target = Optional[Array]


class Certificate(NamedTuple):
  r"""A certified prediction per example: the model's (or smoothed model's) prediction provably
  does not change on the ball of ``radius`` around the input.

  Produced by :func:`jaxrobust.certify.smoothing` (L2 radii of the Gaussian-smoothed classifier,
  valid with probability at least :math:`1 - \alpha` over the noise draws) and
  :func:`jaxrobust.certify.certify_bounds` (deterministic radii in the attack norm, from bound
  propagation). :func:`jaxrobust.certify.certified_curve` turns one into a certified robustness
  curve, a lower bound on the true robust accuracy.

  Attributes:
    prediction: ``[B]`` int32 class, or ``-1`` where the certifier abstains (radius 0).
    radius: ``[B]`` float32, in the units of ``x``; 0 where nothing is certified.

  Examples:
    >>> import jax.numpy as jnp
    >>> Certificate(jnp.array([3, -1]), jnp.array([0.25, 0.0])).prediction.tolist()
    [3, -1]
  """

  prediction: Array
  radius: Array
