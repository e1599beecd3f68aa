r"""Certified robustness: guarantees that hold for every point of a region, not only the ones tried.

An attack that fails to find an adversarial example proves nothing: empirical robust accuracy is
an **upper** bound on the true robust accuracy (a stronger attack can only lower it). A
certificate is a proof that the prediction cannot change anywhere in the region, so certified
accuracy is a **lower** bound; together they bracket the truth,
``certified <= true <= empirical``.

This package bounds any JAX function by interpreting its jaxpr (:mod:`._jaxpr` traces ``fn`` and
inlines ``jit``/custom-derivative sub-jaxprs, evaluating everything that does not depend on the
input, such as eval-mode BatchNorm statistics):

* :func:`interval_bounds` -- interval bound propagation (IBP, Gowal et al. 2018): an interval
  ``[l, u]`` per value, pushed forward; an affine layer maps it by the centre-radius form
  ``W (l + u) / 2 ± |W| (u - l) / 2``, ReLU and other monotone functions by their endpoints.
* :func:`linear_bounds` -- CROWN (Zhang et al. 2018): each output is bounded by a linear function
  of the input, obtained by pulling the output's coefficient back through the network (exactly
  through affine layers, by their vector-Jacobian products; through an unstable ReLU on
  ``[l, u]``, ``l < 0 < u``, by ``α v <= relu(v) <= u (v - l) / (u - l)`` with ``α = 1`` if
  ``u > -l`` else ``0``), then minimised over the box in closed form,
  ``min_x Λᵀx = Σ_i min(Λ_i l_i, Λ_i u_i)``. Intermediate ReLU bounds are CROWN bounds too, and
  every bound is intersected with IBP's, so CROWN is never looser.
* :func:`margin_bounds` -- lower bounds on ``z_y - z_j`` with the margin merged into the last
  affine layers, exact on linear models; a positive bound for every ``j != y`` certifies the box.

Certificates (:class:`jaxrobust.Certificate`) come from :func:`certify_bounds` (the largest eps
whose box :func:`margin_bounds` certifies) or from randomized smoothing (:func:`smoothing`,
:func:`smoothed_predict`); :func:`certified_curve` turns them into a :class:`jaxrobust.Curve`.

Supported primitives: ``dot_general``, ``conv_general_dilated`` (any layout, strides, padding,
dilation, feature groups), ``add``/``sub``/``neg``, products and quotients by constants, ``max``
and ``min`` (ReLU, clipping), ``reshape``/``transpose``/``broadcast_in_dim``/``squeeze``/
``slice``/``dynamic_slice``/``gather`` with constant indices/``concatenate``/``pad``/``rev``/
``select_n`` with a constant predicate, ``reduce_sum``/``reduce_max``/``reduce_min``, average and
max pooling (``reduce_window_sum``/``reduce_window_max``), monotone elementwise functions
(``tanh``, ``logistic``, ``exp``, ``log``, ``log1p``, ``expm1``, ``sqrt``, ``rsqrt``, ``erf``),
positive integer powers and float conversions. Anything else raises one ``NotImplementedError``
naming every such primitive at once (a ``select_n`` whose predicate depends on the input
included). Bounds are computed in float32 at least and are sound for the real-number
computation up to the rounding of the bound arithmetic itself.

Examples:
  >>> import jax.numpy as jnp
  >>> from jaxrobust import certify
  >>> lo, hi = certify.interval_bounds(jnp.tanh, jnp.zeros((1, 2)), jnp.ones((1, 2)))
  >>> hi
  Array([[0.7615942, 0.7615942]], dtype=float32)

References:
  S. Gowal et al. On the effectiveness of interval bound propagation for training verifiably
  robust models. arXiv:1810.12715, 2018.
  H. Zhang, T.-W. Weng, P.-Y. Chen, C.-J. Hsieh, L. Daniel. Efficient neural network robustness
  certification with general activation functions. NeurIPS 2018.
"""

from jaxrobust.certify._certifier import Certifier, bounds_certifier, smoothing_certifier
from jaxrobust.certify._curve import certified_curve
from jaxrobust.certify._interval import interval_bounds
from jaxrobust.certify._linear import linear_bounds
from jaxrobust.certify._margins import margin_bounds
from jaxrobust.certify._radius import certify_bounds
from jaxrobust.certify._smoothing import gaussian_noise, smoothed_predict, smoothing

__all__ = ["Certifier", "bounds_certifier", "certified_curve", "certify_bounds", "gaussian_noise",
           "interval_bounds", "linear_bounds", "margin_bounds", "smoothed_predict", "smoothing",
           "smoothing_certifier"]
