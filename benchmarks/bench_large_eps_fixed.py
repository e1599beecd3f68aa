#!/usr/bin/env python
"""Robust counts at fixed L1 eps: the AutoAttack reference's APGD-CE (``use_largereps`` off and
on; 100 iterations, 1 restart, seed 0) against ``jr.attacks.apgd("l1", large_eps=False/True)``
(100 steps, 1 restart, key 0) on one zoo model of ``bench_optimality.py``, first ``n`` digits.
Every returned point is judged by the JAX model; the reference's points are checked to lie in
the eps ball.

Example::

  python benchmarks/bench_large_eps_fixed.py cnn-adversarial 100 1.0 1.5
"""
import sys, time
import jax, jax.numpy as jnp, numpy as np, torch
import jaxrobust as jr
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import bench_optimality as bo
torch.set_num_threads(1)
AA_PATH = "/work/main/.aa"  # a checkout of fra31/auto-attack
model, n = sys.argv[1], int(sys.argv[2])
apply_fn, params, build = bo.zoo_model(model)
port = build(params)
x_all, y_all = bo.load_examples()
x, y = np.asarray(x_all[:n]), np.asarray(y_all[:n])
correct = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x)), -1)) == y
xt, yt = torch.from_numpy(bo.nchw(x)), torch.from_numpy(y.astype(np.int64))
def verdict(x_adv):  # JAX model's verdict, L1 size
  pred = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x_adv)), -1))
  size = np.abs(x_adv - x).reshape(n, -1).sum(1)
  return (pred != y) & correct, size
for eps in map(float, sys.argv[3:]):
  line = [f"{model} eps={eps}: clean-correct {correct.sum()}"]
  for large in (False, True):
    t = time.time()
    torch.manual_seed(0)
    attack = bo.reference_apgd(AA_PATH, "l1", use_largereps=large, eps=eps)(port)
    adv = attack.perturb(xt, yt).detach().numpy()
    adv = np.transpose(adv, (0, 2, 3, 1)).reshape(x.shape)
    broken, size = verdict(adv)
    assert np.all(size[broken] <= eps * 1.001), size[broken].max()
    line.append(f"ref largereps={large}: robust {correct.sum() - broken.sum()} ({time.time()-t:.0f}s)")
  for large in (False, True):
    attack = jr.attacks.apgd("l1", large_eps=large)
    run = jax.jit(lambda params, x, y, e, key: jr.run(attack, lambda v: apply_fn(params, v), x, y,
                                                       jr.Budget(e), key))
    r = run(params, jnp.asarray(x), jnp.asarray(y), jnp.float32(eps), jax.random.key(0))
    broken, size = verdict(np.asarray(r.x_adv))
    line.append(f"jr large_eps={large}: robust {correct.sum() - broken.sum()}")
  print("; ".join(line), flush=True)
