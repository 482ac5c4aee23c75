#!/usr/bin/env python3
"""Step-time traces of seven kinds of cluster behaviour, drawn differently from
`syncopate trace-gen` (other distributions, other proportions, other seeds), for checking
`advise` on traces it was not tuned on.

    python3 benches/advise/gen_traces.py OUT_DIR [--workers 16] [--steps 2000] [--median-ms 50] [--seed 2027]

writes OUT_DIR/<kind>.csv (worker,step,seconds) for each kind:

- steady: per-worker speeds log-normal (sigma 0.35), gamma step noise (shape 40).
- markov: three states per worker (normal, 2.5x, 7x), per-worker transition rates.
- pareto: m * (0.5 + 0.5 * Pareto(1.5)) per step, independent: a finite mean, infinite variance.
- dead-node: one worker 6x slower and, half the time in bursts, 20x; log-normal noise.
- uniform: per-step uniform on 0.3..1.7 m, times a per-worker offset uniform on 0.9..1.1.
- two-types: half of the workers 1.6x slower, gamma noise.
- regime-change: at a third of the steps the whole cluster slows 1.4x and three workers
  start straggling (5x with probability 0.2 per step).
"""

import argparse
import os

import numpy as np

KINDS = ["steady", "markov", "pareto", "dead-node", "uniform", "two-types", "regime-change"]


def gamma_noise(rng, shape, size):
    return rng.gamma(shape, 1.0 / shape, size)


def generate(kind, n, steps, m, rng):
    t = np.empty((steps, n))
    if kind == "steady":
        speed = np.exp(0.35 * rng.standard_normal(n))
        speed /= np.median(speed)
        t[:] = m * speed * gamma_noise(rng, 40, (steps, n))
    elif kind == "markov":
        factors = np.array([1.0, 2.5, 7.0])
        slow_in = rng.uniform(0.01, 0.06, n)
        recover = rng.uniform(0.15, 0.4, n)
        state = np.zeros(n, dtype=int)
        for s in range(steps):
            u = rng.random(n)
            normal = state == 0
            # From normal: into a slow state (the very slow one a quarter of the time).
            into = normal & (u < slow_in)
            very = rng.random(n) < 0.25
            state = np.where(into, np.where(very, 2, 1), state)
            back = ~normal & (u < recover)
            state = np.where(back, 0, state)
            t[s] = m * factors[state] * gamma_noise(rng, 60, n)
    elif kind == "pareto":
        t[:] = m * (0.5 + 0.5 * (rng.pareto(1.5, (steps, n)) + 1.0))
    elif kind == "dead-node":
        dead = rng.integers(n)
        t[:] = m * np.exp(0.08 * rng.standard_normal((steps, n)))
        burst = False
        for s in range(steps):
            burst = (rng.random() < 0.9) if burst else (rng.random() < 0.1)
            t[s, dead] *= 20.0 if burst else 6.0
    elif kind == "uniform":
        offset = rng.uniform(0.9, 1.1, n)
        t[:] = m * offset * rng.uniform(0.3, 1.7, (steps, n))
    elif kind == "two-types":
        slow = rng.permutation(n) < n // 2
        t[:] = m * np.where(slow, 1.6, 1.0) * gamma_noise(rng, 50, (steps, n))
    elif kind == "regime-change":
        t[:] = m * np.exp(0.1 * rng.standard_normal((steps, n)))
        change = steps // 3
        stragglers = rng.permutation(n)[:3]
        t[change:] *= 1.4
        hit = rng.random((steps - change, 3)) < 0.2
        t[change:, stragglers] *= np.where(hit, 5.0, 1.0)
    else:
        raise ValueError(kind)
    return np.clip(t, 1e-6, 86400.0)


def write(path, t):
    steps, n = t.shape
    with open(path, "w") as f:
        f.write("worker,step,seconds\n")
        for w in range(n):
            for s in range(steps):
                f.write(f"{w},{s},{t[s, w]:.9f}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--median-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=2027)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for i, kind in enumerate(KINDS):
        rng = np.random.default_rng([a.seed, i])
        write(os.path.join(a.out, f"{kind}.csv"), generate(kind, a.workers, a.steps, a.median_ms / 1000.0, rng))
        print(f"{kind}.csv")


if __name__ == "__main__":
    main()
