"""Bad inputs to the metrics of minimal norms and to the curve functions are refused with a
ValueError that says what was wrong (the observed values or shapes) and how to fix it, instead of
a raw JAX error or a silent NaN; good inputs (``inf`` norms included, Python lists, jitted calls
with traced arguments) still give the documented numbers. Value checks run on concrete inputs
only (inside ``jax.jit`` the values are tracers); shape checks always run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust._validation import check_values

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

NORMS = jnp.array([0.1, 0.2, 0.4, jnp.inf])
CORRECT = jnp.array([True, True, True, False])
EPS = jnp.array([0.0, 0.15, 0.3])
NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------------------------
# The shared check.


def test_check_values_names_the_rule_and_the_offending_entries():
  with pytest.raises(ValueError, match=r"x must be >= 0 \(inf allowed\) and not NaN, got 4 of 5 "
                                       r"entries that do not: x\[0\] = nan, x\[2\] = -1, "
                                       r"x\[3\] = -inf, \.\.\.\. fix it"):
    check_values("x", np.array([NAN, 1.0, -1.0, -INF, NAN]), low=0.0, hint="fix it")
  with pytest.raises(ValueError, match=r"x must not be NaN, got nan\."):
    check_values("x", np.float32(NAN))
  with pytest.raises(ValueError, match=r"x\[1, 0\] = 2"):
    check_values("x", np.array([[0.5], [2.0]]), low=0.0, high=1.0)
  check_values("x", np.array([0.0, INF]), low=0.0)  # inf is inside [0, inf]
  check_values("x", np.array([NAN, 1.0]), low=0.0, where=np.array([False, True]))  # padding
  jax.jit(lambda v: check_values("x", v, low=0.0) or v)(jnp.array([NAN]))  # traced: not read


# ------------------------------------------------------------------------------------------------
# perturbation_quantiles and median_perturbation.


@pytest.mark.parametrize("q, observed", [
    (1.5, "1.5"), (-0.1, "-0.1"), (NAN, "nan"),
    (jnp.array([0.5, 50.0]), r"1 of 2 entries that do not: q\[1\] = 50"),
    ([0.5, NAN], r"1 of 2 entries that do not: q\[1\] = nan"),
])
def test_quantiles_refuse_q_outside_the_unit_interval(q, observed):
  with pytest.raises(ValueError, match=rf"q must lie in \[0, 1\], got {observed}\. .*median is "
                                       r"q=0.5, not 50\.$"):
    jr.metrics.perturbation_quantiles(NORMS, q)


@pytest.mark.parametrize("norms, q, mask, match", [
    (jnp.ones((2, 3)), 0.5, None, r"norms must be a 1-D array \[B\].*got shape \(2, 3\)"),
    (jnp.float32(1.0), 0.5, None, r"norms must be a 1-D array \[B\].*got shape \(\)"),
    (NORMS, jnp.array([[0.1, 0.5]]), None, r"q must be a quantile or a 1-D array \[Q\].*\(1, 2\)"),
    (NORMS, 0.5, jnp.ones(3, bool), r"mask must have shape \(4,\), got \(3,\)"),
    (NORMS, 0.5, jnp.ones((4, 1), bool), r"mask must have shape \(4,\), got \(4, 1\)"),
])
def test_quantiles_refuse_bad_shapes(norms, q, mask, match):
  with pytest.raises(ValueError, match=match):
    jr.metrics.perturbation_quantiles(norms, q, mask)


@pytest.mark.parametrize("bad, shown", [(NAN, "nan"), (-1.0, "-1")])
def test_quantiles_refuse_nan_or_negative_norms_of_selected_rows(bad, shown):
  norms = jnp.array([0.1, bad, 0.3])
  for call in (lambda: jr.metrics.perturbation_quantiles(norms, jnp.array([0.5])),
               lambda: jr.metrics.median_perturbation(norms),
               lambda: jr.metrics.median_perturbation(norms, jnp.array([True, True, False]))):
    with pytest.raises(ValueError, match=rf"norms\[1\] = {shown}\..*inf where no adversarial "
                                         r"point was found.*mask=False"):
      call()
  # A row under mask=False is padding: whatever it holds is not read.
  masked = jr.metrics.median_perturbation(norms, jnp.array([True, False, True]))
  assert float(masked) == pytest.approx(0.2)


def test_quantiles_of_good_inputs_incl_inf_lists_and_jit():
  q = jnp.array([0.0, 0.5, 1.0])
  expected = [0.10000000149011612, 0.30000001192092896, INF]  # float32
  assert jr.metrics.perturbation_quantiles(NORMS, q).tolist() == expected
  assert jr.metrics.perturbation_quantiles([0.1, 0.2, 0.4, INF], [0.0, 0.5, 1.0]).tolist() == \
      expected
  assert float(jr.metrics.median_perturbation(jnp.array([INF, INF, 0.3]))) == INF
  jitted = jax.jit(jr.metrics.perturbation_quantiles)
  assert jitted(NORMS, q, jnp.ones(4, bool)).tolist() == expected
  assert float(jax.jit(jr.metrics.median_perturbation)(NORMS)) == pytest.approx(0.3)
  # Traced values are not read (no ConcretizationTypeError): what jnp.nanquantile makes of them.
  assert float(jitted(NORMS, jnp.float32(1.0))) == INF
  assert np.isnan(float(jitted(jnp.array([NAN, NAN]), jnp.float32(0.5))))


def test_quantiles_of_nothing_are_nan_of_the_shape_of_q():
  for norms, mask in ((jnp.zeros((0,)), None), (jnp.zeros((0,)), jnp.zeros((0,), bool)),
                      (NORMS, jnp.zeros(4, bool))):
    got = jr.metrics.perturbation_quantiles(norms, jnp.array([0.25, 0.5]), mask)
    assert got.shape == (2,) and got.dtype == jnp.float32 and np.isnan(got).all()
    assert np.isnan(float(jr.metrics.median_perturbation(norms, mask)))
  assert np.isnan(float(jax.jit(jr.metrics.median_perturbation)(jnp.zeros((0,)))))
  with pytest.raises(ValueError, match="q must lie"):  # q is still checked
    jr.metrics.perturbation_quantiles(jnp.zeros((0,)), 2.0)


# ------------------------------------------------------------------------------------------------
# CurveCounts and NormHistogram.


@pytest.mark.parametrize("size", [-1, 2.5, 2.0, True, "3", None])
def test_empty_refuses_sizes_that_are_not_ints(size):
  with pytest.raises(ValueError, match=rf"num_eps must be an int >= 0, got {size!r}\."):
    jr.metrics.CurveCounts.empty(size)
  with pytest.raises(ValueError, match=rf"num_edges must be an int >= 0, got {size!r}\."):
    jr.metrics.NormHistogram.empty(size)


def test_empty_of_good_sizes_is_the_identity_of_merge():
  assert jr.metrics.CurveCounts.empty(np.int64(3)).robust.shape == (3,)
  assert jr.metrics.CurveCounts.empty(0).robust.shape == (0,)
  h = jr.metrics.NormHistogram.from_batch(NORMS, CORRECT, EPS)
  merged = jr.metrics.NormHistogram.empty(3).merge(h)
  assert isinstance(merged, jr.metrics.NormHistogram)
  jax.tree.map(np.testing.assert_array_equal, merged, h)


@pytest.mark.parametrize("make, name", [
    (lambda norms, edges, mask: jr.metrics.CurveCounts.from_norms(norms, CORRECT, edges, mask),
     "epsilons"),
    (lambda norms, edges, mask: jr.metrics.NormHistogram.from_batch(norms, CORRECT, edges, mask),
     "edges"),
], ids=["from_norms", "from_batch"])
def test_counts_from_norms_refuse_nan_or_negative_values(make, name):
  for edges, shown in (([0.0, NAN], rf"{name}\[1\] = nan"), ([-0.1, 0.1], rf"{name}\[0\] = -0.1")):
    with pytest.raises(ValueError, match=rf"{name} must be >= 0 \(inf allowed\).*{shown}\."):
      make(NORMS, jnp.array(edges), None)
  mask = jnp.array([True, True, False, True])
  for bad in (NAN, -0.5):
    norms = NORMS.at[2].set(bad)
    with pytest.raises(ValueError, match=r"norms\[2\] = .*padded rows belong under mask=False"):
      make(norms, EPS, None)
    # Under mask=False the row is padding: not read, not counted.
    got = make(norms, EPS, mask)
    assert (int(got.n), int(got.correct)) == (3, 2)
    assert got.robust.tolist() == [2, 1, 0]  # 0.1 and 0.2 > 0; 0.2 > 0.15; none > 0.3


def test_counts_from_norms_refuse_mismatched_shapes_naming_them():
  from_norms, from_batch = jr.metrics.CurveCounts.from_norms, jr.metrics.NormHistogram.from_batch
  with pytest.raises(ValueError, match=r"got norms \(4,\), correct \(3,\), epsilons \(3,\)"):
    from_norms(NORMS, CORRECT[:3], EPS)
  with pytest.raises(ValueError, match=r"got norms \(4, 1\), correct \(4,\), epsilons \(3,\)"):
    from_norms(NORMS[:, None], CORRECT, EPS)
  with pytest.raises(ValueError, match=r"epsilons \[K\]; got .* epsilons \(\)"):
    from_norms(NORMS, CORRECT, 0.1)
  with pytest.raises(ValueError, match=r"edges \[E\]; got norms \(4,\), correct \(2,\), edges"):
    from_batch(NORMS, CORRECT[:2], EPS)
  with pytest.raises(ValueError, match=r"mask must have shape \(4,\), got \(3,\)"):
    from_batch(NORMS, CORRECT, EPS, jnp.ones(3, bool))
  with pytest.raises(ValueError, match=r"robust must be \[K, B\] and correct \[B\].*got robust "
                                       r"\(2, 3\), correct \(4,\)"):
    jr.metrics.CurveCounts.from_flags(jnp.ones((2, 3), bool), CORRECT)
  with pytest.raises(ValueError, match=r"got robust \(4,\), correct \(4,\)"):
    jr.metrics.CurveCounts.from_flags(CORRECT, CORRECT)


def test_counts_of_good_inputs_incl_inf_lists_and_jit():
  eps = jnp.array([0.0, 0.15, 0.3, INF])
  eager = jr.metrics.NormHistogram.from_batch(NORMS, CORRECT, eps)
  assert (int(eager.n), int(eager.correct), eager.robust.tolist()) == (4, 3, [3, 2, 1, 0])
  listed = jr.metrics.NormHistogram.from_batch([0.1, 0.2, 0.4, INF], [True, True, True, False],
                                               [0.0, 0.15, 0.3, INF])
  jax.tree.map(np.testing.assert_array_equal, listed, eager)
  jitted = jax.jit(jr.metrics.NormHistogram.from_batch)(NORMS, CORRECT, eps, jnp.ones(4, bool))
  jax.tree.map(np.testing.assert_array_equal, jitted, eager)
  traced = jax.jit(jr.metrics.CurveCounts.from_norms)(NORMS.at[0].set(NAN), CORRECT, eps)
  assert int(traced.n) == 4  # traced NaN: not read, and no ConcretizationTypeError
  counts = jr.metrics.CurveCounts.from_norms(NORMS, CORRECT, eps)
  assert counts.compute(eps)["robust_accuracy"].tolist() == [0.75, 0.5, 0.25, 0.0]


# ------------------------------------------------------------------------------------------------
# curve_from_norms and curve_consistency.


@pytest.mark.parametrize("norms, eps, match", [
    (NORMS, [0.0, NAN], r"epsilons must be >= 0 \(inf allowed\).*epsilons\[1\] = nan\."),
    (NORMS, [-0.1, 0.1], r"epsilons must be >= 0.*epsilons\[0\] = -0.1\."),
    (NORMS.at[1].set(NAN), EPS, r"norms must be >= 0.*norms\[1\] = nan\. .*as jr.run reports\.$"),
    (NORMS.at[3].set(-INF), EPS, r"norms\[3\] = -inf\."),
])
def test_curve_from_norms_refuses_nan_or_negative_values(norms, eps, match):
  with pytest.raises(ValueError, match=match):
    jr.curve_from_norms(norms, CORRECT, jnp.array(eps))


def test_curve_from_norms_of_good_inputs_incl_inf_lists_int_flags_and_jit():
  eps = jnp.array([0.0, 0.15, 0.3, INF])
  curve = jr.curve_from_norms(NORMS, CORRECT, eps)
  assert curve.robust_accuracy.tolist() == [0.75, 0.5, 0.25, 0.0]
  listed = jr.curve_from_norms([0.1, 0.2, 0.4, INF], [1, 1, 1, 0], [0.0, 0.15, 0.3, INF])
  np.testing.assert_array_equal(listed.robust, curve.robust)
  jitted = jax.jit(jr.curve_from_norms)(NORMS, CORRECT, eps)
  np.testing.assert_array_equal(jitted.robust, curve.robust)
  assert float(jitted.auc) == float(curve.auc)
  jax.jit(jr.curve_from_norms)(NORMS.at[0].set(NAN), CORRECT, EPS)  # traced: not read
  with pytest.raises(ValueError, match=r"norms \(3,\), correct \(4,\)"):  # shapes: even traced
    jax.jit(jr.curve_from_norms)(NORMS[:3], CORRECT, EPS)


def test_curve_consistency_refuses_norms_of_other_examples_naming_shapes():
  curve = jr.curve_from_norms(NORMS, CORRECT, EPS)  # robust [3, 4]
  for norms, correct, observed in ((NORMS[:3], CORRECT[:3], r"norms \(3,\), correct \(3,\)"),
                                   (NORMS, CORRECT[:3], r"norms \(4,\), correct \(3,\)"),
                                   (NORMS[None], CORRECT, r"norms \(1, 4\), correct \(4,\)")):
    with pytest.raises(ValueError, match=rf"curve.robust is \[K, B\].*got {observed}, "
                                         r"curve.robust \(3, 4\), curve.epsilons \(3,\)\.$"):
      jr.curve_consistency(norms, correct, curve)
  with pytest.raises(ValueError, match=r"norms \(4,\).*curve.robust \(3, 3\)"):  # traced too
    jax.jit(jr.curve_consistency)(NORMS, CORRECT, curve._replace(robust=curve.robust[:, :3]))
  no_flags = curve._replace(robust=np.zeros((3, 0), bool))  # a Report's curve without them
  with pytest.raises(ValueError, match=r"curve.robust \(3, 0\).*keep_per_example=True"):
    jr.curve_consistency(NORMS, CORRECT, no_flags)
  with pytest.raises(TypeError, match="curve must be a jaxrobust.Curve.*got tuple"):
    jr.curve_consistency(NORMS, CORRECT, tuple(curve))
  with pytest.raises(ValueError, match=r"norms\[0\] = nan"):
    jr.curve_consistency(NORMS.at[0].set(NAN), CORRECT, curve)


def test_curve_consistency_of_good_inputs_incl_inf_lists_and_jit():
  eps = jnp.array([0.1, 0.2])
  curve = jr.curve_from_norms(jnp.array([0.15, 0.5, INF]), jnp.array([True, True, True]), eps)
  norms = jnp.array([0.15, 0.18, INF])
  eager = jr.curve_consistency(norms, jnp.array([True, True, True]), curve)
  assert (eager.norm_attack_weaker.tolist(), eager.budget_attack_weaker.tolist()) == \
      ([0, 0], [0, 1])
  listed = jr.curve_consistency([0.15, 0.18, INF], [1, 1, 1], curve)
  jax.tree.map(np.testing.assert_array_equal, listed, eager)
  jitted = jax.jit(jr.curve_consistency)(norms, jnp.array([True, True, True]), curve)
  jax.tree.map(np.testing.assert_array_equal, jitted, eager)


def test_a_float_mask_is_refused_not_read_as_weights():
  """``mask=[0.5, 1.0]`` would count the first row in full: masks select rows, never weigh
  them. Bool and 0/1 integer masks give the same counts."""
  norms, correct = jnp.array([0.1, 0.3]), jnp.array([True, True])
  with pytest.raises(TypeError, match="mask must be a bool"):
    jr.metrics.CurveCounts.from_norms(norms, correct, jnp.array([0.2]), mask=jnp.array([0.5, 1.0]))
  with pytest.raises(TypeError, match="mask must be a bool"):
    jr.metrics.median_perturbation(norms, mask=np.array([0.0, 1.0]))
  by_bool = jr.metrics.CurveCounts.from_norms(norms, correct, jnp.array([0.2]),
                                           mask=jnp.array([False, True]))
  by_int = jr.metrics.CurveCounts.from_norms(norms, correct, jnp.array([0.2]), mask=np.array([0, 1]))
  assert int(by_bool.n) == int(by_int.n) == 1 and by_bool.robust.tolist() == by_int.robust.tolist()
