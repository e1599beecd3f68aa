"""The eps search of ``benchmarks/bench_optimality.py`` around fixed-budget peers (``eps_search``).

On a linear model the minimum adversarial distance is known in closed form: with logits
``z_0 = m - w . (x - x_0)``, ``z_1 = 0`` and the other eight classes at ``-100``, label 0 is lost
exactly when ``w . delta >= m``, so ``d* = m / ||w||_q`` with ``q`` the dual norm (Linf: ``||w||_1``,
L2: ``||w||_2``, L1: ``||w||_inf``), reached inside the box for the margins below. An attack that
is exact at every eps (PGD without random start in Linf: every step of Foolbox's ``LinfPGD`` is
``sign(w)`` times a fixed size, so 40 steps of eps/30 end at the corner ``eps sign(w)``; the
reference's APGD, whose first step of 2 eps reaches that corner) breaks a sample exactly when
``eps >= d*``, so the search ends in ``[d*, d* + w]``, ``w`` the final bracket: from
``init_eps = 0.75 min d*`` (every ``d*`` within ``0.75..2.25 init_eps``) a sample is found after at
most two doublings at ``eps <= 4 init_eps``, with the bracket's lower end at least ``d* / 2``
(the last eps that failed), so its width is at most ``d*`` halved 13 times (``w <= 2^-13 d*``).
Every adversarial point is at least
``d*`` away, whatever the attack, which bounds the defaults' rows from below.
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_optimality as bo  # noqa: E402

W = np.array([1.0, -2.0, 0.5, 1.0])
MARGINS = np.array([0.1, 0.2, 0.3])
DUAL = {"linf": np.abs(W).sum(), "l2": np.sqrt((W ** 2).sum()), "l1": np.abs(W).max()}
AA_PATH = os.environ.get("AUTOATTACK_PATH", str(ROOT / ".aa"))


class Linear(torch.nn.Module):
  """``z_0 = -w . (x - 0.5)``, ``z_1 = 0``, ``z_2..9 = -100`` (``linear_problem`` puts each clean
  point where ``z_0`` is its margin)."""

  def __init__(self):
    super().__init__()
    self.w = torch.tensor(W, dtype=torch.float32)

  def forward(self, x):
    flat = x.flatten(1)
    z0 = -(flat - 0.5) @ self.w
    return torch.cat([z0[:, None], torch.zeros_like(z0)[:, None],
                      torch.full((len(x), 8), -100.0)], 1)


def linear_problem():
  """Clean points shifted along ``-w`` so that ``z_0 = m`` there: ``x = 0.5 - m w / |w|^2``."""
  x = 0.5 - MARGINS[:, None] * W[None] / (W ** 2).sum()
  return x.reshape(3, 2, 2, 1).astype(np.float32), np.zeros(3, np.int64)


def check(points, x, norm, rtol):
  model = Linear()
  with torch.no_grad():
    fooled = model(torch.from_numpy(points)).argmax(1).numpy() != 0
  assert fooled.all()
  d = bo.lp_norms(points.transpose(0, 2, 3, 1), x, norm)
  exact = MARGINS / DUAL[norm]
  assert np.all(d >= exact * (1 - 1e-5)), (d, exact)
  assert np.all(d <= exact * (1 + rtol)), (d, exact)


def test_the_margins_give_the_closed_form():
  x, _ = linear_problem()
  with torch.no_grad():
    z = Linear()(torch.from_numpy(bo.nchw(x))).numpy()
  np.testing.assert_allclose(z[:, 0], MARGINS, rtol=1e-5)
  assert np.all(np.abs(x - 0.5) + MARGINS.max() / DUAL["l1"] < 0.5)  # every d* inside the box


def test_foolbox_pgd_in_groups_of_equal_eps_reaches_the_exact_distance():
  fb = pytest.importorskip("foolbox")
  x, y = linear_problem()
  model = Linear()
  fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0), device="cpu")
  attack = fb.attacks.LinfPGD(random_start=False)

  def run(xt, yt, eps):
    return attack.run(fmodel, xt, fb.criteria.Misclassification(yt), epsilon=eps).numpy()

  init = float(MARGINS.min() / DUAL["linf"]) * 0.75  # each d* within 4 init (0.75 to 2.25 init)
  points = bo.eps_search(bo.in_groups_of_equal_eps(run, x, y), "linf", model, x, y,
                         init_eps=init)
  check(points, x, "linf", rtol=2 ** -12)
  # the row's own run (defaults, random start): never below d*, and found
  check(bo.run_foolbox_eps_search("l2", model, x, y), x, "l2", rtol=0.5)


@pytest.mark.skipif(not pathlib.Path(AA_PATH, "autoattack").is_dir(),
                    reason="no AutoAttack reference (set AUTOATTACK_PATH)")
@pytest.mark.parametrize("targeted", [False, True], ids=["apgd-ce", "apgd-t"])
def test_reference_apgd_with_a_per_sample_eps_reaches_the_exact_distance(targeted):
  x, y = linear_problem()
  model = Linear()
  torch.manual_seed(0)
  attack = bo.reference_apgd(AA_PATH, "linf", targeted, eps=1.0)(model)
  at = bo.apgd_per_sample_eps(attack, model, x, y, targeted)
  init = float(MARGINS.min() / DUAL["linf"]) * 0.75
  check(bo.eps_search(at, "linf", model, x, y, init_eps=init), x, "linf", rtol=2 ** -12)
