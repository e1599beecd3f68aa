r"""The factory call that built an attack, recorded on it as JSON (``Attack.config``).

A robustness number is meaningless without its threat model, and an attack's short ``name``
(``"pgd-linf-20x1-ce"``) leaves settings out (step size, random start, targets). Every public
factory of :mod:`jaxrobust.attacks` is wrapped by :func:`recorded`, which binds the call's
arguments to the factory's signature, fills in the defaults and stores

.. code-block:: json

   {"factory": "pgd", "norm": "linf", "steps": 20, "restarts": 1, "step_size": null, ...}

as a JSON string in :attr:`jaxrobust.Attack.config` (a string keeps the attack hashable and
comparable). Attacks given to a composing factory (``ensemble``, ``eot``) appear as their own
nested configurations; a callable argument (a custom loss) by its qualified name; a value JSON
cannot hold exactly (``inf``, NaN, arrays) by its ``repr``. Reports (:class:`jaxrobust.Report`)
copy it into their provenance.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from jaxrobust._types import Attack


def describe(value: Any) -> Any:
  """``value`` as JSON-ready Python data (see the module docstring).

  Examples:
    >>> describe({"eps": float("inf"), "steps": (10, 20), "loss": len})
    {'eps': 'inf', 'steps': [10, 20], 'loss': 'len'}
  """
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else repr(value)
  if isinstance(value, Attack):
    return json.loads(value.config) if value.config else {"name": value.name}
  if isinstance(value, Mapping):
    return {str(k): describe(v) for k, v in value.items()}
  if isinstance(value, (tuple, list)):
    return [describe(v) for v in value]
  if callable(value):
    return getattr(value, "__qualname__", type(value).__qualname__)
  return repr(value)


def recorded(factory: Callable[..., Attack]) -> Callable[..., Attack]:
  """Wraps an attack factory so that the attacks it returns carry their call in ``config``.

  The wrapper has the factory's name, signature and docstring; the attack is otherwise the one
  the factory built.

  Examples:
    >>> import json
    >>> from jaxrobust.attacks import _pgd
    >>> pgd = recorded(_pgd.pgd)
    >>> config = json.loads(pgd("l2", steps=5).config)
    >>> config["factory"], config["norm"], config["steps"], config["restarts"]
    ('pgd', 'l2', 5, 1)
  """
  signature = inspect.signature(factory)

  @functools.wraps(factory)
  def build(*args: Any, **kwargs: Any) -> Attack:
    attack = factory(*args, **kwargs)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    config = {"factory": factory.__name__}
    for name, value in bound.arguments.items():
      kind = signature.parameters[name].kind
      if kind is inspect.Parameter.VAR_KEYWORD:
        config.update({str(k): describe(v) for k, v in value.items()})
      else:
        config[name] = describe(value)
    return attack._replace(config=json.dumps(config, sort_keys=False))

  return build
