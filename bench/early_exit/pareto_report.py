#!/usr/bin/env python3
"""Merges the early-exit benchmark: helios-bench serving runs (one per policy point, `full` first)
and `helios eval` quality rows, into OUT.md, OUT.json and OUT_pareto.png (serving speed-up vs
perplexity increase, with the Pareto front).

Serving labels name the point: full, per-token-<measure>-<threshold>, batch-sync-<measure>-<threshold>,
fixed-depth-<depth>, self-speculative-<depth>; a threshold may be 'calibrated'. A label may start with
the exit heads' kind, KIND:POINT, matched with --eval KIND=FILE."""
import argparse
import json
import sys


def split_kind(label):
    """'ridge:fixed-depth-21' -> ('ridge', 'fixed-depth-21'); no kind -> (None, label)."""
    kind, sep, point = label.partition(":")
    return (kind, point) if sep else (None, label)


def parse_label(label):
    """label -> (policy, measure, threshold, depth); None where the policy has no such setting."""
    label = split_kind(label)[1]
    if label in ("full", "full-repeat"):
        return ("full", None, None, None)
    for policy in ("per-token", "batch-sync"):
        if label.startswith(policy + "-"):
            measure, threshold = label[len(policy) + 1:].rsplit("-", 1)
            return (policy, measure, threshold_key(threshold), None)
    for policy in ("fixed-depth", "self-speculative"):
        if label.startswith(policy + "-"):
            return (policy, None, None, int(label[len(policy) + 1:]))
    raise ValueError(f"unknown point label {label!r}")


def threshold_key(value):
    """A number, or 'calibrated' (each exit's fitted threshold)."""
    return value if value == "calibrated" else round(float(value), 4)


def eval_key(row):
    policy = row["policy"]
    if policy in ("per-token", "batch-sync"):
        return (policy, row["measure"], threshold_key(row["threshold"]), None)
    if policy in ("fixed-depth", "self-speculative"):
        return (policy, None, None, int(row["depth"]))
    return ("full", None, None, None)


def describe_commit(commit):
    if not isinstance(commit, dict):
        return str(commit)
    return commit.get("describe", commit.get("commit", "?")) + (" (uncommitted changes)" if commit.get("dirty") else "")


def describe_machine(machine):
    if not isinstance(machine, dict):
        return str(machine)
    load = machine.get("load_average_at_start")
    return (f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, {machine.get('memory_gib', '?')} GiB"
            + (f", load average at start {load[0]:.2f}" if load else ""))


