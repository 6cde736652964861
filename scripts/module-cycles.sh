#!/usr/bin/env bash
# List the `use crate::` / `crate::x::` / `super::` edges between the modules of one crate
# and fail if they form a cycle.
#
#   scripts/module-cycles.sh crates/memfabric-store/src
#
# A module is a file (`a.rs` or `a/mod.rs` is `a`, `a/b.rs` is `a::b`; lib.rs / main.rs is
# the crate root). An edge A -> B means a path in A's file names module B or an item of it.
# A path that stops at an item re-exported by a module file (`pub use x::{Name}` in lib.rs
# or a mod.rs) is followed to the module that defines it, so going through a facade does
# not hide a cycle. `mod` declarations are not edges (the tree is not a dependency).
# Exit status: 0 without a cycle, 1 with one (each cycle found is printed), 2 on misuse.
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 CRATE_SRC_DIR   (e.g. crates/memfabric-store/src)" >&2
    exit 2
fi
exec python3 - "$1" <<'PY'
import os, re, sys

root = sys.argv[1].rstrip('/')
files = {}  # module path (tuple) -> file
for d, _, names in os.walk(root):
    for n in names:
        if not n.endswith('.rs'):
            continue
        rel = os.path.relpath(os.path.join(d, n), root)[:-3].split(os.sep)
        if rel[-1] == 'mod' or (len(rel) == 1 and rel[0] in ('lib', 'main')):
            rel = rel[:-1]
        files[tuple(rel)] = os.path.join(d, n)

def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)

src = {m: strip_comments(open(f).read()) for m, f in files.items()}

# Re-exports: (module, name) -> module the name comes from.
reexport = {}
for m, text in src.items():
    for body in re.findall(r'pub(?:\([a-z]+\))?\s+use\s+([^;]+);', text):
        body = re.sub(r'\s+', '', body)
        base, _, names = body.partition('::{')
        if names:
            names = names.rstrip('}').split(',')
        else:
            base, _, last = body.rpartition('::')
            names = [last]
        base = base.split('::')
        if base[0] == 'crate':
            target = tuple(base[1:])
        elif base[0] == 'super':
            target = m[:-1] + tuple(base[1:])
        elif base[0] == 'self':
            target = m + tuple(base[1:])
        else:
            target = m + tuple(base)
        for n in names:
            n = n.split('as')[0]
            if n and n != 'self':
                reexport[(m, n)] = target

def resolve(segs, seen=0):
    """The deepest module a path names, following re-exports of its next segment."""
    mod = ()
    for s in segs:
        if mod + (s,) in files:
            mod = mod + (s,)
            continue
        nxt = reexport.get((mod, s))
        if nxt is not None and nxt in files and seen < 8 and nxt != mod:
            return resolve(list(nxt) + segs[segs.index(s):], seen + 1)
        break
    return mod

def paths_in(m, text):
    # Expand `use a::{b, c::{d}}` groups into paths; keep plain paths as they are.
    out = []
    for u in re.findall(r'\buse\s+([^;]+);', text):
        u = re.sub(r'\s+', '', u)
        stack = [('', u)]
        while stack:
            prefix, rest = stack.pop()
            i = rest.find('{')
            if i < 0:
                out.append(prefix + rest)
                continue
            head, inner = rest[:i], rest[i + 1:rest.rfind('}')]
            depth, part, parts = 0, '', []
            for ch in inner:
                if ch == ',' and depth == 0:
                    parts.append(part); part = ''
                    continue
                depth += ch == '{'
                depth -= ch == '}'
                part += ch
            parts.append(part)
            for p in parts:
                if p:
                    stack.append((prefix + head, p))
    # Paths outside `use` (`crate::item::HDR`); a prefix followed by `::{` was expanded above.
    out += re.findall(r'\b((?:crate|super)(?:::\w+)+)\b(?!::\{)', text)
    return out

edges = {m: set() for m in files}
for m, text in src.items():
    for p in paths_in(m, text):
        segs = p.split('::')
        if segs[0] == 'crate':
            segs = segs[1:]
        elif segs[0] == 'super':
            base = list(m)
            while segs and segs[0] == 'super':
                base = base[:-1]
                segs = segs[1:]
            segs = base + segs
        else:
            continue
        segs = [s for s in segs if s not in ('self', '*')]
        t = resolve(segs)
        if t != m and not (len(t) < len(m) and m[:len(t)] == t and t == ()):
            edges[m].add(t)

def name(m):
    return '::'.join(m) or 'crate'

for m in sorted(edges):
    if edges[m]:
        print(f"{name(m)} -> {', '.join(sorted(name(t) for t in edges[m]))}")

# Cycles: depth-first search, report each back edge's cycle once.
state, stack, cycles = {}, [], set()
def dfs(u):
    state[u] = 1
    stack.append(u)
    for v in sorted(edges.get(u, ())):
        if state.get(v) == 1:
            cyc = stack[stack.index(v):]
            k = cyc.index(min(cyc))
            cycles.add(tuple(cyc[k:] + cyc[:k]))
        elif v not in state:
            dfs(v)
    stack.pop()
    state[u] = 2
sys.setrecursionlimit(10000)
for m in sorted(edges):
    if m not in state:
        dfs(m)
if cycles:
    for c in sorted(cycles):
        print('cycle: ' + ' -> '.join(name(x) for x in c + (c[0],)), file=sys.stderr)
    sys.exit(1)
print(f"no cycle among {len(files)} modules")
PY
