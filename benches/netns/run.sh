#!/usr/bin/env bash
# BSP over TCP on emulated hosts, one server against S = n shards, beside gloo's allreduce
# on the same links. Needs root: it creates network namespaces, veth pairs, a bridge and tc
# qdiscs, and removes them all on exit (normal end, error, Ctrl-C or TERM).
#
#   benches/netns/run.sh [options]
#   benches/netns/run.sh --teardown      # remove what an interrupted run left behind
#
# Hosts: one namespace per worker (PREFIX-w0..) and per server or shard (PREFIX-s0..), each
# with one link `eth0` (a veth pair) to a bridge in a hub namespace (PREFIX-hub); nothing is
# added to the caller's namespace. Every host link is shaped both ways (its two ends'
# egress) to the rate of the row: tc netem `rate` plus the one-way delay where the kernel
# has sch_netem, else tbf, whose rate holds but which adds no delay (the script says so).
#
# Rows, for each rate and worker count n, repeated and interleaved: BSP with one server
# (S = 1), BSP with n shards (S = n, `--shard k/n`; the sharded worker talks to every
# shard), and gloo's allreduce (torch.distributed) with one rank per worker namespace. The
# workers hand back a constant gradient at once, so a round is communication and the
# servers' arithmetic. A row's figure is the median over its timed rounds (after the
# warm-up ones) of one run; the table gives the median over the repeats, each repeat's
# figure, the link floor (the bytes one direction of the busiest link carries per round,
# over the rate; BSP sends a model only once every gradient is in, so where nothing
# overlaps a BSP round takes twice its floor), the CPU time of the run's processes per
# round, the share of the machine's CPU that was busy during the run (100% = one core) and
# the load average before it.
#
# Options:
#   --rates "R ..."     tc rates, NNmbit or NNgbit (default "1gbit 10gbit")
#   --workers "N ..."   worker counts (default "4 8")
#   --d D               floats per gradient (default 25000000)
#   --warmup W          untimed rounds first (default 2)
#   --rounds T          timed rounds (default 5)
#   --repeats K         runs of every row (default 3)
#   --setups "..."      any of single, sharded, gloo (default all three)
#   --delay DELAY       one-way delay of a host link, where netem exists (default 0.1ms)
#   --out DIR           logs and results.tsv (default target/netns)
#   --python PATH       a Python with torch, for gloo (default python3)
#   --node PATH         the netns_node example binary
#                       (default target/release/examples/netns_node)
#   --prefix P          namespace prefix (default snet)
#   --teardown          only remove the namespaces of PREFIX
#
# Build the node first: cargo build --release -p syncopate-benches --example netns_node
set -uo pipefail

usage() { sed -n '2,/^# Build the node/p' "$0" | sed 's/^# \{0,1\}//'; }
die_usage() { echo "run.sh: $*" >&2; exit 2; }

RATES="1gbit 10gbit"
WORKERS="4 8"
D=25000000
WARMUP=2
ROUNDS=5
REPEATS=3
SETUPS="single sharded gloo"
DELAY=0.1ms
OUT=target/netns
PYTHON=python3
NODE=target/release/examples/netns_node
PREFIX=snet
TEARDOWN_ONLY=0

while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --teardown) TEARDOWN_ONLY=1; shift; continue ;;
    --rates | --workers | --d | --warmup | --rounds | --repeats | --setups | --delay | --out | --python | --node | --prefix)
      [ $# -ge 2 ] || die_usage "$1 needs a value"
      case "$1" in
        --rates) RATES=$2 ;; --workers) WORKERS=$2 ;; --d) D=$2 ;; --warmup) WARMUP=$2 ;;
        --rounds) ROUNDS=$2 ;; --repeats) REPEATS=$2 ;; --setups) SETUPS=$2 ;; --delay) DELAY=$2 ;;
        --out) OUT=$2 ;; --python) PYTHON=$2 ;; --node) NODE=$2 ;; --prefix) PREFIX=$2 ;;
      esac
      shift 2 ;;
    *) die_usage "unknown argument '$1' (see --help)" ;;
  esac
done

is_count() { [[ "$1" =~ ^[0-9]+$ ]] && [ "${#1}" -le 9 ]; }
for pair in "d:$D" "rounds:$ROUNDS" "repeats:$REPEATS"; do
  is_count "${pair#*:}" && [ "${pair#*:}" -ge 1 ] || die_usage "--${pair%%:*} must be a whole number of at least 1, got '${pair#*:}'"
done
is_count "$WARMUP" || die_usage "--warmup must be a whole number, got '$WARMUP'"
for n in $WORKERS; do
  is_count "$n" && [ "$n" -ge 2 ] && [ "$n" -le 64 ] || die_usage "--workers: each count must be 2 to 64, got '$n'"
