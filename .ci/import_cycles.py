#!/usr/bin/env python3
"""Import cycles between the files of a Rust crate.

A file depends on the file that defines each item it names: every path through `crate::`,
`super::`, `self::`, a child module or a name it imported (use trees and inline paths) is
resolved to the longest module prefix that is a file, then, where that module only imports the
name (`use`, `pub use`), on to the import's target. A re-export is therefore no edge of its
own, and an inline `#[cfg(test)]` module is not its file's code. A cycle is a strongly
connected component (Tarjan) of more than one file. Comments and string literals are ignored;
`#[path]` modules are not followed.

Usage: import_cycles.py [-v] SRC_DIR...     exit 1 when a crate has a cycle (-v: its edges)
       import_cycles.py --self-test         checks the checker on made-up crates
"""
import os, re, sys
sys.setrecursionlimit(10000)

def modfiles(src):
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if not n.endswith('.rs'): continue
            p = os.path.join(root, n)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] == 'mod': rel = rel[:-1]
            if rel in (['lib'], ['main']): rel = []
            files[tuple(rel)] = p
    return files

def strip(t):
    t = re.sub(r'/\*.*?\*/', '', t, flags=re.S)
    t = re.sub(r'//[^\n]*', '', t)
    t = re.sub(r'r#*"(.*?)"#*', '""', t, flags=re.S)
    t = re.sub(r'"(\\.|[^"\\])*"', '""', t)
    t = re.sub(r"'(\\.|[^'\\])'", "' '", t)
    return t

def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch == '{': depth += 1
        elif ch == '}': depth -= 1
        if ch == ',' and depth == 0: parts.append(cur); cur = ''
        else: cur += ch
    if cur: parts.append(cur)
    return parts

def expand_use(tree):
    """[(segs, alias)]"""
    tree = re.sub(r'\s+', ' ', tree).strip()
    out = []
    def rec(prefix, s):
        for p in split_top(s):
            p = p.strip()
            if not p: continue
            if '{' in p:
                i = p.index('{')
                head = [x for x in p[:i].strip().rstrip(':').split('::') if x]
                rec(prefix + head, p[i+1:p.rindex('}')])
            else:
                alias = None
                m = re.match(r'(.*?)\s+as\s+(\w+)$', p)
                if m: p, alias = m.group(1), m.group(2)
                segs = prefix + [x.strip() for x in p.split('::') if x.strip()]
                if segs and segs[-1] == 'self': segs = segs[:-1]; alias = alias or (segs[-1] if segs else None)
                out.append((segs, alias or (segs[-1] if segs else None)))
    rec([], tree)
    return out

def drop_test_mods(t):
    """Inline `#[cfg(test)] mod x { ... }` bodies (or `#[cfg(all(test, ...))]`) are a module of
    their own, not the file's code."""
    out, i = [], 0
    test_cfg = r'#\[cfg\((?:test|all\([^\]]*?(?<!not\()\btest\b[^\]]*\))\)\]'
    for m in re.finditer(test_cfg + r'\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+\w+\s*\{', t):
        if m.start() < i: continue
        out.append(t[i:m.start()])
        depth, j = 1, m.end()
        while j < len(t) and depth:
            depth += {'{': 1, '}': -1}.get(t[j], 0); j += 1
        i = j
    out.append(t[i:])
    return ''.join(out)

class Crate:
    def __init__(self, src):
        self.files = modfiles(src)
        self.text = {m: drop_test_mods(strip(open(p).read())) for m, p in self.files.items()}
        self.defs = {m: set(re.findall(r'\b(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(\w+)', t))
                     for m, t in self.text.items()}
        self.imports = {m: {} for m in self.files}
        self.globs = {m: [] for m in self.files}
        self.uses = {m: [] for m in self.files}
        for m, t in self.text.items():
            for u in re.finditer(r'(\bpub(?:\([\w:]+\))?\s+)?\buse\s+([^;]+);', t):
                for segs, alias in expand_use(u.group(2)):
                    a = self.absolute(m, segs)
                    if a is None: continue
                    if not u.group(1): self.uses[m].append(a)
                    if alias == '*': self.globs[m].append(a[:-1])
                    elif alias: self.imports[m][alias] = a

    def absolute(self, cur, segs, use_imports=False):
        if not segs: return None
        if segs[0] == 'crate': return segs[1:]
        if segs[0] in ('super', 'self'):
            base = list(cur)
            while segs and segs[0] in ('super', 'self'):
                if segs[0] == 'super':
                    if not base: return None
                    base = base[:-1]
                segs = segs[1:]
            return base + segs
        if tuple(cur) + (segs[0],) in self.files: return list(cur) + segs
        if use_imports and segs[0] in self.imports[cur]:
            return self.imports[cur][segs[0]] + segs[1:]
        return None

    def resolve(self, a, seen=None):
        seen = seen or set()
        for k in range(len(a), -1, -1):
            M = tuple(a[:k])
            if M in self.files: break
        if k == len(a): return M
        name = a[k]
        if name in self.defs[M] or (M, name) in seen: return M
        if name in self.imports[M]:
            seen.add((M, name))
            return self.resolve(self.imports[M][name] + a[k+1:], seen)
        for g in self.globs[M]:
            return self.resolve(g + a[k:], seen | {(M, name)})
        return M

    def edges(self):
        E = {m: set() for m in self.files}; self.why = {}
        for m, t in self.text.items():
            paths = list(self.uses[m])
            body = re.sub(r'\bpub(?:\([\w:]+\))?\s+use\s+[^;]+;', '', t)
            body = re.sub(r'\buse\s+[^;]+;', '', body)
            for p in re.finditer(r'(?<![:\w])([A-Za-z_]\w*(?:::[A-Za-z_]\w*)+)', body):
                a = self.absolute(m, p.group(1).split('::'), use_imports=True)
                if a is not None: paths.append(a)
            for a in paths:
                r = self.resolve(a)
                if r is not None and r != m:
                    E[m].add(r); self.why.setdefault((m, r), set()).add('::'.join(a))
        return E

