#!/usr/bin/env python3
"""Checks that inside each crate of the workspace no modules import each other in a circle.

The compiler keeps the crates' graph acyclic; inside a crate it allows modules to use each
other both ways. This reads every crate's `src/` (its `use` paths and `crate::`, `super::`
and child-module paths, outside comments and the trailing `#[cfg(test)] mod tests`),
projects each reference onto the sibling modules it joins (a reference from `a::b::c` to
`a::d` is an arrow `a::b -> a::d`), and prints every circle among siblings.

    scripts/module-cycles.py            # every crate; exit 1 when any has a circle
    scripts/module-cycles.py DIR/src    # one crate
    --strict                            # also a module and its own submodules

A reference names a module by its path (an item defined in `mod.rs` belongs to the
directory's module); a path it cannot resolve to a module file is not an arrow."""
import os, re, sys
from collections import defaultdict

def modpath(src, f):
    rel = os.path.relpath(f, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main") and len(rel) == 1: return ()
    if rel[-1] == "mod": rel = rel[:-1]
    return tuple(rel)

def strip(text):
    m = re.search(r'\n#\[cfg\(test\)\]\s*\nmod [a-z_]+\s*\{', text)
    if m: text = text[:m.start()]
    out = []
    for line in text.split('\n'):
        s = line.strip()
        if s.startswith('//'): continue
        out.append(re.sub(r'//.*', '', line))
    return '\n'.join(out)

def check(src, strict):
    mods = {}
    for d, _, fs in os.walk(src):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(d, f); mods[modpath(src, p)] = p
    known = set(mods)
    # inline modules are not handled: treat as part of the file
    edges = defaultdict(set)
    for m, p in mods.items():
        text = strip(open(p).read())
        children = set(re.findall(r'^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;', text, re.M))
        refs = []
        for mm in re.finditer(r'(?<![A-Za-z0-9_:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
            refs.append(mm.group(1).split('::'))
        # use groups: crate::a::{b, c::d}
        for mm in re.finditer(r'\b(crate|super|self)((?:::[a-z_0-9]+)*)::\{([^}]*)\}', text):
            base = [mm.group(1)] + [x for x in mm.group(2).split('::') if x]
            for item in mm.group(3).split(','):
                item = item.strip().split(' as ')[0].strip()
                if item: refs.append(base + item.split('::'))
        for parts in refs:
            if parts[0] == 'crate': tgt = list(); rest = parts[1:]
            elif parts[0] == 'super' or parts[0] == 'self':
                tgt = list(m); rest = parts
                ok = True
                while rest and rest[0] in ('super', 'self'):
                    if rest[0] == 'super':
                        if not tgt: ok = False; break
                        tgt.pop()
                    rest = rest[1:]
                if not ok: continue
            elif parts[0] in children: tgt = list(m); rest = parts
            else: continue
            cur = tuple(tgt)
            for seg in rest:
                if cur + (seg,) in known: cur = cur + (seg,)
                else: break
            if cur != m: edges[m].add(cur)
    # project to sibling level
    graph = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]: i += 1
            lca = a[:i]
            if len(a) == i or len(b) == i:
                if not strict: continue
                na = a[:i+1] if len(a) > i else a
                nb = b[:i+1] if len(b) > i else b
            else:
                na, nb = a[:i+1], b[:i+1]
            graph[na].add(nb)
    # tarjan
    index = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(comp)
    for v in list(graph): 
        if v not in index: sc(v)
    n = 0
    print(f"{os.path.relpath(src)}: ", end="")
    for comp in sccs:
        n += 1
        names = sorted('::'.join(x) or 'crate' for x in comp)
        print('cycle:', ', '.join(names))
        cs = set(comp)
        for a in comp:
            for b in graph[a]:
                if b in cs: print('   ', '::'.join(a) or 'crate', '->', '::'.join(b) or 'crate', [ '::'.join(x) for x in edges if x[:len(a)]==a and any(y[:len(b)]==b for y in edges[x])][:4])
    if n == 0: print('no cycles')
    return n

def main():
    strict = '--strict' in sys.argv
    dirs = [a for a in sys.argv[1:] if not a.startswith('--')]
    if not dirs:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        dirs = [os.path.join(root, 'src')] + sorted(
            os.path.join(root, 'crates', c, 'src') for c in os.listdir(os.path.join(root, 'crates'))
            if os.path.isdir(os.path.join(root, 'crates', c, 'src')))
    found = sum(check(d, strict) for d in dirs)
    sys.exit(1 if found else 0)

main()
