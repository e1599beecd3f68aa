"""One JAX CPU device per core, and jaxrobust's programs data-parallel over them (benchmarks).

XLA:CPU runs a convolution's input gradient on about one core where PyTorch's use every core
(``benchmarks/RESULTS.md``, "Every core of a CPU"), so a fair CPU comparison splits the batch over
one JAX CPU device per core, as ``jr.evaluate(..., mesh=mesh)`` does on its ``shard_map`` path and as
``jaxrobust evaluate`` does by default. :func:`use_cpu_devices` asks for the devices (before JAX's
backend starts), :func:`place` puts the arguments on them and :func:`data_parallel` wraps a
program ``program(state, *rest)`` in ``jax.shard_map`` over the batch. With one device every
function leaves things as they are.

Example (one CPU device per core, a program of the parameters and a batch)::

  use_cpu_devices(os.cpu_count())          # right after ``import jax``
  args = place(params, (x, True), (y, True), (eps, False), (key, False))
  program = jax.jit(data_parallel(curve_robust, (True, True, False, False), out_axis=1))
  robust = program(*args)
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


def data_parallel(program: Callable, batched: tuple[bool, ...], out_axis: int = 0) -> Callable:
  """``program(state, *rest)`` run per device on its shard of the batch (``jax.shard_map``).

  ``batched[i]`` says whether argument ``i`` (after the state) is split over the devices along
  its first axis; the output's batch axis is ``out_axis`` (of every output leaf). A single key
  (an unbatched key argument) is folded with the device's index, so the shards draw different
  randomness; batched keys (one per example) are split with their examples and kept. This is what
  ``jr.evaluate(..., mesh=mesh)`` runs per device on its ``shard_map`` path; with one device the
  program is returned unchanged.
  """
  mesh = batch_mesh()
  if mesh is None:
    return program
  P = jax.sharding.PartitionSpec

  def local(state, *rest):
    index = jax.lax.axis_index("batch")
    rest = tuple(jax.random.fold_in(a, index) if is_key(a) and not b else a
                 for a, b in zip(rest, batched))
    return program(state, *rest)

  out_spec = P(*([None] * out_axis), "batch")
  return jax.shard_map(local, mesh=mesh, in_specs=(P(),) + tuple(P("batch") if b else P()
                                                                   for b in batched),
                       out_specs=out_spec, check_vma=False)


def is_key(a: Any) -> bool:
  return isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key)


def place(state, *rest_and_batched):
  """``state`` replicated and each ``(array, batched)`` sharded over the batch mesh (if any)."""
  mesh = batch_mesh()
  if mesh is None:
    return (state,) + tuple(a for a, _ in rest_and_batched)
  P, S = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
  count = mesh.devices.size
  for a, b in rest_and_batched:
    if b and a.shape[0] % count:
      raise SystemExit(f"a batch of {a.shape[0]} does not split over {count} CPU devices: pass "
                       f"a multiple of {count}, or --cpu-devices 1")
  return (jax.device_put(state, S(mesh, P())),) + tuple(
      jax.device_put(a, S(mesh, P("batch") if b else P())) for a, b in rest_and_batched)
