r"""Ensemble members run one after another, each on the points the earlier ones left robust.

For members :math:`A_1..A_M` and the rows to attack :math:`T`, member :math:`m` attacks
:math:`T \setminus \bigcup_{l<m} S_l` (:math:`S_l` the rows member :math:`l` broke) and the
result keeps, per row, the first successful adversarial point. This is the engine behind
:func:`jaxrobust.attacks.ensemble` and :func:`jaxrobust.attacks.auto_attack`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxrobust._batch import expand
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget
from jaxrobust.engine.attack_loop import run_attack

Array = jax.Array


def run_members(members: Sequence[Attack], logits_fn: Callable[..., Array], x: Array, y: Array,
                budget: Budget, keys: Array, target: Array | None, todo: Array,
                options: RunOptions) -> tuple[Array, Array]:
  """``(x_adv, robust_after [M, B])``: the first success per row (``x`` where none), and the
  rows of ``todo`` still robust after members ``1..m``.

  Every member gets the same per-example ``keys``, so a member computes on the rows it attacks
  exactly what it computes alone: the ensemble is never weaker than any member run alone.
  Every member runs with the ensemble's ``options`` (early exit, compaction), except that it
  scores only the rows it attacked, leaves canonical convolutions to the outer run and runs its
  own loop with ``unroll=1`` (:func:`jaxrobust.engine.attack_loop.run_attack`).
  """
  options = options.replace(unroll=1, score_skipped_rows=False, canonical=False)
  alive = todo
  x_adv = x
  robust_after = []
  everyone = jnp.ones_like(todo)
  for member in members:  # static: the members are configuration
    result, _ = run_attack(member, logits_fn, x, y, budget, keys, target,
                           options=options, clean_correct=everyone, active=alive)
    newly = alive & result.success
    x_adv = jnp.where(expand(newly, x.ndim), result.x_adv, x_adv)
    alive = alive & ~result.success
    robust_after.append(alive)
  return x_adv, jnp.stack(robust_after)
