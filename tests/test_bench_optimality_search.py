"""The eps search of ``benchmarks/bench_optimality.py`` around fixed-budget peers (``eps_search``).

On a linear model the minimum adversarial distance is known in closed form: with logits
``z_0 = m - w . (x - x_0)``, ``z_1 = 0`` and the other eight classes at ``-100``, label 0 is lost
exactly when ``w . delta >= m``, so ``d* = m / ||w||_q``, ``q`` the dual norm (Linf: ``||w||_1``,
L2: ``||w||_2``, L1: ``||w||_inf``), reached inside the box for the margins of
``linear_problem``. An attack exact at every eps breaks a sample exactly when ``eps >= d*``:
Linf PGD from the clean point (each of Foolbox's steps is ``sign(w)`` times eps/5 here, so 10
steps end at the corner ``eps sign(w)``), and the reference's APGD (its first step, of 2 eps,
reaches that corner). A sample first found at run ``k + 1``, after ``k`` doublings, has the
bracket ``[eps_k / 2, eps_k]`` (the last eps that failed, the distance found), narrower than
``d*``, and the ``15 - k`` runs left halve it: from ``init_eps = 0.9 min d*`` (every ``d*``
within ``1.1..3.4 init_eps``, so ``k <= 2``) the search ends in ``[d*, d* (1 + 2^-13)]`` (the
test allows ``2^-12`` for float rounding). No adversarial point is closer than ``d*``, whatever
the attack. Foolbox's PGD is run with a per-sample eps (a ``[B, 1, 1, 1]`` tensor): the test
also checks it finds the points of AttackBench's way, one run per distinct float eps.
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


@pytest.fixture(autouse=True)
def one_thread():
  """Models of four inputs: torch's threads cost more than they save (restored after)."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


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
  model = Linear().eval()
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


LINF_INIT = float(MARGINS.min() / DUAL["linf"]) * 0.9
"""Every Linf ``d*`` lies in ``[1.1, 3.4] LINF_INIT``: at most two doublings."""


def test_foolbox_pgd_with_a_per_sample_eps_reaches_the_exact_distance():
  fb = pytest.importorskip("foolbox")
  x, y = linear_problem()
  model = Linear().eval()
  # 10 steps of eps / 5 from the clean point reach the corner eps sign(w): exact at every eps
  exact_pgd = dict(random_start=False, steps=10, rel_stepsize=0.2, init_eps=LINF_INIT)
  check(bo.run_foolbox_eps_search("linf", model, x, y, **exact_pgd), x, "linf", rtol=2 ** -12)
  # AttackBench's way, one run with a float eps per distinct eps, finds the same points
  attack = fb.attacks.LinfPGD(random_start=False, steps=10, rel_stepsize=0.2)
  fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0))

  def run(xt, yt, eps):
    return attack.run(fmodel, xt, fb.criteria.Misclassification(yt), epsilon=eps).numpy()

  grouped = bo.eps_search(bo.in_groups_of_equal_eps(run, x, y), "linf", model, x, y,
                          init_eps=LINF_INIT)
  np.testing.assert_allclose(grouped, bo.run_foolbox_eps_search("linf", model, x, y, **exact_pgd),
                             atol=1e-6)
  # L2 and L1 (their projections take the eps as [B]): the batch equals one run per sample
  for norm, eps in (("l2", [0.05, 0.1, 0.2]), ("l1", [0.1, 0.2, 0.4])):
    pgd = bo.foolbox_pgd(norm, random_start=False, steps=10)
    xt, yt = torch.from_numpy(bo.nchw(x)), torch.from_numpy(y)
    batch = pgd.run(fmodel, xt, fb.criteria.Misclassification(yt),
                    epsilon=torch.tensor(eps).view(3, 1, 1, 1)).numpy()
    single = [pgd.run(fmodel, xt[i:i + 1], fb.criteria.Misclassification(yt[i:i + 1]),
                      epsilon=eps[i]).numpy() for i in range(3)]
    np.testing.assert_allclose(batch, np.concatenate(single), atol=1e-6)
    assert np.all(bo.lp_norms(batch.transpose(0, 2, 3, 1), x, norm) <= np.array(eps) * (1 + 1e-5))


@pytest.mark.skipif(not pathlib.Path(AA_PATH, "autoattack").is_dir(),
                    reason="no AutoAttack reference (set AUTOATTACK_PATH)")
@pytest.mark.parametrize("targeted", [False, True], ids=["apgd-ce", "apgd-t"])
def test_reference_apgd_with_a_per_sample_eps_reaches_the_exact_distance(targeted):
  x, y = linear_problem()
  model = Linear().eval()
  torch.manual_seed(0)
  # 10 iterations (its first step of 2 eps reaches the corner); APGD-T: the first target only
  # (class 1; the DLR of a class at -100 is constant, so the reference warns of zero gradients)
  few = dict(eps=1.0, n_iter=10, **({"n_target_classes": 1} if targeted else {}))
  attack = bo.reference_apgd(AA_PATH, "linf", targeted, **few)(model)
  at = bo.apgd_per_sample_eps(attack, model, x, y, targeted)
  check(bo.eps_search(at, "linf", model, x, y, init_eps=LINF_INIT), x, "linf", rtol=2 ** -12)
