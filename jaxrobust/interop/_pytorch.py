r"""A PyTorch ``nn.Module`` as a jaxrobust model, through torchax.

torchax (google/torchax) runs a module's ATen operations as JAX operations: ``torchax.extract_jax
(module)`` returns the module's parameters *and buffers* (BatchNorm's running statistics) as a
dict ``name -> jax.Array`` and a pure function ``(params, args) -> outputs`` whose every operation
is a JAX one, so it traces under ``jax.jit``, ``grad``, ``vmap``, ``lax.scan`` and a sharded mesh
like any JAX function. :func:`from_torch` wraps it as a :class:`TorchModel`, a
:class:`jaxrobust.model.Model` that splits that dict in two: ``params``, the floating-point
``nn.Parameter`` s with ``requires_grad`` (what ``jax.grad`` differentiates and an optimizer
updates; never an integer leaf, so the ``jr.training`` losses fine-tune it), and ``buffers``, the
rest (running statistics, BatchNorm's integer ``num_batches_tracked``, frozen parameters). Every
front door takes it directly, and it passes both to compiled programs as arguments
(:attr:`~jaxrobust.model.Model.arguments`), never as constants.

Layout. jaxrobust's images are NHWC (Square and AutoAttack read the last axis as the channels);
PyTorch's are NCHW. With ``layout="nhwc"`` (the default) the model takes NHWC images and
transposes every 4-D input to NCHW before the module's first operation,

.. math:: f_{\text{jax}}(\theta, x) = f_{\text{torch}}(\theta, x^{\top(0,3,1,2)}),\qquad
   x \in \mathbb{R}^{B\times H\times W\times C},

so the attacks, their projections and the box act on the same pixels as in PyTorch. Inputs of
other ranks (flat features ``[B, D]``, sequences) pass unchanged; ``layout="nchw"`` passes 4-D
inputs unchanged too (then images must be NCHW everywhere, and Square would read the width as the
channels). ``example_input`` is always in the module's own layout (NCHW for images), as one calls
the module in PyTorch.

Checks. :func:`from_torch` refuses a module with any submodule in training mode (BatchNorm would
use batch statistics, Dropout would drop: call ``module.eval()``), names the ATen operation
torchax cannot lower (:class:`UnsupportedOperationError`), and compares the converted model's
logits with the module's on ``example_input`` once:

.. math:: \max_{b,c} |z^{\text{jax}}_{bc} - z^{\text{torch}}_{bc}|
   \le \text{atol} + \text{rtol}\,|z^{\text{torch}}_{bc}|

in float64, else a ``ValueError`` with the largest error.

References:
  torchax, https://github.com/google/torchax (``torchax.extract_jax``); PyTorch,
  ``torch.nn.Module.eval`` and ``torch.func.functional_call``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust.interop import _torchax_compat
from jaxrobust.model import Model

EXTRA = "pip install 'jaxrobust[torch]'"
"""How to install what :func:`from_torch` needs (PyTorch, torchax 0.0.13, safetensors)."""

LAYOUTS = ("nhwc", "nchw")

_STATE = {"patched": False}


class UnsupportedOperationError(NotImplementedError):
  """An ATen operation of the module that torchax cannot lower to JAX; ``operation`` names it."""

  def __init__(self, operation: str, message: str):
    super().__init__(message)
    self.operation = operation


def import_torch() -> tuple[Any, Any]:
  """``(torch, torchax)``, torchax imported after :mod:`._torchax_compat`'s aliases (once per
  process); an ``ImportError`` naming the extra when either is missing."""
  missing = [name for name in ("torch", "torchax") if importlib.util.find_spec(name) is None]
  if missing:
    raise ImportError(f"jr.interop needs {' and '.join(missing)}: {EXTRA} "
                      "(PyTorch >= 2.11 and torchax 0.0.13)")
  import torch  # noqa: PLC0415 - the optional extra, imported only when it is used

  if not _STATE["patched"]:
    _torchax_compat.patch_missing_overloads()
    _STATE["patched"] = True
  import torchax  # noqa: PLC0415

  return torch, torchax


@dataclasses.dataclass(frozen=True, eq=False)
class TorchModel(Model):
  """A converted PyTorch module: a :class:`jaxrobust.model.Model` whose ``params`` are the
  module's trainable parameters (a dict ``name -> jax.Array`` of the floating-point
  ``nn.Parameter`` s with ``requires_grad``, what a PyTorch optimizer is given) and whose
  ``buffers`` are everything else the module reads (BatchNorm's running statistics and its integer
  ``num_batches_tracked``, frozen parameters); ``spec`` is the pure apply
  ``(params, buffers, x) -> logits``.

  ``model(x)`` is the module on ``x`` (NHWC images with ``layout="nhwc"``), ``model.apply(params,
  x)`` the module on other parameters of the same structure (and this model's buffers), and
  ``params, apply = model`` unpacks it. Since ``params`` holds only floating-point arrays,
  ``jax.grad`` over it works as for any JAX model (fine-tuning with ``jr.training`` and optax);
  the buffers are never differentiated nor updated by an optimizer, as in PyTorch. A pytree whose
  leaves are the parameters and the buffers: pass ``model`` as an argument of ``jax.jit`` (then
  ``model.with_params(p)`` or ``model.apply(p, x)`` inside reads the buffers as arguments too;
  a model closed over by the jitted function has its buffers compiled in as constants).

  Attributes:
    buffers: the module's other arrays, a dict ``name -> jax.Array`` (an argument of compiled
      programs like ``params``; see :attr:`arguments`).
    check_error: the largest absolute logit difference from the PyTorch module on the example
      input, measured by :func:`from_torch`.

  Examples:
    >>> import numpy as np, torch, jax, jaxrobust as jr
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
    ...                           torch.nn.Linear(4, 2)).eval()
    >>> model = jr.interop.from_torch(net, np.ones((2, 3), np.float32))
    >>> sorted(model.params), sorted(model.buffers)[-1]
    (['0.bias', '0.weight', '1.bias', '1.weight', '2.bias', '2.weight'], '1.running_var')
    >>> grads = jax.grad(lambda p: model.apply(p, np.ones((2, 3), np.float32)).sum())(model.params)
    >>> grads["2.bias"].tolist()
    [2.0, 2.0]
  """

  buffers: Any = None  # a dict name -> jax.Array: what the module reads and does not train
  check_error: float | None = None

  def as_callable(self) -> Any:
    """``functools.partial(apply, params, buffers)``: the logits function on :attr:`params`."""
    return functools.partial(self.spec, self.params, self.buffers)

  @property
  def arguments(self) -> Any:
    """``(params, buffers)``: every array the module reads (see :attr:`Model.arguments`)."""
    return (self.params, self.buffers)

  def with_arguments(self, arguments: Any) -> TorchModel:
    params, buffers = arguments
    return self._replace(params=params, buffers=buffers)

  def compute_in(self, dtype: Any) -> TorchModel:
    """As :meth:`Model.compute_in`, the floating-point buffers (running statistics) cast too."""
    cast = lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
    return super().compute_in(dtype)._replace(buffers=jax.tree.map(cast, self.buffers))

  def __iter__(self) -> Any:
    return iter((self.params, self.apply))


jax.tree_util.register_pytree_node(
    TorchModel, lambda m: ((m.params, m.buffers), (m.kind, m.spec, m.compute_dtype,
                                                    m.check_error)),
    lambda aux, children: TorchModel(children[0], *aux[:3], buffers=children[1],
                                     check_error=aux[3]))


_NO_LOWERING = re.compile(r"Operator with name (\S+) has no lowering")


def _apply(jax_fn: Any, layout: str, not_found: type, module: Any, params: Any, buffers: Any,
           x: Any) -> Any:
  """The module on ``x`` (NHWC images transposed to NCHW) with ``params`` and ``buffers``;
  PyTorch's implicit broadcasting and type promotion allowed inside (the module's semantics,
  whatever the caller's JAX promotion settings). torchax runs the live ``module``'s ``forward``
  at every trace, so a module put back in training mode after the conversion is refused here."""
  _refuse_training(module, after=True)
  x = jnp.asarray(x)
  if layout == "nhwc" and x.ndim == 4:
    x = jnp.transpose(x, (0, 3, 1, 2))
  with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
    try:
      return jax_fn({**params, **buffers}, (x,))
    except not_found as error:
      found = _NO_LOWERING.search(str(error))
      operation = found.group(1) if found else str(error)
      raise UnsupportedOperationError(
          operation, f"torchax cannot lower the PyTorch operation {operation} to JAX, so this "
          "module cannot be converted; rewrite that part of the module with supported "
          "operations (or register a lowering with torchax)") from error


def _example(torch: Any, example_input: Any) -> Any:
  if isinstance(example_input, torch.Tensor):
    return example_input.detach().cpu()
  return torch.from_numpy(np.array(example_input))  # a copy: writable, contiguous


def _refuse_training(module: Any, *, after: bool = False) -> None:
  training = [name or type(module).__name__ for name, m in module.named_modules() if m.training]
  if training:
    shown = ", ".join(training[:3]) + (f" and {len(training) - 3} more" if len(training) > 3 else "")
    when = ("was put back in training mode after from_torch" if after else
            "is in training mode")
    raise ValueError(f"the module {when} ({shown}): BatchNorm would normalise with "
                     "the batch's statistics and Dropout would drop, so the attacked model would "
                     "not be the one you evaluate; call module.eval()"
                     + (" (the converted model runs the module's own forward)" if after else
                        " before from_torch"))


def _refuse_unconvertible(torch: Any, module: Any) -> None:
  """What torchax would convert wrongly or not at all: parameters or buffers that are not float32
  (the attacks call the model in float32; bfloat16 ones do not even reach NumPy) and hooks on
  the module itself (torchax calls its ``forward`` directly, so they would be skipped)."""
  dtypes = sorted({str(t.dtype).replace("torch.", "") for t in (*module.parameters(),
                                                                 *module.buffers())
                   if t.is_floating_point() and t.dtype != torch.float32})
  if dtypes:
    raise ValueError(f"the module's parameters or buffers are {', '.join(dtypes)}; convert a "
                     "float32 module, module.float(), and to compute in low precision use "
                     "from_torch(module.float(), example).compute_in(jnp.bfloat16) (or float16)")
  hooks = [kind for kind in ("_forward_pre_hooks", "_forward_hooks")
           if getattr(module, kind, None)]
  if hooks:
    raise ValueError("the module has forward hooks registered on itself "
                     f"({', '.join(h.strip('_') for h in hooks)}), which the conversion would "
                     "skip (torchax calls module.forward directly): register them on a submodule, "
                     "fold them into forward, or wrap the module in another one")


def _reference(torch: Any, module: Any, example: Any) -> np.ndarray:
  """The module's logits on ``example`` (NCHW), in PyTorch; a ``ValueError`` if it fails."""
  try:
    with torch.no_grad():
      out = module(example)
  except Exception as error:  # noqa: BLE001 - the user's module on the user's input
    raise ValueError(f"the module failed on example_input of shape {tuple(example.shape)} "
                     f"({example.dtype}); give a batch in the module's own layout (NCHW for "
                     f"images): {type(error).__name__}: {error}") from error
  if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != example.shape[0]:
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    raise ValueError(f"the module must return logits [B, C]; on example_input of shape "
                     f"{tuple(example.shape)} it returned {shape}")
  return out.detach().cpu().numpy()


