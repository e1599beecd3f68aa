"""Training the demo's `SmallCNN` on the digits with the losses of :mod:`jaxrobust.training`,
with an on-disk cache.

Four training methods, all with Adam on batches of 64 and the same network (so that the demo's
table compares training methods, not architectures):

* ``"plain"``: the cross-entropy of the clean batch;
* ``"adversarial"``: Madry et al. (2018): :func:`jaxrobust.training.adversarial_loss`, the
  cross-entropy at Linf PGD-7 points (eps 0.2, PGD's default cosine step schedule from 2 eps,
  random start) found against the current parameters, every point of the batch attacked;
* ``"trades"``: Zhang et al. (2019): :func:`jaxrobust.training.trades_loss`, clean cross-entropy
  plus ``beta = 6`` times the KL divergence between the predictions at ``x`` and at the point of
  a 7-step KL ascent (eps 0.2, the reference's step of 7/31 eps): the same inner cost as PGD-7;
* ``"ibp"``: Gowal et al. (2018): :func:`jaxrobust.training.ibp_loss`,
  ``kappa * CE(z, y) + (1 - kappa) * CE(z_hat, y)`` with ``z_hat`` the worst-case logits of the
  Linf box by interval bound propagation, on :func:`ibp_schedule`: eps 0 for the first 10% of
  the steps, then eps ramped linearly to 0.1 and ``kappa`` from 1 to 0.5 over the next 50%, then
  both held. IBP certifies 78% of the test set at Linf 0.05 and 56% at 0.1 for this network,
  none for the others (CROWN: 64% at 0.1, the PGD-trained network 38%), at the price of about
  seven points of clean accuracy (0.91 against 0.98).

A training step (loss, gradient, Adam update) is one jitted function of the parameters, the
optimiser state, the batch, the key and the step number (the IBP schedule and the attack keys are
data, so it compiles once per configuration); the epoch loop around it is plain Python. On
XLA:CPU one program per step trains this network several times faster than a ``lax.scan`` over
the batches, whose loop body slows the strided convolution's gradients down (see
``benchmarks/RESULTS.md``). Each epoch shuffles the training split (the few images that do not
fill a batch change from epoch to epoch).

Trained parameters are cached under ``cache_dir`` (default ``$XDG_CACHE_HOME/jaxrobust``, else
``~/.cache/jaxrobust``) in a file named after a hash of the whole training configuration and the
jax and jaxrobust versions, so a changed setting or upgrade retrains and an unchanged one loads in
milliseconds. Files are written atomically; an unreadable or mismatched file is retrained.

References:
  A. Madry et al. Towards deep learning models resistant to adversarial attacks. ICLR 2018.
  H. Zhang et al. Theoretically principled trade-off between robustness and accuracy. ICML 2019.
  S. Gowal et al. On the effectiveness of interval bound propagation for training verifiably
  robust models. arXiv:1810.12715, 2018.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import warnings
from typing import Any, Callable, Optional, Union

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

import jaxrobust as jr
from jaxrobust import training
from jaxrobust.demo import data, files
from jaxrobust.demo.model import SmallCNN

Params = Any

METHODS = ("plain", "adversarial", "trades", "ibp")
"""The training methods, in the demo's order."""

CACHE_FORMAT = 3  # 3: trained by jr.training (every point attacked; unrolled); trades, ibp
"""Bumped whenever the meaning of a cached file changes."""

DEFAULT_EPOCHS = {"plain": 20, "adversarial": 20, "trades": 20, "ibp": 20}
"""Epochs per method: seconds (plain) to tens of seconds (PGD, TRADES, IBP) on CPU."""

DEFAULT_LEARNING_RATE = 2e-3
DEFAULT_EPS = 0.2
"""Linf radius of PGD and TRADES training, in pixel units of [0, 1] images."""

DEFAULT_IBP_EPS = 0.1
"""Linf radius IBP training ramps up to. Certified accuracy falls off quickly above the training
radius; 0.1 keeps the clean accuracy near 0.9 and certifies most of the test set at 0.05 (a trial
at 0.15, 15 epochs, lost another 8 points of clean accuracy and certified less at 0.05 and 0.1)."""

ATTACK_STEPS = 7
"""Inner steps of PGD and TRADES training (PGD: its default cosine schedule from 2 eps, random
start; TRADES: the reference's sign steps of 7/31 eps from ``x + 0.001 N(0, I)``)."""

