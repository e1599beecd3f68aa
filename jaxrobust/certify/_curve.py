r"""Certified robustness curves: ``Certified Acc(r) = 1/N Σ_i 1[f(x_i) = y_i and R_i ≥ r]``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._types import Certificate, Curve
from jaxrobust._validation import check_label_shape, is_concrete
from jaxrobust.metrics import curve_auc

Array = jax.Array


def certified_curve(certificate: Certificate, y: Array, radii: Array) -> Curve:
  r"""The certified accuracy at each radius, as a :class:`jaxrobust.Curve`.

  .. math:: \mathrm{robust}_{k,i} = [\hat y_i = y_i] \, [R_i \ge r_k], \qquad
     \mathrm{robust\_accuracy}_k = \frac1N \sum_i \mathrm{robust}_{k,i},

  with :math:`\hat y_i` the certificate's prediction (``-1``, abstain, is never correct). The
  ``clean_accuracy`` is the certificate's accuracy (abstentions count as wrong): for randomized
  smoothing it is the smoothed classifier's certified accuracy at radius 0, not the base model's.
  Because it is a :class:`jaxrobust.Curve`, AUCs, :meth:`jaxrobust.Report.with_certified` and the
  plots work unchanged; it is a lower bound on the true robust accuracy at each radius (with
  probability ``1 - alpha`` per example for smoothing).

  Args:
    certificate: from :func:`jaxrobust.certify.smoothing` or
      :func:`jaxrobust.certify.certify_bounds`.
    y: ``[B]`` labels.
    radii: ``[K]`` radii (data).

  Returns:
    A :class:`jaxrobust.Curve` with ``robust [K, B]``.

  Raises:
    ValueError: a certificate whose ``prediction`` is not ``[B]`` or whose ``radius`` has
      another shape than its ``prediction``; ``y`` not a 1-D int array as long as the
      certificate, a concrete ``y`` with a negative entry (``-1`` is the code of an abstention:
      a label of ``-1`` would count every abstention as correct), ``radii`` not ``[K]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> c = jr.Certificate(jnp.array([0, 1, -1, 2]), jnp.array([0.5, 0.2, 0.0, 0.9]))
    >>> curve = jr.certify.certified_curve(c, jnp.array([0, 1, 1, 0]), jnp.array([0.1, 0.3]))
    >>> float(curve.clean_accuracy), curve.robust_accuracy.tolist()
    (0.5, [0.5, 0.25])
  """
  prediction_shape, radius_shape = np.shape(certificate.prediction), np.shape(certificate.radius)
  if len(prediction_shape) != 1 or radius_shape != prediction_shape:
    raise ValueError(
        "The certificate must hold one prediction and one radius per example, both [B]; got "
        f"prediction {prediction_shape} and radius {radius_shape}. Pass the Certificate that "
        "jr.certify.smoothing or certify_bounds returned for the batch, unchanged (slice both "
        "fields alike to select examples).")
  batch = prediction_shape[0]
  check_label_shape("y", y, batch, f"the certificate has {batch} predictions")
  lowest = int(np.min(np.asarray(y))) if is_concrete(y) and batch else 0
  if lowest < 0:
    raise ValueError(f"y must hold class indices >= 0, got min {lowest}: -1 "
                     "is the prediction of an abstention, so a label -1 would count it correct. "
                     "Drop the unlabelled examples first.")
  if np.ndim(radii) != 1:
    raise ValueError(f"radii must be a 1-D array [K], got shape {np.shape(radii)}.")
  radii = jnp.asarray(radii, jnp.float32)
  correct = certificate.prediction == y
  robust = correct[None, :] & (certificate.radius[None, :] >= radii[:, None])
  clean = jnp.mean(correct.astype(jnp.float32))
  accuracy = jnp.mean(robust.astype(jnp.float32), axis=1)
  return Curve(epsilons=radii, clean_accuracy=clean, robust_accuracy=accuracy, robust=robust,
               auc=curve_auc(radii, accuracy, clean))
