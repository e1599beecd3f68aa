r"""Static gradient-masking diagnosis: what blocks or falsifies gradients on the path from ``x`` to
the logits, read from the model's program before any attack runs.

Run-time checks (Carlini et al. 2019; AutoAttack's checks, Croce & Hein 2020) see gradient
masking through its symptoms: zero or non-finite gradients, a gradient-free attack beating the
gradient ones. In JAX the cause is visible in the jaxpr: :func:`diagnose` traces
``logits_fn`` on the shape of ``x`` (``jax.make_jaxpr``; the model never runs) and reports every
operation that lies on the path from ``x`` to the logits (it depends on ``x`` and its result
reaches the logits) and that Athalye, Carlini & Wagner (2018) name as the sources of obfuscated
gradients: shattered gradients (``stop_gradient``, rounding, indices, integer casts, piecewise
selections, custom derivative rules, loops whose length depends on ``x``) and stochastic
gradients (random draws).

How the path is found: the jaxpr is first pruned of what does not reach the logits (JAX's
dead-code elimination), then interpreted once with a taint per variable (does it depend on
``x``?) by :func:`jaxrobust._jaxpr_walk.interpret`, descending into calls (``jit``,
``closed_call``, ``checkpoint``, ``shard_map``: the body's inputs are the call's operands);
``scan`` and ``while`` iterate their body to a fixed point of the carried taints, ``cond`` joins
its branches, and a custom-derivative call carries its body's taints. Other equations holding
jaxprs are opaque: their results depend on ``x`` when an operand does. An operation whose
result does not reach the logits (an output dropped) is not reported, nor is one whose inputs do
not depend on ``x`` (an ``argmax`` of a constant, a ``stop_gradient`` on a parameter).

The kinds (:data:`KINDS`; ``severity`` is ``"error"`` when the operation's gradient is zero or
absent, so a gradient attack cannot see through it, and ``"warning"`` when a gradient exists but
may mislead):

================== ======== =============================================================
kind               severity what
================== ======== =============================================================
stop_gradient      error    ``lax.stop_gradient`` of an x-dependent value
rounding           error    ``round``, ``floor``, ``ceil``, ``sign`` of x-dependent floats
index              error    integer outputs of ``argmax``, ``argmin``, ``sort`` (argsort),
                            ``top_k`` on x-dependent values that reach the logits (a gather,
                            a dynamic slice, a one-hot, a select); sorted *values* alone are
                            differentiable and not reported
integer_cast       error    ``convert_element_type`` (or a bitcast) of x-dependent floats to
                            an integer or bool dtype
loop               error    a ``while_loop`` whose condition depends on x (its trip count)
comparison         warning  ``lt``/``le``/``gt``/``ge``/``eq``/``ne`` of x-dependent floats
                            whose result reaches the logits (``jnp.where``, a mask); not
                            ``x != x`` (a NaN test) nor a comparison with ``inf``. ReLU as
                            ``max(x, 0)`` has no comparison and is not reported
rank_mask          warning  such a comparison against a value of a ``sort`` or ``top_k`` of
                            x-dependent values: k-winners-take-all masks
custom_derivative  warning  a ``custom_jvp``/``custom_vjp`` function of the user's: the
                            gradient is the rule's; the body is not searched further
random             warning  a random draw (``random_bits``, ``rng_uniform``,
                            ``rng_bit_generator``, ``threefry2x32``) whose result reaches the
                            logits, whatever its key
================== ======== =============================================================

JAX's and Flax's own building blocks are not reported: custom derivative rules defined inside
the ``jax``/``jaxlib``/``flax`` (or ``optax``, ``equinox``, ``haiku``) packages (``jax.nn.relu``,
``softplus``, ``logaddexp``...), and any operation written inside ``jax.nn`` (softmax's and
``log_softmax``'s ``stop_gradient`` of the maximum, ``elu``'s and ``leaky_relu``'s
``jnp.where``), ``logsumexp`` or Flax's activation modules, decided from the Python frames that
created the equation. A random draw is reported wherever it was made (Flax's ``Dropout``
included). The location of a finding is the innermost frame outside those packages and the
standard library: the user's line that called ``jnp.round`` or ``nn.Dropout``. Findings with the
same kind, primitive and location are reported once.

Not seen: masking that happens outside the traced function (pre-processing on the host, a
callback), masking written with differentiable primitives (a steep sigmoid, a huge
temperature), and numerical rather than structural effects (saturated softmax, overflow);
randomness enters a randomized ``logits_fn(x, keys)`` through its ``keys``, which this function
does not take. Those remain for the run-time checks.

The records (:data:`KINDS`, :class:`Finding`, :class:`Diagnosis`) live in
:mod:`jaxrobust._findings` and are re-exported here. :func:`jaxrobust.evaluate` runs
:func:`diagnose_traced` on the forward program of the model it evaluates and keeps the diagnosis
in its report (:attr:`jaxrobust.Report.diagnosis`).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> w = jnp.ones((4, 3))
  >>> len(diagnose(lambda x: jax.nn.relu(x) @ w, jnp.ones((2, 4))))   # clean
  0
  >>> found = diagnose(lambda x: jnp.round(x * 255) / 255 @ w, jnp.ones((2, 4)))
  >>> [(f.kind, f.severity, f.primitive) for f in found]
  [('rounding', 'error', 'round')]

References:
  Athalye, Carlini & Wagner, "Obfuscated gradients give a false sense of security:
  circumventing defenses to adversarial examples", ICML 2018 (BPDA, EOT).
  Carlini, Athalye, Papernot, Brendel, Rauber, Tsipras, Goodfellow, Madry & Kurakin, "On
  evaluating adversarial robustness", arXiv:1902.06705, 2019.
  Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
  parameter-free attacks", ICML 2020 (AutoAttack and its checks).
  Tramer, Carlini, Brendel & Madry, "On adaptive attacks to adversarial example defenses",
  NeurIPS 2020 (k-winners-take-all).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from jaxrobust import _jaxpr_walk
from jaxrobust import model as _model
from jaxrobust._findings import (ERROR, KINDS, SECTION, WARNING, Diagnosis,  # noqa: F401
                                 Finding, GradientMaskingWarning, Kind,  # re-exported
                                 warn_if_masked)

try:  # JAX's dead-code elimination: private, used by _live_program only
  from jax._src.interpreters import partial_eval as _partial_eval
except ImportError:  # pragma: no cover - a JAX without it: every equation counts as live
  _partial_eval = None

# ------------------------------------------------------------------------------------------------
# Where an equation comes from: Python frames, library code, the user's line.

_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "equinox", "haiku")
# Where JAX's and Flax's well-known building blocks live (paths inside their packages): jax.nn,
# logsumexp, Flax's activation modules. An operation written there is not reported.
_TRUSTED = (("jax", "_src/nn/"), ("jax", "_src/ops/special.py"),
            ("flax", "linen/activation.py"), ("flax", "nnx/nn/activations.py"))


def _package_root(name: str) -> str | None:
  """The directory of an imported package (with a trailing separator), ``None`` if not loaded."""
  file = getattr(sys.modules.get(name), "__file__", None)
  return os.path.dirname(os.path.abspath(file)) + os.sep if file else None


def _library_roots() -> tuple[str, ...]:
  """Directories whose frames are never the user's: the libraries and Python's standard one."""
  roots = [_package_root(name) for name in _LIBRARIES]
  roots += [sysconfig.get_path("stdlib"), os.path.dirname(functools.__file__)]
  return tuple(os.path.join(os.path.normcase(r), "") for r in roots if r)


def _trusted_roots() -> tuple[str, ...]:
  roots = ((_package_root(package), inner) for package, inner in _TRUSTED)
  return tuple(os.path.normcase(os.path.join(root, *inner.split("/")))
               for root, inner in roots if root)


def _frames(eqn: Any) -> list[tuple[str, int]]:
  """``(file, line)`` of the Python frames that created ``eqn``, innermost first; ``[]`` when
  JAX kept none. The one place that reads the traceback JAX keeps in ``source_info``."""
  try:
    return [(frame.file_name, frame.line_num) for frame in eqn.source_info.traceback.frames]
  except (AttributeError, TypeError):  # no traceback kept, or another traceback object
    return []


class _Origin(NamedTuple):
  location: str  # "file:line" of the innermost user frame, or "unknown"
  trusted: bool  # created inside one of _TRUSTED's building blocks


def _origin(eqns: Iterable[Any], library: tuple[str, ...], trusted: tuple[str, ...]) -> _Origin:
  """Where the first of ``eqns`` comes from, the others being the calls (``jit``, loops) it sits
  in, innermost first: JAX keeps the frames of an equation inside a call only up to the called
  function, so the frames are those of every equation in turn. The location is the first frame
  outside ``library``; the equation is trusted if a frame before it (the library code between
  the user's and the primitive) lies in ``trusted``."""
  inside = False
  for file, line in (frame for eqn in eqns for frame in _frames(eqn)):
    name = os.path.normcase(os.path.abspath(file)) if os.path.isabs(file) else file
    if not name.startswith(library):
      return _Origin(f"{file}:{line}", inside)
    inside = inside or name.startswith(trusted)
  return _Origin("unknown", inside)


def _rule_source(eqn: Any) -> tuple[str, str]:
  """``(function name, file)`` of a custom-derivative call's function, from the debug info JAX
  keeps with its body; ``("a function", "")`` when there is none."""
  body = _jaxpr_walk.call_body(eqn)
  info = getattr(body[0], "debug_info", None) if body else None
  name, _, where = str(getattr(info, "func_src_info", "") or "").partition(" at ")
  return (name or "a function"), where.rpartition(":")[0]


# ------------------------------------------------------------------------------------------------
# The path: live variables, taints, the rules per primitive.

X, RANK = 1, 2  # taint bits: depends on x; computed from sorted (or top_k) x-dependent values

_ROUNDING = frozenset({"round", "floor", "ceil", "sign"})
_INDEX = frozenset({"argmax", "argmin", "sort", "top_k", "approx_top_k"})
_RANKING = frozenset({"sort", "top_k", "approx_top_k"})
_CASTS = frozenset({"convert_element_type", "bitcast_convert_type"})
_COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
_DRAWS = frozenset({"random_bits", "rng_uniform", "rng_bit_generator", "threefry2x32"})
_CUSTOM = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
_NOT_INLINED = _CUSTOM | {"scan", "while", "cond"}


def _dtype(atom: Any) -> Any:
  return getattr(getattr(atom, "aval", None), "dtype", None)


def _is(atom: Any, kind: Any) -> bool:
  dtype = _dtype(atom)
  try:
    return dtype is not None and bool(jnp.issubdtype(dtype, kind))
  except TypeError:  # an extended dtype (PRNG keys)
    return False


def _floating(atom: Any) -> bool:
  return _is(atom, jnp.inexact)


def _discrete(atom: Any) -> bool:
  return _is(atom, jnp.integer) or _is(atom, jnp.bool_)


def _infinite_literal(atom: Any) -> bool:
  if not isinstance(atom, core.Literal):
    return False
  with contextlib.suppress(TypeError, ValueError):
    return bool(np.all(np.isinf(np.asarray(atom.val))))
  return False


def _live_program(closed: Any) -> Any:
  """``closed``'s open jaxpr without what does not reach its outputs (JAX's dead-code
  elimination, nested jaxprs included, its inputs kept); the jaxpr as it is if that fails."""
  jaxpr = closed.jaxpr
  if _partial_eval is None:
    return jaxpr
  try:
    return _partial_eval.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
  except Exception:  # noqa: BLE001 (a private API: any failure falls back to no pruning)
    return jaxpr


def _used_vars(jaxpr: Any) -> set:
  """The variables read anywhere in ``jaxpr`` or its nested jaxprs, or returned by one: after
  dead-code elimination, the ones that reach the logits."""
  used = set()
  for inner in _jaxpr_walk.iter_jaxprs(jaxpr):
    atoms = list(inner.outvars) + [atom for eqn in inner.eqns for atom in eqn.invars]
    used.update(atom for atom in atoms if isinstance(atom, core.Var))
  return used


def _untainted(value: Any) -> int:
  del value
  return 0


def _inlined(eqn: Any) -> bool:
  """Calls whose body takes the call's operands and gives its results one for one."""
  if eqn.primitive.name in _NOT_INLINED:
    return False
  body = _jaxpr_walk.call_body(eqn)
  return (body is not None and len(body[0].invars) == len(eqn.invars)
          and len(body[0].outvars) == len(eqn.outvars))


def _join(*taints: Iterable[int]) -> list[int]:
  return [functools.reduce(lambda a, b: a | b, column, 0) for column in zip(*taints)]


class _Walk:
  """One diagnosis: the taint rule :func:`_jaxpr_walk.interpret` applies to every equation, and
  the findings it records (first occurrence of each kind, primitive and location)."""

  def __init__(self, used: set):
    self.used = used
    self.quiet = 0  # > 0 while walking where findings are not recorded (fixed-point passes)
    self.calls: list[Any] = []  # the equations (calls, loops) whose bodies are being walked
    self.found: dict[tuple[str, str, str], Finding] = {}
    self.library, self.trusted = _library_roots(), _trusted_roots()

  def run(self, jaxpr: Any, args: list[int], quiet: bool = False) -> list[int]:
    """The taints of ``jaxpr``'s (closed or open) outputs given its inputs'."""
    inner = _jaxpr_walk.open_jaxpr(jaxpr)[0]
    self.quiet += quiet
    try:
      return _jaxpr_walk.interpret(inner, [0] * len(inner.constvars), args, self.rule,
                                   wrap=_untainted)
    finally:
      self.quiet -= quiet

  def run_in(self, eqn: Any, jaxpr: Any, args: list[int], quiet: bool = False) -> list[int]:
    """:meth:`run` on a body of ``eqn`` (a call, a loop, a branch)."""
    self.calls.append(eqn)
    try:
      return self.run(jaxpr, args, quiet)
    finally:
      self.calls.pop()

  def live(self, atoms: Iterable[Any]) -> bool:
    return any(isinstance(atom, core.Var) and atom in self.used for atom in atoms)

  def record(self, kind: str, eqn: Any, message: str, *, trusted: bool = False) -> None:
    if self.quiet:
      return
    origin = _origin([eqn, *reversed(self.calls)], self.library, self.trusted)
    if trusted or origin.trusted:
      return
    key = (kind, eqn.primitive.name, origin.location)
    if key not in self.found:
      self.found[key] = Finding(kind, KINDS[kind].severity, eqn.primitive.name, origin.location,
                                message, KINDS[kind].remedy)

  def rule(self, eqn: Any, taints: list[int]) -> list[int]:
    special = _SPECIAL.get(eqn.primitive.name)
    if special is not None:
      return special(self, eqn, taints)
    if _inlined(eqn):
      return self.run_in(eqn, _jaxpr_walk.call_body(eqn)[0], taints)
    taint = functools.reduce(lambda a, b: a | b, taints, 0)
    outs = [taint] * len(eqn.outvars)
    name = eqn.primitive.name
    if name in _DRAWS and self.live(eqn.outvars):
      key = " Its key depends on x." if taint & X else ""
      self.record("random", eqn, f"a random draw ({name}) reaches the logits: each call is one "
                  f"sample of a randomized model.{key}")
    if not taint & X:
      return outs
    if name in _RANKING:
      outs = [t | RANK if _floating(v) else t for t, v in zip(outs, eqn.outvars)]
    self._check(eqn, taints)
    return outs

  def _check(self, eqn: Any, taints: list[int]) -> None:
    """Records ``eqn`` if it is one of the blocking or falsifying operations on x's path."""
    name, ins = eqn.primitive.name, list(zip(eqn.invars, taints))
    floats = [(a, t) for a, t in ins if t & X and _floating(a)]
    if not floats or not self.live(eqn.outvars):
      return
    if name == "stop_gradient":
      self.record("stop_gradient", eqn, "stop_gradient of an x-dependent value: no gradient "
                  "flows through it, so gradient attacks see a flatter model than the real one.")
    elif name in _ROUNDING:
      self.record("rounding", eqn, f"{name} of x-dependent values: piecewise constant, its "
                  "gradient is zero almost everywhere.")
    elif name in _INDEX and self.live(v for v in eqn.outvars if _discrete(v)):
      self.record("index", eqn, f"the integer indices {name} computes from x-dependent values "
                  "reach the logits (a gather, slice, one-hot or select): which entry is chosen "
                  "has no gradient.")
    elif name in _CASTS and all(_discrete(v) for v in eqn.outvars):
      self.record("integer_cast", eqn, f"x-dependent floats cast to {_dtype(eqn.outvars[0])}: "
                  "piecewise constant, no gradient.")
    elif name in _COMPARISONS and not (
        eqn.invars[0] is eqn.invars[1] or any(map(_infinite_literal, eqn.invars))):
      if any(t & RANK for _, t in ins):
        self.record("rank_mask", eqn, f"{name} against an order statistic (a sort or top_k "
                    "value) of x-dependent values decides a mask: a k-winners-take-all-like "
                    "active set that changes under tiny perturbations.")
      else:
        self.record("comparison", eqn, f"{name} of x-dependent values decides a selection or "
                    "mask (jnp.where, a mask product): the gradient is the chosen piece's and "
                    "does not see the jump at the boundary.")

  def custom(self, eqn: Any, taints: list[int]) -> list[int]:
    body = _jaxpr_walk.call_body(eqn)
    if body is None or len(body[0].invars) != len(taints):
      return [functools.reduce(lambda a, b: a | b, taints, 0)] * len(eqn.outvars)
    outs = self.run_in(eqn, body[0], taints, quiet=True)
    if any(t & X for t in taints) and self.live(eqn.outvars):
      function, file = _rule_source(eqn)
      library = bool(file) and os.path.normcase(os.path.abspath(file)).startswith(self.library)
      rule = "custom_jvp" if "jvp" in eqn.primitive.name else "custom_vjp"
      self.record("custom_derivative", eqn, f"{function} has a {rule} rule: gradient attacks "
                  "follow the rule, not the function it stands for.", trusted=library)
    return outs

  def scan(self, eqn: Any, taints: list[int]) -> list[int]:
    params = eqn.params
    consts, rest = taints[:params["num_consts"]], taints[params["num_consts"]:]
    carry, xs = rest[:params["num_carry"]], rest[params["num_carry"]:]
    carry = self._fixed_point(
        lambda c: self.run_in(eqn, params["jaxpr"], consts + c + xs, quiet=True), carry)
    return self.run_in(eqn, params["jaxpr"], consts + carry + xs)

  def while_loop(self, eqn: Any, taints: list[int]) -> list[int]:
    params = eqn.params
    cond_consts = taints[:params["cond_nconsts"]]
    body_consts = taints[params["cond_nconsts"]:params["cond_nconsts"] + params["body_nconsts"]]
    carry = taints[params["cond_nconsts"] + params["body_nconsts"]:]
    carry = self._fixed_point(
        lambda c: self.run_in(eqn, params["body_jaxpr"], body_consts + c, quiet=True), carry)
    self.run_in(eqn, params["body_jaxpr"], body_consts + carry)
    (predicate,) = self.run_in(eqn, params["cond_jaxpr"], cond_consts + carry, quiet=True)
    if predicate & X and self.live(eqn.outvars):
      self.record("loop", eqn, "a while_loop whose condition depends on x: its trip count is a "
                  "piecewise-constant function of x, and reverse-mode differentiation of "
                  "while_loop is unsupported.")
    return [t | (predicate & X) for t in carry]

  def cond(self, eqn: Any, taints: list[int]) -> list[int]:
    index, operands = taints[0], taints[1:]
    outs = _join(*(self.run_in(eqn, branch, operands) for branch in eqn.params["branches"]))
    return [t | (index & X) for t in outs]

  @staticmethod
  def _fixed_point(step: Callable[[list[int]], list[int]], carry: list[int]) -> list[int]:
    """The carried taints of a loop: joined with one more pass of the body until they stop
    growing (at most two bits per variable, so this ends)."""
    while True:
      grown = _join(carry, step(carry)[:len(carry)])
      if grown == carry:
        return carry
      carry = grown


_SPECIAL: dict[str, Callable[[_Walk, Any, list[int]], list[int]]] = {
    "scan": _Walk.scan, "while": _Walk.while_loop, "cond": _Walk.cond,
    **{name: _Walk.custom for name in _CUSTOM},
}


def _input_spec(x: Any) -> jax.ShapeDtypeStruct:
  """``x``'s shape and dtype, refused unless it is a floating array (or ``ShapeDtypeStruct``)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    spec = x
  elif hasattr(x, "shape") and hasattr(x, "dtype"):
    spec = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
  else:
    message = f"jr.diagnose: x must be an array or a jax.ShapeDtypeStruct, got {x!r:.80}"
    try:
      array = np.asarray(x)
    except Exception as error:  # noqa: BLE001 (any conversion failure means: not array-like)
      raise TypeError(message) from error
    if array.dtype.kind not in "biufc":
      raise TypeError(message)
    spec = jax.ShapeDtypeStruct(array.shape, jnp.result_type(array))
  if not jnp.issubdtype(spec.dtype, jnp.floating):
    raise TypeError(f"jr.diagnose: x must be floating (the input attacks perturb), got dtype "
                    f"{spec.dtype}; convert integer images with x.astype(jnp.float32) / 255")
  return spec


def diagnose(logits_fn: Callable[..., jax.Array], x: Any) -> Diagnosis:
  """Static gradient-masking diagnosis of ``logits_fn`` at inputs shaped like ``x``.

  Traces ``logits_fn`` (``jax.make_jaxpr``, never running it) and reports every operation on
  the path from ``x`` to the logits that blocks gradients (``stop_gradient``, rounding,
  ``argmax``/``argsort``/``top_k`` indices, integer casts, loops whose trip count depends on
  ``x``) or may falsify them (comparisons deciding a selection or mask, k-winners-take-all masks,
  the user's custom derivative rules, random draws), each with its source line and remedy:
  BPDA for non-differentiable operations, EOT for randomness, a gradient-free attack
  (:func:`jaxrobust.attacks.square`) to confirm. The kinds, the severity rule, what is not
  reported (JAX's and Flax's own building blocks) and what cannot be seen are in the module
  documentation (:mod:`jaxrobust.diagnosis`).

  Args:
    logits_fn: the model, ``x [B, ...] -> logits``: any callable (it may close over parameters,
      concrete or traced), a ``functools.partial`` of an apply function, or a Flax NNX module
      (split and merged, so tracing it changes none of its state).
    x: a floating array or a :class:`jax.ShapeDtypeStruct`; only its shape and dtype are used.

  Returns:
    a :class:`Diagnosis`, a tuple of :class:`Finding` (``kind``, ``severity``, ``primitive``,
    ``location``, ``message``, ``remedy``), empty for a model with nothing to report;
    ``print(diagnosis)`` shows the table.

  Raises:
    TypeError: ``logits_fn`` is not callable, or ``x`` is not a floating array or
      ``ShapeDtypeStruct``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> w = jnp.ones((4, 3))
    >>> def defended(x):
    ...   h = jax.lax.stop_gradient(jnp.tanh(x)) + x     # a planted mask
    ...   return jax.nn.log_softmax(jnp.maximum(h, 0.0) @ w)
    >>> found = diagnose(defended, jax.ShapeDtypeStruct((8, 4), jnp.float32))
    >>> [(f.kind, f.severity) for f in found], found[0].line == defended.__code__.co_firstlineno + 1
    ([('stop_gradient', 'error')], True)
    >>> print(diagnose(lambda x: jnp.maximum(x, 0.0) @ w, jnp.ones((8, 4))))
    No gradient-masking operation on the path from x to the logits.

  References:
    Athalye, Carlini & Wagner, "Obfuscated gradients give a false sense of security", ICML 2018;
    Carlini et al., "On evaluating adversarial robustness", arXiv:1902.06705, 2019; Croce &
    Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020.
  """
  if not callable(logits_fn):
    raise TypeError(f"jr.diagnose: logits_fn must be callable (x -> logits), got "
                    f"{type(logits_fn).__name__}")
  spec = _input_spec(x)
  model = _model.model_of(logits_fn)
  return diagnose_traced(jax.make_jaxpr(lambda arguments, v: model.with_arguments(arguments)(v))(
      model.arguments, spec))


def diagnose_traced(closed: Any, num_inputs: int = 1) -> Diagnosis:
  """:func:`diagnose` of a model already traced: ``closed``, the closed jaxpr of
  ``forward(params, x, *others)`` whose inputs are the parameters' leaves, then ``x``, then
  ``num_inputs - 1`` inputs that do not depend on ``x`` (the ``keys`` of a randomized model,
  whose draws are reported as ``random``). :func:`jaxrobust.evaluate` runs it on the forward
  program it traces anyway."""
  jaxpr = _live_program(closed)
  walk = _Walk(_used_vars(jaxpr))
  num_params = len(jaxpr.invars) - num_inputs  # the parameters' leaves, then x (and the rest)
  walk.run(jaxpr, [0] * num_params + [X] + [0] * (num_inputs - 1))
  return Diagnosis(walk.found.values())