done
for rate in $RATES; do
  [[ "$rate" =~ ^[1-9][0-9]{0,5}(mbit|gbit)$ ]] || die_usage "--rates: expected NNmbit or NNgbit, got '$rate'"
done
for setup in $SETUPS; do
  case "$setup" in single | sharded | gloo) ;; *) die_usage "--setups: unknown setup '$setup' (single, sharded, gloo)" ;; esac
done
[[ "$DELAY" =~ ^[0-9]+(\.[0-9]+)?(us|ms)$ ]] || die_usage "--delay: expected a time such as 0.1ms, got '$DELAY'"
[[ "$PREFIX" =~ ^[a-z]{1,6}$ ]] || die_usage "--prefix: 1 to 6 lower-case letters, got '$PREFIX'"
[ -n "$RATES" ] && [ -n "$WORKERS" ] && [ -n "$SETUPS" ] || die_usage "--rates, --workers and --setups need at least one value"

# Nothing is created, changed or written before this check.
if [ "$(id -u)" != 0 ]; then
  echo "needs root: run.sh creates network namespaces, veth pairs, a bridge and tc qdiscs (run it as root, e.g. with sudo); nothing was changed" >&2
  exit 2
fi
for tool in ip tc; do
  command -v "$tool" >/dev/null || { echo "run.sh: '$tool' not found (iproute2)" >&2; exit 2; }
done

HUB="$PREFIX-hub"
mine() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(hub|w[0-9]+|s[0-9]+)$"; }

CREATED=()
PIDS=()
# Stops the processes this shell started that are still running (bash's own job table, so a
# finished process's id, which the system may reuse, is never signalled).
stop_pids() {
  local running
  running=$(jobs -pr)
  [ -z "$running" ] || kill $running 2>/dev/null
  wait 2>/dev/null
  PIDS=()
}
teardown() {
  set +e
  stop_pids
  local ns
  # Host namespaces first: deleting one destroys its veth pair; the hub (and its bridge) last.
  for ns in "${CREATED[@]}"; do [ "$ns" = "$HUB" ] || ip netns del "$ns" 2>/dev/null; done
  for ns in "${CREATED[@]}"; do [ "$ns" = "$HUB" ] && ip netns del "$ns" 2>/dev/null; done
  CREATED=()
}

if [ "$TEARDOWN_ONLY" = 1 ]; then
  mapfile -t CREATED < <(mine)
  teardown
  left=$(mine)
  [ -z "$left" ] || { echo "run.sh: could not remove: $left" >&2; exit 1; }
  echo "run.sh: no namespace of prefix $PREFIX is left"
  exit 0
fi

case " $SETUPS " in *" single "* | *" sharded "*)
  [ -x "$NODE" ] || { echo "run.sh: $NODE not found: build it with cargo build --release -p syncopate-benches --example netns_node (or give --node)" >&2; exit 2; } ;;
esac
case " $SETUPS " in *" gloo "*)
  "$PYTHON" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
    { echo "run.sh: $PYTHON cannot import torch.distributed with gloo (give --python)" >&2; exit 2; } ;;
esac
existing=$(mine)
if [ -n "$existing" ]; then
  echo "run.sh: namespaces of prefix $PREFIX exist already ($(echo $existing)): another run, or an interrupted one (remove them with --teardown)" >&2
  exit 2
fi

trap teardown EXIT
trap 'echo "run.sh: interrupted: tearing down" >&2; exit 130' INT
trap 'echo "run.sh: terminated: tearing down" >&2; exit 143' TERM
trap 'echo "run.sh: failed at line $LINENO: $BASH_COMMAND" >&2; exit 1' ERR
set -eE

HERE=$(cd "$(dirname "$0")" && pwd)
DRIVE="$HERE/drive.py"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RESULTS="$OUT/results.tsv"
NMAX=0
for n in $WORKERS; do [ "$n" -gt "$NMAX" ] && NMAX=$n; done

# Topology. Addresses: worker i 10.46.0.(10+i), server or shard k 10.46.1.(10+k).
newns() { ip netns add "$1"; CREATED+=("$1"); ip -n "$1" link set lo up; }
newns "$HUB"
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
HOSTS=()
host() { # NAME ADDRESS
  local ns="$PREFIX-$1"
  newns "$ns"
  ip -n "$HUB" link add "$ns" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "$ns" master br0 up
  ip -n "$ns" addr add "$2/16" dev eth0
  ip -n "$ns" link set eth0 up
  HOSTS+=("$1")
}
for ((i = 0; i < NMAX; i++)); do host "w$i" "10.46.0.$((10 + i))"; done
for ((k = 0; k < NMAX; k++)); do host "s$k" "10.46.1.$((10 + k))"; done

