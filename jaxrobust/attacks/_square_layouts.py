r"""How the Square attack sees an input: the grid of positions, each holding ``C`` channels,
that its windows live on (:class:`Grid`), read from one example's shape and the ``layout``
option by :func:`grid`.

Every layout is a reshape of the example in memory order, never a transpose, so
``x.reshape((B,) + grid(x.shape[1:], layout).shape)`` is the attack's ``[B, H, W, C]`` view:

* ``"image"``: the :math:`H \times W` pixels of ``[B, H, W, C]`` (NHWC) or ``[B, H, W]``, square
  windows (an image of one row or column is a sequence of its pixels);
* ``"sequence"``: the ``T`` positions of ``[B, T, C]`` (or of ``[B, P_1, ..., P_k, C]``, in
  memory order), windows are runs of contiguous positions with all their channels;
* ``"features"``: the ``D`` coordinates of any ``[B, ...]`` as a sequence of one channel;
* ``"auto"``: chosen from the number of axes and their sizes (:data:`MAX_CHANNELS`), refusing a
  4-D input that looks channels-first (NCHW).

The ``Input layouts`` section of :mod:`jaxrobust.attacks._square` gives the full rules of
``"auto"`` and each layout's windows and starts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from jaxrobust._validation import looks_channels_first

LAYOUTS = ("auto", "image", "sequence", "features")
"""The values of :func:`~jaxrobust.attacks._square.square`'s ``layout`` option (see the module
docstring)."""

MAX_CHANNELS = 4
"""``layout="auto"`` reads a last axis of at most this many entries as channels (see :func:`grid`).

A Linf window gives each channel its own sign, so a window over ``C`` channels is one of
:math:`2^C` vertices: random search resolves a few channels (colour, stereo, a sensor's axes) but
not many (on 64-input linear models at 1.02 times the minimal distance: 100% success with
``[B, 16, 4]`` read as a sequence, 0% with ``[B, 4, 16]``; 100% for both read as images)."""


class Grid(NamedTuple):
  """How Square sees one example: ``height x width`` positions of ``channels`` channels.

  ``image=True``: square windows on the ``height x width`` pixels. ``image=False``: a sequence
  (``height = 1``), windows are runs of contiguous positions along ``width``. Every layout is a
  reshape of the example in memory order, so ``x.reshape((B,) + grid.shape)`` is its view.
  """

  height: int
  width: int
  channels: int
  image: bool

  @property
  def shape(self) -> tuple[int, int, int]:
    return (self.height, self.width, self.channels)


def _describe(shape: tuple[int, ...]) -> str:
  """``[B, d1, d2, ...]``: the user's batch shape, whatever chunk of it the attack sees."""
  return "[" + ", ".join(["B", *map(str, shape)]) + "]"


def grid(shape: tuple[int, ...], layout: str = "auto") -> Grid:
  """The :class:`Grid` Square uses for examples of ``shape`` (``x.shape[1:]``) under ``layout``.

  See the module docstring for the layouts, and the ``Input layouts`` section of
  :mod:`jaxrobust.attacks._square` for the rules of ``"auto"``.

  Examples:
    >>> grid((64,))  # [B, D]: tabular features, runs of contiguous features
    Grid(height=1, width=64, channels=1, image=False)
    >>> grid((256, 2))  # [B, T, F] with few channels: a 2-channel signal
    Grid(height=1, width=256, channels=2, image=False)
    >>> grid((28, 28))  # [B, T, F] with more: a one-channel image (grayscale, time x feature)
    Grid(height=28, width=28, channels=1, image=True)
    >>> grid((32, 32, 3)), grid((1, 100, 3)).image  # NHWC; an image of one row is a sequence
    (Grid(height=32, width=32, channels=3, image=True), False)

  Raises:
    ValueError: an unknown layout, ``"image"`` for inputs that are not ``[B, H, W(, C)]``, or
      ``"auto"`` for a 4-D input that looks channels-first (NCHW). Messages name the shape of
      one example (as ``[B, ...]``), so they hold whatever part of the batch is being traced.
  """
  shape = tuple(int(d) for d in shape)
  size = math.prod(shape)
  if layout not in LAYOUTS:
    raise ValueError(f"square: unknown layout {layout!r}; supported: "
                     f"{', '.join(map(repr, LAYOUTS))}.")
  if layout == "auto":
    if looks_channels_first(shape):
      raise ValueError(
          f"square: x of shape {_describe(shape)} looks channels-first (NCHW, {shape[0]} "
          f"channel(s) of {shape[1]}x{shape[2]} pixels), but jaxrobust reads 4-D inputs as "
          "channels-last images [B, H, W, C] (NHWC, as Flax). Pass x.transpose(0, 2, 3, 1) and "
          "transpose back inside the model (logits_fn = lambda v: model(v.transpose(0, 3, 1, "
          "2))), or pass layout='image' to square (layout= to auto_attack) if x really is NHWC.")
    if len(shape) <= 1:
      layout = "features"
    elif len(shape) == 2:  # [B, T, F]: few channels, or a one-channel T x F image
      layout = "sequence" if shape[1] <= MAX_CHANNELS and shape[0] > shape[1] else "image"
    elif len(shape) == 3:
      layout = "image"
    else:
      layout = "sequence" if shape[-1] <= MAX_CHANNELS else "features"
  if layout == "image":
    if len(shape) not in (2, 3):
      raise ValueError(f"square: layout='image' needs images [B, H, W, C] (NHWC) or [B, H, W]; "
                       f"x has shape {_describe(shape)}. Use layout='sequence' or 'features'.")
    height, width = shape[:2]
    channels = shape[2] if len(shape) == 3 else 1
    if height > 1 and width > 1:
      return Grid(height, width, channels, True)
    layout, shape = "sequence", (height * width, channels)  # one row or column: a sequence
  if layout == "sequence" and len(shape) >= 2 and size // shape[-1] > 1:
    return Grid(1, size // shape[-1], shape[-1], False)
  return Grid(1, size, 1, False)  # features, and sequences of a single position
