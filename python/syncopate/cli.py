"""The ``syncopate`` command that ``pip install`` puts on the PATH.

The full command line is the Rust CLI (``cargo install --path adapters/cli`` from a clone
of the repository): a wheel holds either a Python extension or a program, not both. This
console script hands every command to that CLI when it is installed (the first ``syncopate``
on the PATH that is not a script, or ``$SYNCOPATE_CLI``), so the flags, output and exit
codes are the CLI's own. Without it, the script runs ``syncopate serve`` itself over the
extension (:func:`syncopate.serve`) for a vector of your own (``--init FILE.npy``), with
the CLI's flags, defaults and exit codes (2 for bad usage) for the subset it supports;
every other command or flag exits 2 naming what needs the Rust CLI.

``$SYNCOPATE_CLI`` set to a path hands commands to that program; set to the empty string,
it never hands them over (the Python subset runs, or says what it lacks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any, NoReturn, Optional, Sequence

INSTALL_HINT = "cargo install --path adapters/cli, from a clone of the repository"

# The Rust CLI's commands (`syncopate --help`); only `serve` has a Python subset.
RUST_COMMANDS = ("train", "compare", "advise", "trace-gen", "serve", "work", "group", "reproduce", "mpi")

# `serve` flags of the Rust CLI that the extension's server does not offer.
RUST_ONLY_SERVE_FLAGS = (
    "--model", "--data", "--data-format", "--batch-size", "--seed", "--target", "--remote-groups",
    "--checkpoint", "--checkpoint-every", "--resume", "--handshake-timeout", "--frame-timeout",
    "--init-from-worker", "--dim", "--shard", "--run-id",
)

# Updates in the moving mean of the training loss (`--target-loss`), as the Rust CLI reads it.
LOSS_WINDOW = 10


class UsageError(Exception):
    """Bad usage: one line on standard error, exit code 2."""


def is_script(path: str) -> bool:
    """Whether ``path`` starts with ``#!`` (a console script such as this one), or cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return True


def rust_cli() -> Optional[str]:
    """The Rust CLI to hand commands to: ``$SYNCOPATE_CLI`` when set (the empty string:
    none; a script is refused, so this command never hands over to itself), else the first
    ``syncopate`` on the PATH that is an executable and not a script (this console script,
    or another environment's, starts with ``#!``)."""
    chosen = os.environ.get("SYNCOPATE_CLI")
    if chosen is not None:
        if chosen and os.path.isfile(chosen) and is_script(chosen):
            raise UsageError(f"$SYNCOPATE_CLI={chosen} is a script, not the Rust CLI (leave it unset or empty "
                             "to run this package's subset)")
        return chosen or None
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "syncopate")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        if os.path.realpath(candidate) == me or is_script(candidate):
            continue
        return candidate
    return None


def needs_rust(what: str) -> UsageError:
    return UsageError(
        f"{what} needs the Rust CLI, which is not installed ({INSTALL_HINT}); "
        "this Python package runs `syncopate serve --init FILE.npy` only"
    )


HELP = f"""\
syncopate (the Python package's command)

Usage: syncopate <COMMAND> [OPTIONS]

Without the Rust CLI ({INSTALL_HINT}) this command runs:
  serve --init FILE.npy   the parameter server of a flat float32 vector of your own, over TCP
                          (workers: syncopate.run_worker or syncopate.torch.train_worker)
The other commands ({', '.join(c for c in RUST_COMMANDS if c != 'serve')}) and serve's
built-in models need the Rust CLI; once it is on the PATH, this command hands everything to it.
"""


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error style: ``error: ...`` on one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def positive(kind: type, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a positive number, got '{text}'") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{what} must be a positive number, got '{text}'")
        return value

    return parse


def workers_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not in 1..=65535")
    return n


def momentum_value(text: str) -> float:
    try:
        b = float(text)
    except ValueError:
        b = float("nan")
    if not 0.0 <= b < 1.0:
        raise argparse.ArgumentTypeError(f"momentum must be a number in [0, 1), got '{text}'")
    return b