UNROLL_ATTACK = True
"""Unroll the inner attack's loop (``unroll=True`` of the losses). Chosen when XLA:CPU ran a
convolution's input gradient several times slower inside a loop body; since ``jr.training``
writes its loops' convolutions in canonical form the looped attack is as fast, but the setting is
kept: results equal the looped ones only up to float rounding, which changes the trained weights,
and it is part of the configuration (and the cache key) of the models users have cached."""

TRADES_BETA = 6.0
"""TRADES' weight of the KL term (the paper's default)."""

IBP_SCHEDULE = {"warmup_fraction": 0.1, "ramp_fraction": 0.5, "kappa_start": 1.0,
                "kappa_end": 0.5}
"""Shape of the IBP schedule (fractions of all training steps): see `ibp_schedule`."""


def ibp_schedule(step: jax.typing.ArrayLike, total_steps: int, *, eps: jax.typing.ArrayLike,
                 warmup_fraction: float = 0.1, ramp_fraction: float = 0.5,
                 kappa_start: float = 1.0, kappa_end: float = 0.5) -> tuple[jax.Array, jax.Array]:
  r"""Gowal et al.'s IBP training schedule: ``(eps_t, kappa_t)`` at step ``step``.

  With :math:`W` = ``warmup_fraction * total_steps`` warm-up steps and :math:`R` =
  ``ramp_fraction * total_steps`` ramp steps, :math:`r_t = \mathrm{clip}((t - W) / R, 0, 1)`:

  .. math::
     \epsilon_t = r_t \, \epsilon, \qquad
     \kappa_t = \kappa_{start} + r_t (\kappa_{end} - \kappa_{start}).

  So training starts as clean training (``eps 0``, ``kappa 1``), the bound's weight and radius
  grow linearly together, and both are held from step ``W + R`` on. Everything is traced data:
  under ``jit`` the step number changes nothing but values.

  Args:
    step: the step number, 0-based (a Python int or a traced scalar).
    total_steps: steps of the whole training run (static).
    eps: the final radius.
    warmup_fraction, ramp_fraction: the warm-up and ramp lengths as fractions of ``total_steps``.
    kappa_start, kappa_end: the clean term's weight before and after the ramp.

  Returns:
    ``(eps_t, kappa_t)``, float32 scalars.

  Examples:
    >>> [tuple(round(float(v), 3) for v in ibp_schedule(t, 100, eps=0.1))
    ...  for t in (0, 10, 35, 60, 99)]
    [(0.0, 1.0), (0.0, 1.0), (0.05, 0.75), (0.1, 0.5), (0.1, 0.5)]

  References:
    S. Gowal et al. On the effectiveness of interval bound propagation for training verifiably
    robust models. arXiv:1810.12715, 2018 (Section 4: eps ramped up linearly after a warm-up,
    kappa from 1 to 0.5).
  """
  warmup = warmup_fraction * total_steps
  ramp = max(ramp_fraction * total_steps, 1.0)
  t = jnp.asarray(step).astype(jnp.float32)
  progress = jnp.clip((t - warmup) / ramp, 0.0, 1.0)
  eps_t = progress * jnp.asarray(eps, jnp.float32)
  kappa_t = kappa_start + progress * (kappa_end - kappa_start)
  return eps_t, kappa_t.astype(jnp.float32)


def method_name(method: Union[str, bool]) -> str:
  """``method`` as one of `METHODS`; ``True``/``False`` (the old ``adversarial`` flag) mean
  ``"adversarial"``/``"plain"``.

  Raises:
    ValueError: an unknown method, with the known ones.
  """
  if isinstance(method, (bool, np.bool_)):
    return "adversarial" if method else "plain"
  if method not in METHODS:
    raise ValueError(f"unknown training method {method!r}; expected one of {', '.join(METHODS)}")
  return method


