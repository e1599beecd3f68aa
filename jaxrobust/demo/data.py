"""The demo's dataset: scikit-learn's embedded 8x8 handwritten digits, as NHWC arrays in [0, 1].

The data (1797 greyscale images of the digits 0-9, pixel values 0-16) ships inside scikit-learn,
so the demo runs offline. scikit-learn is an optional dependency: ``pip install 'jaxrobust[demo]'``.
"""

from __future__ import annotations

import numpy as np

NUM_EXAMPLES = 1797
"""Images in the full dataset (about 180 per class)."""

IMAGE_SHAPE = (8, 8, 1)
"""NHWC shape of one image."""

NUM_CLASSES = 10


def load_digits(
  test_fraction: float = 0.3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Loads the handwritten digits and splits them into a training and a test set.

  Pixels are scaled from 0..16 to [0, 1] (divided by 16). The split is stratified by class and
  fixed by ``seed``, so the same arguments always give the same arrays. With the defaults the
  training set holds 1257 images and the test set 540 (``ceil(0.3 * 1797)``); within each set the
  order is shuffled by the split.

  Args:
    test_fraction: fraction of the 1797 images held out for testing, strictly between 0 and 1.
    seed: seed of the split.

  Returns:
    ``(x_train, y_train, x_test, y_test)``: images are ``float32 [N, 8, 8, 1]`` in [0, 1],
    labels are ``int32 [N]`` in 0..9.

  Raises:
    ImportError: if scikit-learn is not installed.
    ValueError: if ``test_fraction`` is not strictly between 0 and 1.

  Examples:
    >>> x_train, y_train, x_test, y_test = load_digits()
    >>> x_train.shape, x_test.shape, y_test.dtype
    ((1257, 8, 8, 1), (540, 8, 8, 1), dtype('int32'))
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be strictly between 0 and 1, got {test_fraction!r}")
  try:
    from sklearn import datasets, model_selection
  except ImportError as error:
    raise ImportError(
      "The jaxrobust demo needs scikit-learn for its digits dataset; install it with "
      "`pip install 'jaxrobust[demo]'` (or `pip install scikit-learn`)."
    ) from error

  digits = datasets.load_digits()
  images = (np.asarray(digits.images, dtype=np.float32) / np.float32(16.0))[..., None]
  labels = np.asarray(digits.target, dtype=np.int32)
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
    images, labels, test_size=test_fraction, random_state=seed, stratify=labels
  )
  return (
    np.ascontiguousarray(x_train, dtype=np.float32),
    np.ascontiguousarray(y_train, dtype=np.int32),
    np.ascontiguousarray(x_test, dtype=np.float32),
    np.ascontiguousarray(y_test, dtype=np.int32),
  )