def serve_parser(protocols: Sequence[str]) -> Parser:
    p = Parser(prog="syncopate serve", description="Run the parameter server of a vector of your own over TCP "
               "(the Python package's subset of the Rust CLI's `syncopate serve`)")
    p.add_argument("--protocol", default="bsp", choices=list(protocols))
    p.add_argument("--workers", type=workers_count, default=8)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--staleness", type=int)
    p.add_argument("--iteration-timeout", type=float, metavar="MS")
    p.add_argument("--backup-workers", type=int, metavar="B")
    p.add_argument("--interrupt", choices=["abort", "complete"])
    p.add_argument("--k-min", type=int, metavar="K")
    p.add_argument("--groups", type=int, metavar="G")
    p.add_argument("--group-lr-scaling", choices=["linear", "none", "sqrt"])
    p.add_argument("--round-deadline", type=float, metavar="MS")
    p.add_argument("--stall-report", type=float, metavar="MS")
    p.add_argument("--listen", default="127.0.0.1:7070", metavar="ADDR")
    p.add_argument("--steps", type=positive(int, "--steps"), default=300,
                   help="gradient steps per worker: the run stops after steps x workers accepted gradients")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    p.add_argument("--time-limit", type=positive(float, "--time-limit"), metavar="SECS")
    p.add_argument("--secret-file", metavar="FILE")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--optimizer", metavar="RULE", help="the server's update rule: sgd, momentum, nesterov, adamw "
                   "or mean (default: momentum with a non-zero --momentum, else sgd)")
    p.add_argument("--momentum", type=momentum_value, default=0.0, metavar="BETA")
    p.add_argument("--beta1", type=float)
    p.add_argument("--beta2", type=float)
    p.add_argument("--eps", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--schedule", metavar="SPEC", help="constant, step:EVERY:GAMMA or warmup-cosine:WARMUP:TOTAL[:FLOOR]")
    p.add_argument("--lost-after", type=positive(float, "--lost-after"), default=10.0, metavar="SECS")
    p.add_argument("--wire", choices=["f32", "bf16", "fp16"], default="f32",
                   help="the tensor encoding on the wire (the server keeps float32)")
    p.add_argument("--init", metavar="FILE.npy", help="the flat float32 vector to train (required here)")
    p.add_argument("--save", metavar="FILE.npy")
    p.add_argument("--target-loss", type=float, metavar="L")
    p.add_argument("--record-trace", metavar="FILE")
    return p


def load_vector(path: str) -> Any:
    """The flat float32 vector in a ``.npy`` file, refused as the Rust CLI refuses it."""
    import numpy as np

    try:
        vector = np.load(path, allow_pickle=False)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{path}: not a .npy array of numbers ({e})") from None
    if not isinstance(vector, np.ndarray):
        raise UsageError(f"{path}: an .npz archive, not one .npy array")
    if vector.dtype != np.dtype("<f4"):
        raise UsageError(f"{path}: dtype {vector.dtype.str}: expected '<f4' (float32; numpy: a.astype('<f4'))")
    if vector.ndim != 1:
        raise UsageError(f"{path}: shape {vector.shape}: expected one dimension (numpy: a.reshape(-1))")
    if vector.size == 0:
        raise UsageError(f"{path}: shape (0,): the vector is empty")
    bad = np.flatnonzero(~np.isfinite(vector))
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"{path}: element {i} is {vector[i]}: the initial parameters must be finite")
    return np.ascontiguousarray(vector)


