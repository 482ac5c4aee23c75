#!/usr/bin/env bash
# A/B of the `overhead` bench's mem_n4 group: two bench binaries (e.g. target/release/deps/overhead-* of two trees)
# usage: ab.sh OLD_BIN NEW_BIN ROUNDS  -> /tmp/ab.txt and a median table
OLD=$1; NEW=$2; R=${3:-3}
: > /tmp/ab.txt
for r in $(seq $R); do for b in OLD NEW; do eval bin=\$$b; (cd /tmp && $bin --bench mem_n4 2>&1 | grep -B1 "time:" | tr '\n' ' ' | sed 's/--/\n/g' | sed "s/^ *//; s/^/$b /"; echo) >> /tmp/ab.txt; done; done
python3 - <<'PY'
import re,statistics,collections
d=collections.defaultdict(list)
for l in open('/tmp/ab.txt'):
    for m in re.finditer(r'overhead/(\S+)/mem_n4\s+time:\s+\[\S+ \S+ (\S+) (\S+)',l):
        p,v,u=m.groups(); v=float(v)*(1000 if u.startswith('µ') else 1)
        d[(p,l.split()[0])].append(v)
for p in dict.fromkeys(p for p,_ in d):  # the protocols in the bench's order
    o=statistics.median(d[(p,'OLD')]); n=statistics.median(d[(p,'NEW')])
    print(f"| {p} | {o:.0f} | {n:.0f} | {n/o:.2f} | {' '.join('%.0f'%x for x in d[(p,'OLD')])} | {' '.join('%.0f'%x for x in d[(p,'NEW')])} |")
PY
