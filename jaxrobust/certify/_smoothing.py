r"""Randomized smoothing: Cohen, Rosenfeld & Kolter (2019)'s CERTIFY and PREDICT.

The smoothed classifier of a base classifier :math:`f` at noise level :math:`\sigma` is

.. math:: g(x) = \arg\max_c \; P_{\varepsilon \sim \mathcal N(0, \sigma^2 I)}[f(x + \varepsilon) = c].

If the top class has probability :math:`p_A \ge \underline{p_A} > 1/2`, then :math:`g` is constant
on the L2 ball of radius :math:`R = \sigma\, \Phi^{-1}(\underline{p_A})` around :math:`x` (Cohen et
al., Theorem 1, with :math:`\overline{p_B} = 1 - \underline{p_A}`). CERTIFY estimates it by Monte
Carlo:

1. draw ``n0`` noisy copies, take the most frequent class :math:`\hat c_A` (selection);
2. draw ``n`` fresh copies, count :math:`n_A` hits of :math:`\hat c_A`;
3. :math:`\underline{p_A}` = the one-sided Clopper--Pearson lower bound at level :math:`1 - \alpha`
   (:func:`jaxrobust.metrics.binomial_interval`, ``sided="lower"``);
4. abstain (``-1``, radius 0) when :math:`\underline{p_A} \le 1/2`, else return
   :math:`(\hat c_A, \sigma\,\Phi^{-1}(\underline{p_A}))`.

With probability at least :math:`1 - \alpha` over the draws, a returned class is :math:`g(x)` and
the radius is valid. PREDICT draws ``n`` copies and returns the top class only if a two-sided
binomial test of its count against the runner-up's rejects equality at level :math:`\alpha`
(:math:`\mathrm{p\text{-}value} = \min(1, 2\,P[X \ge n_A])`, :math:`X \sim
\mathrm{Bin}(n_A + n_B, 1/2)`), else abstains; it errs with probability at most :math:`\alpha`.

Implementation. Noise draw :math:`j` of example :math:`i` uses the key
``fold_in(fold_in(key_i, stream), j)`` (``stream`` 0 for selection, 1 for estimation, 2 for
PREDICT), so results depend neither on the example's position (given per-example keys) nor on
``batch_size``, the number of draws evaluated per example at a time. Draws run in a fixed-length
``lax.scan`` of ``ceil(n / batch_size)`` chunks (the last masked), so memory is that of one chunk,
``[B, batch_size, ...]``, whatever ``n``. Each chunk evaluates the model on ``[B, ...]`` slices
(``vmap`` over the draws), so every operation is per example and a batch-sharded ``x`` needs no
collective. Noise is Gaussian in the units of ``x`` and is not clipped to the box (the theorem is
about the unclipped noise). A non-finite output counts for no class (:func:`jaxrobust.predict`).

References:
  Cohen, Rosenfeld & Kolter, "Certified Adversarial Robustness via Randomized Smoothing",
  ICML 2019 (CERTIFY/PREDICT, defaults n0 = 100, n = 100 000, alpha = 0.001).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxrobust._batch import as_keys, fold_in, like_batch, one_hot_mask, predict
from jaxrobust._types import Certificate
from jaxrobust._validation import (check_batch, check_finite, check_logits, check_number,
                                   check_positive_int, is_concrete, logits_shape)
from jaxrobust.metrics import binomial_interval

Array = jax.Array

SELECT, ESTIMATE, PREDICT = 0, 1, 2
"""The noise streams of the selection draws, the estimation draws and PREDICT's draws."""


