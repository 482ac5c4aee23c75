#!/usr/bin/env bash
# Runs every benchmark of BENCHMARKS.md in one go and writes the tables to
# target/bench-report/REPORT.md (also printed at the end):
#   1. aggregation kernels (criterion, benches/benches/kernels.rs), with ratios to a copy
#      and to a hand-written 16-lane loop measured in the same run;
#   2. state-machine overhead per control message (criterion, benches/benches/overhead.rs);
#   3. end-to-end BSP rounds over the channel star and TCP loopback (benches/src/bin/rounds.rs),
#      next to two MPI peers of the same bytes and ranks when mpicc/mpirun are present
#      (benches/mpi/allreduce.c; Debian: apt-get install openmpi-bin libopenmpi-dev):
#      MPI_Allreduce (the target) and MPI_Reduce + MPI_Bcast (a parameter server's
#      gather/broadcast pattern); each configuration runs 3 times, ours and MPI's
#      interleaved, and the table shows medians (the machine is shared and noisy);
#   3b. BSP rounds over the MPI adapter (benches/src/bin/mpi_rounds.rs, feature `mpi`) for
#      n = 2, 4, 8 worker ranks and d = 1e5, 1e6, 1e7, next to the same MPI peers and the bare
#      point-to-point star of the same bytes on n+1 ranks (allreduce.c's `star`, a lower bound
#      for any star-shaped parameter server); MPI runs with its defaults (mpirun turns
#      yield-when-idle on where it oversubscribes);
#   4. simulator throughput (tests/tests/sim_throughput.rs, release, ignored test).
# Usage: benches/run.sh [--quick]   (--quick: fewer rounds, for a smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="--repeat 3"
[[ "${1:-}" == "--quick" ]] && QUICK="--quick"
OUT=target/bench-report
mkdir -p "$OUT"
REPORT="$OUT/REPORT.md"

{
  echo "# Benchmark run $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  echo "nproc: $(nproc)"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|L1d|L2|L3)' || true
  echo "kernel: $(uname -r)"
  rustc --version
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo '```'
  echo
} > "$REPORT"

echo "== kernels and state-machine overhead (criterion)" >&2
cargo bench -p syncopate-benches --bench kernels --bench overhead -- --noplot >"$OUT/criterion.log" 2>&1
cargo run -q -p syncopate-benches --release --bin summary >>"$REPORT"

echo "== end-to-end BSP rounds" >&2
MPI_ARGS=()
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -o "$OUT/allreduce" benches/mpi/allreduce.c
  MPI_ARGS=(--mpi "$PWD/$OUT/allreduce")
else
  echo "(mpicc not found: MPI peer skipped)" >&2
fi
{
  echo
  echo "### End-to-end BSP rounds (f32, constant gradient, median over rounds, then over runs)"
  echo
  cargo run -q -p syncopate-benches --release --bin rounds -- $QUICK "${MPI_ARGS[@]}"
} >>"$REPORT"

# BSP rounds over syncopate-mpi next to the MPI peers (feature `mpi`).
if [[ ${#MPI_ARGS[@]} -gt 0 ]] && cargo build -q --release -p syncopate-benches --features mpi --bin mpi_rounds; then
  echo "== BSP rounds over the MPI adapter" >&2
  {
    echo
    echo "### BSP rounds over the MPI adapter (n worker ranks + 1 server rank; MPI peers on n ranks)"
    echo
    cargo run -q -p syncopate-benches --release --bin rounds -- $QUICK "${MPI_ARGS[@]}" \
      --mpi-adapter "$PWD/target/release/mpi_rounds" --transport mpi --n 2,4,8 --dim 1e5,1e6,1e7
  } >>"$REPORT"
fi

echo "== simulator throughput" >&2
{
  echo
  echo "### Simulator throughput (trivial workload: GradientSource::Constant)"
  echo
  echo '```'
  cargo test -q --release -p syncopate-tests --test sim_throughput -- --ignored --nocapture 2>&1 |
    grep -E 'events/s|test result' || echo "(sim throughput test did not run)"
  echo '```'
} >>"$REPORT"

echo "== simulator at scale (n = 100, 1,000, 10,000)" >&2
{
  echo
  echo "### Simulator at scale (every protocol, trivial workload, 600,000 gradients per run)"
  cargo test -q --release -p syncopate-tests --test sim_scale -- --ignored --nocapture 2>&1 |
    grep -E '^\||^[a-z].*:|test result' || echo "(sim scale test did not run)"
} >>"$REPORT"

cat "$REPORT"
