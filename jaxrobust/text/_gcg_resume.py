r"""GCG in segments: the search state between steps, advancing it, and saving it to a file.

:func:`run_gcg` runs every step in one call. To checkpoint a long run (and resume it after an
interruption), run it as segments instead: :func:`gcg_segment` advances a :class:`GCGState` by
``steps`` steps (``state=None``: from the initial suffix), :func:`save_gcg_state` writes it
atomically and :func:`load_gcg_state` reads it back. Step ``t`` draws from ``fold_in`` of the
example's key with ``t`` whichever segment runs it, so segments of ``n_1 + ... + n_k =
attack.steps`` steps visit the same candidates as one run and return the same suffix (on one
machine the same program path: bitwise equal states); :meth:`GCGState.result` is the
:class:`GCGResult`, with the loss as the search scored it. Every segment must get the same
inputs (model, prompts, targets, key and options) as the first; the file records the attack's
configuration and the step reached, and a state from another attack is refused.

Examples:
  A bigram LM (embedding row ``v`` = the logits after token ``v``) where only token 2 is
  followed by token 3; four steps as two segments of two, with a save and a load between them:

  >>> import functools, os, tempfile, jax, jax.numpy as jnp
  >>> from jaxrobust.text import gcg, run_gcg
  >>> table = jnp.array([[2., 0, 0, 0], [2., 0, 0, 0], [0., 0, 0, 9], [0., 9, 0, 0]])
  >>> lm, prompt, target = lambda embeds: embeds, jnp.array([[0]]), jnp.array([[3]])
  >>> attack = gcg(suffix_length=1, steps=4, search_width=2, topk=4)
  >>> segment = jax.jit(functools.partial(gcg_segment, attack, lm, steps=2))
  >>> path = os.path.join(tempfile.mkdtemp(), "gcg.npz")
  >>> state = load_gcg_state(path, attack)  # None: nothing saved yet
  >>> while state is None or int(state.step) < attack.steps:
  ...   state = segment(table, prompt, target, jax.random.key(0), state=state)
  ...   save_gcg_state(path, state, attack)
  ...   state = load_gcg_state(path, attack)  # as a resumed process would
  >>> whole = run_gcg(attack, lm, table, prompt, target, jax.random.key(0))
  >>> state.result().suffix.tolist() == whole.suffix.tolist(), int(state.step)
  (True, 4)
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _checkpoint
from jaxrobust._batch import like_batch
from jaxrobust._validation import check_positive_int, is_concrete
from jaxrobust.text._gcg import GCG, GCGResult, _advance, _start, _State, prepare

Array = jax.Array
_FORMAT = "jaxrobust.text.GCGState/1"


class GCGState(NamedTuple):
  """The state of a GCG search between two steps (a pytree: it passes through ``jit``).

  Attributes:
    current: ``[B, S]`` int32, the suffix the next step takes its token gradient at.
    best: ``[B, S]`` int32, the best suffix seen so far (success first, then loss).
    best_loss: ``[B]`` float32, its loss as scored during the search (``inf`` where NaN).
    best_success: ``[B]`` bool, its success.
    step: ``[]`` int32, the number of steps done (the index of the next step).
  """

  current: Array
  best: Array
  best_loss: Array
  best_success: Array
  step: Array

  def result(self) -> GCGResult:
    """The :class:`GCGResult` of the best suffix so far; ``loss`` is the search's score of it
    (:func:`run_gcg` re-scores it instead: equal up to float rounding, NaN where this is
    ``inf``)."""
    return GCGResult(self.best, self.best_loss, self.best_success)


def _check_state(state: Any, batch: int, length: int) -> GCGState:
  if not isinstance(state, GCGState):
    raise ValueError(f"state must be None or a jr.text.GCGState (from gcg_segment or "
                     f"load_gcg_state), got {type(state).__name__}.")
  shapes = {"current": (batch, length), "best": (batch, length), "best_loss": (batch,),
            "best_success": (batch,), "step": ()}
  for name, shape in shapes.items():
    if tuple(jnp.shape(getattr(state, name))) != shape:
      raise ValueError(f"state.{name} has shape {tuple(jnp.shape(getattr(state, name)))}, "
                       f"expected {shape} for {batch} prompts and a suffix of {length} tokens: "
                       f"resume with the inputs of the run that made the state.")
  return state


def gcg_segment(attack: GCG, lm_logits_fn: Callable[..., Array], embedding: Array,
                prompt: Array, target: Array, key: Array, *, steps: int,
                state: Optional[GCGState] = None, allowed: Optional[Array] = None,
                init_suffix: Any = None, after_suffix: Optional[Array] = None,
                target_mask: Optional[Array] = None, context_length: Optional[int] = None,
                prefix_fn: Optional[Callable[[Array], Any]] = None) -> GCGState:
  """``steps`` more GCG steps from ``state`` (``None``: from the initial suffix): one segment of
  a run of ``attack.steps`` steps (see the module docstring).

  Args:
    attack, lm_logits_fn, embedding, prompt, target, key, allowed, init_suffix, after_suffix,
      target_mask, context_length, prefix_fn: as for :func:`run_gcg`, the same in every segment
      (``init_suffix`` is used by the first segment only).
    steps: the steps of this segment (a static int: ``jit`` compiles one program per value).
    state: the state the previous segment returned (or :func:`load_gcg_state` read), ``None``
      for the first segment.

  Returns:
    The :class:`GCGState` after the segment; ``state.step`` counts the steps done.

  Raises:
    ValueError: what :func:`run_gcg` raises; ``steps < 1``; a state of the wrong shapes; a
      (concrete) ``state.step + steps`` above ``attack.steps``. A traced ``state.step`` (inside
      ``jit``) cannot raise: the steps past ``attack.steps`` leave the state as it is, and
      ``state.step`` stops at ``attack.steps``.
  """
  steps = check_positive_int("steps", steps)
  first = jnp.zeros((), jnp.int32)
  if state is not None:
    state = _check_state(state, jnp.shape(prompt)[0], getattr(attack, "suffix_length", 0))
    first = jnp.asarray(state.step, jnp.int32)
  if is_concrete(first) and int(first) + steps > getattr(attack, "steps", 0):
    raise ValueError(f"the state has done {int(first)} of the attack's {attack.steps} steps: "
                     f"at most {attack.steps - int(first)} remain, not {steps}.")
  problem, allowed, init, step_keys = prepare(
      attack, lm_logits_fn, embedding, prompt, target, key, allowed=allowed,
      init_suffix=init_suffix, after_suffix=after_suffix, target_mask=target_mask,
      context_length=context_length, prefix_fn=prefix_fn)
  if state is None:
    inner = _start(problem, init)
  else:
    inner = _State(*(like_batch(jnp.asarray(a), init) for a in state[:4]))
  indices = first + jnp.arange(steps, dtype=jnp.int32)
  # A traced state.step cannot be checked: steps past attack.steps do nothing and are not counted.
  inner = _advance(problem, attack, allowed, step_keys, inner, indices, bounded=True)
  return GCGState(*inner, step=jnp.minimum(first + steps, attack.steps))


def save_gcg_state(path: os.PathLike | str, state: GCGState, attack: GCG) -> None:
  """Writes ``state`` (with ``attack``'s configuration) to the ``.npz`` file ``path``,
  atomically: a process killed at any moment leaves the old file or the new one.

  Raises:
    ValueError: ``attack`` not from :func:`gcg`, or ``state`` not a :class:`GCGState`.
  """
  if not isinstance(attack, GCG) or not isinstance(state, GCGState):
    raise ValueError("save_gcg_state(path, state, attack) takes a jr.text.GCGState and the "
                     "jr.text.gcg(...) attack it belongs to.")
  arrays = {name: np.asarray(getattr(state, name)) for name in GCGState._fields}
  header = {"format": _FORMAT, "attack": json.loads(attack.config), "step": int(state.step)}
  _checkpoint.save(path, header, arrays)


def _search_settings(config: dict) -> dict:
  """An attack's configuration less ``dedupe``, which changes how many rows a step scores but
  not the search (a state saved with either value, or before the option existed, resumes with
  either)."""
  return {name: value for name, value in config.items() if name != "dedupe"}


def load_gcg_state(path: os.PathLike | str, attack: GCG) -> Optional[GCGState]:
  """The :class:`GCGState` saved at ``path`` by :func:`save_gcg_state`, or ``None`` if there is
  no file (a run not started yet).

  Raises:
    ValueError: the file is not a saved GCG state, or was saved for another configuration than
      ``attack``'s (``dedupe`` aside: it does not change the search).
  """
  if not isinstance(attack, GCG):
    raise ValueError(f"attack must come from jr.text.gcg(...), got {type(attack).__name__}.")
  loaded = _checkpoint.load(path)
  if loaded is None:
    return None
  header, arrays = loaded
  if header.get("format") != _FORMAT or set(arrays) != set(GCGState._fields):
    raise ValueError(f"{path} is not a GCG state written by jr.text.save_gcg_state.")
  if _search_settings(header["attack"]) != _search_settings(json.loads(attack.config)):
    raise ValueError(f"{path} holds a GCG state of another attack configuration "
                     f"({header['attack']}), not {attack.config}: resume with the attack that "
                     f"started the run, or use another path.")
  dtypes = {"current": jnp.int32, "best": jnp.int32, "best_loss": jnp.float32,
            "best_success": jnp.bool_, "step": jnp.int32}
  return GCGState(**{name: jnp.asarray(arrays[name], dtype) for name, dtype in dtypes.items()})


__all__ = ["GCGState", "gcg_segment", "load_gcg_state", "save_gcg_state"]
