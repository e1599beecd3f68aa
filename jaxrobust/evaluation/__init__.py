r"""``jr.evaluate``: a streaming, sharded, resumable robustness evaluation over a whole data set.

The data arrive as host batches; each is padded to ``batch_size`` (copies of a valid example,
masked out) and fed to ONE compiled step, built and ``jax.jit``-ed once per call, that runs every
attack on the batch and returns integer sums. For example :math:`i` (global index :math:`g_i`),
attack :math:`a` and budget :math:`\epsilon_k` the step computes

.. math::
   r_{a,k,i} = [\hat y(x_i) = y_i]\;\prod_{j:\ \epsilon_j \le \epsilon_k}
               \big(1 - s_a(x_i, \epsilon_j;\ \mathrm{fold\_in}(\mathrm{fold\_in}(key, g_i), j))\big)

(for a minimum-norm attack :math:`r_{a,k,i} = [\hat y(x_i) = y_i]\,[\epsilon^*_a(x_i) >
\epsilon_k]`) and the masked sums :math:`N = \sum_i m_i`, :math:`\sum_i m_i [\hat y(x_i) = y_i]`,
:math:`\sum_i m_i r_{a,k,i}` and :math:`\sum_i m_i \prod_a r_{a,k,i}` (the per-example worst case
over attacks). The host adds them up in int64 (:class:`jaxrobust.Report`). Because every
example's randomness derives from its global index and the sums are exact integers, the report
does not depend on batch size, padding, batch order, device count or an interruption. Reliability
flags are decided the same way, from integer counts summed over the whole data set.

The report describes the model as it is when the call starts: compiled steps are reused across
calls only where they compute what a fresh one would (the model's parameters are arguments, or
the arrays compiled in as constants are the very same ones; see :func:`evaluate`).

Scaling: with ``mesh=`` the batch is sharded over the mesh's first (or ``batch_axis``) axis with
:class:`jax.sharding.NamedSharding`; the attack loop is purely per-example, so XLA compiles it
with no cross-device movement of attack data (only integer scalars, the reliability counts of
each eps, and the final integer sums are all-reduced). Multi-host
runs call :func:`jax.distributed.initialize` first; each process then passes its own shard of
the data and the batches are assembled with :func:`jax.make_array_from_process_local_data`.

**The model, as it is at call time.** Every call evaluates the model as it is when the call
starts, whatever changed since an earlier call (a training loop evaluating each epoch). The
forward pass is traced once per call (cheap; the step is not) to see what the model reads:

* ``functools.partial(model.apply, params)`` (or ``jax.tree_util.Partial``) and
  ``flax.nnx.Module`` (its state, through ``nnx.split``/``nnx.merge``): the arrays become
  arguments of the compiled step, so they keep the sharding they already have (replicated or
  model-sharded), are not copied into the program as constants, and new parameters of the same
  shapes reuse the compiled step (no recompilation across epochs);
* any other callable (a closure, a function reading a global, an object with array
  attributes): the arrays it reads are compiled into the step as constants. The compiled step
  is reused only while they are the very same arrays (a ``jax.Array`` cannot change in place)
  and the traced program is the same (a changed Python constant or architecture changes it);
  after a weight change the step is compiled again. Pass a ``partial`` or an ``nnx.Module`` to
  avoid that recompilation.

Not seen by the trace, so not allowed to change between calls that reuse a step: state read
only inside custom derivative rules (``jax.custom_vjp`` backward functions) or host callbacks,
and Python branches taken only at batch shapes other than ``batch_size`` (e.g. chunks).

**Sharding.** With ``mesh``, each batch is placed with ``NamedSharding(mesh, P(batch_axis))``
(default: the mesh's first axis; ``batch_size`` must be a multiple of its size); eps and key are
replicated. Explicit and Auto axis types both work. The attack loops need no communication;
the sums are global. ``use_shard_map=True`` runs the same step per device under
:func:`jax.shard_map` and reduces with :func:`jaxrobust.metrics.psum` instead (the model is
then replicated on every device); the report is the same.

**Multi-host.** Call ``jax.distributed.initialize()`` first, build a mesh over
``jax.devices()`` (all processes), and give each process its own shard of the data, in batches
of ``batch_size // jax.process_count()``; every process must see the same number of batches.
Global batch ``b`` is the concatenation of the processes' ``b``-th local batches in process
order, so a local row ``i`` of process ``p`` gets the global index
``b * batch_size + p * (batch_size // P) + i`` (pass explicit indices as a third batch element
``(x, y, index)`` for any other layout). Each process writes its own checkpoint,
``<checkpoint>.process<p>of<P>``; every process gets the whole report.

**Checkpoints.** With ``checkpoint``, the reducer state, the position and a running SHA-256 of
the data seen are written atomically after every batch (a uniquely named temporary file,
``fsync``, :func:`os.replace`; concurrent writers never share a temporary file). If the file
exists, the run resumes: it reads (and hashes, but does not evaluate) the batches already done,
then continues; the final report equals an uninterrupted run's bitwise. A checkpoint written
for other attacks, eps, key, batch size, box or data is refused with a ``ValueError``, and so is
one written for another model: the checkpoint holds the SHA-256 of the model's traced forward
program and of the values of every array it reads (the parameters of a ``partial`` or an
``nnx.Module``, the arrays a closure captures), so other weights or another architecture are
refused (so is the same model after a JAX upgrade that changes its traced program). Delete the
file to start over. The devices are not part of a run's identity (its report does not depend on
them): a checkpoint written on a mesh resumes on another mesh or on one device, and the other
way round. In a multi-process run each process keeps its state one batch back too, and a resumed
run restarts every process from the smallest position reached (with the same process count).

**Reliability flags.** Each attack's ``AttackResult.info`` flags (e.g. non-finite gradients,
AutoAttack's checks) are OR-ed over batches and eps, and the counts behind them summed over the
data set (``Report.attacks[name].counts``: ``[K]`` per eps, ``[]`` when counted once, and
``robust_after`` ``[K, M]`` for ensembles and suites: examples robust after members ``1..m``); a flag defined by a fraction of the
data (AutoAttack's ``square_beats_white_box``) is decided from the global count and ``N`` (see
:func:`jaxrobust.report.decide_flags`), so the report is the same for any batch size.

**Static gradient-masking diagnosis.** Unless ``diagnose=False``, the first batch (before any
evaluation, also when resuming) runs :func:`jaxrobust.diagnose`'s analysis
(:func:`jaxrobust.diagnosis.diagnose_traced`) on the forward program traced above: the model as
evaluated (the one :func:`jaxrobust.model.model_of` takes apart, parameters as arguments) at a
``jax.ShapeDtypeStruct`` of one global batch. No extra trace, no model evaluation, no data
moved. A randomized model (attacks with ``samples``, e.g. ``eot``) is diagnosed as
``logits_fn(x, keys)``, its draws reported as ``random``. The report keeps it in
``provenance["diagnosis"]`` (``Report.diagnosis``, a section of ``str(report)``); findings of
severity ``"error"`` make ``Report.reliable`` False and give one
:class:`jaxrobust.diagnosis.GradientMaskingWarning` naming the remedies. The checkpoint does not
store it: a resumed run diagnoses the model again (the checkpoint's model fingerprint has made
sure it is the same model). Each process of a multi-host run diagnoses its own copy. Should the diagnosis itself fail, the run warns (``RuntimeWarning``)
and goes on without one.

Layout: :mod:`~jaxrobust.evaluation.driver` holds the public loop, which reads in a screen;
:mod:`~jaxrobust.evaluation.device_step` the compiled step (the model taken apart, the curve
kernel per attack, the jit / shard_map cache); :mod:`~jaxrobust.evaluation.host` the data stream,
padding, indices, placement, hashing and progress; :mod:`~jaxrobust.evaluation.checkpointing`
the fingerprints, the host state and resuming.
"""

from jaxrobust.evaluation.device_step import EvalSums, PerExample, build_step
from jaxrobust.evaluation.driver import evaluate

__all__ = ["EvalSums", "PerExample", "build_step", "evaluate"]
