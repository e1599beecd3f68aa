r"""Per-example worst case over several attacks, each later member attacking only survivors.

For attacks :math:`A_1, \dots, A_M` a point :math:`x` with label :math:`y` is robust when it is
classified correctly and no member finds an adversarial point for it:

.. math::
   \text{robust}(x) = [f(x) = y] \wedge \bigwedge_{m=1}^{M} \neg\,\text{success}_m(x),
   \qquad \text{robust accuracy} = \frac1N \sum_x \text{robust}(x),

the mean over points of the minimum over attacks, never the minimum over attacks of the mean
(Carlini et al. 2019). Member :math:`m` runs only on the points members :math:`1..m-1` left
robust; the returned point is the first successful adversarial found (``x`` itself where none
was). ``AttackResult.info["robust_after"]`` (``[M, B]``) holds the robust flags after each member,
so ``info["robust_after"].mean(axis=1)`` is the per-attack breakdown AutoAttack logs.

Every member receives the same per-example keys as the ensemble, so a member inside the ensemble
computes exactly what it computes alone on the points it attacks: the ensemble's robust accuracy
is at most every member's, as a property and not only in expectation.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax

from jaxrobust._batch import work_dtype
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget, Suite
from jaxrobust.engine.attack_loop import check_members, run_suite
from jaxrobust.engine.scoring import clean_correct_mask

Array = jax.Array

MembersFn = Callable[[int], Sequence[Attack]]
"""``num_classes -> members``: lets a suite choose members once the model's class count is known."""


class EnsembleState(NamedTuple):
  """The (trivial) scan carry: the suite does its work in ``init`` (it has no steps)."""

  x_adv: Array


def build(members_fn: MembersFn, *, norm: str, targeted: bool, samples: int, name: str,
          checks: Callable[..., dict] | None = None,
          check_input: Callable[[Array], None] | None = None) -> Attack:
  """The :class:`~jaxrobust.Attack` of a suite (:class:`~jaxrobust.Suite`) whose members may
  depend on the class count.

  The engine runs the suite (:func:`jaxrobust.engine.attack_loop.run_suite`); ``init`` runs it in
  one go (no early exit, no compaction), so that the attack also works in a user's own
  ``init``/``step``/``finalize`` loop, where ``step`` does nothing.
  """
  suite = Suite(members_fn, checks, check_input)
  whole = RunOptions(early_exit=False, chunk_size=None, canonical=False)

  def init(logits_fn, x, y, budget, keys, target=None):
    x = x.astype(work_dtype(x))
    todo = clean_correct_mask(samples, logits_fn, x, y, keys)
    x_adv, _ = run_suite(suite, samples, logits_fn, x, y, Budget(*budget), keys, target, todo,
                         options=whole)
    return EnsembleState(x_adv)

  def step(logits_fn, state, x, y, budget, target=None):
    del logits_fn, x, y, budget, target
    return state

  def finalize(logits_fn, state, x, y, budget, target=None):
    del logits_fn, x, y, budget, target
    return state.x_adv

  return Attack(init=init, step=step, finalize=finalize, num_steps=0, norm=norm,
                targeted=targeted, minimum_norm=False, name=name, samples=samples, suite=suite)


def ensemble(*attacks: Attack, name: str | None = None) -> Attack:
  r"""The per-example worst case over ``attacks``; later members attack only points still robust.

  A point counts as broken as soon as one member succeeds on it (a minimum-norm member succeeds
  when it finds a point within ``budget.eps``). The returned point is the first successful
  adversarial found, or ``x`` where every member failed. ``jr.run(...).info["robust_after"]`` is
  ``[M, B]``: the robust flags after members ``1..m``, whose means are the per-attack breakdown.

  Members run one after another, with the run's options (early exit, ``chunk_size``:
  :class:`jaxrobust._options.RunOptions`), so that points broken by an earlier member (or at a
  smaller eps of a curve) cost close to nothing. ``jax.grad`` through a result computed with
  ``chunk_size`` or early exit raises as soon as a member's point depends differentiably on what
  is differentiated (FAB's projections, L2 steps). Every member gets the ensemble's per-example
  keys unchanged, so the ensemble's robust accuracy is never above any member's run alone with
  the same key.

  Args:
    *attacks: :class:`jaxrobust.Attack` objects with one norm, all untargeted or all targeted.
    name: the ensemble's name (default: the members' names joined by ``" -> "``).

  Returns:
    A fixed-budget :class:`jaxrobust.Attack` whose ``suite`` the engine runs (``num_steps = 0``:
    in a user's own scan it does its work in ``init``).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.9, 0.1]]), jnp.array([0, 0])  # Linf distances 0.1, 0.4
    >>> attack = jr.attacks.ensemble(jr.attacks.fgsm(), jr.attacks.pgd(steps=10))
    >>> result = jr.run(attack, logits_fn, x, y, jr.Budget(0.2), jax.random.key(0))
    >>> result.success.tolist(), result.info["robust_after"].tolist()
    ([True, False], [[False, True], [False, True]])

  References:
    Carlini, Athalye, Papernot, Brendel, Rauber, Tsipras, Goodfellow, Madry & Kurakin, "On
    Evaluating Adversarial Robustness", arXiv:1902.06705, 2019 (per-example worst case).
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020.
  """
  check_members(attacks)
  members = tuple(attacks)
  return build(lambda num_classes: members, norm=members[0].norm, targeted=members[0].targeted,
               samples=max(a.samples for a in members),
               name=name or " -> ".join(a.name for a in members))
