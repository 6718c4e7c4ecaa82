#!/usr/bin/env python3
"""Worst-case stack depth of the firmware from gcc's -fstack-usage and
-fcallgraph-info=su output (the .ci files: VCG graphs whose nodes carry each
function's frame size).

    stack_depth.py ROOT FILE.ci... --indirect F1,F2,... [--bound F=N]...
                   [--limit BYTES]

Prints the deepest call path from ROOT with each frame.  An indirect call
(through a function pointer) is charged as the deepest path from any of the
--indirect candidates: for the firmware, xxHash's long-input variants (its
length dispatch) and kvidx's qsort comparators; the allocation, dump and
snapshot hooks are never set in caller-buffer mode.  --bound F=N: F calls
itself at most N-1 deep (N frames; a bound the code guarantees, e.g. a
bisection over at most KVIDX_JUMP_MAX positions), so its self-calls are
charged as N frames.  Any other recursion fails.  Calls into the C library
(memcpy, memset, strlen, qsort) are charged 0 and listed.  Fails (exit 1) on
recursion, on a frame that is not static (dynamic or bounded), or when the
depth exceeds --limit.
"""
import re
import sys

NODE = re.compile(r'node: \{ title: "([^"]+)" label: "([^"]*)"')
EDGE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')


def short(title):
    return title.rsplit(":", 1)[-1] if ":" in title else title


def main(argv):
    limit, address_taken, bounds = None, [], {}
    while "--bound" in argv:
        i = argv.index("--bound")
        f, n = argv[i + 1].split("=")
        bounds[f] = int(n)
        del argv[i:i + 2]
    if "--indirect" in argv:
        i = argv.index("--indirect")
        address_taken = argv[i + 1].split(",")
        del argv[i:i + 2]
    if "--limit" in argv:
        i = argv.index("--limit")
        limit = int(argv[i + 1])
        del argv[i:i + 2]
    root, files = argv[1], argv[2:]
    frame, kind, calls, external = {}, {}, {}, set()
    for path in files:
        for line in open(path):
            m = NODE.search(line)
            if m:
                name = short(m.group(1))
                fm = re.search(r"\\n(\d+) bytes \((\w+)", m.group(2))
                if fm:
                    frame[name] = int(fm.group(1))
                    kind[name] = fm.group(2)
                elif name != "__indirect_call":
                    external.add(name)
                continue
            m = EDGE.search(line)
            if m:
                calls.setdefault(short(m.group(1)), []).append(short(m.group(2)))
    bad = [f for f, k in kind.items() if k != "static"]
    missing = [f for f in address_taken if f not in frame]
    if missing:
        print("stack: --indirect names unknown functions: " + " ".join(missing))
        return 1

    memo, onstack = {}, set()

    def depth(f):
        """(bytes, path) of the deepest chain starting in f."""
        if f in memo:
            return memo[f]
        if f in onstack:
            raise RecursionError(f)
        onstack.add(f)
        best = (0, [])
        for t in calls.get(f, []):
            if t == "__indirect_call":
                for a in address_taken:
                    d = depth(a)
                    if d[0] > best[0]:
                        best = (d[0], ["(indirect)"] + d[1])
            elif t == f and f in bounds:
                continue  # charged below as bounds[f] frames
            elif t in frame:
                d = depth(t)
                if d[0] > best[0]:
                    best = d
        onstack.discard(f)
        reps = bounds.get(f, 1)
        memo[f] = (frame.get(f, 0) * reps + best[0], [f] * reps + best[1])
        return memo[f]

    try:
        total, path = depth(root)
    except RecursionError as e:
        print(f"stack: recursion through {e.args[0]}: no static bound")
        return 1
    print(f"worst stack depth from {root}: {total} bytes")
    for f in path:
        print(f"  {frame.get(f, 0):6d}  {f}" if f != "(indirect)" else "          (indirect call)")
    reach = set()
    todo = [root]
    while todo:
        f = todo.pop()
        if f in reach:
            continue
        reach.add(f)
        todo += [t for t in calls.get(f, []) if t != "__indirect_call"]
        if "__indirect_call" in calls.get(f, []):
            todo += address_taken
    libc = sorted(reach & (external - set(frame)))
    if libc:
        print("C library calls on the way (charged 0): " + " ".join(libc))
    if bad:
        print("frames that are not static: " + " ".join(sorted(bad)))
        return 1
    if limit is not None and total > limit:
        print(f"stack: {total} bytes exceed the {limit}-byte stack")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
