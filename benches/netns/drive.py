"""Helpers of benches/netns/run.sh: gloo's allreduce on one rank, and the timing tables.

    drive.py gloo --rank R --world N --master ADDR --port P --d D --warmup W --rounds T
    drive.py rounds --warmup W FILE...    # a BSP run's round times from its servers' output
    drive.py cpu --warmup W FILE...       # CPU seconds per timed round, all processes together
    drive.py table RESULTS.tsv            # the markdown table of every finished run

`gloo` runs W + T allreduces (sum) of a float32 tensor of D elements with torch.distributed's
gloo backend, a barrier before each; each allreduce's time is the slowest rank's, and rank 0
prints `allreduce S S ...` (the T timed ones, seconds); every rank prints `cpu SECONDS` (its
CPU time so far) after each allreduce.

`rounds` reads the `model VERSION UNIX_NANOS` lines of one or more servers (the shards of one
run): version v is out when the last shard has published it, a round is the time from one
version to the next, the first W rounds are warm-up; it prints the timed rounds' seconds.

`cpu` reads the `cpu SECONDS` lines every process of a run prints once a round (a process's
CPU time so far) and prints the sum over the processes of their CPU time per round after the
first W lines.

Bad arguments: a one-line message and exit status 2.
"""

import argparse
import os
import statistics
import sys
import time


def gloo(args):
    # The interface gloo binds to is the namespace's own link, never loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", args.iface)
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    tensor = torch.empty(args.d, dtype=torch.float32)
    times = []
    for _ in range(args.warmup + args.rounds):
        # The sum overwrites the tensor: every allreduce starts from the same values.
        tensor.fill_(1e-6)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
        print(f"cpu {time.process_time():.3f}", flush=True)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if args.rank == 0:
        print("allreduce " + " ".join(f"{t:.6f}" for t in slowest.tolist()[args.warmup :]))
    dist.destroy_process_group()


def round_times(files, warmup):
    """Seconds of each timed round of the BSP run whose servers wrote `files`."""
    published = []
    for name in files:
        versions = {}
        with open(name, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "model":
                    versions[int(parts[1])] = int(parts[2])
        published.append(versions)
    if not published:
        return []
    common = sorted(set.intersection(*(set(v) for v in published)))
    ends = [max(v[version] for v in published) for version in common]
    rounds = [(b - a) / 1e9 for a, b in zip(ends, ends[1:])]
    # ends[0] is version 1: rounds[0] is the second round.
    return rounds[max(warmup - 1, 0) :]


def rounds(args):
    times = round_times(args.files, args.warmup)
    if not times:
        print("rounds: no timed round in " + " ".join(args.files), file=sys.stderr)
        sys.exit(1)
    print(" ".join(f"{t:.6f}" for t in times))


def rate_bits(rate):
    """Bits per second of a tc rate such as `1gbit` (0 if it is not one)."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            try:
                return float(rate[: -len(unit)]) * scale
            except ValueError:
                return 0.0
    return 0.0


def cpu_per_round(files, warmup):
    """CPU seconds per round after the warm-up, summed over the processes that wrote `files`."""
    total = 0.0
    for name in files:
        marks = []
        with open(name, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0] == "cpu":
                    marks.append(float(parts[1]))
        first = min(warmup, len(marks) - 1)
        if first >= 0 and len(marks) - 1 > first:
            total += (marks[-1] - marks[first]) / (len(marks) - 1 - first)
    return total


def table(args):
    # Columns: rate, workers, setup, repeat, median round (s), bound (s), load, busy, cpu.
    rows = {}
    with open(args.results, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 9 or parts[0] == "rate":
                continue
            rate, n, setup, _, median, bound, load, busy, cpu = parts
            key = (rate, int(n), setup)
            row = rows.setdefault(key, {"medians": [], "bound": float(bound), "load": [], "busy": [], "cpu": []})
            row["medians"].append(float(median))
            row["load"].append(float(load))
            row["busy"].append(float(busy))
            row["cpu"].append(float(cpu))
    print(
        "| link | workers | setup | round / allreduce, median (s) | runs (s) | link floor (s) "
        "| vs floor | vs gloo | process CPU per round (s) | machine CPU busy (100% = 1 core) | load average |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def order(key):
        rate, n, setup = key
        return (rate_bits(rate), n, setup != "S = 1", setup == "gloo")

    for key in sorted(rows, key=order):
        rate, n, setup = key
        row = rows[key]
        median = statistics.median(row["medians"])
        gloo_row = rows.get((rate, n, "gloo"))
        vs_gloo = f"{median / statistics.median(gloo_row['medians']):.2f}x" if gloo_row and setup != "gloo" else ""
        runs = ", ".join(f"{m:.3f}" for m in row["medians"])
        print(
            f"| {rate} | {n} | {setup} | {median:.3f} | {runs} | {row['bound']:.3f} | {median / row['bound']:.2f}x "
            f"| {vs_gloo} | {statistics.median(row['cpu']):.2f} | {statistics.median(row['busy']):.0f}% "
            f"| {min(row['load']):.1f}–{max(row['load']):.1f} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gloo")
    g.add_argument("--rank", type=int, required=True)
    g.add_argument("--world", type=int, required=True)
    g.add_argument("--master", required=True)
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--d", type=int, required=True)
    g.add_argument("--warmup", type=int, default=2)
    g.add_argument("--rounds", type=int, default=5)
    g.add_argument("--iface", default="eth0")
    g.add_argument("--timeout", type=float, default=600)
    r = sub.add_parser("rounds")
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("files", nargs="+")
    c = sub.add_parser("cpu")
    c.add_argument("--warmup", type=int, default=2)
    c.add_argument("files", nargs="+")
    t = sub.add_parser("table")
    t.add_argument("results")
    args = parser.parse_args()
    if args.command == "gloo":
        if args.world < 1 or not 0 <= args.rank < args.world or args.d < 1 or args.rounds < 1 or args.warmup < 0:
            parser.error("need 0 <= rank < world, d >= 1, rounds >= 1, warmup >= 0")
        gloo(args)
    elif args.command == "rounds":
        rounds(args)
    elif args.command == "cpu":
        print(f"{cpu_per_round(args.files, args.warmup):.3f}")
    else:
        table(args)


if __name__ == "__main__":
    main()
