#!/usr/bin/env bash
# Soak tier: the swarm simulator on every protocol for SEEDS seeds x STEPS events each (a
# random subset of fault kinds per seed, worker crashes included; invariants and the
# conservation ledger checked after every event), then every fuzz target for FUZZ_SECS
# seconds (`cargo fuzz run -s none`, from the committed corpus). Writes a summary
# (summary.md, and the raw lines) into OUT and exits non-zero on any violation, hang or
# fuzz finding.
#
#   tests/soak.sh                                   # 10^4 seeds x 10^4 steps, 600 s per fuzz target
#   SOAK_SEEDS=400 SOAK_STEPS=10000 SOAK_FUZZ_SECS=120 tests/soak.sh   # a smaller run
#
# Settings (environment): SOAK_SEEDS (10000), SOAK_STEPS (10000), SOAK_FUZZ_SECS (600; 0
# skips fuzzing), SOAK_JOBS (2 parallel simulator runs), SOAK_CHUNK (seeds per run, 250),
# SOAK_PROTOCOLS (all), SOAK_OUT (target/soak).
set -uo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SOAK_SEEDS:-10000}
STEPS=${SOAK_STEPS:-10000}
FUZZ_SECS=${SOAK_FUZZ_SECS:-600}
JOBS=${SOAK_JOBS:-2}
CHUNK=${SOAK_CHUNK:-250}
OUT=${SOAK_OUT:-target/soak}
mkdir -p "$OUT"
rm -f "$OUT"/sim-*.log "$OUT"/fuzz-*.log
start=$(date +%s)

# The simulator: one release test binary, runs of CHUNK seeds spread over JOBS processes.
bin=$(cargo test --release -p syncopate-tests --test soak --no-run --message-format=json 2>"$OUT/build.log" |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
if [ -z "$bin" ]; then
  echo "soak: cannot build the simulator (see $OUT/build.log)"
  exit 2
fi
# Every protocol of the fault suite unless SOAK_PROTOCOLS names some.
PROTOCOLS=${SOAK_PROTOCOLS:-$("$bin" --ignored --exact protocols_list --nocapture | sed -n 's/.*soak-protocols: //p')}
echo "soak: $SEEDS seeds x $STEPS steps per protocol ($PROTOCOLS), fuzz $FUZZ_SECS s per target; output in $OUT"
tasks=()
for p in $PROTOCOLS; do
  first=1
  while [ "$first" -le "$SEEDS" ]; do
    n=$((SEEDS - first + 1))
    [ "$n" -gt "$CHUNK" ] && n=$CHUNK
    tasks+=("$p $first $n")
    first=$((first + n))
  done
done
export bin STEPS OUT
printf '%s\n' "${tasks[@]}" | xargs -P "$JOBS" -L 1 sh -c '
  SOAK_PROTOCOL=$0 SOAK_FIRST_SEED=$1 SOAK_SEEDS=$2 SOAK_STEPS=$STEPS \
    "$bin" --ignored --exact soak --nocapture > "$OUT/sim-$0-$1.log" 2>&1 ||
    echo "soak: protocol=$0 first_seed=$1 seeds=$2 CRASHED" >> "$OUT/sim-$0-$1.log"'
sim_end=$(date +%s)

# The fuzz targets.
fuzz_ok=1
if [ "$FUZZ_SECS" -gt 0 ]; then
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "soak: cargo-fuzz is not installed (cargo install --locked cargo-fuzz); fuzzing skipped" | tee "$OUT/fuzz-missing.log"
    fuzz_ok=0
  else
    for target in $(ls fuzz/fuzz_targets | sed 's/\.rs$//'); do
      scratch=$(mktemp -d)
      (cd fuzz && cargo fuzz run -s none "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$FUZZ_SECS" -rss_limit_mb=2048 -print_final_stats=1) > "$OUT/fuzz-$target.log" 2>&1
      echo "exit=$?" >> "$OUT/fuzz-$target.log"
      rm -rf "$scratch"
    done
  fi
fi
end=$(date +%s)

# The summary.
{
  echo "# Soak run $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Settings: $SEEDS seeds x $STEPS steps per protocol, fuzz $FUZZ_SECS s per target, $JOBS jobs."
  echo "Simulator $((sim_end - start)) s, fuzzing $((end - sim_end)) s."
  echo
  echo "| protocol | seeds | events | checks | server restarts | worker crashes | violations | hangs | first failure |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for p in $PROTOCOLS; do
    cat "$OUT"/sim-"$p"-[0-9]*.log | grep -h '^soak: ' | awk -v p="$p" '
      { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if ($0 ~ /CRASHED/) crashed++
        seeds += v["seeds"]; events += v["events"]; checks += v["checks"]; restarts += v["server_restarts"]
        crashes += v["crashes"]; viol += v["violations"]; hangs += v["hangs"]
        if (first == "" && v["first_failure"] != "\"\"") { first = $0; sub(/.*first_failure=/, "", first) } }
      END { if (crashed) first = crashed " runs crashed"; if (first == "") first = "-"
        printf "| %s | %d | %d | %d | %d | %d | %d | %d | %s |\n", p, seeds, events, checks, restarts, crashes, viol, hangs, first }'
  done
  echo
  if [ "$FUZZ_SECS" -gt 0 ] && [ "$fuzz_ok" = 1 ]; then
    echo "| fuzz target | seconds | executions | findings (exit code) |"
    echo "|---|---|---|---|"
    for f in "$OUT"/fuzz-*.log; do
      t=$(basename "$f" .log); t=${t#fuzz-}
      execs=$(grep -h 'stat::number_of_executed_units' "$f" | awk '{print $2}' | tail -1)
      code=$(grep -h '^exit=' "$f" | tail -1 | cut -d= -f2)
      echo "| $t | $FUZZ_SECS | ${execs:-?} | $([ "$code" = 0 ] && echo 0 || echo "exit $code, see $f") |"
    done
  fi
} > "$OUT/summary.md"
cat "$OUT/summary.md"
bad=$(cat "$OUT"/sim-*.log | grep -h '^soak: ' | grep -vc 'violations=0 hangs=0')
fuzz_bad=$(grep -h '^exit=' "$OUT"/fuzz-*.log 2>/dev/null | grep -vc '^exit=0$')
[ "$bad" = 0 ] && [ "${fuzz_bad:-0}" = 0 ]