def training_config(
  method: Union[str, bool],
  *,
  epochs: Optional[int] = None,
  batch_size: int = 64,
  learning_rate: float = DEFAULT_LEARNING_RATE,
  eps: Optional[float] = None,
  seed: int = 0,
) -> dict[str, Any]:
  """The complete, JSON-serialisable description of one training run.

  Everything that changes the trained parameters is in here; its hash names the cache file.
  Only the chosen method's settings are present (plain training has no radius, so ``eps`` does
  not affect it).

  Args:
    method: one of `METHODS` (``"plain"``, ``"adversarial"``, ``"trades"``, ``"ibp"``); ``True``
      and ``False`` mean ``"adversarial"`` and ``"plain"``.
    epochs: passes over the training split; ``None`` picks ``DEFAULT_EPOCHS[method]``.
    batch_size: examples per step.
    learning_rate: Adam's learning rate.
    eps: Linf training radius (``None``: `DEFAULT_EPS`, or `DEFAULT_IBP_EPS` for ``"ibp"``, where
      it is the radius the schedule ramps up to); ignored by plain training.
    seed: seed of the initialisation, the shuffling and the training randomness (attack starts).

  Returns:
    A dict with the model, data split, optimiser and loss settings (``loss``: the
    :mod:`jaxrobust.training` function and its arguments).

  Raises:
    ValueError: an unknown method, ``epochs`` or ``batch_size`` below 1, or ``eps <= 0`` for a
      robust method.

  Examples:
    >>> config = training_config("trades")
    >>> config["epochs"], config["loss"]["function"], config["loss"]["beta"]
    (20, 'jaxrobust.training.trades_loss', 6.0)
    >>> training_config(False)["name"]
    'plain'
  """
  method = method_name(method)
  if epochs is None:
    epochs = DEFAULT_EPOCHS[method]
  if int(epochs) < 1:
    raise ValueError(f"epochs must be at least 1, got {epochs}")
  if int(batch_size) < 1:
    raise ValueError(f"batch_size must be at least 1, got {batch_size}")
  if eps is None:
    eps = DEFAULT_IBP_EPS if method == "ibp" else DEFAULT_EPS
  if method != "plain" and not float(eps) > 0.0:
    raise ValueError(f"eps must be positive for {method} training, got {eps}")
  loss: dict[str, Any]
  if method == "plain":
    loss = {"function": "softmax_cross_entropy"}
  elif method == "adversarial":
    loss = {"function": "jaxrobust.training.adversarial_loss", "norm": "linf", "eps": float(eps),
            "attack": {"factory": "pgd", "steps": ATTACK_STEPS, "step_size": None,
                       "random_start": True, "restarts": 1, "loss": "ce"},
            "unroll": UNROLL_ATTACK}
  elif method == "trades":
    loss = {"function": "jaxrobust.training.trades_loss", "norm": "linf", "eps": float(eps),
            "beta": TRADES_BETA, "steps": ATTACK_STEPS, "step_size": None,
            "unroll": UNROLL_ATTACK}
  else:
    loss = {"function": "jaxrobust.training.ibp_loss", "norm": "linf", "eps": float(eps),
            "schedule": dict(IBP_SCHEDULE)}
  return {
    "name": method,
    "method": method,
    "model": "SmallCNN",
    "num_classes": data.NUM_CLASSES,
    "data": {"dataset": "sklearn.datasets.load_digits", "test_fraction": 0.3, "split_seed": 0},
    "optimizer": "adam",
    "loss": loss,
    "epochs": int(epochs),
    "batch_size": int(batch_size),
    "learning_rate": float(learning_rate),
    "seed": int(seed),
  }


def cache_path(config: dict[str, Any],
               cache_dir: Optional[os.PathLike | str] = None) -> pathlib.Path:
  """Where the parameters of ``config`` are cached: a hash of it and of the library versions.

  Args:
    config: a dict from `training_config`.
    cache_dir: the cache directory; ``None`` means `jaxrobust.demo.files.default_cache_dir`.

  Returns:
    ``<cache_dir>/<name>-<16 hex digits>.msgpack``.
  """
  key = json.dumps(
    {"config": config, "jax": jax.__version__, "jaxrobust": jr.__version__,
     "format": CACHE_FORMAT},
    sort_keys=True,
  )
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  directory = pathlib.Path(cache_dir) if cache_dir is not None else files.default_cache_dir()
  return directory / f"{config['name']}-{digest}.msgpack"


@functools.lru_cache(maxsize=None)
def _init_fn(num_classes: int):
  """``key -> variables`` of `SmallCNN`, jitted once per process (eager init is op-by-op, slow)."""
  model = SmallCNN(num_classes=num_classes)
  return jax.jit(lambda key: model.init(key, jnp.zeros((1, *data.IMAGE_SHAPE), jnp.float32)))


def _param_shapes(config: dict[str, Any]) -> Params:
  return jax.eval_shape(_init_fn(config["num_classes"]), jax.random.key(0))


