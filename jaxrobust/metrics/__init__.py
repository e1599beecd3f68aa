"""Robustness metrics: formulas on predictions, and mergeable reducers of exact sums.

* :mod:`jaxrobust.metrics.formulas` -- pure functions of one batch of predictions (accuracy,
  robust accuracy, attack success rate, perturbation sizes, certified accuracy, curve AUC,
  quantiles of minimal norms), each with an optional ``mask [B]`` for padded rows;
* :mod:`jaxrobust.metrics.reducers` -- the reducer family (``empty`` / ``from_*`` / ``merge`` /
  ``psum`` / ``to_host`` / ``compute``): :class:`Counts` (the sums behind the formulas),
  :class:`CurveCounts` (robustness curves; what :func:`jaxrobust.evaluate` and
  :class:`jaxrobust.Report` are built on) and :class:`NormHistogram` (curves from minimal norms).

Examples:
  >>> import jax.numpy as jnp
  >>> from jaxrobust import metrics
  >>> float(metrics.accuracy(jnp.array([0, 1, 1]), jnp.array([0, 1, 0])))
  0.6666666865348816
"""

from jaxrobust.metrics.formulas import (accuracy, adversarial_accuracy, attack_success_rate,
                                        certified_accuracy, conditional_robust_accuracy,
                                        curve_auc, empirical_robustness, mean_perturbation,
                                        median_perturbation, perturbation_quantiles,
                                        robust_accuracy)
from jaxrobust.metrics.reducers import Counts, CurveCounts, NormHistogram, Reducer, psum

__all__ = [
    "Counts", "CurveCounts", "NormHistogram", "Reducer", "accuracy", "adversarial_accuracy",
    "attack_success_rate", "certified_accuracy", "conditional_robust_accuracy", "curve_auc",
    "empirical_robustness", "mean_perturbation", "median_perturbation", "perturbation_quantiles",
    "psum", "robust_accuracy",
]
