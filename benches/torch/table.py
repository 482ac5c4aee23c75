"""Prints the medians of `run.py`'s results as markdown tables.

    python benches/torch/table.py torch-results.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

SYSTEMS = ("ddp", "ddp-scaled", "localsgd", "bsp", "backup", "dbw", "ssp", "asp")
LABELS = {"ddp": "DDP", "ddp-scaled": "DDP, lr × n", "localsgd": "post-local SGD", "bsp": "BSP", "backup": "backup b=1", "dbw": "DBW", "ssp": "SSP s=3", "asp": "ASP"}


def median_time(rows: list[dict[str, Any]]) -> str:
    """Median time to target over the runs; a run that missed it counts as infinitely slow."""
    times = [r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf") for r in rows]
    m = statistics.median(times)
    missed = sum(t == float("inf") for t in times)
    text = "not reached" if m == float("inf") else f"{m:.2f} s"
    return text + (f" ({missed}/{len(times)} missed)" if missed else "")


def ratio(a: float, b: float) -> str:
    if a == float("inf") or b == float("inf"):
        return "n/a (target not reached)"
    return f"{a / b:.2f}"


def loads(rows: list[dict[str, Any]]) -> str:
    """The range of the 1-minute load average at the start of the runs (older results have none)."""
    values = [r["load_before"] for r in rows if "load_before" in r]
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows if key in r)


def cpu(rows: list[dict[str, Any]], key: str) -> str:
    """The median of a CPU-time field in ms (empty if the runs predate it)."""
    return f"{median_of(rows, key):.1f} ms" if any(key in r for r in rows) else ""


def megabytes(floats: float) -> str:
    return f"{4 * floats / 1e6:.1f} MB"


def print_per_update(groups: dict[tuple, dict[str, list[dict[str, Any]]]]) -> None:
    print("Time and CPU per update of real training, no straggler (median of the runs)\n")
    print("| parameters | workers | DDP | BSP over TCP | BSP / DDP | server CPU per update | "
          "a memory copy of 2·n·d·4 bytes | worker CPU outside forward+backward: DDP, BSP | "
          "all workers' CPU: DDP, BSP | runs | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (dim, _model, workers), by in sorted(groups.items()):
        if "ddp" not in by or "bsp" not in by:
            continue
        ddp, bsp = by["ddp"], by["bsp"]
        d_ms, b_ms = median_of(ddp, "per_update_ms"), median_of(bsp, "per_update_ms")
        copy = f"{median_of(bsp, 'memcpy_ms'):.1f} ms ({megabytes(2 * workers * dim)})" if any(
            "memcpy_ms" in r for r in bsp) else megabytes(2 * workers * dim)
        runs = min(len(ddp), len(bsp))
        print(f"| {dim / 1e6:.2f} M | {workers} | {d_ms:.1f} ms | {b_ms:.1f} ms | {b_ms / d_ms:.2f} | "
              f"{median_of(bsp, 'server_cpu_ms'):.1f} ms | {copy} | "
              f"{median_of(ddp, 'outside_fwdbwd_ms'):.1f} ms, {median_of(bsp, 'outside_fwdbwd_ms'):.1f} ms | "
              f"{median_of(ddp, 'all_workers_cpu_ms'):.1f} ms, {median_of(bsp, 'all_workers_cpu_ms'):.1f} ms | "
              f"{runs} | {loads(ddp + bsp)} |")
    print()


def main(paths: list[str]) -> int:
    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    train: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    link: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    per_update: dict[tuple, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["kind"] == "train":
            key = (r["model"], r["case"] + (" (sleep)" if r.get("straggle") == "sleep" and r["case"] != "none" else ""),
                   r["workers"], r["target"], r["gradients"])
            train[key][r["system"]].append(r)
        elif r["kind"] == "per_update":
            per_update[(r["dim"], r["model"], r["workers"])][r["system"]].append(r)
        else:
            link[(r["model"], r["dim"], r["workers"])][r["system"]].append(r)
    if train:
        print("Time to the test-accuracy target (training time, evaluations excluded; median of the runs) "
              "and final accuracy (median)\n")
        print("| model | case | workers | target | gradients | " + " | ".join(LABELS[s] for s in SYSTEMS)
              + " | runs | load |")
        print("|---|---|---|---|---|" + "---|" * len(SYSTEMS) + "---|---|")
        for (model, case, workers, target, gradients), by in sorted(train.items()):
            cells = []
            for s in SYSTEMS:
                if s not in by:
                    cells.append("")
                    continue
                acc = statistics.median(r["final_accuracy"] for r in by[s])
                cells.append(f"{median_time(by[s])}, {acc:.3f}")
            runs = min(len(v) for v in by.values())
            every = [r for v in by.values() for r in v]
            print(f"| {model} | {case} | {workers} | {target} | {gradients:,} | " + " | ".join(cells)
                  + f" | {runs} | {loads(every)} |")
        print()
        for (model, case, workers, target, _), by in sorted(train.items()):
            if "ddp" not in by:
                continue
            ddp = statistics.median(r["time_to_target_s"] or float("inf") for r in by["ddp"])
            best = min(
                ((statistics.median(r["time_to_target_s"] or float("inf") for r in by[s]), s)
                 for s in SYSTEMS[3:] if s in by),
                default=None,
            )
            bsp = statistics.median(r["time_to_target_s"] or float("inf") for r in by["bsp"]) if "bsp" in by else None
            parts = []
            if bsp is not None:
                parts.append(f"BSP / DDP = {ratio(bsp, ddp)}")
            if best is not None:
                parts.append(f"DDP / best ({LABELS[best[1]]}) = {ratio(ddp, best[0])}")
            print(f"- {model}, {case}, {workers} workers: " + "; ".join(parts))
        print()
    if per_update:
        print_per_update(per_update)
    if link:
        print("Cost of one update's communication (no computation; median ms per update)\n")
        print("| model | parameters | workers | DDP allreduce | syncopate BSP over TCP | BSP / DDP | "
              "CPU per update: DDP rank 0 | BSP server (protocol thread) | BSP worker | all processes: DDP, BSP | "
              "bytes moved per update: server | ring allreduce | runs | load |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (model, dim, workers), by in sorted(link.items()):
            med = {s: statistics.median(r["per_update_ms"] for r in by[s]) for s in ("ddp", "bsp") if s in by}
            ddp = f"{med['ddp']:.1f} ms" if "ddp" in med else ""
            bsp = f"{med['bsp']:.1f} ms" if "bsp" in med else ""
            ratio_text = f"{med['bsp'] / med['ddp']:.2f}" if len(med) == 2 else ""
            # The server receives n gradients and sends n models of d floats; a ring
            # allreduce sends (and receives) 2 (n - 1) / n d floats per worker.
            server = f"{megabytes(2 * workers * dim)} (2 n d)"
            ring = f"{megabytes(2 * (workers - 1) * dim)} (2 (n-1) d)"
            rank_cpu = cpu(by.get("ddp", []), "rank_cpu_ms")
            server_cpu = cpu(by.get("bsp", []), "server_cpu_ms")
            thread_cpu = cpu(by.get("bsp", []), "protocol_thread_cpu_ms")
            server_cpu += f" ({thread_cpu})" if thread_cpu else ""
            worker_cpu = cpu(by.get("bsp", []), "worker_cpu_ms")
            # Every rank of the allreduce does the same work; the server's and the workers'
            # medians add up to a BSP round's.
            totals = ""
            if rank_cpu and worker_cpu:
                ddp_all = workers * median_of(by["ddp"], "rank_cpu_ms")
                bsp_all = median_of(by["bsp"], "server_cpu_ms") + workers * median_of(by["bsp"], "worker_cpu_ms")
                totals = f"{ddp_all:.1f} ms, {bsp_all:.1f} ms"
            runs = min(len(v) for v in by.values())
            every = [r for v in by.values() for r in v]
            print(f"| {model} | {dim:,} | {workers} | {ddp} | {bsp} | {ratio_text} | {rank_cpu} | {server_cpu} "
                  f"| {worker_cpu} | {totals} "
                  f"| {server} | {ring} | {runs} | {loads(every)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["torch-results.jsonl"]))
