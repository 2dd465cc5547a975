#!/usr/bin/env python3
"""The model manager benchmark's report: helios-bench compare runs at batch 1 and under load, the
judge's scores, the stream's mix, the heliosd logs (the manager's decisions and the numbers
behind them) and the models' tensor tables (the batch a budget holds at each depth), merged into
OUT.md, OUT.json, OUT_timeline.png (throughput over time with the decisions marked) and
OUT_pareto.png (throughput vs judged perplexity)."""
import argparse
import glob
import json
import math
import os
import re
import sys

SINGLE = ("full-0.5b", "full-1.5b", "ee-0.5b", "ee-1.5b")
DECISION = re.compile(r"^(\S+ \S+) info coder: (evaluate|choose|extend|switch|reassess) -> (\S+) at (\d+)/(\d+) layers: (.*)$")


def parse_size(text):
    m = re.match(r"^([\d.]+)\s*(KiB|MiB|GiB|KB|MB|GB|B)?$", text.strip())
    scale = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1, None: 1}
    return int(float(m.group(1)) * scale[m.group(2)])


def footprint(inspect_path):
    """(shared bytes, per-layer bytes, kv_dim) from `helios inspect`'s tensor table."""
    shared, layers, kv_dim = 0, {}, 0
    for line in open(inspect_path):
        m = re.match(r"^\s+(\S+)\s+\S+\s+([\d x]+?)\s+(\d+) bytes", line)
        if not m:
            continue
        name, dims, size = m.group(1), m.group(2), int(m.group(3))
        lm = re.match(r"blk\.(\d+)\.", name)
        if lm:
            layers[int(lm.group(1))] = layers.get(int(lm.group(1)), 0) + size
            if name.endswith("attn_k.weight"):
                kv_dim = int(dims.split("x")[-1])
        else:
            shared += size
    return shared, [layers[i] for i in sorted(layers)], kv_dim


def runs_by_point(report):
    return {r.get("target") or r["label"].split("@")[0]: r for r in report["runs"]}


