r"""The one attack loop: a single attack's ``init``/``step``/``finalize`` under ``lax.scan``, or a
suite's members one after another, optionally compacted to the rows still to attack, then
scored honestly.

Every front door runs attacks through :func:`run_attack`: :func:`jaxrobust.run` (one budget),
the curve kernel (:mod:`jaxrobust.engine.curve_kernel`, one run per eps), the members of a
suite (:func:`run_suite`) and :func:`jaxrobust.evaluate`. How it runs (early exit, compaction,
unrolling, scoring, canonical convolutions) is one :class:`~jaxrobust._options.RunOptions`,
``options``.

A suite (:class:`jaxrobust.Suite`: ensembles, AutoAttack) with members :math:`A_1..A_M` and
rows to attack :math:`T` runs member :math:`m` on :math:`T \setminus \bigcup_{l<m} S_l`
(:math:`S_l` the rows member :math:`l` broke) and keeps, per row, the first successful
adversarial point (:func:`run_members`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._batch import as_keys, expand, like_batch, work_dtype
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, AttackResult, Budget, Suite, as_budget
from jaxrobust._validation import logits_shape
from jaxrobust.metrics import checks as checks_lib
from jaxrobust.engine import canonical_conv, compaction, early_exit as early_exit_lib
from jaxrobust.engine import propagations
from jaxrobust.engine.scoring import CleanFindings, clean_diagnosis, score

Array = jax.Array


def _zero_logits(logits_fn: Callable[..., Array], x: Array) -> Array:
  """Zeros shaped like ``logits_fn(x)``, built from ``x`` so they carry its batch sharding."""
  shape = jax.eval_shape(logits_fn, x)
  column = (x.reshape(x.shape[0], -1)[:, :1] * 0).astype(shape.dtype)  # [B, 1], x is finite
  return column + jnp.zeros((1,) + shape.shape[1:], shape.dtype)


def attack_rows(attack: Attack, logits_fn: Callable[..., Array], lower, upper,
                options: RunOptions, *, meter: bool = False) -> Callable[..., Any]:
  """``(x, y, eps, keys, target) -> x_adv``: the attack's ``init``, ``num_steps`` ``step``\\ s
  under one ``lax.scan`` (unrolled by ``options.unroll``), and ``finalize``, on rows that are
  independent of each other.

  With ``meter`` it takes ``limit`` too (``[B]`` int32 steps allowed per row, or ``None``; for an
  attack with a :class:`~jaxrobust._types.Meter`, propagations allowed for its steps) and
  returns ``(x_adv, tally)``, the steps each row ran or what they spent
  (:func:`jaxrobust.engine.propagations.tally`)."""

  def rows(x, y, eps, keys, target, limit=None):
    budget = Budget(eps, lower, upper)
    kernel = propagations.metered_kernel(attack, early_exit_lib.freeze) if meter else attack

    def body(state, _):
      return kernel.step(logits_fn, state, x, y, budget, target), None

    state = attack.init(logits_fn, x, y, budget, keys, target)
    if meter:
      state = propagations.start(state, x, limit, attack)
    state, _ = jax.lax.scan(body, state, None, length=attack.num_steps, unroll=options.unroll)
    inner = state.state if meter else state
    x_adv = attack.finalize(logits_fn, inner, x, y, budget, target).astype(x.dtype)
    return (x_adv, propagations.tally(attack, state)) if meter else x_adv

  return rows


def run_attack(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
               budget: Budget, key: Array, target: Array | None = None, *,
               options: RunOptions, clean_correct: Array | None = None,
               findings: CleanFindings | None = None, active: Array | None = None,
               max_propagations: Array | None = None) -> tuple[AttackResult, Array]:
  """:func:`jaxrobust.run` without input validation, and ``broken`` (``[B]`` bool).

  ``broken`` says the point is not robust: the clean prediction or the prediction on ``x_adv``
  is not ``y``. For untargeted attacks it equals ``success``; for targeted ones a point can be
  broken without the target being reached.

  Drivers that have them already pass ``clean_correct`` (``[B]`` bool) and ``findings``
  (:func:`jaxrobust.engine.scoring.clean_diagnosis`), saving a forward and a backward pass per
  call. ``active`` (``[B]`` bool) restricts the attack to some rows (the others get
  ``x_adv = x``). ``max_propagations`` (``None``, or an int, ``[]`` or ``[B]``, data) caps each
  row's forward plus backward propagations (:mod:`jaxrobust.engine.propagations`); the counts
  are ``info["propagations"]`` wherever the attack's cost per step is fixed.

  ``options`` (every caller states them: the front doors their users', the training losses the
  dense, differentiable scan) say how it runs: early exit (for attacks that declare ``done``,
  unless ``unroll=True``), compaction, scoring of skipped rows, canonical convolutions
  (:class:`~jaxrobust._options.RunOptions`): they choose the program, not the verdicts.
  """
  rows = dict(clean_correct=clean_correct, findings=findings, active=active,
              max_propagations=max_propagations)
  run = lambda: _run_attack(attack, logits_fn, x, y, budget, key, target, options=options,
                            **rows)
  if not options.canonical or attack.samples:  # a randomized model takes keys: left as it is
    return run()
  return canonical_conv.on_cpu_canonical(run, logits_fn, x)


def _all_infinite(eps) -> bool:
  """Whether ``eps`` is known while tracing to be ``inf`` everywhere (a traced eps: False)."""
  try:
    return bool(np.all(np.isinf(np.asarray(eps))))
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
    return False


def _run_attack(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
                budget: Budget, key: Array, target: Array | None = None, *,
                options: RunOptions, clean_correct: Array | None, findings: CleanFindings | None,
                active: Array | None, max_propagations: Array | None
                ) -> tuple[AttackResult, Array]:
  budget = as_budget(budget)
  x_input = x
  x = x.astype(work_dtype(x))
  batch = x.shape[0]
  keys = like_batch(as_keys(key, batch), x)
  if clean_correct is None:
    clean_correct, checked = clean_diagnosis(attack.samples, logits_fn, x_input, y, keys)
    findings = checked if findings is None else findings
  todo = clean_correct if active is None else clean_correct & active
  eps = like_batch(jnp.broadcast_to(jnp.asarray(budget.eps, x.dtype), (batch,)), x)
  if not attack.samples:
    # A ball of radius 0 holds only x: its verdict is the clean one, so those rows cost nothing
    # (a curve's grid usually starts at 0). A randomized model is still re-scored there.
    todo = todo & (eps > 0)
  info = {}
  if attack.suite is not None:
    x_adv, info = run_suite(attack.suite, attack.samples, logits_fn, x, y, budget, keys, target,
                            todo, options=options,
                            active=jnp.ones_like(todo) if active is None else active,
                            max_propagations=max_propagations)
  elif attack.drive is not None:  # the protocol suites replaced (jr.Attack.drive)
    if max_propagations is not None:
      raise ValueError(f"max_propagations cannot cap {attack.name!r}, which drives its own loop "
                       "(jr.Attack.drive).")
    x_adv, info = attack.drive(logits_fn, x, y, budget, keys, target, todo, options.chunk_size)
    info = dict(info or {})
  else:
    costs = propagations.measure(attack, logits_fn, x, y, Budget(eps, budget.lower, budget.upper),
                                 keys, target)
    meter, limit = costs is not None, None
    if max_propagations is not None:
      if not meter:
        raise ValueError(f"max_propagations needs an attack whose propagations per step are "
                         f"fixed; {attack.name!r} calls the model a data-dependent number of "
                         "times (see jaxrobust.engine.propagations).")
      if attack.meter is not None and attack.meter.cap is None:
        raise ValueError(f"max_propagations cannot cap {attack.name!r}: it counts its "
                         "propagations (info['propagations']) but takes no cap (jr.Meter.cap is "
                         "None).")
      cap = like_batch(jnp.broadcast_to(jnp.asarray(max_propagations), (batch,)), x)
      limit, affordable = propagations.limits(attack, costs, cap)
      todo = todo & affordable
    rows = attack_rows(attack, logits_fn, budget.lower, budget.upper, options, meter=meter)
    exits = (options.early_exit and attack.done is not None and attack.num_steps > 0
             and options.unroll is not True)
    if (exits and attack.minimum_norm and not attack.done_unbounded
        and _all_infinite(budget.eps)):
      exits = False  # a minimum-norm search: no row is ever done, so the plain scan
    if exits:
      until_done = lambda frozen, x, y, eps, keys, target, limit: early_exit_lib.run_until_done(
          attack, logits_fn, x, y, eps, keys, target, frozen, limit, lower=budget.lower,
          upper=budget.upper, options=options, meter=meter)
      if options.chunk_size is not None and compaction.batch_axis(todo) is not None:
        # Per device (shard_map): each device re-compacts its own rows every segment.
        out = compaction.per_device(lambda todo, *rows: until_done(~todo, *rows), todo, x, y,
                                    eps, keys, target, limit)
      else:
        out = until_done(~todo, x, y, eps, keys, target, limit)
    elif options.chunk_size is None:
      out = rows(x, y, eps, keys, target, limit)
    else:
      out = compaction.compacted(rows, todo, options.chunk_rows(batch, exits=False), x, y, eps,
                                 keys, target, limit)
    x_adv = out
    if meter:
      x_adv, tally = out
      info["propagations"] = propagations.spent(costs, tally, todo)
  logits_of_todo = None
  if options.early_exit and not options.score_skipped_rows and not attack.samples:
    chunk = options.chunk_rows(batch)
    flops = functools.partial(early_exit_lib.model_flops, attack, logits_fn, x)
    if early_exit_lib.compacts(options, todo, chunk, flops):
      whole = early_exit_lib.whole_when_crowded(options, batch, chunk)
      logits_of_todo = lambda x_adv: compaction.map_rows(
          lambda _, rows: logits_fn(rows), todo, chunk, (x_adv,), whole_when_crowded=whole)
    else:  # no row moves; still no model evaluation when no row was attacked
      logits_of_todo = lambda x_adv: jax.lax.cond(jnp.any(todo), logits_fn,
                                                  functools.partial(_zero_logits, logits_fn),
                                                  x_adv)
  return score(attack, logits_fn, x_input, x, x_adv, y, budget, keys, target, todo=todo,
               clean_correct=clean_correct, findings=findings, info=info,
               logits_of_todo=logits_of_todo, active=active)


def check_members(attacks: Sequence[Attack]) -> None:
  """Members must be attacks with one norm, one ``targeted`` setting and one kind of model."""
  if not attacks:
    raise ValueError("ensemble() needs at least one attack.")
  for attack in attacks:
    if not isinstance(attack, Attack):
      raise TypeError(f"ensemble() members must be jr.Attack objects, got {type(attack).__name__}.")
  norms = sorted({a.norm for a in attacks})
  if len(norms) > 1:
    raise ValueError(f"ensemble() members must share one norm, got {norms} "
                     f"({', '.join(a.name for a in attacks)}).")
  if len({a.targeted for a in attacks}) > 1:
    raise ValueError("ensemble() members must be all targeted or all untargeted.")
  if len({a.samples > 0 for a in attacks}) > 1:
    raise ValueError("ensemble() members must all attack a deterministic logits_fn(x) or all a "
                     "randomized logits_fn(x, keys) (wrap each member with jr.attacks.eot).")


def run_suite(suite: Suite, samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
              budget: Budget, keys: Array, target: Array | None, todo: Array, *,
              options: RunOptions, active: Array | None = None,
              max_propagations: Array | None = None) -> tuple[Array, dict]:
  """``(x_adv, info)`` of a suite on the rows ``todo``: its members (chosen for the model's
  class count) by :func:`run_members`, ``info["robust_after"]`` (``[M, B]``) and its checks
  (``info["flags"]``, ``info["counts"]``, :func:`jaxrobust.metrics.checks.as_info`).

  ``samples`` is the suite's attack's (``> 0``: a randomized ``logits_fn(x, keys)``); ``active``
  the rows that are data, not padding (``None``: all), for the checks. ``info["propagations"]``
  sums the members' (where every member's is counted); ``max_propagations`` caps that sum.
  """
  if suite.check_input is not None:
    suite.check_input(x)
  members = list(suite.members(logits_shape(logits_fn, x, samples)[-1]))
  check_members(members)
  budget = as_budget(budget)
  x_adv, robust_after, spent = run_members(members, logits_fn, x, y, budget, keys, target, todo,
                                           options, max_propagations)
  info = {"robust_after": robust_after}
  if spent is not None:
    info["propagations"] = spent
  if suite.checks is not None:
    info.update(checks_lib.as_info(suite.checks(logits_fn, x, y, budget, keys, target, todo,
                                                robust_after, members, active=active)))
  return x_adv, info


def run_members(members: Sequence[Attack], logits_fn: Callable[..., Array], x: Array, y: Array,
                budget: Budget, keys: Array, target: Array | None, todo: Array,
                options: RunOptions, max_propagations: Array | None = None
                ) -> tuple[Array, Array, dict | None]:
  """``(x_adv, robust_after [M, B], spent)``: the first success per row (``x`` where none), the
  rows of ``todo`` still robust after members ``1..m``, and the propagations the members spent
  per row (``{"forward", "backward"}``, ``[B]`` each; ``None`` where a member's are not counted).
  With ``max_propagations`` each member may spend what the earlier ones left of the cap.

  Every member gets the same per-example ``keys``, so a member computes on the rows it attacks
  exactly what it computes alone: the suite is never weaker than any member run alone.
  Every member runs with the suite's ``options`` (early exit, compaction), except that it
  scores only the rows it attacked, leaves canonical convolutions to the outer run and runs its
  own loop with ``unroll=1``.
  """
  options = options.replace(unroll=1, score_skipped_rows=False, canonical=False)
  alive = todo
  x_adv = x
  robust_after = []
  everyone = jnp.ones_like(todo)
  zeros = jnp.zeros_like(todo, jnp.int32)
  spent = {"forward": zeros, "backward": zeros}
  for member in members:  # static: the members are configuration
    left = (None if max_propagations is None
            else max_propagations - spent["forward"] - spent["backward"])
    result, _ = run_attack(member, logits_fn, x, y, budget, keys, target,
                           options=options, clean_correct=everyone, active=alive,
                           max_propagations=left)
    newly = alive & result.success
    x_adv = jnp.where(expand(newly, x.ndim), result.x_adv, x_adv)
    alive = alive & ~result.success
    robust_after.append(alive)
    counted = result.info.get("propagations")
    spent = None if spent is None or counted is None else jax.tree.map(jnp.add, spent, counted)
  return x_adv, jnp.stack(robust_after), spent