def class_counts(logits_fn: Callable[[Array], Array], x: Array, keys: Array, sigma: Array,
                 num: int, batch_size: int) -> Array:
  """``[B, C]`` int32: how many of ``num`` noisy copies of each example the model puts in each
  class (draw ``j`` of example ``i`` from ``fold_in(keys[i], j)``; see the module docstring).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[2.0], [-2.0]])
    >>> keys = jax.random.split(jax.random.key(0), 2)
    >>> logits_fn = lambda v: jnp.concatenate([-v, v], axis=1)  # class 1 iff v > 0
    >>> class_counts(logits_fn, x, keys, jnp.float32(1.0), 1000, 256).tolist()  # P = 0.977
    [[22, 978], [985, 15]]
  """
  num_classes = jax.eval_shape(logits_fn, x).shape[-1]
  chunks = -(-num // batch_size)
  sigma = jnp.asarray(sigma, jnp.float32)

  def chunk(counts, c):
    draw = c * batch_size + jnp.arange(batch_size, dtype=jnp.uint32)  # [S] draw indices
    draw_keys = jax.vmap(lambda k: jax.vmap(lambda j: jax.random.fold_in(k, j))(draw))(keys)
    noise = jax.vmap(jax.vmap(lambda k: jax.random.normal(k, x.shape[1:], jnp.float32)))(
        draw_keys)  # [B, S, ...]
    noisy = (x[:, None].astype(jnp.float32) + sigma * noise).astype(x.dtype)
    logits = jax.vmap(logits_fn, in_axes=1, out_axes=1)(noisy)  # [B, S, C]
    hits = one_hot_mask(predict(logits), num_classes) & (draw < num)[None, :, None]
    return counts + jnp.sum(hits, axis=1, dtype=jnp.int32), None

  counts = like_batch(jnp.zeros((x.shape[0], num_classes), jnp.int32), x)
  return lax.scan(chunk, counts, jnp.arange(chunks, dtype=jnp.uint32))[0]


def _check_model_inputs(logits_fn: Callable[[Array], Array], x: Array) -> None:
  """``x`` is a non-empty float batch (finite where concrete: Gaussian noise added to an integer
  or a NaN input would certify a classifier that was never smoothed), and ``logits_fn(x)`` is
  ``[B, C]`` with ``C >= 2``."""
  check_batch(x, None)
  check_finite(x)
  check_logits(logits_shape(logits_fn, x), x.shape[0])


def _real(name: str, value, **interval) -> float | None:
  """A real scalar option (data): a Python or NumPy int or float, or a 0-d int/float array. Its
  type and shape are checked always, before any conversion (a bool, a string or a list is
  refused, not converted); a readable value is returned as a Python float inside ``interval``
  (:func:`jaxrobust._validation.check_number`), a traced one as ``None``.

  Raises:
    ValueError: naming the option, what was expected and what was given.

  Examples:
    >>> _real("sigma", "0.5", low=0.0, low_open=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: sigma must be a real number (...), not a str: got '0.5'.
    >>> _real("sigma", 0.0, low=0.0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: sigma must be a finite number > 0, got 0.0.
  """
  if isinstance(value, (str, bytes, bool, np.bool_)):
    raise ValueError(f"{name} must be a real number (an int or a float, or a 0-d float array), "
                     f"not a {type(value).__name__}: got {value!r}.")
  if isinstance(value, (list, tuple)):
    value = np.asarray(value)
  if isinstance(value, (jax.Array, np.ndarray)):
    if np.ndim(value) != 0:
      raise ValueError(f"{name} must be one number (a scalar) for the whole batch, got an array "
                       f"of shape {np.shape(value)}.")
    if not (jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer)):
      raise ValueError(f"{name} must be a real number, got an array of dtype {value.dtype}.")
    if not is_concrete(value):
      return None
    value = value.item()
  return check_number(name, value, **interval)


