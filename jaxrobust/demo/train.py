"""Training the demo's `SmallCNN` on the digits, plainly or adversarially, with an on-disk cache.

Plain training minimises the cross-entropy with Adam. Adversarial training (Madry et al., 2018,
"Towards Deep Learning Models Resistant to Adversarial Attacks") replaces every batch by its
Linf PGD adversarial examples, computed by ``jr.run`` inside the jitted training step against the
current parameters, and minimises the cross-entropy on them.

One epoch is one jitted function (shuffle, then ``lax.scan`` over the full batches; the few
examples that do not fill a batch change from epoch to epoch), compiled once per configuration.

Trained parameters are cached under ``cache_dir`` (default ``$XDG_CACHE_HOME/jaxrobust``, else
``~/.cache/jaxrobust``) in a file named after a hash of the whole training configuration and the
jax and jaxrobust versions, so a changed setting or upgrade retrains and an unchanged one loads in
milliseconds. Files are written atomically; an unreadable or mismatched file is retrained.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
import warnings
from typing import Any, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

import jaxrobust as jr
from jaxrobust.demo import data
from jaxrobust.demo.model import SmallCNN

Params = Any

CACHE_FORMAT = 2  # 2: PGD's default step became a cosine schedule (new adversarial weights)
"""Bumped whenever the meaning of a cached file changes."""

DEFAULT_EPOCHS = {False: 20, True: 20}
"""Epochs per mode (``adversarial`` -> epochs): seconds (plain) to tens of seconds (PGD) on CPU."""

DEFAULT_LEARNING_RATE = 2e-3
DEFAULT_EPS = 0.2
"""Linf radius of adversarial training, in pixel units of [0, 1] images."""

ATTACK_STEPS = 7
"""PGD steps of the training attack (PGD's default cosine step schedule from 2 eps, random
start)."""


def jaxrobust_version() -> str:
  """The installed jaxrobust version, or ``"unknown"`` when running from an uninstalled tree."""
  version = getattr(jr, "__version__", None)
  if version:
    return str(version)
  try:
    from importlib import metadata

    return metadata.version("jaxrobust")
  except Exception:  # noqa: BLE001 - not installed: any lookup failure means unknown
    return "unknown"


def default_cache_dir() -> pathlib.Path:
  """``$XDG_CACHE_HOME/jaxrobust`` if that variable is set and non-empty, else ``~/.cache/jaxrobust``."""
  base = os.environ.get("XDG_CACHE_HOME")
  root = pathlib.Path(base) if base else pathlib.Path.home() / ".cache"
  return root / "jaxrobust"


def training_config(
  adversarial: bool,
  *,
  epochs: Optional[int] = None,
  batch_size: int = 64,
  learning_rate: float = DEFAULT_LEARNING_RATE,
  eps: float = DEFAULT_EPS,
  seed: int = 0,
) -> dict[str, Any]:
  """The complete, JSON-serialisable description of one training run.

  Everything that changes the trained parameters is in here; its hash names the cache file.
  For plain training the attack fields are ``None`` (so ``eps`` does not affect it).

  Args:
    adversarial: Madry-style PGD adversarial training instead of plain training.
    epochs: passes over the training split; ``None`` picks ``DEFAULT_EPOCHS[adversarial]``.
    batch_size: examples per step.
    learning_rate: Adam's learning rate.
    eps: Linf radius of the training attack (adversarial training only).
    seed: seed of the initialisation, the shuffling and the attack's random starts.

  Returns:
    A dict with the model, data split, optimiser and attack settings.

  Examples:
    >>> training_config(False)["epochs"]
    20
  """
  if epochs is None:
    epochs = DEFAULT_EPOCHS[bool(adversarial)]
  if int(epochs) < 1:
    raise ValueError(f"epochs must be at least 1, got {epochs}")
  if int(batch_size) < 1:
    raise ValueError(f"batch_size must be at least 1, got {batch_size}")
  if adversarial and not float(eps) > 0.0:
    raise ValueError(f"eps must be positive for adversarial training, got {eps}")
  return {
    "name": "adversarial" if adversarial else "plain",
    "adversarial": bool(adversarial),
    "model": "SmallCNN",
    "num_classes": data.NUM_CLASSES,
    "data": {"dataset": "sklearn.datasets.load_digits", "test_fraction": 0.3, "split_seed": 0},
    "optimizer": "adam",
    "loss": "softmax_cross_entropy",
    "epochs": int(epochs),
    "batch_size": int(batch_size),
    "learning_rate": float(learning_rate),
    "seed": int(seed),
    "attack": (
      {"norm": "linf", "eps": float(eps), "steps": ATTACK_STEPS, "step_size": None,
       "random_start": True, "restarts": 1, "loss": "ce"}
      if adversarial else None
    ),
  }


def cache_path(config: dict[str, Any], cache_dir: Optional[os.PathLike | str] = None) -> pathlib.Path:
  """Where the parameters of ``config`` are cached: a hash of it and of the library versions.

  Args:
    config: a dict from `training_config`.
    cache_dir: the cache directory; ``None`` means `default_cache_dir`.

  Returns:
    ``<cache_dir>/<name>-<16 hex digits>.msgpack``.
  """
  key = json.dumps(
    {"config": config, "jax": jax.__version__, "jaxrobust": jaxrobust_version(),
     "format": CACHE_FORMAT},
    sort_keys=True,
  )
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  directory = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
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
  """Writes ``params`` atomically: a temporary file in the same directory, then ``os.replace``."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  payload = flax.serialization.to_bytes(jax.device_get(params))
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(payload)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise


