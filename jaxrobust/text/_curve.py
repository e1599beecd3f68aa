r"""Robust accuracy over word-swap budgets, from one run of :func:`jaxrobust.text.run`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._batch import is_correct
from jaxrobust._types import Curve
from jaxrobust._validation import check_label_shape, check_labels, is_concrete
from jaxrobust.metrics import curve_auc
from jaxrobust.text._types import Result, TextFoolerResult

Array = jax.Array


def swap_curve(result: Result, y: Array, budgets: Array) -> Curve:
  r"""Robust accuracy at each swap budget, as a :class:`jaxrobust.Curve`.

  .. math:: \mathrm{robust}_{k,i} = [\hat y(x^0_i) = y_i] \,
     \big(1 - [\hat y(x^{adv}_i) \ne y_i] \, [s_i \le k]\big), \qquad
     \mathrm{robust\_accuracy}_k = \frac1N \sum_i \mathrm{robust}_{k,i},

  with :math:`s_i` = ``result.swaps`` and :math:`\hat y(x^{adv})` re-read from
  ``result.logits``: a point is robust at budget :math:`k` when it is correct on the clean text
  and the attack did not break it with at most :math:`k` swaps. The clean prediction is recovered
  exactly from the result: ``run`` returns clean-misclassified points unchanged (``swaps = 0``,
  misclassified), and a point it changed was correct on the clean text.

  One run gives the whole curve: :func:`jaxrobust.text.run` returns each point's first success
  and its search path does not depend on ``max_swaps``, so a point broken with :math:`s` swaps in
  a run at ``max_swaps = steps`` is broken by no run at a budget :math:`k < s`, and a point a
  run at budget :math:`k` breaks, the long run breaks with the same text. The curve is therefore
  never weaker than separate runs at each budget, and equals them unless a word-swap path lowered
  its swap count by a revisit (through more than :math:`k` swaps to a success with at most
  :math:`k`, where the run at :math:`k` stopped: the curve counts that genuine :math:`k`-swap
  adversarial text as broken; TextFooler never revisits), provided no point the
  run did not break was searched (``max_swaps``) below a budget: its verdict there is unknown, and
  calling it robust would overestimate robust accuracy. With concrete inputs that raises; inside
  ``jit``, where they are traced and nothing can raise, the robust accuracy at such a budget is
  NaN (and so the AUC). A broken point is known at every budget (``robust`` holds what the run
  saw).

  Args:
    result: from :func:`jaxrobust.text.run` or :func:`jaxrobust.text.run_textfooler`.
    y: ``[B]`` the labels given to ``run``.
    budgets: ``[K]`` non-negative int swap budgets (data).

  Returns:
    A :class:`jaxrobust.Curve` with ``epsilons`` the budgets as float32, ``robust [K, B]`` and
    ``auc`` the area under robust accuracy over ``[0, max budget]`` normalised by the largest
    budget (see :func:`jaxrobust.metrics.curve_auc`); NaN at a budget above the ``max_swaps`` of
    a point the run did not break (traced inputs only: concrete ones raise).

  Raises:
    ValueError: ``budgets`` not a 1-D int array, negative, or (concrete) larger than the
      ``max_swaps`` of a point the run did not break; ``y`` not ``[B]`` int labels matching the result's batch, out of
      ``[0, C)``, or (concrete) not the labels given to ``run`` (a point the run broke is
      classified as ``y``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import text
    >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [0.0, 1.0], [3.0, 0.0]])  # on tokens_adv
    >>> result = text.Result(tokens_adv=jnp.zeros((4, 3), jnp.int32),
    ...                      success=jnp.array([False, True, True, False]),
    ...                      swaps=jnp.array([1, 0, 2, 0], jnp.int32), logits=logits,
    ...                      queries=jnp.ones(4, jnp.int32), max_swaps=jnp.full(4, 3, jnp.int32))
    >>> curve = text.swap_curve(result, jnp.array([0, 0, 0, 0]), jnp.array([0, 1, 2, 3]))
    >>> float(curve.clean_accuracy), curve.robust_accuracy.tolist()
    (0.75, [0.75, 0.75, 0.5, 0.5])

  References:
    J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
    adversarial training in NLP. EMNLP 2020 (demos) -- robust accuracy under a word budget.
  """
  budgets = _check(result, y, budgets)
  _refuse_unsearched(result, y, budgets)
  broken = ~is_correct(result.logits, y)  # re-predicts the returned tokens
  correct = ~(broken & (result.swaps == 0))
  within = result.swaps[None, :] <= budgets[:, None]
  robust = correct[None, :] & ~(broken[None, :] & within)
  clean = jnp.mean(correct.astype(jnp.float32))
  accuracy = jnp.mean(robust.astype(jnp.float32), axis=1)
  if result.max_swaps is not None:  # traced: a row the run never searched that far is unknown
    unknown = robust & (result.max_swaps[None, :] < budgets[:, None])
    accuracy = jnp.where(jnp.any(unknown, axis=1), jnp.nan, accuracy)
  epsilons = budgets.astype(jnp.float32)
  return Curve(epsilons=epsilons, clean_accuracy=clean, robust_accuracy=accuracy, robust=robust,
               auc=curve_auc(epsilons, accuracy, clean))


def _check(result: Result, y: Array, budgets: Array) -> Array:
  """Validates the inputs of :func:`swap_curve`; returns the budgets as an int32 array."""
  if not isinstance(result, (Result, TextFoolerResult)):
    raise TypeError(f"result must be a jr.text.Result or TextFoolerResult, got "
                    f"{type(result).__name__}.")
  budgets = jnp.asarray(budgets)
  if budgets.ndim != 1 or not jnp.issubdtype(budgets.dtype, jnp.integer):
    raise ValueError(f"budgets must be a 1-D int array [K] of swap counts, got {budgets.dtype} "
                     f"{budgets.shape}.")
  batch = result.swaps.shape[0]
  if not hasattr(y, "shape") or y.shape != (batch,):
    raise ValueError(f"y must be the [B] = [{batch}] labels given to run, got shape "
                     f"{getattr(y, 'shape', None)}.")
  check_label_shape("y", y, batch, f"the result has {batch} rows")
  check_labels("y", y, result.logits.shape[-1])
  if is_concrete(y, result.success, result.logits):
    # A point the run broke is misclassified under the run's labels: one predicted as y here
    # means y is not what run was given, and every verdict read from it would be wrong.
    claimed = np.asarray(result.success) & (np.argmax(np.asarray(result.logits), axis=-1)
                                            == np.asarray(y))
    if np.any(claimed):
      raise ValueError(f"y is not the labels given to run: {int(np.sum(claimed))} point(s) the "
                       f"run broke (first: row {int(np.argmax(claimed))}) are classified as y.")
  if budgets.shape[0] and is_concrete(budgets):
    lo = int(np.min(np.asarray(budgets)))
    if lo < 0:
      raise ValueError(f"budgets must be >= 0, got min {lo}.")
  return budgets.astype(jnp.int32)


def _refuse_unsearched(result: Result, y: Array, budgets: Array) -> None:
  """Concrete inputs (read with NumPy, so closed-over arrays under ``jit`` too): a ``ValueError``
  when a point the run did not break was searched only below a budget; traced ones leave NaN at
  that budget instead (:func:`swap_curve`)."""
  if result.max_swaps is None or not is_concrete(result.logits, result.max_swaps, y, budgets):
    return
  unbroken = np.argmax(np.asarray(result.logits), axis=-1) == np.asarray(y)
  budgets, searched = np.asarray(budgets), np.asarray(result.max_swaps)
  unknown = unbroken[None, :] & (searched[None, :] < budgets[:, None])
  if np.any(unknown):
    k, i = (int(v[0]) for v in np.nonzero(unknown))
    raise ValueError(
        f"budget {int(budgets[k])} exceeds the max_swaps ({int(searched[i])}) of row {i}, which "
        "the run did not break: it never searched that far, so robust accuracy there would be "
        f"overestimated. Run with max_swaps >= {int(budgets[k])} (and word_swap(steps >= "
        f"{int(budgets[k])})).")
