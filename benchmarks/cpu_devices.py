"""One JAX CPU device per core, and jaxrobust's programs data-parallel over them (benchmarks).

XLA:CPU runs a convolution's input gradient on about one core where PyTorch's use every core
(``benchmarks/RESULTS.md``, "Every core of a CPU"), so a fair CPU comparison splits the batch over
one JAX CPU device per core, as ``jr.evaluate(..., mesh=mesh)`` does on its ``shard_map`` path and as
``jaxrobust evaluate`` does by default. :func:`use_cpu_devices` asks for the devices (before JAX's
backend starts) and :func:`split_over_devices` wraps a program ``program(state, *rest)`` in
``jax.shard_map`` over the batch and puts its arguments on the devices. With one device nothing
changes.

Example (one CPU device per core, a program of the parameters and a batch)::

  use_cpu_devices(os.cpu_count())          # right after ``import jax``
  program, args = split_over_devices(curve_robust, params, (x, True), (y, True), (eps, False),
                                     (key, False), out_axis=1)
  robust = jax.jit(program)(*args)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def use_cpu_devices(count: int) -> None:
  """Asks JAX for ``count`` CPU devices, before its backend starts (on an accelerator the CPU
  backend is not the default one, so :func:`batch_mesh` sees the accelerator alone)."""
  if count > 1:
    jax.config.update("jax_num_cpu_devices", count)


def batch_mesh() -> jax.sharding.Mesh | None:
  """A 1-D ``"batch"`` mesh over every device of this process, or ``None`` with one device."""
  devices = jax.devices()
  return None if len(devices) == 1 else jax.make_mesh((len(devices),), ("batch",),
                                                      devices=devices)


def split_over_devices(program: Callable, state, *args_and_batched: tuple[Any, bool],
                       out_axis: int = 0) -> tuple[Callable, tuple]:
  """``program(state, *rest)`` run per device on its shard of the batch (``jax.shard_map``), and
  its arguments ``(state, *rest)`` on the devices: ``state`` replicated, each ``(array, batched)``
  split over the devices along its first axis where ``batched``, else replicated.

  The output's batch axis is ``out_axis`` (of every output leaf). A single key (an unbatched key
  argument) is folded with the device's index, so the shards draw different randomness; batched
  keys (one per example) are split with their examples and kept. This is what
  ``jr.evaluate(..., mesh=mesh)`` runs per device on its ``shard_map`` path. With one device,
  ``(program, (state, *rest))`` unchanged.
  """
  rest = tuple(a for a, _ in args_and_batched)
  batched = tuple(b for _, b in args_and_batched)
  mesh = batch_mesh()
  if mesh is None:
    return program, (state, *rest)
  P, S = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
  for a, b in args_and_batched:
    if b and a.shape[0] % mesh.size:
      raise SystemExit(f"a batch of {a.shape[0]} does not split over {mesh.size} CPU devices: "
                       f"pass a multiple of {mesh.size}, or --cpu-devices 1")
  specs = tuple(P("batch") if b else P() for b in batched)

  def local(state, *rest):
    index = jax.lax.axis_index("batch")
    rest = tuple(jax.random.fold_in(a, index) if is_key(a) and not b else a
                 for a, b in zip(rest, batched))
    return program(state, *rest)

  split = jax.shard_map(local, mesh=mesh, in_specs=(P(),) + specs,
                        out_specs=P(*([None] * out_axis), "batch"), check_vma=False)
  placed = (jax.device_put(state, S(mesh, P())),) + tuple(
      jax.device_put(a, S(mesh, spec)) for a, spec in zip(rest, specs))
  return split, placed


def is_key(a: Any) -> bool:
  return isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key)