def pareto_front(points):
    """Points (quality loss, speed-up) not beaten on both by another point."""
    front = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serving", required=True, help="helios-bench compare-mode JSON")
    ap.add_argument("--eval", nargs="+", required=True, help="helios eval --json files, each FILE or KIND=FILE")
    ap.add_argument("--split", help="split_text.py's report: how calibration and evaluation text were kept apart")
    ap.add_argument("--model-name", default="", help="the model's short name, for the plot's title")
    ap.add_argument("--command", default="", help="the command that produced the run, for the report")
    ap.add_argument("--out", required=True, help="output path without extension")
    args = ap.parse_args()

    serving = json.load(open(args.serving))
    quality = {}
    eval_meta = None
    heads = {}
    for spec in args.eval:
        kind, sep, path = spec.partition("=")
        kind, path = (kind, path) if sep else (None, spec)
        doc = json.load(open(path))
        eval_meta = eval_meta or {k: doc.get(k) for k in ("model", "n_layers", "heads")}
        heads[kind] = doc.get("heads")
        for row in doc["rows"]:
            # full is the same model whatever the heads: the first file's row stands for all
            quality.setdefault((None,) + eval_key(row) if row["policy"] == "full" else (kind,) + eval_key(row), row)

    runs = serving["runs"]
    for run in runs:  # compare mode labels runs TARGET@RATE; the target names the point
        run["point"] = run.get("target") or run["label"].split("@")[0]
    base = next((r for r in runs if r["point"] == "full"), None)
    if base is None:
        sys.exit("pareto_report: the serving runs have no 'full' baseline")
    base_tps = base["summary"]["output_throughput"]
    points = []
    for run in runs:
        key = parse_label(run["point"])
        kind = split_kind(run["point"])[0]
        q = quality.get((None if key[0] == "full" else kind,) + key, {})
        s = run["summary"]
        points.append({
            "label": run["point"],
            "heads": kind,
            "policy": key[0],
            "output_tok_s": s["output_throughput"],
            "speedup": s["output_throughput"] / base_tps if base_tps else 0.0,
            "median_tpot_ms": s.get("median_tpot_ms"),
            "completed": s.get("completed"),
            "failed": s.get("failed"),
            "perplexity": q.get("perplexity"),
            "perplexity_increase_pct": 0.0 if key[0] == "full" else q.get("perplexity_increase_pct"),
            "agreement": 1.0 if key[0] == "full" else q.get("agreement"),
            "mean_exit_layer": q.get("mean_exit_layer"),
            "layers_per_token": q.get("layers_per_token"),
            "lm_head_rows_per_token": q.get("lm_head_rows_per_token"),
            "eval_decode_speedup": 1.0 if key[0] == "full" else q.get("speedup"),
        })
    repeat = next((p for p in points if p["label"] == "full-repeat"), None)
    noise = abs(repeat["speedup"] - 1.0) if repeat else None

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    lines = [
        "# Early exit on the CPU: serving speed-up vs quality, per policy",
        "",
        f"Command: `{args.command}`  ",
        f"Commit: {describe_commit(serving.get('commit'))}  ",
        f"Model: {eval_meta.get('model')} ({eval_meta.get('n_layers')} layers)  ",
        "Exit heads: " + (", ".join(f"{k or 'default'}: {v}" for k, v in heads.items()) or "none") + "  ",
        f"Machine: {describe_machine(serving.get('machine'))}",
    ]
    split = json.load(open(args.split)) if args.split else None
    if split:
        lines += ["", "Text: calibration " + ", ".join(f"{p} ({n} records)" for p, n in split["calibration"].items()) +
                  f"; evaluation {split['evaluation']}, {split['evaluation_kept']} of {split['evaluation_records']} "
                  f"conversations ({split['dropped_as_seen_in_calibration']} dropped: they share a turn with the "
                  "calibration text)."]
    lines += [
        "",
        "Serving: helios-bench compare mode, every server gets the same ShareGPT prompts at the same "
        "concurrency; speed-up = output tok/s / full's. Quality: `helios eval` on held-out ShareGPT text "
        "(teacher-forced perplexity; greedy agreement = positions equal to full's generation). batch-sync's "
        "perplexity is teacher-forced over whole chunks, one batch each, so it leaves only when every row "
        "of the chunk is confident; its agreement (decoding one sequence) is the telling number.",
        "",
        "Run-to-run noise: " + ("full ran again last at {:.2f}x of its first run, so serving speed-ups within "
                                "±{:.0f}% are noise.".format(repeat["speedup"], 100 * noise) if repeat else "not measured."),
        "The eval speed-up is decode at batch 1 (one sequence, `helios eval`), where a token that leaves "
        "early skips its layers; in serving, a batch's step reads every layer's weights while any row "
        "still needs it.",
        "",
        "| point | serving out tok/s | speed-up | median TPOT ms | eval decode speed-up (batch 1) | ppl | ppl increase % | agreement | mean exit layer | layers/token | LM-head rows/token |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p['label']} | {fmt(p['output_tok_s'], '.1f')} | {fmt(p['speedup'], '.2f')}x | "
            f"{fmt(p['median_tpot_ms'], '.1f')} | {fmt(p['eval_decode_speedup'], '.2f')}x | {fmt(p['perplexity'], '.3f')} | "
            f"{fmt(p['perplexity_increase_pct'], '+.1f')} | {fmt(p['agreement'], '.3f')} | "
            f"{fmt(p['mean_exit_layer'], '.1f')} | {fmt(p['layers_per_token'], '.1f')} | "
            f"{fmt(p['lm_head_rows_per_token'], '.2f')} |")
    scored = [(p["perplexity_increase_pct"], p["speedup"], p["label"]) for p in points
              if p["perplexity_increase_pct"] is not None and p["label"] != "full-repeat"]
    front = pareto_front(scored)
    lines += ["", "Pareto front (no other point is both faster and closer to full's perplexity): " +
              ", ".join(f"{label} ({speed:.2f}x, {loss:+.1f}% ppl)" for loss, speed, label in front)]
    open(args.out + ".md", "w").write("\n".join(lines) + "\n")
    json.dump({"command": args.command, "commit": serving.get("commit"), "machine": serving.get("machine"),
               "split": split, "heads": heads,
               "serving_noise": noise,
               "eval": eval_meta, "points": points, "pareto_front": [p[2] for p in front]},
              open(args.out + ".json", "w"), indent=2)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("pareto_report: matplotlib missing, no plot (apt-get install python3-matplotlib)", file=sys.stderr)
    else:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        colors, markers = {}, {}
        for loss, speed, label in scored:  # colour: the heads' kind; marker: the policy
            policy = parse_label(label)[0]
            kind = split_kind(label)[0] or "-"
            color = colors.setdefault(kind, f"C{len(colors)}")
            marker = markers.setdefault(policy, "os^Dv<>"[len(markers) % 7])
            ax.scatter(loss, speed, color=color, marker=marker,
                       label=policy if kind == "-" else f"{kind} {policy}")  # repeated labels merge in the legend
            ax.annotate(label, (loss, speed), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if len(front) > 1:
            ax.plot([p[0] for p in front], [p[1] for p in front], "k--", linewidth=0.8, label="Pareto front")
        ax.axhline(1.0, color="grey", linewidth=0.6)
        ax.set_xlabel("perplexity increase vs full (%)")
        ax.set_ylabel("serving output tok/s speed-up vs full")
        ax.set_title(f"Early exit, {args.model_name or eval_meta.get('model')} on the CPU")
        handles, names = ax.get_legend_handles_labels()
        unique = dict(zip(names, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out + "_pareto.png", dpi=120)
    print("\n".join(lines))
    print(f"wrote {args.out}.md, {args.out}.json, {args.out}_pareto.png", file=sys.stderr)


if __name__ == "__main__":
    main()
