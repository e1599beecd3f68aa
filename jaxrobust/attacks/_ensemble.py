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
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import logits_shape
from jaxrobust.engine.members import run_members
from jaxrobust.engine.scoring import clean_correct_mask

Array = jax.Array

MembersFn = Callable[[int], Sequence[Attack]]
"""``num_classes -> members``: lets a suite choose members once the model's class count is known."""


class EnsembleState(NamedTuple):
  """The (trivial) scan carry: the ensemble does its work in ``init`` (it has no steps)."""

  x_adv: Array


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


def build(members_fn: MembersFn, *, norm: str, targeted: bool, samples: int, name: str,
          extra_info: Callable[..., dict] | None = None,
          check_input: Callable[[Array], None] | None = None) -> Attack:
  """The :class:`~jaxrobust.Attack` of an ensemble whose members may depend on the class count.

  ``extra_info(logits_fn, x, y, budget, keys, target, todo, robust_after, members, active=)``
  may add entries (e.g. reliability flags) to ``AttackResult.info``; ``active`` is the rows of
  the batch that are data (not padding), as the driver passes them. ``check_input(x)`` may raise for
  inputs a member cannot take, before any member is traced (so that the error speaks about the
  user's whole batch, not a chunk of it, and comes before minutes of tracing).
  """

  def drive(logits_fn, x, y, budget, keys, target, todo, chunk_size=None, *, active=None,
            early_exit=False, options=None):
    # The engine passes its options; a direct call (init below, or a user's) gives the drive
    # protocol's chunk_size and early_exit (jr.Attack.drive).
    if options is None:
      options = RunOptions(early_exit=early_exit, chunk_size=chunk_size, canonical=False)
    if check_input is not None:
      check_input(x)
    num_classes = logits_shape(logits_fn, x, samples)[-1]
    members = list(members_fn(num_classes))
    check_members(members)
    x_adv, robust_after = run_members(members, logits_fn, x, y, Budget(*budget), keys, target,
                                      todo, options)
    info = {"robust_after": robust_after}
    if extra_info is not None:
      info.update(extra_info(logits_fn, x, y, Budget(*budget), keys, target, todo, robust_after,
                             members, active=active))
    return x_adv, info

  drive.takes_active = True  # the engine passes active= (the rows that are data) to this drive
  drive.takes_options = True  # ... and the run's RunOptions as options= (members exit early)
  drive.takes_early_exit = True  # the older protocol (early_exit=), for callers that look for it

  def init(logits_fn, x, y, budget, keys, target=None):
    x = x.astype(work_dtype(x))
    todo = clean_correct_mask(samples, logits_fn, x, y, keys)
    x_adv, _ = drive(logits_fn, x, y, budget, keys, target, todo, None)
    return EnsembleState(x_adv)

  def step(logits_fn, state, x, y, budget, target=None):
    del logits_fn, x, y, budget, target
    return state

  def finalize(logits_fn, state, x, y, budget, target=None):
    del logits_fn, x, y, budget, target
    return state.x_adv

  return Attack(init=init, step=step, finalize=finalize, num_steps=0, norm=norm,
                targeted=targeted, minimum_norm=False, name=name, drive=drive, samples=samples)


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
    A fixed-budget :class:`jaxrobust.Attack` (``num_steps = 0``: it does its work in ``init``, or
    in ``drive`` when run by :func:`jaxrobust.run`).

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
