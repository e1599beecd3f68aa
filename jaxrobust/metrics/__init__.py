"""Robustness metrics: formulas on predictions, and mergeable reducers of exact sums.

* :mod:`jaxrobust.metrics.formulas` -- pure functions of one batch of predictions (accuracy,
  robust accuracy, attack success rate, perturbation sizes, certified accuracy, curve AUC,
  quantiles of minimal norms), each with an optional ``mask [B]`` for padded rows;
* :mod:`jaxrobust.metrics.reducers` -- the reducer family (``empty`` / ``from_*`` / ``merge`` /
  ``psum`` / ``to_host`` / ``compute``): :class:`Counts` (the sums behind the formulas),
  :class:`CurveCounts` (robustness curves; what :func:`jaxrobust.evaluate` and
  :class:`jaxrobust.Report` are built on) and :class:`NormHistogram` (curves from minimal norms);
* :mod:`jaxrobust.metrics.intervals` -- exact Clopper--Pearson bounds (:func:`binomial_interval`,
  in float32 and traceable; :func:`binomial_interval_table`, in float64 on the host for reports);
* :mod:`jaxrobust.metrics.rates` -- the mergeable :class:`Rate` (hits out of trials, with its
  interval; grouped, micro and macro averages);
* :mod:`jaxrobust.metrics.generative` -- the generative-model rates built on it
  (:func:`attack_success_rate_generative`, :func:`prompt_injection_rate`,
  :func:`paraphrase_consistency`);
* :mod:`jaxrobust.metrics.judged` -- judged rates: verdicts in {success, failure, unscored}
  counted by :class:`JudgedRate` (unscored kept apart, explicit rules, hit@k over prompts);
* :mod:`jaxrobust.metrics.scores` -- continuous judged scores (:func:`strongreject_score`, the
  mergeable :class:`ScoreHistogram`, :func:`histogram_mean` with Hoeffding or bootstrap
  intervals);
* :mod:`jaxrobust.metrics.model_evaluations` -- :func:`count_evaluations`, the rows an attack
  sends through the model with and without a gradient (the hardware-independent cost).

The conventions they share (predictions, masks, counts, ratios, and the array namespace that lets
one ``merge`` / ``compute`` serve device and host sums) are :mod:`jaxrobust.metrics.conventions`.

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
from jaxrobust.metrics.model_evaluations import EvaluationCounter, count_evaluations
from jaxrobust.metrics.intervals import binomial_interval, binomial_interval_table
from jaxrobust.metrics.rates import Rate
from jaxrobust.metrics.scores import ScoreHistogram, histogram_mean, strongreject_score
from jaxrobust.metrics.judged import FAILURE, SUCCESS, UNSCORED, JudgedRate
from jaxrobust.metrics.generative import (attack_success_rate_generative, paraphrase_consistency,
                                          prompt_injection_rate)

__all__ = [
    "Counts", "CurveCounts", "NormHistogram", "Reducer", "accuracy", "adversarial_accuracy",
    "attack_success_rate", "certified_accuracy", "conditional_robust_accuracy", "curve_auc",
    "empirical_robustness", "mean_perturbation", "median_perturbation", "perturbation_quantiles",
    "psum", "robust_accuracy",
    # Rates with exact binomial intervals (jaxrobust.metrics.intervals, .rates, .generative).
    "Rate", "attack_success_rate_generative", "binomial_interval", "binomial_interval_table",
    "paraphrase_consistency", "prompt_injection_rate",
    # Judged rates and scores: verdicts with unscored kept apart, hit@k, StrongREJECT-style means.
    "FAILURE", "JudgedRate", "SUCCESS", "ScoreHistogram", "UNSCORED", "histogram_mean",
    "strongreject_score",
    # The cost of an evaluation in model rows (jaxrobust.metrics.model_evaluations).
    "EvaluationCounter", "count_evaluations",
]