def loss_curve(points: Sequence[Sequence[float]], target: Optional[float]) -> dict[str, Any]:
    """The moving mean over ``LOSS_WINDOW`` updates of the reported losses and its first
    crossing of ``target``: the first update with ``LOSS_WINDOW`` points up to it whose
    mean is at most ``target`` (the Rust CLI's rule)."""
    means = []
    for i in range(LOSS_WINDOW - 1, len(points)):
        window = points[i - LOSS_WINDOW + 1 : i + 1]
        means.append((points[i], sum(p[2] for p in window) / LOSS_WINDOW))
    crossing = next(((p, m) for p, m in means if m <= target), None) if target is not None else None
    return {
        "window": LOSS_WINDOW,
        "target_loss": target,
        "time_to_target_loss_s": crossing[0][1] if crossing else None,
        "version_at_target_loss": crossing[0][0] if crossing else None,
        "final_mean_loss": means[-1][1] if means else None,
        "points": [{"version": v, "t_s": t, "loss": loss} for v, t, loss in points],
    }


def protocol_of(args: argparse.Namespace) -> Any:
    import syncopate

    knobs = {
        "staleness": args.staleness,
        "iteration_timeout_ms": args.iteration_timeout,
        "backup_workers": args.backup_workers,
        "interrupt": args.interrupt,
        "k_min": args.k_min,
        "groups": args.groups,
        "group_lr_scaling": args.group_lr_scaling,
        "round_deadline_ms": args.round_deadline,
        "stall_report_ms": args.stall_report,
    }
    try:
        return syncopate.Protocol(args.protocol, workers=args.workers, lr=args.lr,
                                  **{k: v for k, v in knobs.items() if v is not None})
    except (ValueError, OverflowError) as e:
        raise UsageError(str(e)) from None


# The extension's names of the update rule's knobs, and the command line's.
OPTIMIZER_FLAGS = {"rule": "--optimizer", "momentum": "--momentum", "betas[0]": "--beta1", "betas[1]": "--beta2",
                   "eps": "--eps", "weight_decay": "--weight-decay", "schedule": "--schedule"}


def optimizer_of(args: argparse.Namespace) -> Any:
    """The server's update rule from the flags, or None for plain SGD (the server's default);
    a refused knob is named by its flag."""
    import syncopate

    knobs = (args.optimizer, args.beta1, args.beta2, args.eps, args.weight_decay, args.schedule)
    if all(k is None for k in knobs) and args.momentum == 0.0:
        return None
    defaults = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    try:
        return syncopate.Optimizer(
            args.optimizer or ("momentum" if args.momentum else "sgd"), momentum=args.momentum,
            betas=(defaults["betas"][0] if args.beta1 is None else args.beta1,
                   defaults["betas"][1] if args.beta2 is None else args.beta2),
            eps=defaults["eps"] if args.eps is None else args.eps,
            weight_decay=defaults["weight_decay"] if args.weight_decay is None else args.weight_decay,
            schedule=args.schedule,
        )
    except ValueError as e:
        knob, _, why = str(e).partition(" ")
        raise UsageError(f"{OPTIMIZER_FLAGS[knob]} {why}" if knob in OPTIMIZER_FLAGS else str(e)) from None


def summary(args: argparse.Namespace, dim: int, report: dict[str, Any], curve: dict[str, Any]) -> str:
    g = report["gradients"]
    dropped = sum(g["dropped"].values())
    lines = [
        f"syncopate tcp: {args.protocol}, {args.workers} worker{'s' if args.workers != 1 else ''}, "
        f"vector from {args.init} ({dim} params)",
        f"  stopped        {report['reason']}",
        f"  wall time      {report['wall_s']:.3f} s",
        f"  updates        {report['updates']}",
        f"  gradients      accepted {g['accepted']} = applied {g['applied']} + dropped {dropped}; "
        f"refused {g['refused']}",
        f"  staleness      mean {report['staleness_mean']:.2f}, max {report['staleness_max']}",
    ]
    if curve["final_mean_loss"] is None:
        lines.append(f"  train loss     {len(curve['points'])} updates reported a loss "
                     f"(fewer than the {LOSS_WINDOW} of the moving mean)")
    else:
        lines.append(f"  train loss     {curve['final_mean_loss']:.4f} (mean of the last {LOSS_WINDOW} updates)")
    if args.target_loss is not None:
        t = curve["time_to_target_loss_s"]
        reached = f"{t:.3f} s (update {curve['version_at_target_loss']})" if t is not None else "not reached"
        lines.append(f"  to loss {args.target_loss:<6} {reached}")
    if args.save:
        lines.append(f"  saved          {args.save}")
    return "\n".join(lines)


