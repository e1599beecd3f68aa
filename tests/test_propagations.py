"""Per-example propagation accounting and the per-example cap (jaxrobust.engine.propagations).

* By-hand counts: on a linear model, what the algorithms spend per example (derived below from
  each attack's ``init``/``step``/``finalize``, not read from the output), with and without early
  exit (DeepFool's at ``eps = inf`` too); a suite's count is the sum of its members', and a point an earlier member broke costs
  nothing in the later ones.
* An independent check: on a dense run with every point clean-correct, the counts summed over
  the batch equal ``jr.metrics.count_evaluations``' host totals less ``jr.run``'s own clean
  diagnosis (one gradient row per point) and re-scoring (one forward row per point).
* A row's count is the same in batches of other sizes and orders, under compaction and early
  exit (per-example keys).
* The cap: no count exceeds it; a cap that covers the uncapped run changes nothing (bitwise); a
  small cap never lowers robust accuracy; bad caps are ``ValueError``\\ s.
* A model call in a fixed-length inner loop counts its trip count times (Brendel-Bethge's
  start, by hand, traced only).
* ``min_norm_search`` counts what each row's search steps ran (by hand where every inner run
  fails, so runs all its steps) and takes a cap the same way; Brendel-Bethge started by one
  counts itself, its start included (by hand, L1), and refuses a cap.
* A curve under a cap is ``jr.run`` under that cap at every eps (flags and counts, per example
  and per eps), dense or skipping across eps; ``jr.evaluate`` under a cap is that curve, and a
  new cap reuses its compiled step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust._batch import fold_in
from jaxrobust.engine import propagations
from jaxrobust.evaluation import device_step as evaluate_lib
from tests.models import Linear, linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SHAPE = (16,)
CLASSES = 10
BATCH = 12
MODEL = random_linear(3, 16, CLASSES)
X, Y, DIST = linear_points(MODEL, 4, BATCH, SHAPE, "linf")
EPS = float(np.median(DIST))  # about half the points break
KEYS = jax.random.split(jax.random.key(0), BATCH)  # per example: results do not depend on rows


def run(attack, x=X, y=Y, keys=KEYS, eps=EPS, **options):
  # One compiled program per run (faster to build than running operation by operation), the
  # weights, data and eps its arguments.
  return jax.jit(lambda w, b, x, y, keys, eps: jr.run(attack, Linear(w, b).logits_fn, x, y,
                                                      jr.Budget(eps), keys, **options))(
      MODEL.w, MODEL.b, jnp.asarray(x), jnp.asarray(y), keys, eps)


def counts(result):
  p = result.info["propagations"]
  return np.asarray(p["forward"]), np.asarray(p["backward"])


def test_pgd_by_hand():
  # PGD: init draws a random start (no model call); each step is one gradient at the iterate
  # (1 forward + 1 backward); finalize scores the last iterate, which no step has (1 forward).
  # A point misclassified (here row 0) is not attacked: it costs nothing.
  n = 7
  y = Y.copy()
  y[0] = (y[0] + 1) % CLASSES
  forward, backward = counts(run(jr.attacks.pgd("linf", steps=n), y=y, early_exit=False))
  assert forward[0] == backward[0] == 0
  np.testing.assert_array_equal(backward[1:], n)
  np.testing.assert_array_equal(forward[1:], n + 1)
  # Early exit: a point broken by the iterate step s evaluated stops after s steps; its count is
  # then s gradients + 1 forward, s <= n; unbroken points spend everything.
  exits = run(jr.attacks.pgd("linf", steps=n))
  forward, backward = counts(exits)
  np.testing.assert_array_equal(forward, backward + 1)
  assert np.all(backward[~np.asarray(exits.success)] == n)
  assert np.all((backward >= 1) & (backward <= n))
  assert np.any(backward[np.asarray(exits.success)] < n)  # some stopped early


@pytest.mark.parametrize("factory, init_forward, final_forward", [
    # APGD-CE: the start is drawn (no call); n gradient steps; finalize scores the last iterate.
    (lambda n: jr.attacks.apgd("linf", steps=n), 0, 1),
    # APGD-T (one target, one run): init ranks the targets on the clean logits (1 forward).
    (lambda n: jr.attacks.apgd("linf", steps=n, loss="dlr", targeted=True,
                               n_target_classes=1), 1, 1),
    # FMN: starts at x (no call), n gradient steps, finalize scores the last iterate.
    (lambda n: jr.attacks.fmn("linf", steps=n), 0, 1),
])
def test_gradient_attacks_by_hand(factory, init_forward, final_forward):
  n = 6
  forward, backward = counts(run(factory(n), early_exit=False))
  np.testing.assert_array_equal(backward, n)
  np.testing.assert_array_equal(forward, init_forward + n + final_forward)


def test_square_by_hand():
  # Square: init queries its start (1 forward), each step queries one proposal (1 forward), and
  # finalize returns the best point queried (no call); no gradient ever.
  q = 9
  attack = jr.attacks.square("linf", queries=q)
  forward, backward = counts(run(attack, early_exit=False))
  np.testing.assert_array_equal(backward, 0)
  np.testing.assert_array_equal(forward, 1 + attack.num_steps)
  exits = run(attack)
  forward, backward = counts(exits)
  assert np.all(forward[~np.asarray(exits.success)] == 1 + attack.num_steps)
  assert np.all(backward == 0)


def test_deepfool_stops_counting_once_its_iterate_is_adversarial():
  # DeepFool: init takes the clean logits (1 forward); each step one forward and a pullback per
  # candidate (9 of 10 classes: 9 backwards); finalize scores the last iterate (1 forward). Its
  # first move is exact on a linear model: step 1 scores x, step 2 the adversarial iterate, after
  # which the iterate no longer moves, so the row is done, at eps = inf too (done_unbounded):
  # 2 steps instead of n, and the same result as the dense run, bitwise.
  n = 6
  attack = jr.attacks.deepfool("linf", steps=n)
  dense, exits = (run(attack, eps=jnp.inf, early_exit=e) for e in (False, True))
  np.testing.assert_array_equal(counts(dense)[0], 1 + n + 1)
  np.testing.assert_array_equal(counts(dense)[1], 9 * n)
  np.testing.assert_array_equal(counts(exits)[0], 1 + 2 + 1)
  np.testing.assert_array_equal(counts(exits)[1], 9 * 2)
  for a, b in zip(jax.tree.leaves(dense[:4]), jax.tree.leaves(exits[:4])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_suite_sums_members_and_skips_broken_points():
  pgd, square = jr.attacks.pgd("linf", steps=5), jr.attacks.square("linf", queries=8)
  suite = run(jr.attacks.ensemble(pgd, square))
  first = run(pgd)  # the same keys: member 1 computes exactly what it computes alone
  forward, backward = counts(suite)
  forward_1, backward_1 = counts(first)
  broken_1 = np.asarray(first.success)
  assert broken_1.any() and (~broken_1).any()
  # Broken by PGD: PGD's count only, nothing in Square.
  np.testing.assert_array_equal(forward[broken_1], forward_1[broken_1])
  np.testing.assert_array_equal(backward, backward_1)
  # The others: PGD's count and what Square spent on them alone (square is forward-only).
  alone = run(square, x=X[~broken_1], y=Y[~broken_1], keys=KEYS[~broken_1])
  np.testing.assert_array_equal(forward[~broken_1],
                                forward_1[~broken_1] + counts(alone)[0])


def test_auto_attack_is_the_sum_of_its_members():
  attack = jr.attacks.auto_attack("linf", version="standard", n_target_classes=2, steps=5,
                                  queries=20)
  result = run(attack)
  members = attack.suite.members(CLASSES)
  forward, backward = counts(result)
  robust = np.asarray(result.info["robust_after"][-1])
  assert robust.any()  # points no member broke spent every member's full count
  full = [counts(run(m)) for m in members]  # a point no member broke runs every step alone
  np.testing.assert_array_equal(forward[robust], sum(f for f, _ in full)[robust])
  np.testing.assert_array_equal(backward[robust], sum(b for _, b in full)[robust])
  # A point broken by APGD-CE costs only APGD-CE's count.
  by_first = ~np.asarray(result.info["robust_after"][0])
  assert by_first.any()
  np.testing.assert_array_equal(forward[by_first], full[0][0][by_first])
  np.testing.assert_array_equal(backward[by_first], full[0][1][by_first])


def noisy(x, keys, w, b):  # a randomized model: input noise, one key per example
  noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
  return Linear(w, b).logits_fn(x + 0.01 * noise)


@pytest.mark.parametrize("attack", [jr.attacks.pgd("linf", steps=5),
                                    jr.attacks.square("linf", queries=6),
                                    jr.attacks.eot(jr.attacks.pgd("linf", steps=3), samples=4)])
def test_sum_matches_count_evaluations(attack):
  counted, counter = jr.metrics.count_evaluations(
      noisy if attack.samples else lambda x, w, b: Linear(w, b).logits_fn(x))
  # One compiled program, the weights, data and eps its arguments (run eagerly, each operation
  # outside the attack's loops compiled on its own: about 2 s more CPU over the three attacks).
  result = jax.jit(lambda w, b, x, y, keys, eps: jr.run(
      attack, (lambda x, k: counted(x, k, w, b)) if attack.samples else
      (lambda x: counted(x, w, b)), x, y, jr.Budget(eps), keys, early_exit=False,
      chunk_size=None))(MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), KEYS, EPS)
  jax.effects_barrier()
  forward, backward = counts(result)
  # One gradient is one forward and one backward here (no pullback is applied twice).
  if not attack.samples:
    # jr.run's own work: one gradient row per point (clean verdict and gradient check) and one
    # forward row per point (re-scoring the returned point); every point is clean-correct.
    assert counter.gradient == backward.sum() + BATCH
    assert counter.forward == (forward - backward).sum() + BATCH
  else:
    # EOT, S draws: every step is S gradient rows, finalize S forward rows; jr.run votes over S
    # draws on the clean and on the returned points (2 S forward rows per point).
    samples = attack.samples
    np.testing.assert_array_equal(backward, 3 * samples)
    np.testing.assert_array_equal(forward, 3 * samples + samples)
    assert counter.gradient == backward.sum()
    assert counter.forward == (forward - backward).sum() + 2 * samples * BATCH


@pytest.mark.parametrize("attack", [jr.attacks.apgd("linf", steps=6),
                                    jr.attacks.square("linf", queries=12),
                                    jr.attacks.min_norm_search(jr.attacks.pgd("linf", steps=3),
                                                               search_steps=4)])
def test_independent_of_batch_size_and_order(attack):
  whole = counts(run(attack, chunk_size=4))
  part = np.random.default_rng(0).permutation(BATCH)[:7]  # fewer rows, in another order
  permuted = counts(run(attack, x=X[part], y=Y[part], keys=KEYS[part], chunk_size=3))
  for k in range(2):
    np.testing.assert_array_equal(permuted[k], whole[k][part])


@pytest.mark.parametrize("attack", [jr.attacks.pgd("linf", steps=8),
                                    jr.attacks.square("linf", queries=10)])
def test_cap(attack):
  free = run(attack)
  spent = sum(counts(free))
  # The caps are data of one compiled program (a static int cap takes the same path: jr.run
  # broadcasts it to [B] inside the trace), compiled once for a scalar cap and once for a
  # per-example one (a program per cap cost about 0.5 s more CPU per attack).
  caps = np.arange(BATCH, dtype=np.int32) * 2
  same, *capped = run_capped(attack, (int(spent.max()), 0, 9, caps), eps=EPS)
  # A cap that covers every uncapped count changes nothing, bitwise.
  for a, b in zip(jax.tree.leaves(free[:4]), jax.tree.leaves(same[:4])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for cap, result in zip((0, 9), capped):
    assert np.all(sum(counts(result)) <= cap)
    assert np.asarray(result.success).mean() <= np.asarray(free.success).mean()
    if cap == 0:  # not attacked at all (the cap does not cover init and finalize): x_adv = x
      np.testing.assert_array_equal(np.asarray(result.x_adv), X)
  # A per-example cap, traced.
  assert np.all(sum(counts(capped[-1])) <= caps)


def test_cap_of_a_suite_covers_the_members_together():
  attack = jr.attacks.ensemble(jr.attacks.pgd("linf", steps=5), jr.attacks.square("linf",
                                                                                  queries=20))
  capped = run(attack, max_propagations=16)
  assert np.all(sum(counts(capped)) <= 16)
  assert np.any(counts(capped)[1] == 5)  # PGD ran fully (11), Square got what was left


def test_bad_caps():
  for bad in (-1, 1.5, True, jnp.array([1.0])):
    with pytest.raises(ValueError, match="max_propagations"):
      run(jr.attacks.pgd("linf", steps=2), max_propagations=bad)
  # An attack whose calls per step depend on the data and that does not count them itself
  # reports no counts and cannot be capped; nor can min_norm_search around it.
  looping = jr.Attack(init=lambda f, x, y, budget, keys, target: x,
                      step=lambda f, state, x, y, budget, target: jax.lax.while_loop(
                          lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + 0 * f(c[1])[:, :1]),
                          (0, state))[1],
                      finalize=lambda f, state, x, y, budget, target: x, num_steps=1,
                      norm="linf", name="looping")
  for attack in (looping, jr.attacks.min_norm_search(looping, search_steps=1)):
    assert "propagations" not in run(attack).info
    with pytest.raises(ValueError, match="data-dependent"):
      run(attack, max_propagations=10)


def test_curve_counts_per_eps():
  attack = jr.attacks.pgd("linf", steps=5)
  epsilons = jnp.array([0.0, EPS, 2 * EPS])
  curve = jax.jit(lambda w, b, x, y, epsilons, keys: jr.robustness_curve(
      attack, Linear(w, b).logits_fn, x, y, epsilons, keys))(MODEL.w, MODEL.b, jnp.asarray(X),
                                                             jnp.asarray(Y), epsilons, KEYS)
  forward, backward = counts(curve)
  assert forward.shape == backward.shape == (3, BATCH)
  assert np.all(forward[0] == 0) and np.all(backward[0] == 0)  # eps = 0: nothing to attack
  # eps_1 is run with the example's key folded with 1: the count jr.run gives with those keys.
  alone = run(attack, keys=fold_in(KEYS, jnp.uint32(1)))
  np.testing.assert_array_equal(forward[1], counts(alone)[0])
  # At eps_2 a row broken at eps_1 is skipped (0); a row still robust is attacked.
  robust = np.asarray(curve.robust[1])
  assert np.all(forward[2][~robust] == 0) and np.all(forward[2][robust] > 0)


def test_fixed_length_inner_loops_multiply():
  # Brendel-Bethge's init runs its start attacks in full (a scan: FMN's n gradient steps and its
  # last score), checks each start (1 forward) and bisects towards it (a fori_loop of m
  # forwards); its step is one gradient and its finalize one score. Traced only, never run.
  n, m = 3, 4
  attack = jr.attacks.brendel_bethge("linf", steps=5, binary_search_steps=m,
                                     init_attack=(jr.attacks.fmn("linf", steps=n),) * 2)
  costs = propagations.measure(attack, MODEL.logits_fn, jnp.asarray(X), jnp.asarray(Y),
                               jr.Budget(jnp.full(BATCH, jnp.inf)), KEYS, None)
  assert costs.init == (2 * (n + 1 + 1) + m, 2 * n)
  assert costs.step == (1, 1) and costs.finalize == (1, 0)


SEARCH_STEPS, INNER_STEPS = 3, 3
# An inner PGD at eps 1e-4, 2e-4, 4e-4 (growth from init_eps), all far below every point's
# distance to the boundary: every run fails, so every run runs all its steps.
FAILING_SEARCH = jr.attacks.min_norm_search(jr.attacks.pgd("linf", steps=INNER_STEPS),
                                            search_steps=SEARCH_STEPS, init_eps=1e-4)
SEARCH = jr.attacks.min_norm_search(jr.attacks.pgd("linf", steps=INNER_STEPS), search_steps=6)


def run_capped(attack, caps, eps=jnp.inf, **options):
  """jr.run under each cap of ``caps`` (one compiled program, the cap its argument)."""
  capped = jax.jit(lambda w, b, x, y, keys, eps, cap: jr.run(
      attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), keys, max_propagations=cap,
      **options))
  return [capped(MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), KEYS, eps,
                 jnp.asarray(cap, jnp.int32)) for cap in caps]


def test_min_norm_search_by_hand():
  assert DIST.min() > 4e-4
  # Each search step: one full PGD run (its T gradients and its last score) and one forward
  # checking the point found; init and finalize call no model.
  free = run(FAILING_SEARCH, eps=jnp.inf)
  assert not np.asarray(free.success).any()
  forward, backward = counts(free)
  np.testing.assert_array_equal(forward, SEARCH_STEPS * (INNER_STEPS + 2))
  np.testing.assert_array_equal(backward, SEARCH_STEPS * INNER_STEPS)
  # Capped (a search step costs 2 T + 2 = 8): at 19, two steps (16) and a third with 3 left,
  # whose run affords no PGD step (its score and the check: 2); at 15, a second step with 7
  # left, 2 PGD steps (2 + 4), and no third (1 left < 2); at 1 no step at all.
  at_19, at_15, at_1 = (counts(r) for r in run_capped(FAILING_SEARCH, (19, 15, 1)))
  np.testing.assert_array_equal(at_19[0], 2 * (INNER_STEPS + 2) + 2)
  np.testing.assert_array_equal(at_19[1], 2 * INNER_STEPS)
  np.testing.assert_array_equal(at_15[0], (INNER_STEPS + 2) + 2 + 2)
  np.testing.assert_array_equal(at_15[1], INNER_STEPS + 2)
  np.testing.assert_array_equal(at_1[0] + at_1[1], 0)


def test_brendel_bethge_with_a_searched_start_by_hand():
  # BB's start by min_norm_search calls the model a data-dependent number of times, so BB counts
  # itself (jr.Meter with counts_init; L1 here, the same code in every norm): per start its run
  # as jr.run counts it and one forward checking its point (FMN, n steps: n + 1 forwards and n
  # backwards, + 1; a search whose S runs of T-step PGD all fail, from eps 1e-4 below every
  # point's distance: S (T + 2) forwards and S T backwards, + 1), then m bisection forwards, K
  # steps of one gradient and finalize's forward. At eps = inf no row is done: all run K steps.
  n, m, steps = 2, 3, 4
  assert DIST.min() > 4e-4  # the Linf distances; the L1 ones are larger
  search = jr.attacks.min_norm_search(jr.attacks.pgd("l1", steps=INNER_STEPS),
                                      search_steps=SEARCH_STEPS, init_eps=1e-4)
  attack = jr.attacks.brendel_bethge("l1", steps=steps, binary_search_steps=m,
                                     init_attack=(jr.attacks.fmn("l1", steps=n), search))
  assert attack.meter is not None and attack.meter.counts_init
  forward, backward = counts(run(attack, eps=jnp.inf))
  np.testing.assert_array_equal(
      forward, (n + 2) + SEARCH_STEPS * (INNER_STEPS + 2) + 1 + m + steps + 1)
  np.testing.assert_array_equal(backward, n + SEARCH_STEPS * INNER_STEPS + steps)
  with pytest.raises(ValueError, match="takes no cap"):  # the start's cost is known only after
    run(attack, max_propagations=100)


def test_min_norm_search_cap():
  # Inner runs stop early (early exit) at a data-dependent step: counts vary by row.
  free = run(SEARCH, eps=jnp.inf)
  forward, backward = counts(free)
  runs = forward - backward  # each run spends 2 forwards without a backward
  assert np.all(runs % 2 == 0) and np.all(runs > 0) and np.all(backward <= 6 * INNER_STEPS)
  assert len(set((forward + backward).tolist())) > 1
  spent = forward + backward
  caps = (int(spent.max()), 9, 0, np.arange(BATCH) * 3)
  same, *capped = run_capped(SEARCH, caps)
  # A cap that covers the uncapped counts changes nothing, bitwise.
  for a, b in zip(jax.tree.leaves(free[:4]), jax.tree.leaves(same[:4])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for cap, result in zip(caps[1:], capped):
    assert np.all(sum(counts(result)) <= cap)
    assert np.asarray(result.success).sum() <= np.asarray(free.success).sum()
    # With PGD a run the cap cuts short leaves less than another run's score and check (2), so
    # the capped search runs a prefix of the uncapped one's runs: its answer is never smaller.
    assert np.all(np.asarray(result.norm) >= np.asarray(free.norm))
  np.testing.assert_array_equal(np.asarray(capped[1].x_adv), X)  # cap 0: not attacked
  # A minimum-norm curve runs the search once, at eps = inf, under the cap: its norms give it.
  epsilons = jnp.array([0.5 * EPS, EPS, 2 * EPS])
  curve = jax.jit(lambda w, b, x, y, epsilons, keys, cap: jr.robustness_curve(
      SEARCH, Linear(w, b).logits_fn, x, y, epsilons, keys, max_propagations=cap))(
          MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), epsilons, KEYS, jnp.int32(9))
  norms = np.asarray(capped[0].norm)
  np.testing.assert_array_equal(np.asarray(curve.robust),
                                norms[None, :] > np.asarray(epsilons)[:, None])
  for a, b in zip(counts(curve), counts(capped[0])):
    np.testing.assert_array_equal(a, b)


def test_curve_under_a_cap_is_run_under_it_at_every_eps(early_exit=True):
  attack = jr.attacks.pgd("linf", steps=6)
  epsilons = jnp.array([EPS, 0.0, 0.5 * EPS, 2 * EPS])
  eps = np.asarray(epsilons)
  inputs = (MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), epsilons, KEYS)
  # One compiled curve and one compiled jr.run, the cap their argument.
  curve_under = jax.jit(lambda w, b, x, y, epsilons, keys, cap: jr.robustness_curve(
      attack, Linear(w, b).logits_fn, x, y, epsilons, keys, early_exit=early_exit,
      max_propagations=cap))
  at = jax.jit(lambda w, b, x, y, keys, eps, cap: jr.run(
      attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), keys, early_exit=early_exit,
      max_propagations=cap))
  curves = {}
  for cap in (1, 5):  # the random start and its score; 2 PGD steps and the last score
    curve = curves[cap] = curve_under(*inputs, jnp.int32(cap))
    alone = [at(MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), fold_in(KEYS, jnp.uint32(k)),
                e, jnp.int32(cap)) for k, e in enumerate(epsilons)]
    broken = np.stack([np.asarray(r.success) for r in alone])  # every point is clean-correct
    worst = np.stack([broken[eps <= e].any(0) for e in eps])
    np.testing.assert_array_equal(np.asarray(curve.robust), ~worst)
    forward, backward = counts(curve)
    assert np.all(forward + backward <= cap)
    for k in range(len(eps)):
      expected = counts(alone[k])
      if early_exit:  # cross-eps skipping: a row broken at a smaller eps is not run again
        skipped = broken[eps < eps[k]].any(0)
        expected = [np.where(skipped, 0, c) for c in expected]
      np.testing.assert_array_equal(forward[k], expected[0])
      np.testing.assert_array_equal(backward[k], expected[1])
  # The cap bites (fewer points broken), and a cap covering every count changes nothing, bitwise.
  free = jax.jit(lambda w, b, x, y, epsilons, keys: jr.robustness_curve(
      attack, Linear(w, b).logits_fn, x, y, epsilons, keys, early_exit=early_exit))(*inputs)
  assert np.all(np.asarray(curves[1].robust_accuracy) >= np.asarray(free.robust_accuracy))
  assert np.any(np.asarray(curves[1].robust_accuracy) > np.asarray(free.robust_accuracy))
  covered = curve_under(*inputs, jnp.int32(2 * 6 + 1))
  for a, b in zip(jax.tree.leaves(free), jax.tree.leaves(covered)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_evaluate_under_a_cap_is_the_curve():
  attack = jr.attacks.pgd("linf", steps=6)
  epsilons = np.array([0.5 * EPS, EPS, 2 * EPS], np.float32)
  key = jax.random.key(3)
  model = Linear(jnp.asarray(MODEL.w), jnp.asarray(MODEL.b))
  evaluate = lambda cap: jr.evaluate(model.logits_fn, (X, Y), attacks={"pgd": attack},
                                     epsilons=epsilons, key=key, batch_size=BATCH,
                                     progress=False, keep_per_example=True,
                                     max_propagations=cap, diagnose=False)
  report = evaluate(1)  # the cap bites: the random start only
  assert report.provenance["evaluate"]["max_propagations"] == 1
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(BATCH, dtype=jnp.uint32))
  curve = jax.jit(lambda w, b, x, y, epsilons, keys, cap: jr.robustness_curve(
      attack, Linear(w, b).logits_fn, x, y, epsilons, keys, max_propagations=cap))(
          MODEL.w, MODEL.b, jnp.asarray(X), jnp.asarray(Y), jnp.asarray(epsilons), keys,
          jnp.int32(1))
  np.testing.assert_array_equal(report.per_example["robust"][0], np.asarray(curve.robust))
  # The cap is data: another value reuses the compiled step.
  steps = len(evaluate_lib._STEP_CACHE)
  step = next(reversed(evaluate_lib._STEP_CACHE.values()))[0]
  programs = step._cache_size()
  evaluate(7)
  assert len(evaluate_lib._STEP_CACHE) == steps and step._cache_size() == programs
  with pytest.raises(ValueError, match="max_propagations"):
    evaluate(-1)
