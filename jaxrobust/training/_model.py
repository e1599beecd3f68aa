r"""The model a training loss is given, taken apart into the passes that train and the pure copies
that attack and bound it.

A loss calls the model in three roles:

* **outer** passes (the clean and adversarial forward passes whose value is the loss): the model
  exactly as given. Gradients flow through them and, for a Flax ``nnx.Module`` in training mode,
  they are the only calls that update state (BatchNorm running statistics, the Dropout RNG
  counter).
* **attack** passes (every step of the inner maximisation): a *frozen* copy. For an
  ``nnx.Module`` the copy is ``nnx.merge(graphdef, stop_gradient(state))``, rebuilt at every call,
  so whatever the call changes (BatchNorm statistics, RNG counters) is discarded with the copy and
  no tracer of the attack's ``lax.scan`` leaks into the module; for a
  ``functools.partial(model.apply, params)`` (Flax linen) the array arguments get
  ``stop_gradient``. Any other callable is used as it is: its captured parameters are then traced
  through the attack under the user's ``grad``, which gives the same gradient (the adversarial
  point is a ``stop_gradient`` input of the outer passes, so JAX and XLA drop that work) at some
  extra tracing time.
* **bound** passes (:func:`~jaxrobust.training.ibp_loss`): a *pure* copy, like the frozen one but
  differentiable: the bounds carry the parameters' gradient, yet never update state.

Mode (train or eval) is never switched here: every role runs the model in the mode the user
passed. The usual recipe for models with BatchNorm or Dropout, attack in eval mode and update in
train mode, is one keyword: pass the train-mode model as ``logits_fn`` and an eval-mode view of
the same weights as ``attack_logits_fn``::

    def loss_fn(model, x, y, eps, key):          # model in train mode (model.train())
      view = nnx.view(model, deterministic=True, use_running_average=True)
      return jr.training.trades_loss(model, x, y, jr.Budget(eps), key, attack_logits_fn=view)

    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, x, y, eps, key)

(PyTorch's TRADES and MART references do the same with ``model.eval()`` around the attack and
``model.train()`` after it). Passing only ``logits_fn`` attacks the model in its own mode:

* BatchNorm in train mode normalises each attack step's batch by that batch's statistics (so the
  examples are no longer independent: each one's input gradient also carries the others' terms
  through the statistics, as in PyTorch with ``model.train()``), and the running statistics
  change only in the outer passes: once for the clean batch and once for the
  adversarial one (TRADES, MART), once for the adversarial one (Madry), once for the clean one
  (IBP). An eval-mode model (``model.eval()``) is attacked and trained with its running
  statistics, which never change.
* Dropout in train mode draws its masks from the module's RNG stream. The frozen copy starts from
  the stream's state at the call and its draws are discarded with it, so every attack step sees
  the **same** masks (a fixed sub-network, which the attack can climb), the first outer pass
  draws those masks again, and only the outer passes advance the stream (twice per TRADES or MART
  step, once per Madry step).

Flax linen: pass ``functools.partial(model.apply, variables)`` (with ``train=False`` or the like
bound in it for the attack's view). A linen BatchNorm in train mode needs ``mutable=`` and returns
its updates beside the logits, which is not a ``logits_fn``: compute the update in a separate
forward pass with ``mutable=["batch_stats"]`` and give the loss an eval-mode ``partial``.

Functions (``x -> logits``) are deterministic here; a randomized model ``logits_fn(x, keys)`` is
not a training target.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax

from jaxrobust.model import model_of

Array = jax.Array
LogitsFn = Callable[[Array], Array]


class Roles(NamedTuple):
  """The three ways a loss calls the model (see the module docstring)."""

  outer: LogitsFn  # the user's model: gradients and state updates
  frozen: LogitsFn  # no gradient to the parameters, no state update: for attacks
  pure: LogitsFn  # gradients, no state update: for bounds


def roles(logits_fn: LogitsFn) -> Roles:
  """The outer, frozen and pure versions of ``logits_fn`` (see the module docstring).

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]``: an ``nnx.Module``, a
      ``functools.partial(model.apply, params)`` or any callable.

  Returns:
    :class:`Roles`.

  Examples:
    >>> import functools, jax, jax.numpy as jnp
    >>> apply = lambda w, x: x @ w
    >>> r = roles(functools.partial(apply, jnp.ones((2, 2))))
    >>> grad = jax.grad(lambda w: roles(functools.partial(apply, w)).frozen(jnp.ones((1, 2))).sum())
    >>> grad(jnp.ones((2, 2))).tolist()  # the frozen copy gives the parameters no gradient
    [[0.0, 0.0], [0.0, 0.0]]
  """
  model = model_of(logits_fn)
  if model.kind == "nnx":
    # A new copy per call (Model.frozen/pure map the state, Model.__call__ merges a module),
    # its variables created inside the caller's trace (the attack's scan, eval_shape): what the
    # call mutates dies with the copy, and NNX does not refuse the mutation as coming from
    # another trace level.
    return Roles(logits_fn, lambda *x: model.frozen()(*x), lambda *x: model.pure()(*x))
  # Arrays (a partial's) get their stop_gradient once, outside the attack's loop; the frozen
  # Model is called as itself, so a compute dtype's casts apply (Model.__call__).
  return Roles(logits_fn, model.frozen(), logits_fn)
