"""The host staging cost of syncopate's PyTorch worker at about 10 M parameters: per step,
the gradients copied out to (pinned) host memory after backward and checked finite, and the
vector received copied back into the parameters before the next forward (and, under the rule
"mean", into the gradients). No server: the copies only.

Usage: python torch_staging_cost.py [--device cuda] [--params 10000000] [--repeats 50]
Prints one line per part: the median and the 90th percentile in milliseconds."""

import argparse
import statistics
import time

import torch

from syncopate.torch._layout import Layout


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args.add_argument("--params", type=int, default=10_000_000)
    args.add_argument("--repeats", type=int, default=50)
    a = args.parse_args()
    device = torch.device(a.device)
    width = 1000
    layers = max(1, a.params // (width * width + width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    layout = Layout(model, with_buffers=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def gather() -> None:
        layout.gather()

    def install_parameters() -> None:
        layout.install_parameters()
        sync()

    def install_gradients() -> None:
        layout.install_gradients(layout.received.to(device, non_blocking=True)[: layout.n_params])
        sync()

    print(f"{layout.n_params:,} parameters on {device} ({layers} x Linear({width}, {width})), "
          f"pinned host buffers: {layout.sent.is_pinned()}")
    for name, f in (("gradient out (gather, finite check)", gather), ("model in (parameters)", install_parameters),
                    ("mean in (gradients)", install_gradients)):
        times = []
        for i in range(a.repeats + 3):
            sync()
            t = time.perf_counter()
            f()
            if i >= 3:  # warm-up
                times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        print(f"{name}: median {statistics.median(times):.2f} ms, p90 {times[int(0.9 * (len(times) - 1))]:.2f} ms")


if __name__ == "__main__":
    main()
