#!/usr/bin/env python3
"""Plots an exit profile written by `helios profile --json PATH`: per mode (teacher-forced,
free-running), the Helios paper's curve — the share of tokens whose exit prediction is unchanged at
the last layer, by the exit's top-1 probability — and, beside it, the share of tokens that would
leave at each threshold and how many of those agree.

usage: plot_profile.py PROFILE.json [--out PNG]   (default: PROFILE.png next to the JSON)
Needs matplotlib (Debian: python3-matplotlib, run with /usr/bin/python3).
"""
import argparse
import json
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--out")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_profile.py: matplotlib missing (apt-get install python3-matplotlib; run /usr/bin/python3)")
    with open(args.profile) as f:
        data = json.load(f)
    profiles = data["profiles"] if isinstance(data, dict) else data
    out = args.out or os.path.splitext(args.profile)[0] + ".png"
    fig, axes = plt.subplots(len(profiles), 2, figsize=(11, 4.2 * len(profiles)), squeeze=False)
    for row, prof in enumerate(profiles):
        curve, leave = axes[row]
        n = prof["layers"][0]["n"] if prof["layers"] else 0
        for layer in prof["layers"]:
            bins = [b for b in layer["bins"] if b["n"] > 0]
            curve.plot([(b["low"] + b["high"]) / 2 for b in bins], [b["unchanged"] for b in bins], marker="o",
                       label=f"exit {layer['layer']} (agreement {100 * layer['agreement']:.0f}%)")
            ts = layer["top1_thresholds"]
            line, = leave.plot([t["threshold"] for t in ts], [t["leaving"] for t in ts], marker=".",
                               label=f"exit {layer['layer']}: leaving")
            leave.plot([t["threshold"] for t in ts], [t["agreed"] for t in ts], linestyle="--",
                       color=line.get_color(), label=f"exit {layer['layer']}: of those, agreeing")
        curve.plot([0, 1], [0, 1], color="grey", linewidth=0.6, linestyle=":")
        curve.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="exit top-1 probability",
                  ylabel="share unchanged at the last layer", title=f"{prof['mode']} ({n} tokens)")
        leave.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="top-1 threshold", ylabel="share of tokens",
                  title=f"{prof['mode']}: leaving at a threshold, and agreeing")
        curve.legend(fontsize=8, loc="upper left")
        leave.legend(fontsize=7, loc="lower left")
        for ax in (curve, leave):
            ax.grid(alpha=0.3)
    model = os.path.basename(data.get("model", "")) if isinstance(data, dict) else ""
    fig.suptitle(f"Exit profile {model}", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
