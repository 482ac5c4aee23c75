"""A PyTorch worker of `syncopate serve`: the same softmax regression on digits as
numpy_logistic_worker.py, with the gradient from autograd. Needs `pip install torch`
(CPU wheel from PyPI); not run in CI (see the README).

    python torch_worker.py --connect 127.0.0.1:7070 --id 0 --workers 2 --secret-file secret
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import syncopate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connect", required=True)
    p.add_argument("--id", type=int, required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--protocol", default="bsp")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--secret-file", default=None)
    args = p.parse_args()

    data = syncopate.load_digits(args.seed)
    x = torch.from_numpy(data["x_train"])
    y = torch.from_numpy(data["y_train"])
    n_features, n_classes = x.shape[1], 10
    dim = n_classes * n_features + n_classes
    gen = torch.Generator().manual_seed(args.seed * 1000 + args.id)

    def compute(params: np.ndarray, grad: np.ndarray) -> None:
        # Views of the arrays the worker loop owns: no copies in or out.
        theta = torch.from_numpy(params).clone().requires_grad_(True)
        w = theta[: n_classes * n_features].view(n_classes, n_features)
        b = theta[n_classes * n_features :]
        rows = torch.randint(0, len(x), (args.batch_size,), generator=gen)
        loss = torch.nn.functional.cross_entropy(x[rows] @ w.T + b, y[rows])
        loss.backward()
        torch.from_numpy(grad).copy_(theta.grad)

    protocol = syncopate.Protocol(args.protocol, workers=args.workers, lr=args.lr)
    try:
        report = syncopate.run_worker(args.connect, args.id, protocol, dim, compute, secret_file=args.secret_file)
    except syncopate.WorkerError as e:
        print(f"torch worker {args.id}: {e} (cause: {e.__cause__})", file=sys.stderr)
        return 1
    print(f"torch worker {args.id}: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