def _epoch_fn(config: dict[str, Any], num_train: int):
  """The jitted ``(params, opt_state, x, y, key) -> (params, opt_state, mean loss, correct)``."""
  model = SmallCNN(num_classes=config["num_classes"])
  optimizer = optax.adam(config["learning_rate"])
  batch_size = config["batch_size"]
  num_batches = num_train // batch_size
  if num_batches < 1:
    raise ValueError(f"batch_size {batch_size} exceeds the {num_train} training examples")
  attack_config = config["attack"]
  attack = (
    jr.attacks.pgd("linf", steps=attack_config["steps"]) if attack_config is not None else None
  )

  def loss_fn(params, x, y):
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

  def step(carry, batch):
    params, opt_state = carry
    x, y, key = batch
    if attack is not None:
      budget = jr.Budget(attack_config["eps"], 0.0, 1.0)
      x = jax.lax.stop_gradient(
        jr.run(attack, functools.partial(model.apply, params), x, y, budget, key).x_adv
      )
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
    # optax's Adam computes ``decay ** count`` (Python float ** int32), which strict dtype
    # promotion rejects; standard promotion is confined to the optimiser update.
    with jax.numpy_dtype_promotion("standard"):
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == y).astype(jnp.int32))
    return (params, opt_state), (loss, correct)

  @jax.jit
  def epoch(params, opt_state, x, y, key):
    perm_key, attack_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, x.shape[0])[: num_batches * batch_size]
    xb = x[order].reshape((num_batches, batch_size, *x.shape[1:]))
    yb = y[order].reshape((num_batches, batch_size))
    keys = jax.random.split(attack_key, num_batches)
    (params, opt_state), (losses, correct) = jax.lax.scan(
      step, (params, opt_state), (xb, yb, keys)
    )
    return params, opt_state, jnp.mean(losses), jnp.sum(correct)

  return model, optimizer, epoch, num_batches * batch_size


def fit(config: dict[str, Any], *, progress: bool = True) -> Params:
  """Trains from scratch (no cache) according to ``config``; returns the flax variables dict.

  Args:
    config: a dict from `training_config`.
    progress: show a tqdm bar over epochs with the loss and training accuracy (measured on the
      adversarial examples for adversarial training).

  Returns:
    ``{"params": ...}``, ready for ``SmallCNN().apply``.
  """
  x_train, y_train, _, _ = data.load_digits(
    config["data"]["test_fraction"], config["data"]["split_seed"]
  )
  model, optimizer, epoch, seen = _epoch_fn(config, x_train.shape[0])
  init_key, train_key = jax.random.split(jax.random.key(config["seed"]))
  params = _init_fn(config["num_classes"])(init_key)
  opt_state = optimizer.init(params)
  x, y = jnp.asarray(x_train), jnp.asarray(y_train)
  bar = tqdm(
    range(config["epochs"]), desc=f"train {config['name']}", unit="epoch", disable=not progress,
    leave=False,
  )
  for i in bar:
    params, opt_state, loss, correct = epoch(
      params, opt_state, x, y, jax.random.fold_in(train_key, i)
    )
    if progress:
      bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{int(correct) / seen:.3f}")
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
    cache_dir: the cache directory; ``None`` means `default_cache_dir`.
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
  adversarial: bool,
  *,
  epochs: Optional[int] = None,
  batch_size: int = 64,
  learning_rate: float = DEFAULT_LEARNING_RATE,
  eps: float = DEFAULT_EPS,
  seed: int = 0,
  cache_dir: Optional[os.PathLike | str] = None,
  cache: bool = True,
  progress: bool = True,
) -> Params:
  """Trains `SmallCNN` on the digits training split (or loads it from the cache).

  Args:
    adversarial: Madry-style adversarial training with ``jr.attacks.pgd("linf", steps=7)`` at
      radius ``eps``, instead of plain training.
    epochs: passes over the 1257 training images; ``None`` means 20 (both modes).
    batch_size: examples per Adam step.
    learning_rate: Adam's learning rate.
    eps: Linf radius of the training attack (ignored for plain training).
    seed: seed of the initialisation, shuffling and the attack's random starts.
    cache_dir: where trained parameters are cached (default ``$XDG_CACHE_HOME/jaxrobust`` or
      ``~/.cache/jaxrobust``).
    cache: set to ``False`` to neither read nor write the cache.
    progress: show a tqdm progress bar over epochs.

  Returns:
    The flax variables ``{"params": ...}``.

  Examples:
    >>> import functools, jax.numpy as jnp
    >>> params = train(False, epochs=1, cache=False, progress=False)
    >>> logits = SmallCNN().apply(params, jnp.zeros((2, 8, 8, 1)))
    >>> logits.shape
    (2, 10)
  """
  config = training_config(
    adversarial, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, eps=eps,
    seed=seed,
  )
  params, _ = load_or_train(config, cache_dir=cache_dir, cache=cache, progress=progress)
  return params