def _split(module: Any, states: dict) -> tuple[dict, dict]:
  """``states`` (torchax's ``name -> jax.Array`` of parameters and buffers) as ``(params,
  buffers)``: the floating-point parameters with ``requires_grad`` (what ``jax.grad`` may
  differentiate and an optimizer update), and the rest, integer buffers included."""
  trainable = {name for name, p in module.named_parameters()
               if p.requires_grad and p.is_floating_point()}
  params = {name: v for name, v in states.items() if name in trainable}
  return params, {name: v for name, v in states.items() if name not in trainable}


def from_torch(module: Any, example_input: Any, *, layout: str = "nhwc", atol: float = 1e-4,
               rtol: float = 1e-4) -> TorchModel:
  r"""``module`` (a ``torch.nn.Module`` in eval mode) as a jaxrobust model, through torchax.

  Args:
    module: the PyTorch module, every submodule in eval mode (``module.eval()``).
    example_input: a small batch in the module's own layout (NCHW images, ``[B, D]`` features), a
      ``torch.Tensor`` or an array: the module's logits on it are compared with the conversion's.
    layout: ``"nhwc"`` (default): the model takes NHWC images, as jaxrobust's attacks expect, and
      transposes 4-D inputs to NCHW inside; ``"nchw"``: 4-D inputs pass unchanged.
    atol, rtol: the check's tolerance: ``|z_jax - z_torch| <= atol + rtol |z_torch|`` for every
      logit of the example (float32 arithmetic in two libraries differs in the last bits).

  Returns:
    A :class:`TorchModel`: ``model(x)`` gives the logits, ``model.params`` the trainable
    parameters and ``model.buffers`` the rest (dicts of ``jax.Array``), ``model.apply(params, x)``
    the apply on other parameters; it unpacks as ``params, apply = model``. Pass it wherever a
    ``logits_fn`` is accepted (``jr.run``, curves, AutoAttack, ``jr.evaluate``, ``jr.training``,
    ``jr.certify``); inside ``jax.jit``, pass ``model`` as an argument (parameters and buffers
    travel with it; ``model.with_params(p)`` inside for new parameters).

  Raises:
    ImportError: PyTorch or torchax is not installed (``pip install 'jaxrobust[torch]'``).
    ValueError: a submodule is in training mode (also when the converted model is called after
      the module was put back in it), parameters or buffers that are not float32 (convert a
      float32 module and use ``compute_in``), forward hooks on the module itself, the module
      fails on ``example_input`` or returns no ``[B, C]`` logits, or the converted logits differ
      beyond the tolerance.
    UnsupportedOperationError: an ATen operation torchax cannot lower (its name in the message
      and in ``.operation``); also raised when a later call traces such an operation.

  See the module docstring for the layout and the check, and the README section "Your model"
  for a runnable example.
  """
  torch, torchax = import_torch()
  if not isinstance(module, torch.nn.Module):
    raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  _refuse_training(module)
  _refuse_unconvertible(torch, module)
  example = _example(torch, example_input)
  expected = _reference(torch, module, example)
  from torchax.tensor import OperatorNotFound  # noqa: PLC0415 - the optional extra

  states, jax_fn = torchax.extract_jax(module)
  params, buffers = _split(module, states)
  apply = functools.partial(_apply, jax_fn, layout, OperatorNotFound, module)
  x = jnp.asarray(example.numpy())
  if layout == "nhwc" and x.ndim == 4:
    x = jnp.transpose(x, (0, 2, 3, 1))
  try:
    got = np.asarray(apply(params, buffers, x), np.float64)
  except (UnsupportedOperationError, ValueError):
    raise
  except Exception as error:  # noqa: BLE001 - torchax's own failures on the user's module
    raise ValueError(f"torchax could not run the module's forward in JAX: "
                     f"{type(error).__name__}: {error}; the module uses something torchax does "
                     "not convert (e.g. a spectral_norm parametrization): rewrite that part "
                     "with plain operations") from error
  reference = expected.astype(np.float64)
  if got.shape != reference.shape:
    raise ValueError(f"the converted model returned logits of shape {got.shape}, the module "
                     f"{reference.shape}")
  error = float(np.max(np.abs(got - reference), initial=0.0))
  allowed = atol + rtol * np.abs(reference)
  if not np.all(np.abs(got - reference) <= allowed):
    raise ValueError(f"the converted model's logits differ from the module's on example_input by "
                     f"up to {error:.3g} (allowed: atol={atol:g} + rtol={rtol:g} * |logit|); "
                     "check example_input's layout (the module's own, NCHW for images) and that "
                     "the module is deterministic in eval mode")
  return TorchModel(params, "torch", apply, None, buffers=buffers, check_error=error)
