#!/usr/bin/env python3
"""Keeps the shape of src/ that issue 29 left: fails when a production file
grows past 650 lines or when two files import each other (directly or round
a longer loop).

"Production lines" are a file's lines before its first `#[cfg(test)]` that
opens a `mod`; comments count. An import is any `crate::`, `super::` or
`self::` path in those lines outside `#[cfg(test)]` items (in `use` trees or written inline). A module's
paths into its own descendants do not count: a parent declares and calls its
children, so only a child reaching back up (or a sibling) can close a loop.

Usage: scripts/check-shape.py [SRC_DIR]   (default: src)
It first checks itself on a small made-up crate.
"""
import os
import re
import sys

MAX_LINES = 650

def production_lines(text):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]":
            for nxt in lines[i + 1:i + 3]:
                s = nxt.strip()
                if re.match(r"(pub(\(\w+\))?\s+)?mod\s", s):
                    return lines[:i]
    return lines

def crate_roots(src):
    """Each crate root file and the module path of its directory."""
    roots = [os.path.join(src, "lib.rs")]
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for name in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, name)
            if name.endswith(".rs"):
                roots.append(p)
            elif os.path.isfile(os.path.join(p, "main.rs")):
                roots.append(os.path.join(p, "main.rs"))
    return [r for r in roots if os.path.isfile(r)]

def module_map(root):
    """Module path (tuple) -> file, walking `mod x;` declarations."""
    modules = {}
    def walk(path, file, dir_for_children):
        modules[path] = file
        try:
            text = open(file, encoding="utf-8").read()
        except OSError:
            return
        for m in re.finditer(r'^\s*(?:#\[path\s*=\s*"([^"]+)"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', text, re.M):
            custom, name = m.group(1), m.group(2)
            if custom:
                child = os.path.join(os.path.dirname(file), custom)
                walk(path + (name,), child, os.path.splitext(child)[0])
                continue
            a = os.path.join(dir_for_children, name + ".rs")
            b = os.path.join(dir_for_children, name, "mod.rs")
            if os.path.isfile(a):
                walk(path + (name,), a, os.path.join(dir_for_children, name))
            elif os.path.isfile(b):
                walk(path + (name,), b, os.path.join(dir_for_children, name))
    walk((), root, os.path.dirname(root))
    return modules

def strip_comments(text):
    """Code without comments, string contents or char literals."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)

def expand_use(tree):
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d']."""
    tree = re.sub(r"\s+", "", tree)
    out = []
    def rec(prefix, t):
        i = t.find("{")
        if i < 0:
            for part in t.split(","):
                if part:
                    out.append(prefix + part)
            return
        head = t[:i]
        depth, j = 0, i
        for j in range(i, len(t)):
            if t[j] == "{":
                depth += 1
            elif t[j] == "}":
                depth -= 1
                if depth == 0:
                    break
        inner, rest = t[i + 1:j], t[j + 1:]
        # split inner on top-level commas
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                parts.append(cur); cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        for p in parts:
            if p:
                rec(prefix + head, p)
        if rest.startswith(","):
            rec(prefix, rest[1:])
    rec("", tree)
    return out

def resolve(segments, modules):
    """Longest module prefix of an absolute path."""
    for n in range(len(segments), 0, -1):
        if tuple(segments[:n]) in modules:
            return tuple(segments[:n])
    return None

def without_test_items(code):
    """Drops `#[cfg(test)]` items (helpers for the unit tests) from code."""
    out, i = [], 0
    while True:
        j = code.find("#[cfg(test)]", i)
        if j < 0:
            out.append(code[i:])
            return "".join(out)
        out.append(code[i:j])
        k, depth = j + len("#[cfg(test)]"), 0
        while k < len(code):
            ch = code[k]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    k += 1
                    break
            elif ch == ";" and depth == 0:
                k += 1
                break
            k += 1
        i = k

def imports(path, text, modules):
    code = without_test_items(strip_comments("\n".join(production_lines(text))))
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        paths.extend(expand_use(m.group(1)))
    paths.extend(re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", code))
    found = set()
    for p in paths:
        segs = [s for s in p.split("::") if s]
        if not segs:
            continue
        if segs[0] == "crate":
            absolute = segs[1:]
        elif segs[0] in ("super", "self"):
            base = list(path)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
            absolute = base + segs
        else:
            continue
        target = resolve(absolute, modules)
        if target is None or target == path:
            continue
        if target[:len(path)] == path:  # parent into its own descendant
            continue
        found.add(target)
    return found

def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in list(graph):
        if v not in index:
            strong(v)
    return out

def check(src):
    """The failures of one source tree, as lines for people."""
    failures = []
    for root in crate_roots(src):
        modules = module_map(root)
        graph = {}
        for path, file in modules.items():
            text = open(file, encoding="utf-8").read()
            n = len(production_lines(text))
            if n > MAX_LINES:
                failures.append(f"{file}: {n} production lines (at most {MAX_LINES}); split it by job")
            graph[path] = imports(path, text, modules)
        for comp in cycles(graph):
            files = sorted(modules[p] for p in comp)
            failures.append("import cycle between " + ", ".join(files))
    return failures

def self_test():
    """The checker finds what it should on a small made-up crate."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        def write(name, text):
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w", encoding="utf-8").write(text)
        write("lib.rs", "mod a;\nmod b;\nmod p;\nmod big;\n")
        write("a.rs", "use crate::b::B;\npub struct A;\n")
        write("b.rs", "pub struct B;\nfn f() { let _ = crate::a::A; }\n")
        # a parent calling its child and the child reaching back is no cycle
        write("p/mod.rs", "mod c;\npub use c::C;\npub struct P;\n")
        write("p/c.rs", "use super::P;\npub struct C;\n// crate::a::A in a comment\n")
        write("big.rs", "// x\n" * (MAX_LINES + 1) + "#[cfg(test)]\nmod tests {}\n")
        got = check(d)
        assert any("cycle" in f and "a.rs" in f and "b.rs" in f for f in got), got
        assert not any(os.path.join(d, "p") in f for f in got), got
        assert any("big.rs" in f for f in got), got
        assert len(got) == 2, got
        write("big.rs", "// x\n" * 10 + "#[cfg(test)]\nmod tests {\n" + "// y\n" * MAX_LINES + "}\n")
        write("b.rs", "pub struct B;\n#[cfg(test)]\nfn helper() { let _ = crate::a::A; }\n")
        assert check(d) == [], check(d)

def main():
    self_test()
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    failures = check(src)
    for f in failures:
        print("check-shape: " + f, file=sys.stderr)
    if failures:
        sys.exit(1)
    print("check-shape: every production file within %d lines, no import cycle" % MAX_LINES)

if __name__ == "__main__":
    main()