NETEM=0
if ip -n "$HUB" link add probe0 type dummy 2>/dev/null; then
  tc -n "$HUB" qdisc add dev probe0 root netem delay "$DELAY" 2>/dev/null && NETEM=1
  ip -n "$HUB" link del probe0
fi
if [ "$NETEM" = 1 ]; then
  SHAPING="netem rate, $DELAY one-way delay per host link"
else
  SHAPING="tbf rate, no added delay (this kernel has no sch_netem)"
  echo "run.sh: sch_netem is not available: links are shaped with tbf, without the $DELAY delay" >&2
fi

# Shapes every host link to RATE both ways: the host's egress (its upload) and the hub
# side's egress (its download).
shape() {
  local rate=$1 bits bytes burst limit h
  bits=$(awk -v r="$rate" 'BEGIN { n = r + 0; print (r ~ /gbit$/) ? n * 1e9 : n * 1e6 }')
  bytes=$(awk -v b="$bits" 'BEGIN { printf "%d", b / 8 }')
  # A millisecond of traffic per burst (at least 64 KiB: one segmentation-offload packet)
  # and 20 ms of queue.
  burst=$(awk -v b="$bytes" 'BEGIN { x = b / 1000; printf "%d", (x < 65536) ? 65536 : x }')
  limit=$(awk -v b="$bytes" -v u="$burst" 'BEGIN { printf "%d", b / 50 + u }')
  for h in "${HOSTS[@]}"; do
    if [ "$NETEM" = 1 ]; then
      tc -n "$PREFIX-$h" qdisc replace dev eth0 root netem rate "$rate" delay "$DELAY" limit 100000
      tc -n "$HUB" qdisc replace dev "$PREFIX-$h" root netem rate "$rate" limit 100000
    else
      tc -n "$PREFIX-$h" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" limit "$limit"
      tc -n "$HUB" qdisc replace dev "$PREFIX-$h" root tbf rate "$rate" burst "$burst" limit "$limit"
    fi
  done
  RATE_BYTES=$bytes
}

# Busy and total jiffies of the whole machine.
cpu_sample() { awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6; exit }' /proc/stat; }
load1() { cut -d' ' -f1 /proc/loadavg; }

# Waits up to SECONDS for the processes PID... to finish; true if all of them exited with
# status 0 in time. The ones still running at the deadline are left running.
wait_for() {
  local deadline=$((SECONDS + $1)) pid alive running failed=0
  shift
  while :; do
    alive=0
    running=" $(echo $(jobs -pr)) "
    for pid in "$@"; do [[ "$running" == *" $pid "* ]] && alive=1; done
    [ "$alive" = 0 ] && break
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  for pid in "$@"; do wait "$pid" || failed=1; done
  return "$failed"
}

# Waits until every file in the list has a `listening` line.
wait_listening() {
  local deadline=$((SECONDS + 60)) f
  for f in "$@"; do
    until grep -q '^listening' "$f" 2>/dev/null; do
      [ "$SECONDS" -lt "$deadline" ] || { echo "run.sh: no server came up (see $f)" >&2; return 1; }
      sleep 0.1
    done
  done
}