def _check(sigma, alpha, *, test: str = "certify", **counts: int) -> tuple:
  """The options shared by :func:`smoothing` (``test="certify"``), :func:`smoothed_predict`
  (``"predict"``) and :func:`jaxrobust.certify.smoothing_certifier`: counts are ints ``>= 1``,
  ``sigma > 0`` and ``alpha`` in ``(0, 1)`` are real scalars (:func:`_real`), and (readable
  ``alpha``) ``n`` draws can decide at all at level ``alpha``. Returns ``(sigma, alpha)`` as
  Python floats where readable, ``None`` where traced."""
  for name, value in counts.items():
    check_positive_int(name, value)
  sigma = _real("sigma", sigma, low=0.0, low_open=True)
  alpha = _real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)
  n = counts["n"]
  if alpha is not None and test == "certify" and n <= math.log2(1.0 / alpha):
    # All n draws on one class give the lower bound alpha^(1/n), certifying only above 1/2.
    raise ValueError(
        f"n = {n} draws cannot certify anything at alpha = {alpha:g}: even with every draw on "
        f"one class the lower confidence bound is alpha^(1/n) = {alpha ** (1 / n):.3f} <= 1/2, "
        f"so every example would abstain. Use n > log2(1/alpha) = {math.log2(1.0 / alpha):.2f} "
        "(Cohen et al.: n = 100000).")
  if alpha is not None and test == "predict" and n < math.log2(2.0 / alpha):
    # All n draws on one class: the two-sided p-value 2 * 2^-n is the smallest there is.
    raise ValueError(
        f"n = {n} draws cannot predict anything at alpha = {alpha:g}: even with every draw on "
        f"one class the two-sided p-value is 2 * 2^-n = {2.0 * 0.5 ** n:.3g} > alpha, so every "
        f"example would abstain. Use n >= log2(2/alpha) = {math.log2(2.0 / alpha):.2f} "
        "(Cohen et al.: n = 100000).")
  return sigma, alpha


def certify_from_counts(top: Array, count: Array, n: int, sigma: Array,
                        alpha: Array) -> Certificate:
  r"""CERTIFY's decision from ``count`` hits of the selected class ``top`` in ``n`` draws:
  :math:`\underline{p_A}` = one-sided Clopper--Pearson lower bound at :math:`1 - \alpha`, abstain
  when it is at most 1/2, else radius :math:`\sigma\,\Phi^{-1}(\underline{p_A})`. A ``sigma``
  that is not a finite number > 0 (only a traced one gets here: :func:`smoothing` refuses a
  readable one) abstains everywhere with NaN radii, never a negative radius.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> certify = jax.jit(certify_from_counts, static_argnums=2)  # n is static
    >>> c = certify(jnp.array([2, 2]), jnp.array([1000, 500]), 1000, 0.5, 0.001)
    >>> c.prediction.tolist(), round(float(c.radius[0]), 4)  # 1000/1000: 0.001 ** (1/1000)
    ([2, -1], 1.2316)
  """
  p_lower, _ = binomial_interval(count, n, 1.0 - jnp.asarray(alpha, jnp.float32), sided="lower")
  certified = p_lower > 0.5
  # Φ⁻¹(p) = √2 erf⁻¹(2p − 1) (exact in float32 for p ≥ 1/2; jax.scipy.special.ndtri does not
  # trace under an Explicit mesh axis).
  p = jnp.where(certified, p_lower, 0.75)
  radius = jnp.asarray(sigma, jnp.float32) * jnp.sqrt(jnp.float32(2.0)) * lax.erf_inv(
      2.0 * p - 1.0)
  sigma = jnp.asarray(sigma, jnp.float32)
  valid = jnp.isfinite(sigma) & (sigma > 0)
  return Certificate(jnp.where(certified & valid, top.astype(jnp.int32), -1),
                     jnp.where(valid, jnp.where(certified, radius, 0.0), jnp.nan)
                     .astype(jnp.float32))