def load_cached(path: os.PathLike | str, config: dict[str, Any]) -> Optional[Params]:
  """Reads parameters written by `save_cached`, or ``None`` if missing, corrupt or mismatched."""
  path = pathlib.Path(path)
  try:
    raw = path.read_bytes()
  except OSError:
    return None
  expected = _param_shapes(config)
  try:
    restored = flax.serialization.msgpack_restore(raw)
    params = flax.serialization.from_state_dict(expected, restored)
    same_tree = jax.tree.structure(params) == jax.tree.structure(expected)
    leaves, want = jax.tree.leaves(params), jax.tree.leaves(expected)
    if not same_tree or any(
      np.shape(a) != b.shape or np.asarray(a).dtype != b.dtype for a, b in zip(leaves, want)
    ):
      return None
    return jax.tree.map(jnp.asarray, params)
  except Exception:  # noqa: BLE001 - any unreadable file is simply retrained
    return None


def save_cached(path: os.PathLike | str, params: Params) -> None:
  """Writes ``params`` atomically (:func:`jaxrobust.demo.files.write_bytes`)."""
  files.write_bytes(path, flax.serialization.to_bytes(jax.device_get(params)))


def _loss_fn(config: dict[str, Any], total_steps: int) -> Callable[..., Any]:
  """``(params, x, y, key, step) -> (loss, logits)``: the method's :mod:`jaxrobust.training` loss
  of ``SmallCNN`` and the logits it trained on (adversarial points, worst-case logits for IBP)."""
  apply = SmallCNN(num_classes=config["num_classes"]).apply
  method, loss = config["method"], config["loss"]
  if method == "plain":
    def plain(params, x, y, key, step):
      del key, step
      logits = apply(params, x)
      return jnp.mean(jr.losses.cross_entropy(logits, y)), logits

    return plain
  if method == "adversarial":
    attack = jr.attacks.pgd("linf", steps=loss["attack"]["steps"],
                            step_size=loss["attack"]["step_size"])

    def adversarial(params, x, y, key, step):
      del step
      value, aux = training.adversarial_loss(functools.partial(apply, params), x, y,
                                             jr.Budget(loss["eps"]), key, attack=attack,
                                             unroll=loss["unroll"])
      return value, aux.logits_adv

    return adversarial
  if method == "trades":
    def trades(params, x, y, key, step):
      del step
      value, aux = training.trades_loss(functools.partial(apply, params), x, y,
                                        jr.Budget(loss["eps"]), key, beta=loss["beta"],
                                        steps=loss["steps"], step_size=loss["step_size"],
                                        unroll=loss["unroll"])
      return value, aux.logits_adv

    return trades

  def ibp(params, x, y, key, step):
    del key
    eps, kappa = ibp_schedule(step, total_steps, eps=loss["eps"], **loss["schedule"])
    value, aux = training.ibp_loss(functools.partial(apply, params), x, y, jr.Budget(eps),
                                   kappa=kappa)
    return value, aux.logits_adv  # the worst-case logits: argmax == y where certified

  return ibp


def _train_step(config: dict[str, Any], total_steps: int):
  """``(optimizer, step)``: ``step(params, opt_state, x, y, key, t) -> (params, opt_state, loss,
  correct)`` jitted, one compilation per configuration (``t``, the step number, is data)."""
  optimizer = optax.adam(config["learning_rate"])
  loss_fn = _loss_fn(config, total_steps)

  @jax.jit
  def step(params, opt_state, x, y, key, t):
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, x, y, jax.random.fold_in(key, t), t)
    # optax's Adam computes ``decay ** count`` (Python float ** int32), which strict dtype
    # promotion rejects; standard promotion is confined to the optimiser update.
    with jax.numpy_dtype_promotion("standard"):
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == y).astype(jnp.int32))
    return params, opt_state, loss, correct

  return optimizer, step


