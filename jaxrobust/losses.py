"""Per-example attack losses: larger means more adversarial.

Untargeted losses have the signature ``fn(logits [B, C], labels [B]) -> [B]``; targeted ones
``fn(logits [B, C], labels [B], target [B]) -> [B]`` and grow as the prediction moves towards
``target``. Label look-ups use a one-hot comparison instead of fancy indexing, so they work on
batch-sharded arrays under an Explicit-axis mesh without an out-sharding.

Attack factories accept ``loss=`` as one of the names in :data:`LOSSES` or as a function.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust._validation import check_label_shape, check_labels

Array = jax.Array

LossFn = Callable[..., Array]


def _label_mask(logits: Array, labels: Array) -> Array:
  """``[B, C]`` bool mask, True at each example's label column: the one place every loss reads
  its labels, so the one place they are checked. Shapes always (also while tracing); the range
  ``[0, C)`` of concrete labels (a label outside it would match no column, and the loss would
  silently read a logit of 0)."""
  labels = jnp.asarray(labels)  # NumPy's int64 labels become JAX's default integer (no warning)
  if logits.ndim != 2:
    raise ValueError(f"losses take logits [B, C]; got shape {logits.shape}.")
  check_label_shape("labels", labels, logits.shape[0], f"logits have {logits.shape[0]} rows")
  check_labels("labels", labels, logits.shape[1])
  classes = jnp.arange(logits.shape[-1], dtype=labels.dtype)
  return labels[:, None] == classes[None, :]


def label_logit(logits: Array, labels: Array) -> Array:
  """``z_y``: each example's logit at its label, ``[B]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> label_logit(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([1, 0]))
    Array([2., 3.], dtype=float32)
  """
  return jnp.sum(jnp.where(_label_mask(logits, labels), logits, 0.0), axis=-1)


def max_other_logit(logits: Array, labels: Array) -> Array:
  """``max_{j != y} z_j``, ``[B]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> max_other_logit(jnp.array([[1.0, 5.0, 2.0]]), jnp.array([1]))
    Array([2.], dtype=float32)
  """
  return jnp.max(jnp.where(_label_mask(logits, labels), -jnp.inf, logits), axis=-1)


def cross_entropy(logits: Array, labels: Array) -> Array:
  r"""Cross-entropy of the true label, ``logsumexp(z) - z_y`` (untargeted).

  Examples:
    >>> import jax.numpy as jnp
    >>> cross_entropy(jnp.array([[0.0, 0.0]]), jnp.array([0]))  # log 2
    Array([0.6931472], dtype=float32)
  """
  return jax.nn.logsumexp(logits, axis=-1) - label_logit(logits, labels)


def margin(logits: Array, labels: Array) -> Array:
  r"""Carlini–Wagner margin, :math:`\max_{j \ne y} z_j - z_y`; positive iff misclassified.

  References:
    Carlini & Wagner, "Towards Evaluating the Robustness of Neural Networks", S&P 2017.

  Examples:
    >>> import jax.numpy as jnp
    >>> margin(jnp.array([[3.0, 1.0, 2.0]]), jnp.array([0]))
    Array([-1.], dtype=float32)
  """
  return max_other_logit(logits, labels) - label_logit(logits, labels)


def _total_order_keys(logits: Array) -> Array:
  r"""Integer keys that order the logits as ``lax.top_k`` does: IEEE-754 total order.

  .. math:: -\mathrm{NaN} < -\infty < \dots < -0 < +0 < \dots < +\infty < +\mathrm{NaN}

  A float's bits read as a signed integer already order the non-negative floats; flipping every
  bit but the sign of the negative ones reverses their order, as sign-magnitude needs. The
  integer minimum is left free to mark a taken column: the one pattern mapped there (a negative
  NaN with every payload bit set) shares the next key with its neighbour, which is also a NaN.
  """
  bits = jax.lax.bitcast_convert_type(logits, jnp.dtype(f"int{8 * logits.dtype.itemsize}"))
  limits = jnp.iinfo(bits.dtype)
  keys = jnp.where(bits < 0, bits ^ limits.max, bits)
  return jnp.maximum(keys, limits.min + 1)


def _largest(logits: Array, k: int) -> list[Array]:
  """The ``k`` largest logits of each row (``[B]`` each), largest first, ties counted apart.

  Equal to ``lax.top_k(logits, k)[0]`` bit for bit in value and gradient (up to the sign of a
  zero value, which no loss here can see), but without a sort: ``k`` passes of an ``argmax``
  over integer keys (:func:`_total_order_keys`), each taking the first column of the largest
  key, as ``top_k``'s stable sort does, and marking it taken for the next pass. The value is
  read through a one-hot comparison, so its gradient reaches exactly the chosen column (as
  ``top_k``'s does, where ``jnp.max`` would share it between tied columns) with neither a
  gather nor a scatter, and works on batch-sharded logits under an Explicit mesh (the gradient
  of ``jnp.sort`` does not: it sorts an unsharded index array along with the logits). A
  profile of APGD-T on a small MLP found ``top_k``'s sort, and the scatter of its gradient, a
  notable part of the loop body.
  """
  keys = _total_order_keys(jax.lax.stop_gradient(logits))
  classes = jnp.arange(logits.shape[-1])
  taken = jnp.iinfo(keys.dtype).min
  values = []
  for _ in range(k):  # k is static and small (3 or 4)
    chosen = jnp.argmax(keys, axis=-1)[:, None] == classes[None, :]
    values.append(jnp.sum(jnp.where(chosen, logits, 0.0), axis=-1))
    keys = jnp.where(chosen, taken, keys)
  return values


def dlr(logits: Array, labels: Array) -> Array:
  r"""Difference of logits ratio (untargeted), invariant to shifting and scaling the logits.

  .. math:: \mathrm{DLR}(z, y) = -\frac{z_y - \max_{j \ne y} z_j}{z_{\pi_1} - z_{\pi_3} + 10^{-12}}

  with :math:`\pi` sorting the logits in decreasing order. Needs at least 3 classes.

  References:
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020.

  Examples:
    >>> import jax.numpy as jnp
    >>> dlr(jnp.array([[4.0, 2.0, 0.0]]), jnp.array([0]))
    Array([-0.5], dtype=float32)
  """
  _require_classes(logits, 3, "dlr")
  first, _, third = _largest(logits, 3)
  return margin(logits, labels) / (first - third + 1e-12)


def targeted_cross_entropy(logits: Array, labels: Array, target: Array) -> Array:
  r"""Negative cross-entropy of the target class, ``z_t - logsumexp(z)`` (targeted).

  ``labels`` is unused; it is taken so every targeted loss has one signature.

  Examples:
    >>> import jax.numpy as jnp
    >>> targeted_cross_entropy(jnp.array([[0.0, 0.0]]), jnp.array([0]), jnp.array([1]))
    Array([-0.6931472], dtype=float32)
  """
  del labels
  return -cross_entropy(logits, target)


def targeted_margin(logits: Array, labels: Array, target: Array) -> Array:
  r"""Targeted Carlini–Wagner margin, :math:`z_t - \max_{j \ne t} z_j`; positive iff argmax = t.

  Examples:
    >>> import jax.numpy as jnp
    >>> targeted_margin(jnp.array([[3.0, 1.0, 2.0]]), jnp.array([0]), jnp.array([2]))
    Array([-1.], dtype=float32)
  """
  del labels
  return -margin(logits, target)


def targeted_dlr(logits: Array, labels: Array, target: Array) -> Array:
  r"""Targeted difference of logits ratio, as in AutoAttack's APGD-T. Needs at least 4 classes.

  .. math:: -\frac{z_y - z_t}{z_{\pi_1} - (z_{\pi_3} + z_{\pi_4})/2 + 10^{-12}}

  References:
    Croce & Hein, ICML 2020 (see :func:`dlr`).

  Examples:
    >>> import jax.numpy as jnp
    >>> targeted_dlr(jnp.array([[4.0, 3.0, 1.0, 0.0]]), jnp.array([0]), jnp.array([1]))
    Array([-0.2857143], dtype=float32)
  """
  _require_classes(logits, 4, "targeted_dlr")
  first, _, third, fourth = _largest(logits, 4)
  gap = label_logit(logits, labels) - label_logit(logits, target)
  return -gap / (first - 0.5 * (third + fourth) + 1e-12)


def probability_margin(logits: Array, labels: Array) -> Array:
  r"""Probability margin (untargeted), the loss of the Probability Margin Attack (PMA).

  .. math:: \mathrm{PM}(z, y) = \max_{j \ne y} p_j - p_y, \qquad p = \operatorname{softmax}(z)

  Positive iff misclassified, like :func:`margin`, but on probabilities: bounded in
  :math:`[-1, 1]` and its gradient :math:`\partial p_i / \partial z_k = p_i([i = k] - p_k)`
  fades where the prediction is confident, so the ascent spends its steps where the decision is
  close (the paper's argument for it over the logit margin and the cross-entropy). Needs 2
  classes.

  References:
    Xie et al., "Towards Million-Scale Adversarial Robustness Evaluation With Stronger Individual
    Attacks" (PMA), arXiv:2411.15210, 2024.

  Examples:
    >>> import jax.numpy as jnp
    >>> probability_margin(jnp.array([[0.0, 0.0, -jnp.inf]]), jnp.array([0]))  # p = (.5, .5, 0)
    Array([0.], dtype=float32)
    >>> probability_margin(jnp.array([[0.0, -jnp.inf, -jnp.inf]]), jnp.array([0]))  # p = (1, 0, 0)
    Array([-1.], dtype=float32)
  """
  p = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
  return max_other_logit(p, labels) - label_logit(p, labels)


def targeted_probability_margin(logits: Array, labels: Array, target: Array) -> Array:
  r"""Targeted probability margin, :math:`p_t - \max_{j \ne t} p_j`; positive iff argmax = t.

  The PMA paper defines the untargeted loss only (:func:`probability_margin`); this is its
  targeted form, built as :func:`targeted_margin` is from :func:`margin`.

  Examples:
    >>> import jax.numpy as jnp
    >>> targeted_probability_margin(jnp.array([[0.0, -jnp.inf]]), jnp.array([0]), jnp.array([1]))
    Array([-1.], dtype=float32)
  """
  del labels
  return -probability_margin(logits, target)


def _require_classes(logits: Array, minimum: int, name: str) -> None:
  if logits.ndim != 2:
    raise ValueError(f"{name}: logits must be [B, C], got shape {logits.shape}.")
  if logits.shape[-1] < minimum:
    raise ValueError(
        f"{name} needs at least {minimum} classes, the model has {logits.shape[-1]}; "
        "use loss='ce' or loss='margin' instead.")


UNTARGETED = {"ce": cross_entropy, "margin": margin, "dlr": dlr,
              "probability_margin": probability_margin}  # new names go last: LOSSES keeps order
TARGETED = {"ce": targeted_cross_entropy, "margin": targeted_margin, "dlr": targeted_dlr,
            "probability_margin": targeted_probability_margin}
LOSSES = tuple(UNTARGETED)
MIN_CLASSES = {"ce": 2, "margin": 2, "dlr": 3, "probability_margin": 2}
MIN_CLASSES_TARGETED = {"ce": 2, "margin": 2, "dlr": 4, "probability_margin": 2}


def resolve(loss: str | LossFn, targeted: bool) -> LossFn:
  """Turns a loss name or function into a function of the right signature.

  Args:
    loss: ``"ce"``, ``"margin"``, ``"dlr"``, ``"probability_margin"``, or a function
      ``(logits, labels) -> [B]``
      (untargeted) / ``(logits, labels, target) -> [B]`` (targeted), larger = more adversarial.
    targeted: whether the attack is targeted.

  Returns:
    The loss function.

  Raises:
    ValueError: for an unknown name.
  """
  if callable(loss):
    return loss
  table = TARGETED if targeted else UNTARGETED
  if loss not in table:
    raise ValueError(f"Unknown loss {loss!r}; supported: {', '.join(map(repr, LOSSES))} "
                     "or a function (logits, labels[, target]) -> [B].")
  return table[loss]
