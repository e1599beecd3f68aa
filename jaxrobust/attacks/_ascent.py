r"""Steepest-ascent directions under each norm, batched over examples.

For a gradient :math:`g`, the steepest-ascent direction of unit :math:`\ell_p` norm maximises
:math:`\langle g, d \rangle` subject to :math:`\|d\|_p \le 1`:

* :math:`\ell_\infty`: :math:`d = \operatorname{sign}(g)` (FGSM, Goodfellow et al. 2015);
* :math:`\ell_2`: :math:`d = g / \|g\|_2`;
* :math:`\ell_1`: all mass on the largest :math:`|g_i|`. A single coordinate stalls as soon as it
  hits the box, so PGD uses the sparse variant of Tramèr & Boneh (2019): spread the step evenly
  over the top fraction of coordinates by :math:`|g_i|`, skipping coordinates that the box
  blocks (at ``lower`` with :math:`g_i < 0` or at ``upper`` with :math:`g_i > 0`), as AutoAttack's
  L1 APGD also does.

References:
  Goodfellow, Shlens & Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015.
  Tramèr & Boneh, "Adversarial Training and Robustness for Multiple Perturbations", NeurIPS 2019.
  Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks", ICML 2021.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrobust.attacks._common import expand

Array = jax.Array


def _flat(a: Array) -> Array:
  return a.reshape(a.shape[0], -1)


def l1_topk(num_elements: int, sparsity: float) -> int:
  """How many coordinates one sparse L1 step moves: ``ceil(sparsity * D)``, at least 1."""
  return max(1, min(num_elements, math.ceil(sparsity * num_elements)))


def direction(grad: Array, norm: str, x_adv: Array, lower: Array, upper: Array,
              l1_sparsity: float) -> Array:
  """The unit-norm steepest-ascent direction ``[B, ...]`` (0 where the gradient is 0)."""
  if norm == "linf":
    return jnp.sign(grad)
  if norm == "l2":
    g = _flat(grad)
    n = jnp.sqrt(jnp.sum(g * g, axis=1))
    safe = jnp.where(n > 0, n, 1.0)
    return grad / expand(safe, grad.ndim)
  if norm == "l1":
    g = _flat(grad)
    xa = _flat(x_adv)
    blocked = ((xa <= lower) & (g < 0)) | ((xa >= upper) & (g > 0))
    magnitude = jnp.where(blocked, 0.0, jnp.abs(g))
    k = l1_topk(g.shape[1], l1_sparsity)
    kth = jax.lax.top_k(magnitude, k)[0][:, k - 1:k]
    chosen = (magnitude >= kth) & (magnitude > 0)
    count = jnp.sum(chosen, axis=1, keepdims=True).astype(g.dtype)
    d = jnp.where(chosen, jnp.sign(g), 0.0) / jnp.maximum(count, 1.0)
    return d.reshape(grad.shape)
  # Unreachable through the factories, which validate the norm.
  raise ValueError(f"Unknown norm {norm!r}; supported: 'linf', 'l2', 'l1'.")
