"""jaxrobust: empirical adversarial robustness in JAX.

Pure, jit-compiled, vmap-vectorised attacks with exact norm projections feed stateless metric
reducers, so a whole robustness curve compiles into one XLA program.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> import jaxrobust as jr
  >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
  >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])
  >>> run = jax.jit(lambda x, y: jr.run(jr.attacks.pgd("linf"), logits_fn, x, y, jr.Budget(0.2),
  ...                                   jax.random.key(0)))
  >>> run(x, y).success
  Array([ True], dtype=bool)
"""

from jaxrobust import (attacks, certify, interop, losses, metrics, plotting, projections, text,
                       training)
from jaxrobust._types import Attack, AttackResult, Budget, Certificate, Curve, Meter, Suite
from jaxrobust._validation import check_inputs
from jaxrobust._batch import predict
from jaxrobust.curves import (CurveConsistency, curve_consistency, curve_from_norms,
                              robustness_curve)
from jaxrobust.diagnosis import diagnose
from jaxrobust.evaluation import evaluate
from jaxrobust.report import Report
from jaxrobust._run import run

__version__ = "0.1.0"

__all__ = [
    "Attack", "AttackResult", "Budget", "Certificate", "Curve", "CurveConsistency", "Report",
    "Suite",
    "Meter",
    "attacks", "certify", "interop",
    "check_inputs", "curve_consistency", "curve_from_norms", "diagnose", "evaluate",
    "losses", "metrics", "plotting", "predict", "projections", "robustness_curve", "run", "text",
    "training",
]