def fit(config: dict[str, Any], *, progress: bool = True) -> Params:
  """Trains from scratch (no cache) according to ``config``; returns the flax variables dict.

  Args:
    config: a dict from `training_config`.
    progress: show a tqdm bar over epochs with the mean loss and the training accuracy on what
      the loss trained on (the adversarial points for PGD and TRADES, the worst-case logits for
      IBP, i.e. the share of the batch that IBP certifies at the current radius).

  Returns:
    ``{"params": ...}``, ready for ``SmallCNN().apply``.

  Raises:
    ValueError: a batch size larger than the training split.
  """
  x_train, y_train, _, _ = data.load_digits(
    config["data"]["test_fraction"], config["data"]["split_seed"]
  )
  batch_size = config["batch_size"]
  num_batches = x_train.shape[0] // batch_size
  if num_batches < 1:
    raise ValueError(f"batch_size {batch_size} exceeds the {x_train.shape[0]} training examples")
  optimizer, step = _train_step(config, config["epochs"] * num_batches)
  init_key, train_key = jax.random.split(jax.random.key(config["seed"]))
  params = _init_fn(config["num_classes"])(init_key)
  opt_state = optimizer.init(params)
  shuffle = np.random.default_rng(config["seed"])
  bar = tqdm(
    range(config["epochs"]), desc=f"train {config['name']}", unit="epoch", disable=not progress,
    leave=False,
  )
  t = 0
  for _ in bar:
    order = shuffle.permutation(x_train.shape[0])[: num_batches * batch_size]
    xb = jnp.asarray(x_train[order].reshape((num_batches, batch_size, *x_train.shape[1:])))
    yb = jnp.asarray(y_train[order].reshape((num_batches, batch_size)))
    losses, correct = [], []
    for i in range(num_batches):
      params, opt_state, loss, right = step(params, opt_state, xb[i], yb[i], train_key,
                                            jnp.int32(t))
      losses.append(loss)
      correct.append(right)
      t += 1
    if progress:
      seen = num_batches * batch_size
      bar.set_postfix(loss=f"{float(jnp.mean(jnp.stack(losses))):.3f}",
                      acc=f"{int(jnp.sum(jnp.stack(correct))) / seen:.3f}")
  bar.close()
  return jax.block_until_ready(params)


def load_or_train(
  config: dict[str, Any],
  *,
  cache_dir: Optional[os.PathLike | str] = None,
  cache: bool = True,
  progress: bool = True,
) -> tuple[Params, bool]:
  """Loads ``config``'s parameters from the cache, or trains and caches them.

  Args:
    config: a dict from `training_config`.
    cache_dir: the cache directory; ``None`` means `jaxrobust.demo.files.default_cache_dir`.
    cache: read and write the cache at all.
    progress: show the training progress bar.

  Returns:
    ``(params, loaded_from_cache)``.
  """
  path = cache_path(config, cache_dir) if cache else None
  if path is not None:
    params = load_cached(path, config)
    if params is not None:
      return params, True
  params = fit(config, progress=progress)
  if path is not None:
    try:
      save_cached(path, params)
    except OSError as error:
      warnings.warn(f"could not write the parameter cache {path}: {error}", RuntimeWarning,
                    stacklevel=2)
  return params, False


def train(
  method: Union[str, bool],
  *,
  epochs: Optional[int] = None,
  batch_size: int = 64,
  learning_rate: float = DEFAULT_LEARNING_RATE,
  eps: Optional[float] = None,
  seed: int = 0,
  cache_dir: Optional[os.PathLike | str] = None,
  cache: bool = True,
  progress: bool = True,
) -> Params:
  """Trains `SmallCNN` on the digits training split (or loads it from the cache).

  Args:
    method: ``"plain"``, ``"adversarial"`` (PGD-7, Madry et al.), ``"trades"`` or ``"ibp"`` (see
      the module docstring); ``True``/``False`` mean ``"adversarial"``/``"plain"``.
    epochs: passes over the 1257 training images; ``None`` means 20 (every method).
    batch_size: examples per Adam step.
    learning_rate: Adam's learning rate.
    eps: Linf training radius (``None``: 0.2, or 0.1 for IBP); ignored by plain training.
    seed: seed of the initialisation, shuffling and the training randomness.
    cache_dir: where trained parameters are cached (default ``$XDG_CACHE_HOME/jaxrobust`` or
      ``~/.cache/jaxrobust``).
    cache: set to ``False`` to neither read nor write the cache.
    progress: show a tqdm progress bar over epochs.

  Returns:
    The flax variables ``{"params": ...}``.

  Examples:
    >>> import functools, jax.numpy as jnp
    >>> params = train("plain", epochs=1, cache=False, progress=False)
    >>> logits = SmallCNN().apply(params, jnp.zeros((2, 8, 8, 1)))
    >>> logits.shape
    (2, 10)
  """
  config = training_config(
    method, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, eps=eps,
    seed=seed,
  )
  params, _ = load_or_train(config, cache_dir=cache_dir, cache=cache, progress=progress)
  return params
