r"""Mergeable reducers: exact sums over examples, combined across batches, devices and hosts.

Every reducer here is a NamedTuple of sums (in the spirit of ``clu.metrics``) with one interface:

* ``empty(...)`` -- the identity of ``merge`` (strong dtypes: int32 counts, float32 sums, so a
  jitted merge compiles once);
* ``from_*(...)`` -- the sums of one batch, with an optional ``mask [B]`` for padded rows;
* ``merge(other)`` -- elementwise addition (associative and commutative; exact for counts);
* ``psum(axis_name)`` -- the sum over a mapped axis inside :func:`jax.shard_map` or ``vmap``;
* ``to_host()`` -- NumPy copies in int64 / float64, so that host-side merges over a whole data
  set never overflow (a device int32 count of one batch is exact; a sum over billions is not);
* ``compute(...)`` -- the metrics, as ratios of the sums.

:class:`CurveCounts` is the reducer of robustness curves: :func:`jaxrobust.evaluate` sums one
per attack (and one for the per-example worst case) and :class:`jaxrobust.Report` computes its
curves from them; :class:`NormHistogram` is the same counts built from minimal adversarial norms;
:class:`Counts` holds the sums behind the prediction metrics of :mod:`jaxrobust.metrics`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import projections
from jaxrobust._validation import check_min_norms, check_positive_int, check_values
from jaxrobust.metrics.conventions import (NO_PREDICTION, array_namespace, as_predictions,
                                           count_true, int_like, masked_sum, matches, ratio,
                                           row_mask)
from jaxrobust.metrics.formulas import perturbation_sizes, success_flags, trapezoid_auc

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def _zero_int() -> Array:
  return jnp.zeros((), jnp.int32)


def _zero_float() -> Array:
  return jnp.zeros((), jnp.float32)


def _add(a, b):
  """``a + b`` in the namespace of both: NumPy for two host arrays (int64 stays int64), else JAX."""
  return array_namespace(a, b).add(a, b)


def _on_host(a) -> np.ndarray:
  a = np.asarray(a)
  if a.dtype.kind in "iub":
    return a.astype(np.int64)
  return a.astype(np.float64)


def _check_same_shapes(a, b) -> None:
  """Raises unless ``a`` and ``b`` have the same tree structure and every leaf the same shape
  (static, so it runs while tracing); names the first field that differs."""
  leaves_a, structure_a = jax.tree_util.tree_flatten_with_path(a)
  leaves_b, structure_b = jax.tree.flatten(b)
  kind = type(a).__name__
  if structure_a != structure_b:
    raise ValueError(f"Cannot merge two {kind} of different structure (e.g. other attacks or "
                     f"certifiers): {structure_a} and {structure_b}.")
  for (path, left), right in zip(leaves_a, leaves_b):
    if np.shape(left) != np.shape(right):
      raise ValueError(f"Cannot merge two {kind} whose fields differ in shape: "
                       f"{jax.tree_util.keystr(path)} has shape {np.shape(left)} in this one and "
                       f"{np.shape(right)} in the other (sums are added, never broadcast)."
                       f"{getattr(a, '_MERGE_HINT', '')}")


def _robust_above(norms: ArrayLike, correct: ArrayLike, grid: ArrayLike, mask: Optional[ArrayLike],
                  grid_name: str, grid_size: str) -> Array:
  """``[K, B]`` flags ``norms_i > grid_k``, after the checks :meth:`CurveCounts.from_norms` and
  :meth:`NormHistogram.from_batch` share: shapes (static), then concrete values (the grid >= 0,
  the norms of the rows in ``mask`` >= 0, none NaN; ``inf`` is allowed in both)."""
  norms, grid = jnp.asarray(norms, jnp.float32), jnp.asarray(grid, jnp.float32)
  if norms.ndim != 1 or np.shape(correct) != norms.shape or grid.ndim != 1:
    raise ValueError(f"norms and correct must both be [B] (one entry per example) and {grid_name} "
                     f"[{grid_size}]; got norms {norms.shape}, correct {np.shape(correct)}, "
                     f"{grid_name} {grid.shape}.")
  check_values(grid_name, grid, low=0.0)
  check_min_norms(norms, row_mask(mask, norms.shape[0]))
  return norms[None, :] > grid[:, None]


def psum(counts, axis_name: str):
  """Sums a reducer (:class:`Counts`, :class:`CurveCounts`, :class:`Rate`, ...) over a named
  mapped axis: ``jax.lax.psum`` on every field, the same as ``reducer.psum(axis_name)``.

  ``psum(c, a).field = sum over the devices (or vmapped rows) along a of c.field``. Use inside
  ``jax.shard_map`` (or ``jax.vmap(..., axis_name=...)``) to combine per-shard counts.

  Args:
    counts: the per-shard reducer (any pytree of arrays; the name is API.md's).
    axis_name: the mapped axis to reduce over.

  Returns:
    The total, identical on every shard.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> pred, y = jnp.array([[0, 1], [2, 2]]), jnp.array([[0, 1], [2, 3]])
    >>> per_row = lambda p, t: metrics.psum(metrics.Counts.from_batch(p, p, t), "rows")
    >>> jax.vmap(per_row, axis_name="rows")(pred, y).clean_correct.tolist()
    [3, 3]
  """
  return jax.tree.map(lambda v: jax.lax.psum(v, axis_name), counts)


class Reducer:
  """The methods every reducer shares; mixed into a NamedTuple of sums (see the module)."""

  __slots__ = ()

  def merge(self, other):
    """Elementwise sum of two reducers of the same kind (associative and commutative).

    ``merge(a, b).f = a.f + b.f`` for every field ``f``, which must have the same shape in both:
    sums are never broadcast, so a grouped ``[G]`` rate does not absorb an ungrouped ``[]`` one
    and curves over different eps grids do not mix. Shapes are static, so the check also runs
    while ``jit`` traces. Host reducers (:meth:`to_host`) merge in NumPy int64; device reducers
    in JAX.

    Raises:
      TypeError: for reducers of different kinds.
      ValueError: when the two differ in structure or in the shape of a field (the message names
        the field and both shapes).

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> a = metrics.Counts.from_batch(jnp.array([0, 1]), jnp.array([0, 0]), jnp.array([0, 1]))
      >>> int(a.merge(a).clean_correct), int(a.merge(metrics.Counts.empty()).clean_correct)
      (4, 2)
      >>> metrics.CurveCounts.empty(2).merge(metrics.CurveCounts.empty(3))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: ... .robust has shape (2,) in this one and (3,) in the other (sums are added, ...
    """
    if type(self) is not type(other):
      raise TypeError(f"Cannot merge a {type(self).__name__} with a {type(other).__name__}.")
    _check_same_shapes(self, other)
    return jax.tree.map(_add, self, other)

  def psum(self, axis_name):
    """The sum over a named mapped axis (``jax.lax.psum`` of every field), the same on every
    shard; for use inside :func:`jax.shard_map` (or ``jax.vmap(..., axis_name=...)``). The
    same as :func:`jaxrobust.metrics.psum` (``psum(self, axis_name)``)."""
    return psum(self, axis_name)

  def to_host(self):
    """A NumPy copy with int64 counts and float64 sums, for exact host-side merging.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> c = metrics.CurveCounts.from_flags(jnp.array([[True, False]]), jnp.array([True, True]))
      >>> c.to_host().robust.dtype.name, int(c.to_host().merge(c.to_host()).n)
      ('int64', 4)
    """
    return jax.tree.map(_on_host, self)


class _CountsSums(NamedTuple):
  n: Array  # [] int32, examples
  clean_correct: Array  # [] int32
  robust: Array  # [] int32
  success: Array  # [] int32
  success_clean_correct: Array  # [] int32
  flipped: Array  # [] int32
  nonfinite: Array  # [] int32
  rel_perturbation_sum: Array  # [] float32
  success_perturbation_sum: Array  # [] float32


class Counts(_CountsSums, Reducer):
  """Sums behind the streaming metrics; a pytree of scalar arrays with fixed (strong) dtypes.

  Counts are int32 and sums of norms are float32, whatever the inputs, so a jitted
  :meth:`merge` compiles once. Only examples with ``mask == True`` are counted. Merging is
  elementwise addition: associative, commutative, with :meth:`empty` as identity (float sums up to
  float32 rounding).

  ``adversarial_accuracy`` needs no field of its own: on clean-correct examples
  ``pred_adv == pred_clean`` is the same as ``pred_adv == y``, so its numerator is ``robust``.

  Attributes:
    n: number of examples.
    clean_correct: examples with ``pred_clean == y``.
    robust: examples with ``pred_clean == y`` and ``pred_adv == y``.
    success: attack successes (``pred_adv != y``; ``pred_adv == target`` if targeted).
    success_clean_correct: successes among clean-correct examples.
    flipped: examples with ``pred_adv != pred_clean``.
    nonfinite: diagnostic, examples with no prediction (``-1``) on the clean or adversarial input.
    rel_perturbation_sum: sum over flipped examples of ``||x_adv - x|| / ||x||`` (float32).
    success_perturbation_sum: sum over successful examples of ``||x_adv - x||`` (float32).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> y = jnp.array([0, 1, 2, 3])
    >>> c = metrics.Counts.empty()
    >>> c = c.update(jnp.array([0, 1]), jnp.array([0, 0]), y[:2])
    >>> c = c.update(jnp.array([2, 0]), jnp.array([2, 0]), y[2:])
    >>> int(c.n), int(c.clean_correct), int(c.robust)
    (4, 3, 2)
    >>> float(c.compute()["conditional_robust_accuracy"])
    0.6666666865348816
  """

  __slots__ = ()

  @classmethod
  def empty(cls) -> Counts:
    """All-zero counts (int32) and sums (float32): the identity of :meth:`merge`.

    Returns:
      A :class:`Counts` of zeros.

    Examples:
      >>> from jaxrobust import metrics
      >>> int(metrics.Counts.empty().n)
      0
    """
    return cls(
      n=_zero_int(),
      clean_correct=_zero_int(),
      robust=_zero_int(),
      success=_zero_int(),
      success_clean_correct=_zero_int(),
      flipped=_zero_int(),
      nonfinite=_zero_int(),
      rel_perturbation_sum=_zero_float(),
      success_perturbation_sum=_zero_float(),
    )

  @classmethod
  def from_batch(
    cls,
    pred_clean: ArrayLike,
    pred_adv: ArrayLike,
    y: ArrayLike,
    *,
    x: Optional[ArrayLike] = None,
    x_adv: Optional[ArrayLike] = None,
    norm: Optional[str] = None,
    target: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
  ) -> Counts:
    """The counts of one batch.

    Each field is ``sum_i m_i`` of its per-example quantity (see the class attributes). The
    perturbation sums need ``x``, ``x_adv`` and ``norm``; without ``x`` and ``x_adv`` they are 0
    (so ``empirical_robustness`` and ``mean_perturbation`` from :meth:`compute` are then
    meaningless, 0 or NaN). A flipped example with ``x = 0`` and a nonzero perturbation adds
    ``inf`` to ``rel_perturbation_sum``, as in :func:`empirical_robustness`.

    Args:
      pred_clean: ``[B]`` int predictions on the clean inputs (``-1`` = no prediction).
      pred_adv: ``[B]`` int predictions on the adversarial inputs.
      y: ``[B]`` int labels.
      x: optional ``[B, ...]`` clean inputs.
      x_adv: optional ``[B, ...]`` adversarial inputs (given together with ``x``).
      norm: ``"linf"``, ``"l2"`` or ``"l1"`` (static); required with ``x``.
      target: optional ``[B]`` int targets; success is then ``pred_adv == target``.
      mask: optional ``[B]`` bool; ``False`` excludes an example.

    Returns:
      A :class:`Counts`.

    Raises:
      ValueError: if only one of ``x``, ``x_adv`` is given, or ``norm`` is missing or unknown.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> c = metrics.Counts.from_batch(jnp.array([0, 1, 2]), jnp.array([0, 0, -1]),
      ...                               jnp.array([0, 1, 1]), mask=jnp.array([True, True, False]))
      >>> int(c.n), int(c.success), int(c.nonfinite)
      (2, 1, 0)
    """
    pc = as_predictions(pred_clean, "pred_clean")
    pa = int_like(pred_adv, pc, "pred_adv")
    y = int_like(y, pc, "y")
    t = None if target is None else int_like(target, pc, "target")
    m = row_mask(mask, pc.shape[0])
    clean = matches(pc, y) & m
    success = success_flags(pa, y, t) & m
    flipped = (pa != pc) & m
    if (x is None) != (x_adv is None):
      raise ValueError("x and x_adv must be given together.")
    if x is None:
      rel_sum, size_sum = _zero_float(), _zero_float()
    else:
      if norm is None:
        raise ValueError(f"norm is required with x and x_adv; one of {projections.NORMS}.")
      size, rel = perturbation_sizes(x, x_adv, norm, pc.shape[0])
      rel_sum, size_sum = masked_sum(flipped, rel), masked_sum(success, size)
    return cls(
      n=count_true(m),
      clean_correct=count_true(clean),
      robust=count_true(clean & matches(pa, y)),
      success=count_true(success),
      success_clean_correct=count_true(success & clean),
      flipped=count_true(flipped),
      nonfinite=count_true(((pc == NO_PREDICTION) | (pa == NO_PREDICTION)) & m),
      rel_perturbation_sum=rel_sum,
      success_perturbation_sum=size_sum,
    )

  def update(
    self,
    pred_clean: ArrayLike,
    pred_adv: ArrayLike,
    y: ArrayLike,
    *,
    x: Optional[ArrayLike] = None,
    x_adv: Optional[ArrayLike] = None,
    norm: Optional[str] = None,
    target: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
  ) -> Counts:
    """Adds one batch: ``self.merge(Counts.from_batch(...))`` (same arguments).

    Args:
      pred_clean: ``[B]`` int predictions on the clean inputs.
      pred_adv: ``[B]`` int predictions on the adversarial inputs.
      y: ``[B]`` int labels.
      x: optional ``[B, ...]`` clean inputs.
      x_adv: optional ``[B, ...]`` adversarial inputs.
      norm: ``"linf"``, ``"l2"`` or ``"l1"``; required with ``x``.
      target: optional ``[B]`` int targets.
      mask: optional ``[B]`` bool.

    Returns:
      The merged :class:`Counts`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> c = metrics.Counts.empty().update(jnp.array([1]), jnp.array([1]), jnp.array([1]))
      >>> int(c.robust)
      1
    """
    return self.merge(
      Counts.from_batch(
        pred_clean, pred_adv, y, x=x, x_adv=x_adv, norm=norm, target=target, mask=mask
      )
    )

  def compute(self) -> dict[str, Array]:
    """The metrics, as float32 scalars (NaN where the denominator is 0).

    Keys: ``accuracy`` = clean_correct / n; ``robust_accuracy`` = robust / n;
    ``conditional_robust_accuracy`` and ``adversarial_accuracy`` = robust / clean_correct;
    ``attack_success_rate`` = success / n; ``attack_success_rate_clean_correct`` =
    success_clean_correct / clean_correct; ``empirical_robustness`` = rel_perturbation_sum /
    flipped; ``mean_perturbation`` = success_perturbation_sum / success. Device counts give
    JAX scalars; host counts (:meth:`to_host`, int64) give NumPy ones, computed without passing
    through int32.

    Returns:
      A dict from metric name to float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> d = metrics.Counts.empty().compute()
      >>> sorted(d)[:2], bool(jnp.isnan(d["accuracy"]))
      (['accuracy', 'adversarial_accuracy'], True)
    """
    return {
      "accuracy": ratio(self.clean_correct, self.n),
      "robust_accuracy": ratio(self.robust, self.n),
      "conditional_robust_accuracy": ratio(self.robust, self.clean_correct),
      "adversarial_accuracy": ratio(self.robust, self.clean_correct),
      "attack_success_rate": ratio(self.success, self.n),
      "attack_success_rate_clean_correct": ratio(self.success_clean_correct, self.clean_correct),
      "empirical_robustness": ratio(self.rel_perturbation_sum, self.flipped),
      "mean_perturbation": ratio(self.success_perturbation_sum, self.success),
    }


class _CurveSums(NamedTuple):
  n: Array  # [] int32, examples
  correct: Array  # [] int32, clean-correct examples
  robust: Array  # [K] int32, examples robust at eps_k


class CurveCounts(_CurveSums, Reducer):
  r"""The sums behind a robustness curve: examples, clean-correct ones, and robust ones per eps.

  Over the examples seen (valid rows only) and the eps grid :math:`\epsilon_1..\epsilon_K`:
  ``n`` :math:`= \sum_i m_i`, ``correct`` :math:`= \sum_i m_i [\hat y(x_i) = y_i]` and
  ``robust[k]`` :math:`= \sum_i m_i\, r_{k,i}`, where :math:`r_{k,i}` says example :math:`i` is
  robust at :math:`\epsilon_k` (clean-correct and not broken at any eps up to it). The curve is
  ``robust / n`` whatever the batching; sums are exact integers, so the result does not depend on
  batch size, order, padding or device count.

  Attributes:
    n: ``[]`` int32 examples.
    correct: ``[]`` int32 clean-correct examples.
    robust: ``[K]`` int32 examples robust at each eps.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> robust = jnp.array([[True, True, False], [True, False, False]])  # [K=2, B=3]
    >>> c = metrics.CurveCounts.from_flags(robust, jnp.array([True, True, False]))
    >>> c = c.merge(metrics.CurveCounts.from_norms(jnp.array([0.15]), jnp.array([True]),
    ...                                            jnp.array([0.1, 0.2])))
    >>> int(c.n), int(c.correct), c.robust.tolist()
    (4, 3, [3, 1])
    >>> c.compute(jnp.array([0.1, 0.2]))["robust_accuracy"].tolist()
    [0.75, 0.25]
  """

  __slots__ = ()

  @classmethod
  def empty(cls, num_eps: int) -> CurveCounts:
    """Zero counts over ``num_eps`` budgets: the identity of :meth:`merge`.

    Raises:
      ValueError: ``num_eps`` not an int >= 0 (a bool or a float is refused, not rounded).
    """
    num_eps = check_positive_int("num_eps", num_eps, minimum=0)
    return cls(_zero_int(), _zero_int(), jnp.zeros((num_eps,), jnp.int32))

  @classmethod
  def from_flags(cls, robust: ArrayLike, correct: ArrayLike,
                 mask: Optional[ArrayLike] = None) -> CurveCounts:
    """The counts of one batch from per-example flags.

    Args:
      robust: ``[K, B]`` bool, example robust at eps_k (a :class:`jaxrobust.Curve`'s ``robust``);
        only clean-correct examples count as robust.
      correct: ``[B]`` bool, clean prediction correct.
      mask: optional ``[B]`` bool; ``False`` rows (padding) are not counted.

    Raises:
      ValueError: ``robust`` not ``[K, B]`` with the ``B`` of ``correct`` and ``mask`` (``[B]``).
    """
    correct, robust = jnp.asarray(correct, bool), jnp.asarray(robust, bool)
    if correct.ndim != 1 or robust.ndim != 2 or robust.shape[1] != correct.shape[0]:
      raise ValueError(f"robust must be [K, B] and correct [B] (one entry per example); got "
                       f"robust {robust.shape}, correct {correct.shape}.")
    keep = row_mask(mask, correct.shape[0])
    good = keep & correct
    robust = robust & good[None, :]
    return cls(count_true(keep), count_true(good), jnp.sum(robust, axis=1, dtype=jnp.int32))

  @classmethod
  def from_norms(cls, norms: ArrayLike, correct: ArrayLike, epsilons: ArrayLike,
                 mask: Optional[ArrayLike] = None) -> CurveCounts:
    r"""The counts of one batch from minimal adversarial norms :math:`\epsilon^*` (``inf``
    where none was found): an example is robust at eps iff it is clean-correct and
    :math:`\epsilon^* > \epsilon`.

    Args:
      norms: ``[B]`` minimal adversarial norms, each ``>= 0`` (``inf`` where none was found).
      correct: ``[B]`` bool, clean prediction correct.
      epsilons: ``[K]`` budgets, each ``>= 0`` (``inf`` allowed).
      mask: optional ``[B]`` bool; ``False`` rows (padding, which may hold anything, even NaN)
        are not counted.

    Raises:
      ValueError: ``norms``, ``correct`` or ``mask`` not ``[B]``, or ``epsilons`` not ``[K]``;
        and, for concrete values (not under ``jax.jit``), a NaN or negative eps, or a NaN or
        negative norm in a row of ``mask``.
    """
    return cls.from_flags(_robust_above(norms, correct, epsilons, mask, "epsilons", "K"), correct,
                          mask)

  def compute(self, epsilons: ArrayLike) -> dict[str, Array]:
    """``clean_accuracy`` ``[]``, ``robust_accuracy`` ``[K]`` (float32, NaN when ``n == 0``) and
    ``auc`` (:func:`jaxrobust.metrics.curve_auc`). A host reducer (:meth:`to_host`) computes
    in NumPy, its AUC included (the same formula in float32; it agrees with the device value
    to float32 rounding), so counts past :math:`2^{31}` never pass through int32.

    Examples:
      >>> import numpy as np
      >>> from jaxrobust import metrics
      >>> big = metrics.CurveCounts(np.int64(4_000_000_000), np.int64(3_000_000_000),
      ...                           np.array([2_000_000_000, 1_000_000_000]))
      >>> out = big.compute(np.array([0.1, 0.2]))
      >>> float(out["clean_accuracy"]), out["robust_accuracy"].tolist(), float(out["auc"])
      (0.75, [0.5, 0.25], 0.5)
    """
    xp = array_namespace(*self)  # NumPy for host sums: int64 counts never pass through int32
    clean = ratio(self.correct, self.n)
    robust = ratio(self.robust, self.n)
    auc = trapezoid_auc(xp.asarray(epsilons, xp.float32), robust, clean)
    return {"clean_accuracy": clean, "robust_accuracy": robust, "auc": xp.asarray(auc)}


class NormHistogram(CurveCounts):
  r"""A streaming, mergeable fixed-bin histogram of minimal adversarial norms :math:`\epsilon^*`.

  For ascending bin edges :math:`e_0 < \dots < e_{E-1}` (given to every call, never stored, so
  :func:`psum` and :meth:`merge` only add counts) it keeps, over the examples seen,

  * ``n``: examples; ``correct``: clean-correct examples;
  * ``above[k]``: clean-correct examples with :math:`\epsilon^* > e_k`, i.e. still robust at
    :math:`\epsilon = e_k`.

  So the robustness curve at the edges is exactly ``above / n`` whatever the batching, and the
  histogram of :math:`\epsilon^*` over clean-correct points follows by differences
  (:meth:`compute`). Merging is integer addition: associative and exact.

  Examples:
    >>> import jax.numpy as jnp
    >>> edges = jnp.array([0.0, 0.1, 0.2])
    >>> h = NormHistogram.from_batch(jnp.array([0.05, 0.15, jnp.inf]), jnp.array([True] * 3), edges)
    >>> h = h.merge(NormHistogram.from_batch(jnp.array([0.0]), jnp.array([False]), edges))
    >>> h.compute(edges)["robust_accuracy"].tolist()
    [0.75, 0.5, 0.25]
  """

  __slots__ = ()

  @property
  def above(self) -> Array:
    r"""``[E]`` int32 clean-correct examples with :math:`\epsilon^* > e_k` (``robust``)."""
    return self.robust

  @classmethod
  def empty(cls, num_edges: int) -> NormHistogram:
    """Zero counts for ``num_edges`` edges: the identity of :meth:`merge`.

    Raises:
      ValueError: ``num_edges`` not an int >= 0 (a bool or a float is refused, not rounded).
    """
    num_edges = check_positive_int("num_edges", num_edges, minimum=0)
    return cls(*CurveCounts.empty(num_edges))

  @classmethod
  def from_batch(cls, norms: ArrayLike, correct: ArrayLike, edges: ArrayLike,
                 mask: Optional[ArrayLike] = None) -> NormHistogram:
    """Counts of one batch (:meth:`CurveCounts.from_norms` at ``eps = edges``).

    Args:
      norms: ``[B]`` minimal adversarial norms (``inf`` where none was found).
      correct: ``[B]`` bool, clean prediction correct.
      edges: ``[E]`` bin edges (the eps grid of the curve), each ``>= 0`` (``inf`` allowed).
      mask: optional ``[B]`` bool for padded batches (rows under ``False`` may hold anything).

    Raises:
      ValueError: as :meth:`CurveCounts.from_norms`, naming ``edges``.
    """
    return cls.from_flags(_robust_above(norms, correct, edges, mask, "edges", "E"), correct, mask)

  def compute(self, edges: ArrayLike) -> dict[str, Array]:
    """The curve at the edges and the histogram of :math:`\\epsilon^*` over clean-correct points.

    Returns:
      ``clean_accuracy`` ``[]``; ``robust_accuracy`` ``[E]`` (at ``eps = edges``);
      ``histogram`` ``[E + 1]``: clean-correct examples with :math:`\\epsilon^* \\le e_0`, in
      :math:`(e_{k-1}, e_k]`, and above :math:`e_{E-1}` (the last bin includes ``inf``); ``auc``.
      Ratios are NaN when ``n == 0``.
    """
    xp = array_namespace(*self)  # host sums stay int64 (counts past 2**31)
    above = xp.asarray(self.above)
    at_or_below = xp.concatenate([xp.asarray(self.correct, above.dtype)[None], above])
    histogram = xp.concatenate([at_or_below[:-1] - at_or_below[1:], at_or_below[-1:]])
    return {**CurveCounts(*self).compute(edges), "histogram": histogram}