def smoothing(logits_fn: Callable[[Array], Array], x: Array, key: Array, *, sigma: float,
              n0: int = 100, n: int = 100_000, alpha: float = 0.001,
              batch_size: int = 1_000) -> Certificate:
  r"""Cohen et al.'s CERTIFY for the Gaussian-smoothed classifier (see the module docstring).

  Args:
    logits_fn: the base classifier, ``x [B, ...] -> logits [B, C]``.
    x: ``[B, ...]`` inputs.
    key: a PRNG key (example ``i`` uses ``fold_in(key, i)``) or one key per example ``[B]``
      (results then do not depend on the example's position).
    sigma: the noise's standard deviation, in the units of ``x`` (data: no recompile).
    n0: draws to select the class (static).
    n: draws to estimate its probability (static).
    alpha: the certificate fails with probability at most ``alpha`` (data).
    batch_size: draws evaluated per example at a time (memory; results do not depend on it).
      Each model call evaluates ``B * batch_size`` rows: on an accelerator, size it for the
      batch as a whole. On an H200, 32 CIFAR images through WRN-16-4 at n = 10,000 ran in 1.1 s
      both at 1000 draws each (32,000 rows per call: 23.5 GiB of XLA buffers, first call 71 s,
      most of it XLA tuning convolutions at that size) and at 125 (4,000 rows: first call
      19 s); ``benchmarks/RESULTS.md``.

  Returns:
    A :class:`jaxrobust.Certificate`: class or ``-1`` (abstain), and the certified L2 radius.

  Raises:
    ValueError: ``sigma`` or ``alpha`` not a real scalar (a bool, a string, an array of another
      shape), ``sigma <= 0``, ``alpha`` outside ``(0, 1)``, counts below 1, or (concrete
      ``alpha``) ``n <= log2(1/alpha)``: then even ``n`` draws on one class give
      :math:`\underline{p_A} = \alpha^{1/n} \le 1/2` and every example abstains (at the
      default ``alpha = 0.001``, ``n >= 10``).
      Also an empty batch, NaN/Inf in a concrete ``x``, or logits that are not ``[B, C]`` with
      ``C >= 2``.
    TypeError: an integer ``x`` (the noise would be truncated to integers).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> w = jnp.array([[1.0, -1.0], [0.0, 0.0]])  # class 0 iff x_0 > 0: distance |x_0|
    >>> x = jnp.array([[0.3, 0.5], [-0.8, 0.5], [0.01, 0.5]])
    >>> c = jax.jit(lambda x, key: jr.certify.smoothing(lambda v: v @ w, x, key, sigma=0.5,
    ...                                                 n=2_000))(x, jax.random.key(0))
    >>> c.prediction.tolist(), [round(float(r), 2) for r in c.radius]  # below 0.3, 0.8
    ([0, 1, -1], [0.28, 0.72, 0.0])

  References:
    Cohen, Rosenfeld & Kolter, ICML 2019, Algorithm CERTIFY.
  """
  _check(sigma, alpha, n0=n0, n=n, batch_size=batch_size)
  _check_model_inputs(logits_fn, x)
  keys = like_batch(as_keys(key, x.shape[0]), x)
  select = class_counts(logits_fn, x, fold_in(keys, SELECT), sigma, n0, min(batch_size, n0))
  top = jnp.argmax(select, axis=-1).astype(jnp.int32)
  counts = class_counts(logits_fn, x, fold_in(keys, ESTIMATE), sigma, n, min(batch_size, n))
  count = jnp.sum(jnp.where(one_hot_mask(top, counts.shape[-1]), counts, 0), axis=-1)
  return certify_from_counts(top, count, n, sigma, alpha)


def significant(n_a: Array, n_b: Array, alpha: Array) -> Array:
  r"""The two-sided exact binomial test of :math:`n_A` successes in :math:`m = n_A + n_B` trials
  against :math:`p = 1/2` rejects at level :math:`\alpha` (for :math:`n_A \ge n_B`).

  The p-value is :math:`\min(1, 2\,P_{1/2}[X \ge n_A])`. Since :math:`P_p[X \ge n_A]` grows with
  :math:`p` and the two-sided Clopper--Pearson lower bound :math:`L` at confidence
  :math:`1 - \alpha` solves :math:`P_L[X \ge n_A] = \alpha/2`, the test rejects exactly when
  :math:`L \ge 1/2`; this uses :func:`jaxrobust.metrics.binomial_interval`, accurate to a few
  float32 ulps up to :math:`10^7` trials (a float32 incomplete beta for the p-value itself is off
  by 1.6% near :math:`10^{-3}` at :math:`m = 10^5`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> test = jax.jit(significant)
    >>> test(jnp.array([9, 5, 60]), jnp.array([1, 5, 40]), 0.05).tolist()  # p: .021 1 .057
    [True, False, False]
  """
  lower, _ = binomial_interval(n_a, n_a + n_b, 1.0 - jnp.asarray(alpha, jnp.float32))
  return (lower >= 0.5) & (n_a > n_b)