def save_vector(path: str, vector: Any) -> None:
    """Writes ``vector`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    import numpy as np

    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".syncopate-save-", suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.asarray(vector, dtype="<f4"))
        os.replace(tmp, path)
    except OSError as e:
        raise RuntimeError(f"{path}: cannot write: {e.strerror or e}") from None


def serve(argv: Sequence[str]) -> int:
    import syncopate

    for flag in RUST_ONLY_SERVE_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            raise needs_rust(f"serve {flag}")
    args = serve_parser(syncopate.PROTOCOLS).parse_args(list(argv))
    if args.init is None:
        raise needs_rust("serve without --init (a built-in model)")
    protocol = protocol_of(args)
    optimizer = optimizer_of(args)
    params = load_vector(args.init)
    secret_dir = None
    secret_file = args.secret_file
    if secret_file is None and os.environ.get("SYNCOPATE_SECRET"):
        # The extension reads a secret from a file: a private one, removed after the run.
        secret_dir = tempfile.mkdtemp(prefix="syncopate-secret-")
        secret_file = os.path.join(secret_dir, "secret")
        with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.environ["SYNCOPATE_SECRET"])

    def listening(address: str) -> None:
        print(f"serve: {args.protocol} with {args.workers} worker{'s' if args.workers != 1 else ''}, "
              f"vector from {args.init} ({len(params)} params), listening on {address}"
              f"{'' if secret_file else ' (no shared secret)'}", file=sys.stderr, flush=True)

    # SIGTERM stops the run as Ctrl-C does: the workers are told to stop, the report follows.
    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        report = syncopate.serve(
            params, protocol, listen=args.listen, secret_file=secret_file, insecure=args.insecure,
            optimizer=optimizer, gradients=args.steps * args.workers, time_limit_s=args.time_limit,
            on_listen=listening, log=lambda line: print(f"serve: {line}", file=sys.stderr, flush=True),
            record_trace=args.record_trace, lost_after_s=args.lost_after, wire=args.wire,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)
    if args.save:
        save_vector(args.save, params)
    curve = loss_curve(report.pop("losses"), args.target_loss)
    if args.json:
        report.update(protocol=args.protocol, workers=args.workers, dim=len(params), loss_curve=curve)
        print(json.dumps(report))
    else:
        print(summary(args, len(params), report, curve))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script: ``syncopate <command> ...``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli = rust_cli()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cli is not None:
        try:
            os.execv(cli, [cli, *args])
        except OSError as e:
            print(f"error: cannot run the Rust CLI {cli}: {e.strerror or e}", file=sys.stderr)
            return 2
    try:
        if not args:
            print(HELP, file=sys.stderr, end="")
            return 2
        if args[0] in ("-h", "--help", "help"):
            print(HELP, end="")
            return 0
        if args[0] in ("-V", "--version"):
            from importlib.metadata import version

            print(f"syncopate {version('syncopate')} (Python package)")
            return 0
        if args[0] == "serve":
            return serve(args[1:])
        if args[0] in RUST_COMMANDS:
            hint = ""
            if args[0] == "work":
                hint = " (a model of your own trains with syncopate.run_worker or syncopate.torch.train_worker)"
            raise UsageError(f"`syncopate {args[0]}` needs the Rust CLI, which is not installed "
                             f"({INSTALL_HINT}){hint}")
        raise UsageError(f"unknown command '{args[0]}': expected one of {', '.join(RUST_COMMANDS)}")
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Outside a run (a run stops cleanly and reports): nothing to report.
        return 130


if __name__ == "__main__":
    sys.exit(main())