def served_share(run):
    total = {}
    for req in run["requests"]:
        for k, v in (req.get("served_by") or {}).items():
            total[k] = total.get(k, 0) + v
    n = sum(total.values()) or 1
    return {k: v / n for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


def decisions_from_log(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        m = DECISION.match(line.strip())
        if m:
            out.append({"time": m.group(1), "decision": m.group(2), "model": m.group(3), "depth": int(m.group(4)),
                        "n_layers": int(m.group(5)), "reason": m.group(6)})
    return out


def decision_times(run):
    """(run time s, kind) where the group's decision count rose between server samples."""
    marks, last = [], None
    for s in run.get("server_series") or []:
        n = s.get("group_decisions", 0)
        if last is not None and n > last:
            marks.append((s["t"], s.get("group_last_decision", "")))
        last = n
    return marks


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch1", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--judge", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--stream-file", required=True)
    ap.add_argument("--logs", required=True, help="folder of helios-bench's kept heliosd logs")
    ap.add_argument("--inspect", nargs="+", required=True, help="NAME=helios inspect output")
    ap.add_argument("--budget", required=True)
    ap.add_argument("--sweep")
    ap.add_argument("--command", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    b1, load = json.load(open(args.batch1)), json.load(open(args.load))
    judge = json.load(open(args.judge))["runs"]
    stream = json.load(open(args.stream))
    budget = parse_size(args.budget)
    r1, rl = runs_by_point(b1), runs_by_point(load)
    points = [p for p in (*SINGLE, "manager") if p in r1]

    def judged(point):
        for label, v in judge.items():
            if label.split("@")[0] == point:
                return v
        return {}

    lines = ["# The Helios model manager on the CPU: Qwen2.5-Coder 0.5B + 1.5B", "",
             f"Command: `{args.command}`  ",
             f"Commit: {b1.get('commit', {}).get('describe', '?')}  ",
             f"Machine: {b1.get('machine', {}).get('cpu', '?')}, {b1.get('machine', {}).get('cores', '?')} cores  ",
             f"Stream: {sum(stream['counts'].values())} prompts (seed {stream['seed']}): " +
             ", ".join(f"{k} {v}" for k, v in stream["counts"].items()) +
             "; helios-bench serves them in its own seeded order (below), the same for every configuration.",
             f"Memory budget of the group: {args.budget}; single models get a 1 GiB KV cache beside their weights.", ""]
    # The order the requests were served in, by kind.
    prompts = [p["prompt"] for p in json.load(open(args.stream_file))]
    kind_of = dict(zip(prompts, stream["order"]))
    served_order = [kind_of.get(r.get("prompt"), "?")[0].upper() for r in b1["workload"]]
    lines += ["Served order (S = ShareGPT, G = GSM8K, C = code): `" + "".join(served_order) + "`", ""]

    def table(title, runs, base):
        out = [f"## {title}", "",
               "| configuration | out tok/s | vs full-0.5b | vs full-1.5b | mean TTFT ms | mean TPOT ms | judge ppl | judge agreement | served by (share of tokens) |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for p in points + (["full-0.5b-repeat"] if "full-0.5b-repeat" in runs else []):
            s = runs[p]["summary"]
            j = judged(p)
            share = ", ".join(f"{k} {100 * v:.0f}%" for k, v in served_share(runs[p]).items())
            out.append(f"| {p} | {s['output_throughput']:.1f} | {s['output_throughput'] / runs['full-0.5b']['summary']['output_throughput']:.2f}x | "
                       f"{s['output_throughput'] / runs['full-1.5b']['summary']['output_throughput']:.2f}x | "
                       f"{fmt(s.get('mean_ttft_ms'), '.0f')} | {fmt(s.get('mean_tpot_ms'), '.1f')} | "
                       f"{fmt(j.get('judge_perplexity') if base else None, '.3f')} | {fmt(j.get('judge_agreement') if base else None, '.3f')} | {share} |")
        rep = runs.get("full-0.5b-repeat")
        if rep:
            noise = rep["summary"]["output_throughput"] / runs["full-0.5b"]["summary"]["output_throughput"]
            out += ["", f"Run-to-run noise: full-0.5b ran again last at {noise:.2f}x of its first run."]
        return out + [""]

    lines += table("Batch 1 (concurrency 1): paper section 5.1 / 5.3", r1, True)
    lines += table("Under load (concurrency 4)", rl, False)
    lines += ["Judge: the 1.5B at full depth, teacher-forced over prompt + output (`helios score`); agreement = share of "
              "generated tokens that are its greedy choice at that point. Judged on the batch-1 outputs.", ""]

    # Exit distribution (the paper's Table 4).
    lines += ["## Exit distribution (share of generated tokens by exit layer, batch 1)", "",
              "| configuration | exit layers |", "|---|---|"]
    for p in points:
        hist = r1[p].get("exit_layer_histogram") or {}
        n = sum(hist.values()) or 1
        lines.append(f"| {p} | " + ", ".join(f"{k}: {100 * v / n:.0f}%" for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))) + " |")
    lines.append("")

    # The manager's decisions (its heliosd log), both runs.
    timeline = {}
    for name, report in (("batch1", b1), ("load4", load)):
        logs = sorted(glob.glob(os.path.join(args.logs, f"{name}_heliosd-manager*.log")))
        decisions = decisions_from_log(logs[0]) if logs else []
        timeline[name] = {"decisions": decisions, "marks": decision_times(runs_by_point(report)["manager"])}
        lines += [f"## The manager's decisions ({name})", ""]
        lines += [f"- {d['time']} **{d['decision']}** → {d['model']} at {d['depth']}/{d['n_layers']} layers: {d['reason']}"
                  for d in decisions] or ["- none logged"]
        lines.append("")

    # The batch a budget holds (the paper's Figure 9).
    lines += [f"## The largest batch within {args.budget} (sequences of 1024 tokens, f16 KV)", "",
              "| model | loaded depth | weights MiB | KV per sequence MiB | sequences | vs all layers |", "|---|---:|---:|---:|---:|---:|"]
    capacity = {}
    exits = {"qwen-0.5b": [6, 12, 18], "qwen-1.5b": [7, 14, 21]}
    for spec in args.inspect:
        name, path = spec.split("=", 1)
        shared, layers, kv_dim = footprint(path)
        rows = []
        for depth in exits.get(name, []) + [len(layers)]:
            weights = shared + sum(layers[:depth])
            per_seq = 2 * depth * kv_dim * 2 * 1024
            rows.append((depth, weights, per_seq, max(0, (budget - weights) // per_seq)))
        full = rows[-1][3] or 1
        for depth, weights, per_seq, n in rows:
            lines.append(f"| {name} | {depth}/{len(layers)} | {weights / 2**20:.0f} | {per_seq / 2**20:.1f} | {n} | {n / full:.2f}x |")
        capacity[name] = [{"depth": d, "weight_bytes": w, "kv_bytes_per_sequence": s, "sequences": n} for d, w, s, n in rows]
    lines += ["", "Computed as the engine sizes its pool: (budget − the prefix's weights) / (2 × depth × kv_dim × 2 bytes × 1024).", ""]

    if args.sweep:
        sw = json.load(open(args.sweep))
        lines += ["## Sweeps of RI and the threshold (concurrency 4)", "", "| configuration | out tok/s | decisions | served by |", "|---|---:|---:|---|"]
        for label, run in runs_by_point(sw).items():
            series = run.get("server_series") or [{}]
            lines.append(f"| {label} | {run['summary']['output_throughput']:.1f} | {series[-1].get('group_decisions', 0)} | " +
                         ", ".join(f"{k} {100 * v:.0f}%" for k, v in served_share(run).items()) + " |")
        lines.append("")

    # Pareto: throughput vs judged perplexity, at batch 1 and under load.
    def pareto(runs):
        pts = [(judged(p).get("judge_perplexity"), runs[p]["summary"]["output_throughput"], p) for p in points]
        pts = [x for x in pts if x[0]]
        mgr = next((m for m in pts if m[2] == "manager"), None)
        if not mgr:
            return pts, "no manager point"
        beaten = [q[2] for q in pts if q[2] != "manager" and q[0] <= mgr[0] and q[1] >= mgr[1]]
        return pts, ("on or beyond the Pareto front of the single-model configurations" if not beaten else
                     "dominated by " + ", ".join(beaten) + " (as fast or faster at a judged perplexity as low or lower)")
    pts1, verdict1 = pareto(r1)
    pts, verdict = pareto(rl)
    lines += ["## Pareto (throughput vs judged perplexity)", "",
              f"- batch 1: the manager's point is {verdict1}.",
              f"- concurrency 4: the manager's point is {verdict} (mind the run-to-run noise above).", ""]
    open(args.out + ".md", "w").write("\n".join(lines) + "\n")
    json.dump({"command": args.command, "stream": stream, "budget_bytes": budget, "judge": judge,
               "batch1": {p: r1[p]["summary"] for p in r1}, "load4": {p: rl[p]["summary"] for p in rl},
               "served_by": {p: served_share(r1[p]) for p in points}, "timeline": timeline, "capacity": capacity,
               "pareto": {"batch1": pts1, "load4": pts}, "verdict": {"batch1": verdict1, "load4": verdict}},
              open(args.out + ".json", "w"), indent=1)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("manager_report: no matplotlib, no plots", file=sys.stderr)
    else:
        fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=False)
        for ax, (name, report) in zip(axes, (("batch1", b1), ("load4", load))):
            run = runs_by_point(report)["manager"]
            times = sorted(req["start_s"] + t for req in run["requests"] for t in req.get("token_times_s", []))
            if times:
                width = max(1.0, times[-1] / 60)
                bins = [0] * (int(times[-1] / width) + 1)
                for t in times:
                    bins[int(t / width)] += 1
                ax.plot([i * width for i in range(len(bins))], [b / width for b in bins], label="manager tok/s")
            for t, kind in timeline[name]["marks"]:
                ax.axvline(t, color={"evaluate": "grey", "choose": "green", "extend": "orange", "switch": "red",
                                     "reassess": "purple"}.get(kind, "black"), linestyle="--", linewidth=0.8)
                ax.annotate(kind, (t, ax.get_ylim()[1] * 0.9), fontsize=7, rotation=90)
            ax.set_title(f"the manager's throughput over time, {name}")
            ax.set_xlabel("seconds into the run")
            ax.set_ylabel("output tok/s")
        fig.tight_layout()
        fig.savefig(args.out + "_timeline.png", dpi=110)
        fig, ax = plt.subplots(figsize=(7, 5))
        for ppl, tps, label in pts1:
            ax.scatter(ppl, tps, color="red" if label == "manager" else "C0")
            ax.annotate(label, (ppl, tps), fontsize=8, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel("judged perplexity (the 1.5B at full depth)")
        ax.set_ylabel("output tok/s at batch 1")
        ax.set_title("manager vs single models")
        fig.tight_layout()
        fig.savefig(args.out + "_pareto.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
