r"""The run options: how the engine executes an attack, a curve or an evaluation, in one object.

The front doors (:func:`jaxrobust.run`, :func:`jaxrobust.robustness_curve`,
:func:`jaxrobust.evaluate`, :func:`jaxrobust.training.robust_counts`, the training losses) keep
their keyword arguments, build one :class:`RunOptions` from them and hand it down as one value:
the curve kernel, the attack loop, early exit, ensemble members and the compiled step of
``jr.evaluate`` all take ``options``. The options are static (Python values fixed while tracing):
they choose the program, never the numbers a run computes, up to the float rounding documented
per option.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from jaxrobust._cost import model_flops
from jaxrobust._types import Attack
from jaxrobust._validation import check_bool


def default_chunk_size() -> int:
  """Rows per chunk of early exit's re-compaction when the caller gives none, from the default
  backend (read when called, never at import).

  On CPU a model evaluation costs about in proportion to its rows above a few dozen, and a chunk
  that holds one row still to attack costs all its rows. On the digits models, chunks of 64 rows
  gave the fastest AutoAttack curve of the sizes tried and most of the saving on PGD curves, at a
  small overhead where almost no point breaks (the figures: ``benchmarks/RESULTS.md``, "Early exit
  and cross-eps skipping (the defaults) against the dense computation"). Accelerators are only
  saturated by large batches, so their chunks are large (a smaller chunk would save no time).
  """
  return 64 if jax.default_backend() == "cpu" else 512


LATENCY_BOUND_FLOPS = 8e9
"""Below this many floating-point operations for one model evaluation of a curve's whole work at
once (the batch at every eps: :func:`jaxrobust._cost.model_flops` times the eps), a curve
on a GPU is latency-bound (see :meth:`RunOptions.for_curve`). Measured on an H200: the digits
CNN at 540 rows x 8 eps (1.0 GFLOP) is latency-bound; WRN-28-10 at 512 rows (2.7 TFLOP) is not."""


def _optional_int(value: Any, low: int, message: str) -> int | None:
  """``value`` as an int when it is ``None`` or an int (not a bool) ``>= low``, else
  ``ValueError(message)``."""
  if value is not None and (isinstance(value, (bool, np.bool_))
                            or not isinstance(value, (int, np.integer)) or value < low):
    raise ValueError(message)
  return None if value is None else int(value)


def _check_chunk_size(chunk_size: Any) -> int | None:
  return _optional_int(chunk_size, 1,
                       f"chunk_size must be None or a positive int, got {chunk_size!r}.")


def _check_eps_batch_size(eps_batch_size: Any) -> int | None:
  return _optional_int(eps_batch_size, 0, "eps_batch_size must be None, 0 or a positive int, "
                       f"got {eps_batch_size!r}.")


def _check_unroll(unroll: Any) -> int | bool:
  if isinstance(unroll, (bool, np.bool_)):
    return bool(unroll)
  if not isinstance(unroll, (int, np.integer)) or unroll < 0:
    raise ValueError(f"unroll must be a bool or an int >= 0 (as for jax.lax.scan), got "
                     f"{unroll!r}.")
  return int(unroll)


@dataclasses.dataclass(frozen=True, eq=False)
class RunOptions:
  r"""The static execution options of one run, curve or evaluation; the one place each is
  explained. Frozen and hashable (a ``jax.jit`` static argument, a cache key), validated when
  built (a ``ValueError`` naming the option and the value), with the backend default of
  ``chunk_size`` resolved in one method, :meth:`chunk_rows`.

  The defaults are the front doors' (``jr.run``, curves, ``jr.evaluate``). Which combinations a
  curve accepts depends on the attack too (:meth:`check_curve`).

  Attributes:
    early_exit: stop attacking a point once it is broken. For an attack that declares ``done``
      (FGSM/PGD, APGD(-T), Square, and DeepFool, C&W, FMN, DDN and FAB at a finite eps; see
      :class:`jaxrobust.Attack`), broken rows are frozen, the rows left are re-compacted every
      few steps into chunks of :meth:`chunk_rows` rows, and the loop ends when none is left
      (:mod:`jaxrobust.engine.early_exit`). The success flags, robust accuracies and curves equal
      the dense run's (a point broken at a smaller eps is broken at every larger one either way,
      and a point never broken runs every step in both), but a broken point's ``x_adv`` is its
      *first* adversarial point rather than the one of largest loss (for FMN and C&W, rather than
      the smallest found). ``False``: one fixed-length ``jax.lax.scan``, the strongest adversarial
      example, differentiable in reverse mode (with ``chunk_size=None``); the training losses'
      inner attacks run so. In a curve with ``eps_batch_size=None`` it also turns on cross-eps
      skipping (see ``eps_batch_size``). Under an Explicit mesh axis that shards the batch, rows
      are not moved between devices: early exit compacts only inside your own ``shard_map`` (as
      ``jr.evaluate`` runs, which therefore takes its ``shard_map`` path with a mesh).
    chunk_size: rows per chunk of the compaction that skips the points needing no attack
      (misclassified ones; for an ensemble, those an earlier member broke; in a curve, those
      broken at a smaller eps): the points to attack are moved together into chunks of this many
      rows and only chunks holding such points are computed (:mod:`jaxrobust.engine.compaction`).
      Results equal the dense run's. ``None``: with early exit, a backend default (and where a
      batch of at least four such chunks would skip fewer than a chunk's rows, the whole batch
      runs at once, :mod:`jaxrobust.engine.early_exit`; a batch of two or three is compacted only
      for a model that costs enough, :func:`jaxrobust.engine.early_exit.compacts`); without, no
      compaction (:meth:`chunk_rows` says which number is used). A number is kept: at most that
      many rows per model call in the attack's loop. The chunk loop is a ``lax.while_loop``,
      which JAX cannot differentiate in reverse mode: to take ``jax.grad`` through an attack
      (adversarial training), leave ``chunk_size=None`` and pass ``early_exit=False``. An
      explicit ``chunk_size`` compacts per device under an Explicit mesh axis (and selects
      ``jr.evaluate``'s ``shard_map`` path). In a curve it needs ``eps_batch_size=None`` (for a
      fixed-budget attack).
    unroll: passed to ``jax.lax.scan`` (with early exit: steps per iteration of its inner loop,
      the done check running between them). ``True`` unrolls the whole attack loop and so turns
      early exit off (no loop is left to leave). It used to be the fast setting on CPU for
      convolutional models; now that the attack's convolutions are made canonical on CPU (see
      ``canonical``) the loops run as fast, and unrolling only costs compile time, which grows
      steeply with the unrolled steps (``benchmarks/RESULTS.md``, "PGD overhead"). Results agree
      up to float rounding. Ensemble members run their own loops with ``unroll=1``.
    eps_batch_size: how a curve runs a fixed-budget attack over its eps grid (curves and
      ``jr.evaluate`` only; on a GPU a small curve at the defaults runs with ``0`` and no early
      exit, :meth:`for_curve`): ``None`` one eps after another (least memory), ``0`` all eps
      vectorised at once, ``b`` chunks of ``b`` vectorised eps. Each eps folds its index into the
      example's key, so every setting draws the same random starts (XLA may round a vectorised
      model evaluation differently, so a borderline example can still flip between settings).
      With ``None`` and early exit (or ``chunk_size``) the eps run in increasing order and each
      attacks only the points still robust at the smaller ones (**cross-eps skipping**,
      :mod:`jaxrobust.engine.curve_kernel`; the same flags, far fewer model evaluations). ``0``
      with ``unroll=True`` leaves no loop around the model (and so no early exit), which XLA:CPU
      runs faster per step for strided convolutions, at the price of attacking every point at
      every eps.
    score_skipped_rows: ``True`` (``jr.run``): every returned field is re-scored on every row.
      ``False`` (the curve kernel, ensemble members: callers that read only ``broken`` and
      ``success`` of the rows they attacked): with early exit only the attacked rows are
      re-scored, saving a forward pass over the others (:func:`jaxrobust.engine.scoring.score`).
    canonical: on CPU, for a deterministic model that holds a convolution, the whole attack is
      traced once more with every convolution in XLA:CPU's canonical form
      (:mod:`jaxrobust.engine.canonical_conv`): the same values, several times faster per step
      in the attack loops, since XLA:CPU canonicalises convolutions only outside loops. The front
      doors set it; nested runs (ensemble members) are covered by the outer one and leave it off.

  Examples:
    >>> from jaxrobust._options import RunOptions
    >>> options = RunOptions(chunk_size=32)
    >>> options.replace(early_exit=False).chunk_rows(100), options.chunk_rows(100)
    (32, 25)
    >>> RunOptions(unroll=True) == RunOptions(unroll=1)  # unroll=True turns early exit off
    False
    >>> RunOptions(chunk_size=0)
    Traceback (most recent call last):
    ...
    ValueError: chunk_size must be None or a positive int, got 0.
  """

  early_exit: bool = True
  chunk_size: int | None = None
  unroll: int | bool = 1
  eps_batch_size: int | None = None
  score_skipped_rows: bool = True
  canonical: bool = True

  def __post_init__(self):
    checked = {"early_exit": check_bool("early_exit", self.early_exit),
               "chunk_size": _check_chunk_size(self.chunk_size),
               "unroll": _check_unroll(self.unroll),
               "eps_batch_size": _check_eps_batch_size(self.eps_batch_size),
               "score_skipped_rows": check_bool("score_skipped_rows", self.score_skipped_rows),
               "canonical": check_bool("canonical", self.canonical)}
    for name, value in checked.items():  # Python values: one hash and one JSON form per setting
      object.__setattr__(self, name, value)

  def _key(self) -> tuple:
    # With types: True == 1 in Python, but unroll=True and unroll=1 are different programs.
    return tuple((type(v), v) for v in dataclasses.astuple(self))

  def __eq__(self, other: object) -> bool:
    return isinstance(other, RunOptions) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def replace(self, **changes: Any) -> RunOptions:
    """A copy with ``changes`` (validated like a new object)."""
    return dataclasses.replace(self, **changes)

  def chunk_rows(self, batch: int, *, exits: bool | None = None) -> int | None:
    r"""Rows per chunk of the compaction for a batch of ``batch`` rows (static), or ``None`` for
    no compaction: where ``chunk_size=None`` becomes a number.

    Without early exit (``exits`` false: the option is off, or the attack cannot exit early),
    the answer is ``chunk_size`` as given: ``None`` runs the batch densely, ``c`` compacts into
    chunks of exactly ``c`` rows (:func:`jaxrobust.engine.compaction.compacted`, the last one
    padded). With early exit the rows are re-compacted before every segment of steps, so the
    chunk is balanced over the batch: with the limit :math:`L = \min(\text{chunk\_size}, B)`
    (``chunk_size=None``: :func:`default_chunk_size`, 64 on CPU, 512 on accelerators) a batch
    of :math:`B` rows needs :math:`n = \lceil B / L \rceil` chunks, and
    :math:`c = \lceil B / n \rceil \le L` rows per chunk cover it with fewer than :math:`n` rows
    of padding (540 rows at most 64 per chunk: 9 chunks of 60, not 9 of 64 with 36 padded).

    Args:
      batch: the rows of the batch (per device inside a ``shard_map``).
      exits: whether this run exits early (default: ``early_exit``).

    Examples:
      >>> options = RunOptions(chunk_size=64)
      >>> options.chunk_rows(540), RunOptions(chunk_size=128).chunk_rows(64)
      (60, 64)
      >>> RunOptions(early_exit=False).chunk_rows(540) is None
      True
    """
    if not (self.early_exit if exits is None else exits):
      return self.chunk_size
    limit = max(1, min(self.chunk_size or default_chunk_size(), batch))
    return -(-batch // -(-batch // limit))

  def for_curve(self, attack: Attack, logits_fn: Callable[[jax.Array], jax.Array],
                x: jax.Array, eps_count: int, *, capped: bool,
                backend: str | None = None) -> RunOptions:
    r"""The options a curve of a fixed-budget ``attack`` over ``eps_count`` eps runs with: these,
    except on a GPU for a latency-bound curve at the default schedule, which runs dense with every
    eps vectorised (``early_exit=False, eps_batch_size=0``). The flags, and so every curve and
    report, are the same either way (see ``early_exit``); only the time, and the propagations
    ``info`` reports as spent, differ.

    A GPU runs each iteration of a loop at a fixed cost of tens of microseconds, whatever its
    rows, until its rows fill it. Where a model evaluation of the whole curve's rows at once
    (``x`` at every eps) costs under :data:`LATENCY_BOUND_FLOPS`, the loop iterations are the
    time, not the rows: early exit and cross-eps skipping add iterations (a loop per segment and
    per eps) and save rows that cost nothing, and vectorising the eps runs every eps in the
    iterations of one. Measured on an H200 (``benchmarks/RESULTS.md``, "An NVIDIA H200"), PGD-20
    curves of 540 digits at 8 eps: the early-exit defaults took 1.9-5x the dense run's time, the
    dense run with every eps vectorised 0.26-0.37x. Nothing changes above the threshold
    (WRN-28-10 at 512 rows: early exit 0.63x dense where points break, 1.006x where none does),
    on a CPU (where early exit pays at these sizes) or a TPU (not measured), for an option given
    other than its default, a suite (AutoAttack: its members' compaction saves whole attacks),
    an attack that drives its own loop, a randomized model (``attack.samples``) or a capped run
    (``capped``: ``max_propagations``).

    Args:
      attack: the curve's attack (fixed budget).
      logits_fn, x: the model and the batch (traced once more at this shape, on a GPU only).
      eps_count: the eps of the curve.
      capped: whether the run has a ``max_propagations`` cap.
      backend: the platform (default :func:`jax.default_backend`).

    Examples:
      >>> import jax.numpy as jnp
      >>> import jaxrobust as jr
      >>> x, w = jnp.ones((540, 64)), jnp.ones((64, 10))
      >>> gpu = RunOptions().for_curve(jr.attacks.pgd(), lambda v: v @ w, x, 8, capped=False,
      ...                              backend="gpu")
      >>> gpu.early_exit, gpu.eps_batch_size
      (False, 0)
      >>> RunOptions().for_curve(jr.attacks.pgd(), lambda v: v @ w, x, 8, capped=False,
      ...                        backend="cpu") == RunOptions()
      True
    """
    default = (self.early_exit and self.chunk_size is None and self.eps_batch_size is None
               and type(self.unroll) is int and self.unroll == 1)
    plain = (attack.suite is None and attack.drive is None and not attack.samples
             and not attack.minimum_norm and not capped)
    if not (default and plain and (backend or jax.default_backend()) == "gpu"):
      return self
    if model_flops(logits_fn, x) * eps_count >= LATENCY_BOUND_FLOPS:
      return self
    return self.replace(early_exit=False, eps_batch_size=0)

  @property
  def skips_across_eps(self) -> bool:
    """Whether a curve runs its eps in increasing order, each attacking only the rows not broken
    at a smaller eps (see ``eps_batch_size``): with ``chunk_size``, or early exit one eps after
    another."""
    return self.chunk_size is not None or (self.early_exit and self.eps_batch_size is None)

  @property
  def moves_rows(self) -> bool:
    """Whether the run compacts rows within the batch (early exit or ``chunk_size``): a sharded
    driver must then keep the compaction per device."""
    return self.chunk_size is not None or self.early_exit

  def check_curve(self, attack: Attack) -> None:
    """The combinations a curve of ``attack`` accepts (static, checked on the host)."""
    if self.chunk_size is not None and self.eps_batch_size is not None \
        and not attack.minimum_norm:
      raise ValueError("chunk_size skips points broken at a smaller eps, so the eps run one "
                       "after another: use eps_batch_size=None with it (got "
                       f"{self.eps_batch_size!r}).")

  def provenance(self) -> dict[str, Any]:
    """The options a report records, under the keys (and in the order) ``jr.evaluate`` has
    always written: ``eps_batch_size``, ``unroll``, ``chunk_size``, ``early_exit``."""
    return {"eps_batch_size": self.eps_batch_size, "unroll": self.unroll,
            "chunk_size": self.chunk_size, "early_exit": self.early_exit}