def tarjan(nodes, edges):
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in edges[v]:
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in sorted(nodes):
        if v not in idx: sc(v)
    return out

def name(m):
    return '::'.join(m) or 'lib'


def self_test():
    import tempfile
    def crate(files):
        d = tempfile.mkdtemp()
        for path, text in files.items():
            p = os.path.join(d, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, 'w').write(text)
        c = Crate(d)
        return [sorted(map(name, x)) for x in tarjan(list(c.files), c.edges()) if len(x) > 1]
    # A parent that re-exports a child which imports the parent's own item: no cycle.
    ok = {'lib.rs': 'mod a;\nmod b;\npub use a::A;\npub struct L;\n',
          'a.rs': 'use crate::L;\npub struct A;\n', 'b.rs': 'use crate::A;\nfn f() {}\n'}
    assert crate(ok) == [], crate(ok)
    # Two siblings naming each other's items (one inline path, one through a re-export).
    bad = {'lib.rs': 'mod a;\nmod b;\npub use b::B;\n',
           'a.rs': 'pub struct A;\nfn f() -> crate::B { todo!() }\n',
           'b.rs': 'use super::a::A;\npub struct B(A);\n'}
    assert crate(bad) == [['a', 'b']], crate(bad)
    # A parent using a child's item in its code while the child uses the parent's.
    parent = {'lib.rs': 'mod m;\n', 'm/mod.rs': 'mod c;\npub struct P;\nfn f() { c::g(); }\n',
              'm/c.rs': 'use super::P;\npub fn g() {}\n'}
    assert crate(parent) == [['m', 'm::c']], crate(parent)
    # An inline test module's imports are not its file's.
    tests = {'lib.rs': 'mod m;\nmod n;\npub struct L;\n',
             'm.rs': 'pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::n::g;\n}\n',
             'n.rs': 'pub fn g() { crate::m::f() }\n'}
    assert crate(tests) == [], crate(tests)
    # Likewise under a narrower test-only cfg, while a `not(test)` module is the file's code.
    narrow = dict(tests, **{'m.rs': tests['m.rs'].replace('cfg(test)', 'cfg(all(test, target_os = "linux"))')})
    assert crate(narrow) == [], crate(narrow)
    shipped = dict(tests, **{'m.rs': tests['m.rs'].replace('cfg(test)', 'cfg(all(not(test), unix))')})
    assert crate(shipped) == [['m', 'n']], crate(shipped)
    print('self-test passed')


if __name__ == '__main__':
    if sys.argv[1:] == ['--self-test']:
        self_test()
        sys.exit(0)
    verbose = '-v' in sys.argv
    total = 0
    for src in [a for a in sys.argv[1:] if a != '-v']:
        c = Crate(src); E = c.edges()
        comps = [x for x in tarjan(list(c.files), E) if len(x) > 1]
        total += len(comps)
        print(f'{src}: {len(c.files)} files, {sum(len(e) for e in E.values())} edges, {len(comps)} cycles')
        for comp in comps:
            print('  cycle:', ', '.join(sorted(map(name, comp))))
            if verbose:
                cs = set(comp)
                for m in sorted(comp):
                    for w in sorted(E[m] & cs):
                        via = ' '.join(sorted(c.why[(m, w)])[:4])
                        print('    ', name(m), '->', name(w), ' via', via)
    sys.exit(1 if total else 0)
