"""A NumPy worker of `syncopate serve`: softmax (multinomial logistic) regression on the
digits data, the same model and data split as the server's `--model softmax --seed SEED`.

    syncopate serve --protocol bsp --workers 2 --secret-file secret &
    python numpy_logistic_worker.py --connect 127.0.0.1:7070 --id 0 --secret-file secret
    python numpy_logistic_worker.py --connect 127.0.0.1:7070 --id 1 --secret-file secret

The protocol and the model's size come from the server. The model layout is the server's:
W (10 x 64, row-major) then b (10).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import syncopate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connect", required=True, help="the server's address, host:port")
    p.add_argument("--id", type=int, default=None, help="this worker's id (default: $RANK and the like)")
    p.add_argument("--seed", type=int, default=1, help="the server's --seed (same data split)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--secret-file", default=None)
    p.add_argument("--fail-after", type=int, default=None, help="raise in the callback after N gradients (tests)")
    args = p.parse_args()

    data = syncopate.load_digits(args.seed)
    x, y = data["x_train"], data["y_train"]
    n_features, n_classes = x.shape[1], 10
    rng = np.random.default_rng(args.seed * 1000 + args.id)
    onehot = np.eye(n_classes, dtype=np.float32)
    steps = 0

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        nonlocal steps
        if args.fail_after is not None and steps >= args.fail_after:
            raise RuntimeError(f"planted failure after {steps} gradients")
        steps += 1
        w = params[: n_classes * n_features].reshape(n_classes, n_features)
        b = params[n_classes * n_features :]
        rows = rng.integers(0, len(x), size=args.batch_size)
        xb = x[rows]
        z = xb @ w.T + b
        z -= z.max(axis=1, keepdims=True)
        p_ = np.exp(z)
        p_ /= p_.sum(axis=1, keepdims=True)
        d = (p_ - onehot[y[rows]]) / len(rows)
        grad[: n_classes * n_features] = (d.T @ xb).ravel()
        grad[n_classes * n_features :] = d.sum(axis=0)
        return float(-np.mean(np.log(p_[np.arange(len(rows)), y[rows]] + 1e-12)))

    try:
        report = syncopate.run_worker(args.connect, compute, id=args.id, secret_file=args.secret_file)
    except syncopate.WorkerError as e:
        print(f"numpy worker {args.id}: {e} (cause: {e.__cause__})", file=sys.stderr)
        return 1
    print(f"numpy worker {args.id}: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
