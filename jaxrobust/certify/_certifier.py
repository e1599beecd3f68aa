r"""Certifiers for :func:`jaxrobust.evaluate`: certified curves computed beside empirical ones.

A :class:`Certifier` is to certification what a :class:`jaxrobust.Attack` is to attacks: static
configuration fixed by a factory, and a pure function that the evaluation step calls on every
batch,

.. code-block:: python

   correct, robust = certifier.certify(logits_fn, x, y, keys, epsilons, lower, upper)

with ``correct [B]`` (the certified prediction equals the label) and ``robust [K, B]`` (proven
robust at each eps of the grid: correct and certified at that radius). ``jr.evaluate`` sums them
into a certified :class:`jaxrobust.metrics.CurveCounts` per certifier, and the report holds them
in :attr:`jaxrobust.Report.certified`, so one report brackets the truth:
certified (lower) :math:`\le` true :math:`\le` empirical (upper).

The bracket is about one classifier. Bound propagation certifies the model itself, the one the
attacks attack. Randomized smoothing certifies the *smoothed* classifier
:math:`g(x) = \arg\max_c P[f(x + \varepsilon) = c]`, not the base model; its certified curve is a
lower bound for :math:`g`, and the empirical curve of an attack on :math:`f` is not an upper bound
for :math:`g` (attack :math:`g` itself, e.g. with :func:`jaxrobust.attacks.eot` on a
``logits_fn(x, keys)`` that adds the noise, to bracket it).
"""

from __future__ import annotations

import json
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from jaxrobust._batch import like_batch, predict
from jaxrobust._types import NORMS
from jaxrobust.certify._linear import check_examples_per_pass
from jaxrobust.certify._margins import check_method
from jaxrobust.certify._radius import certified_at
from jaxrobust.certify._smoothing import _check, smoothing

Array = jax.Array


class Certifier(NamedTuple):
  """A certification method for :func:`jaxrobust.evaluate` (see the module docstring).

  Attributes:
    certify: ``(logits_fn, x, y, keys, epsilons, lower, upper) -> (correct [B], robust [K, B])``;
      ``keys`` holds one PRNG key per example.
    norm: the norm of the certified radii.
    name: a human-readable description.
    config: the factory call as JSON (recorded in reports' provenance).
  """

  certify: Callable[..., tuple[Array, Array]]
  norm: str
  name: str
  config: Optional[str] = None


def smoothing_certifier(*, sigma: float, n0: int = 100, n: int = 100_000, alpha: float = 0.001,
                        batch_size: int = 1_000) -> Certifier:
  r"""Randomized smoothing (:func:`jaxrobust.certify.smoothing`) as a :class:`Certifier`: example
  ``i`` is certified at eps when the smoothed prediction is its label and the certified L2
  radius is at least eps. Certifies the smoothed classifier, not the base model.

  Raises:
    ValueError: what :func:`jaxrobust.certify.smoothing` refuses of the options, at build time:
      ``sigma`` or ``alpha`` not a real number (a bool, a string, an array), ``sigma <= 0``,
      ``alpha`` outside ``(0, 1)``, counts below 1, ``n <= log2(1/alpha)`` (every example would
      abstain).

  Examples:
    >>> import jaxrobust as jr
    >>> jr.certify.smoothing_certifier(sigma=0.25, n=1000).name
    'smoothing-l2-sigma0.25-n1000-alpha0.001'
  """
  sigma, alpha = _check(sigma, alpha, n0=n0, n=n, batch_size=batch_size)

  def certify(logits_fn, x, y, keys, epsilons, lower, upper):
    del lower, upper  # the noise is Gaussian on the whole space (not clipped to the box)
    certificate = smoothing(logits_fn, x, keys, sigma=sigma, n0=n0, n=n, alpha=alpha,
                            batch_size=batch_size)
    correct = certificate.prediction == y
    return correct, correct[None, :] & (certificate.radius[None, :] >= epsilons[:, None])

  config = {"factory": "smoothing_certifier", "sigma": float(sigma), "n0": n0, "n": n,
            "alpha": float(alpha), "batch_size": batch_size}
  return Certifier(certify, "l2", f"smoothing-l2-sigma{sigma:g}-n{n}-alpha{alpha:g}",
                   json.dumps(config))


def bounds_certifier(*, method: str = "ibp", norm: str = "linf",
                     examples_per_pass: int | None = None) -> Certifier:
  r"""Bound propagation (:func:`jaxrobust.certify.margin_bounds`) as a :class:`Certifier`: example
  ``i`` is certified at each eps of the grid when the model classifies it correctly and every
  margin bound over ``[max(x - eps, lower), min(x + eps, upper)]`` is positive (one bound
  computation per eps, no bisection; L2/L1 balls are enclosed in their Linf box).

  Examples:
    >>> import jaxrobust as jr
    >>> jr.certify.bounds_certifier(method="crown").name
    'bounds-crown-linf'
  """
  check_method(method)
  check_examples_per_pass(examples_per_pass)
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")

  def certify(logits_fn, x, y, keys, epsilons, lower, upper):
    del keys
    correct = predict(logits_fn(x)) == y
    per_eps = lambda eps: certified_at(
        logits_fn, x, y, like_batch(jnp.broadcast_to(eps, y.shape), x), lower, upper,
        method, examples_per_pass) & correct
    return correct, lax.map(per_eps, epsilons)

  config = {"factory": "bounds_certifier", "method": method, "norm": norm}
  return Certifier(certify, norm, f"bounds-{method}-{norm}", json.dumps(config))
