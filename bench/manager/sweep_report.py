#!/usr/bin/env python3
"""The manager's RI and threshold sweeps (the Helios paper's Figures 10 and 11): one helios-bench
compare run of manager configurations; per configuration the throughput, latency, decisions (from
its heliosd log) and which model and depth served the tokens. Writes OUT.md and OUT.json."""
import argparse
import collections
import glob
import json
import os
import re

DECISION = re.compile(r" info coder: (evaluate|choose|extend|switch|reassess) -> (\S+) at (\d+)/(\d+) layers")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = json.load(open(args.sweep))
    lines = ["# The model manager's RI and threshold sweeps (concurrency 4)", "", f"Command: `{args.command}`  ",
             f"Commit: {report.get('commit', {}).get('describe', '?')}", "",
             "| configuration | out tok/s | mean TTFT ms | mean TPOT ms | decisions | served by (share of tokens) |",
             "|---|---:|---:|---:|---|---|"]
    rows = {}
    for run in report["runs"]:
        label = run.get("target") or run["label"].split("@")[0]
        served = collections.Counter()
        for req in run["requests"]:
            served.update(req.get("served_by") or {})
        n = sum(served.values()) or 1
        logs = glob.glob(os.path.join(args.logs, f"sweep_heliosd-{label}*.log"))
        kinds = collections.Counter(m.group(1) for line in (open(logs[0], errors="replace") if logs else [])
                                    for m in [DECISION.search(line)] if m)
        s = run["summary"]
        rows[label] = {"summary": s, "served_by": {k: v / n for k, v in served.items()}, "decisions": dict(kinds)}
        lines.append(f"| {label} | {s['output_throughput']:.1f} | {s['mean_ttft_ms']:.0f} | {s['mean_tpot_ms']:.1f} | " +
                     ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + " | " +
                     ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in served.most_common()) + " |")
    open(args.out + ".md", "w").write("\n".join(lines) + "\n")
    json.dump({"command": args.command, "runs": rows}, open(args.out + ".json", "w"), indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
