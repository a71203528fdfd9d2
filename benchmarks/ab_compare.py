#!/usr/bin/env python
"""Builds' graph_calls.py timings, alternated in one device call, compared point by point.

    python benchmarks/ab_compare.py results/run69-cluster-arrive-early-ab.txt [--base main] [--rows 100,333,1024]

The input is what a device call appends when it alternates builds (benchmarks/NOTES.md,
"Method"): a line `== <build>` before each graph_calls.py run, then that run's lines
`<config> <kind> R=.. H=.. K=..: t1 t2 ...` (µs a call, one per row count). For every other build
against the base (the first one unless --base), every product and layer, this prints per row count
the mean time of both builds over their runs, the other's mean over the base's, and the larger of
the two builds' spreads (a build's slowest run over its fastest): a difference smaller than the
spread is noise. Runs anywhere (no GPU).
"""

import argparse
import re
import statistics
import sys
from collections import defaultdict

POINT = re.compile(r"^(\S+) (fwd|gx|gw|bwd|gx\+gw) (R=\d+ H=\d+ K=\d+):\s+(.*)$")


def parse(lines):
    """{(kind, layer): {build: [[t per row count] per run]}}, and the builds in order of appearance."""
    runs = defaultdict(lambda: defaultdict(list))
    builds, build = [], None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("== "):
            build = line[3:].strip()
            if build not in builds:
                builds.append(build)
            continue
        m = POINT.match(line)
        if m and build is not None:
            runs[(m.group(2), m.group(3))][build].append([float(v) for v in m.group(4).split()])
    return runs, builds


def compare(runs, base, other):
    """[(kind, layer, [(base mean, other mean, other / base, base spread, other spread) per row count])]."""
    out = []
    for (kind, layer), by_build in sorted(runs.items()):
        a, b = by_build.get(base), by_build.get(other)
        if not a or not b:
            continue
        points = []
        for i in range(min(len(a[0]), len(b[0]))):
            ta, tb = [r[i] for r in a], [r[i] for r in b]
            ma, mb = statistics.mean(ta), statistics.mean(tb)
            points.append((ma, mb, mb / ma, max(ta) / min(ta), max(tb) / min(tb)))
        out.append((kind, layer, points))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--base", help="the build the others are compared against (default: the first one)")
    p.add_argument("--rows", type=lambda s: s.split(","), help="names of the row-count columns, for the header")
    args = p.parse_args(argv)
    with open(args.file) as f:
        runs, builds = parse(f)
    if len(builds) < 2:
        print(f"ab_compare.py: expected two or more builds in {args.file}, found {builds}", file=sys.stderr)
        return 1
    base = args.base or builds[0]
    if base not in builds:
        print(f"ab_compare.py: no build {base!r} in {args.file} (builds: {builds})", file=sys.stderr)
        return 1
    for other in (b for b in builds if b != base):
        print(f"{other} / {base}: mean µs a call over each build's runs; ± the larger build's spread (its slowest "
              "run over its fastest)")
        for kind, layer, points in compare(runs, base, other):
            heads = args.rows or [str(i) for i in range(len(points))]
            cells = "  ".join(f"{h}: {ma:.2f}->{mb:.2f} {r:.3f} (±{max(sa, sb) - 1:.1%})"
                              for h, (ma, mb, r, sa, sb) in zip(heads, points))
            print(f"{kind:3s} {layer:22s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