# One run of SETUP with N workers in this shell (so that a teardown knows its processes):
# writes the timed rounds' seconds to $OUT/$TAG.times (nothing if it failed) and leaves
# the logs in $OUT/$TAG.*.
run_one() {
  local setup=$1 n=$2 tag=$3 k i list files=() budget
  budget=$(awk -v n="$n" -v r="$((WARMUP + ROUNDS))" -v d="$D" -v b="$RATE_BYTES" 'BEGIN { printf "%d", 120 + 4 * r * 2 * n * d * 4 / b }')
  case "$setup" in
    single | sharded)
      local count=1 shard_flag=()
      [ "$setup" = sharded ] && count=$n
      list=""
      for ((k = 0; k < count; k++)); do
        [ "$setup" = sharded ] && shard_flag=(--shard "$k/$count")
        ip netns exec "$PREFIX-s$k" "$NODE" server --listen "10.46.1.$((10 + k)):7046" --d "$D" --workers "$n" \
          --rounds "$((WARMUP + ROUNDS))" "${shard_flag[@]}" >"$OUT/$tag.s$k.out" 2>"$OUT/$tag.s$k.err" &
        PIDS+=($!)
        files+=("$OUT/$tag.s$k.out")
        list="$list${list:+,}10.46.1.$((10 + k)):7046"
      done
      wait_listening "${files[@]}" || { stop_pids; return 0; }
      local sharded_flag=()
      [ "$setup" = sharded ] && sharded_flag=(--sharded)
      local servers=("${PIDS[@]}")
      for ((i = 0; i < n; i++)); do
        ip netns exec "$PREFIX-w$i" "$NODE" worker --connect "$list" --id "$i" "${sharded_flag[@]}" \
          >"$OUT/$tag.w$i.out" 2>"$OUT/$tag.w$i.err" &
        PIDS+=($!)
      done
      local ok=1
      wait_for "$budget" "${servers[@]}" || { ok=0; echo "run.sh: $tag: a server failed or went past $budget s (see $OUT/$tag.s*.err)" >&2; }
      # The rounds are the servers'; a worker still trying to reach a server that has
      # finished is stopped.
      wait_for 3 "${PIDS[@]:${#servers[@]}}" || echo "run.sh: $tag: a worker failed or was stopped after its servers finished (see $OUT/$tag.w*.err)" >&2
      stop_pids
      [ "$ok" = 1 ] && "$PYTHON" "$DRIVE" rounds --warmup "$WARMUP" "${files[@]}" >"$OUT/$tag.times" || true
      ;;
    gloo)
      for ((i = 0; i < n; i++)); do
        ip netns exec "$PREFIX-w$i" env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 "$PYTHON" "$DRIVE" gloo --rank "$i" \
          --world "$n" --master 10.46.0.10 --port 29546 --d "$D" --warmup "$WARMUP" --rounds "$ROUNDS" \
          >"$OUT/$tag.r$i.out" 2>"$OUT/$tag.r$i.err" &
        PIDS+=($!)
      done
      if wait_for "$budget" "${PIDS[@]}"; then
        sed -n 's/^allreduce //p' "$OUT/$tag.r0.out" >"$OUT/$tag.times"
      else
        echo "run.sh: $tag: a rank failed or went past $budget s (see $OUT/$tag.r*.err)" >&2
      fi
      stop_pids
      ;;
  esac
}

# The floor of a row, seconds: the bytes one direction of the busiest link carries per
# round, over the rate.
bound() {
  awk -v s="$1" -v n="$2" -v d="$D" -v b="$RATE_BYTES" 'BEGIN {
    bytes = d * 4
    if (s == "single") t = n * bytes / b              # the server: n gradients in, n models out
    else if (s == "sharded") t = bytes / b            # a worker or a shard: d floats each way
    else t = 2 * (n - 1) / n * bytes / b              # a rank of the ring
    printf "%.6f", t }'
}
setup_name() { case "$1" in single) echo "S = 1" ;; sharded) echo "S = $2" ;; gloo) echo gloo ;; esac; }

[ -f "$RESULTS" ] || printf 'rate\tworkers\tsetup\trepeat\tmedian_s\tbound_s\tload1\tbusy_pct\tcpu_per_round_s\n' >"$RESULTS"
echo "d = $D floats, $WARMUP warm-up + $ROUNDS timed rounds per run, $REPEATS repeats; links: $SHAPING; $(nproc) cores"
echo "logs and results: $OUT"
for ((rep = 1; rep <= REPEATS; rep++)); do
  for rate in $RATES; do
    shape "$rate"
    for n in $WORKERS; do
      for setup in $SETUPS; do
        tag="$rate.n$n.$setup.$rep"
        rm -f "$OUT/$tag".*
        load=$(load1)
        read -r busy0 total0 < <(cpu_sample)
        run_one "$setup" "$n" "$tag"
        times=$(cat "$OUT/$tag.times" 2>/dev/null || true)
        read -r busy1 total1 < <(cpu_sample)
        name=$(setup_name "$setup" "$n")
        if [ -z "$times" ]; then
          echo "repeat $rep, $rate, n = $n, $name: failed (logs: $OUT/$tag.*)" >&2
          continue
        fi
        median=$(echo "$times" | tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
        busy=$(awk -v b="$((busy1 - busy0))" -v t="$((total1 - total0))" -v c="$(nproc)" 'BEGIN { printf "%.0f", (t > 0) ? 100 * c * b / t : 0 }')
        cpu=$("$PYTHON" "$DRIVE" cpu --warmup "$WARMUP" "$OUT/$tag".*.out)
        b=$(bound "$setup" "$n")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rate" "$n" "$name" "$rep" "$median" "$b" "$load" "$busy" "$cpu" >>"$RESULTS"
        printf 'repeat %d  %-7s n = %d  %-6s  median %.3f s  (rounds: %s)  floor %.3f s  process CPU %s s per round  machine busy %s%%  load %s\n' \
          "$rep" "$rate" "$n" "$name" "$median" "$times" "$b" "$cpu" "$busy" "$load"
      done
    done
  done
done
echo
"$PYTHON" "$DRIVE" table "$RESULTS"
