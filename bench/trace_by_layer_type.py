#!/usr/bin/env python3
"""Sums a `cnnflow train --trace` file by layer type and pass.

Each layer span is named "<layer> (<type>)" with the pass as its category
(forward, backward); the table gives, per type and pass, the total ms per
step and the share of the step, so that two traces (fp32 and bf16, say)
show which layers a change sped up and which now dominate.

    python3 bench/trace_by_layer_type.py trace.json
"""
import collections
import json
import re
import sys


def main(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step" and e.get("ph") == "X"]
    step_ms = sum(e["dur"] for e in steps) / 1e3
    n = max(1, len(steps))
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in steps)

    def in_a_step(e):  # the final evaluation's forwards are not a step's
        return any(a <= e["ts"] <= b for a, b in windows)

    by = collections.defaultdict(float)
    other = collections.defaultdict(float)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") == "step" or not in_a_step(e):
            continue
        m = re.match(r".* \((\w+)\)$", e.get("name", ""))
        if m and e["cat"] in ("forward", "backward"):
            by[(m.group(1), e["cat"])] += e["dur"] / 1e3
        else:
            other[e.get("cat", "?")] += e["dur"] / 1e3
    print(f"{n} steps, {step_ms / n:.1f} ms per step")
    print(f"  {'layer type':<16} {'pass':<9} {'ms/step':>9} {'% of step':>9}")
    rows = sorted(by.items(), key=lambda kv: -kv[1])
    for (kind, phase), ms in rows:
        print(f"  {kind:<16} {phase:<9} {ms / n:9.1f} {100 * ms / step_ms:8.1f}%")
    for cat, ms in sorted(other.items(), key=lambda kv: -kv[1]):
        print(f"  {'(' + cat + ')':<16} {'':<9} {ms / n:9.1f} {100 * ms / step_ms:8.1f}%")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