def smoothed_predict(logits_fn: Callable[[Array], Array], x: Array, key: Array, *,
                     sigma: float, n: int = 1_000, alpha: float = 0.001,
                     batch_size: int = 1_000) -> Array:
  r"""Cohen et al.'s PREDICT: the smoothed classifier's class, or ``-1`` (abstain) when the top
  two counts of ``n`` draws do not differ significantly at level ``alpha`` (see the module
  docstring); wrong with probability at most ``alpha``.

  Args:
    logits_fn: the base classifier.
    x: ``[B, ...]`` inputs.
    key: a PRNG key, or one per example ``[B]``.
    sigma: the noise's standard deviation, in the units of ``x``.
    n: draws (static).
    alpha: the level of the test (data).
    batch_size: draws evaluated per example at a time (memory only).

  Returns:
    ``[B]`` int32.

  Raises:
    ValueError: ``sigma`` or ``alpha`` not a real scalar (a bool, a string, an array of another
      shape), ``sigma <= 0``, ``alpha`` outside ``(0, 1)``, ``n`` below 1, or (concrete
      ``alpha``) ``n < log2(2/alpha)``: then even ``n`` draws on one class have the two-sided
      p-value :math:`2 \cdot 2^{-n} > \alpha` and every example abstains (at the default
      ``alpha = 0.001``, ``n >= 11``).
      Also an empty batch, NaN/Inf in a concrete ``x``, or logits that are not ``[B, C]`` with
      ``C >= 2``.
    TypeError: an integer ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda v: jnp.concatenate([-v, v], axis=1)  # class 1 iff v > 0
    >>> predict = jax.jit(lambda x, key: jr.certify.smoothed_predict(logits_fn, x, key,
    ...                                                              sigma=0.5))
    >>> predict(jnp.array([[1.0], [0.0]]), jax.random.key(0)).tolist()  # 0: a tie, abstain
    [1, -1]

  References:
    Cohen, Rosenfeld & Kolter, ICML 2019, Algorithm PREDICT.
  """
  _check(sigma, alpha, test="predict", n=n, batch_size=batch_size)
  _check_model_inputs(logits_fn, x)
  keys = like_batch(as_keys(key, x.shape[0]), x)
  counts = class_counts(logits_fn, x, fold_in(keys, PREDICT), sigma, n, min(batch_size, n))
  values, indices = lax.top_k(counts, 2)
  n_a, n_b, top = values[:, 0], values[:, 1], indices[:, 0]
  return jnp.where(significant(n_a, n_b, alpha), top.astype(jnp.int32), -1)


def gaussian_noise(logits_fn: Callable[[Array], Array], sigma: float) -> Callable[..., Array]:
  r"""The base classifier under Gaussian input noise, as a randomized model
  ``noisy(x, keys) = logits_fn(x + sigma * N(0, I))`` (one key per example; the noise is not
  clipped to the box), to attack the *smoothed* classifier empirically:
  ``jr.attacks.eot(jr.attacks.pgd("l2"), samples=S)`` on it averages the logits over ``S`` noise
  draws and judges each point by the majority of the draws, i.e. by a Monte-Carlo estimate of
  :math:`g(x) = \arg\max_c P[f(x + \varepsilon) = c]` (the SmoothAdv attack of Salman et al.,
  2019, on soft logits). Its robust accuracy is an empirical upper bound for the smoothed
  classifier, which :func:`smoothing` bounds from below.

  Raises:
    ValueError: ``sigma`` not a real scalar (a bool, a string, an array of another shape), or a
      readable ``sigma <= 0`` (a traced ``sigma`` is used as given).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> noisy = jr.certify.gaussian_noise(lambda v: v, sigma=0.5)
    >>> keys = jax.random.split(jax.random.key(0), 2)
    >>> noisy(jnp.zeros((2, 3)), keys).shape
    (2, 3)

  References:
    Salman et al., "Provably Robust Deep Learning via Adversarially Trained Smoothed
    Classifiers", NeurIPS 2019.
  """
  _real("sigma", sigma, low=0.0, low_open=True)  # 0: the deterministic model, which eot refuses

  def noisy(x: Array, keys: Array) -> Array:
    noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:], jnp.float32))(keys)
    return logits_fn((x.astype(jnp.float32) + jnp.asarray(sigma, jnp.float32) * noise)
                     .astype(x.dtype))

  return noisy
