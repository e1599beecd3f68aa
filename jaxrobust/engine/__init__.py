"""The engine: driver machinery every front door shares, below the attacks.

* :mod:`~jaxrobust.engine.attack_loop` -- one attack on one batch: ``init``/``step`` under
  ``lax.scan``, or a suite's members each on the survivors of earlier ones; compaction, honest
  scoring;
* :mod:`~jaxrobust.engine.scoring` -- the clean diagnosis and the score of a returned point;
* :mod:`~jaxrobust.engine.curve_kernel` -- the per-batch curve kernel ``robust_flags`` used by
  :func:`jaxrobust.robustness_curve` and :func:`jaxrobust.evaluate`;
* :mod:`~jaxrobust.engine.compaction` -- compute skipping with static shapes;
* :mod:`~jaxrobust.engine.randomized` -- majority votes and expected gradients of randomized
  models;
* :mod:`~jaxrobust.engine.propagations` -- per-example forward/backward propagation counts and
  the per-example cap on them.

The engine imports nothing from :mod:`jaxrobust.attacks`; attacks (ensembles, suites, EOT) use
the engine. Nothing here is public API: use the front doors.
"""
