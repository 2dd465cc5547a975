#!/usr/bin/env python3
"""Merges the per-model JSON of helios-bench-engine and llama_cpp_bench.py into one results JSON
and a Markdown table, Helios and llama.cpp side by side. Standard library only.

usage: cpu_bench_report.py --command CMD --date D --out-json PATH --out-md PATH [--bandwidth-gbs X] \
           LABEL HELIOS_JSON LLAMA_JSON [LABEL HELIOS_JSON LLAMA_JSON ...]
LABEL is MODEL@DEPTH/KV (run_cpu_bench.sh writes them so).
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return None if not a or not b else a / b


def model_line(h):
    m = h["model"]
    types = ", ".join(f"{k}×{v}" for k, v in m["file_tensor_types"].items())
    return (f"{m['path']} ({m['file_bytes'] / 1e6:.1f} MB; {m['n_layer']} layers × {m['n_embd']}, "
            f"ffn {m['n_ff']}, heads {m['n_head']}/{m['n_head_kv']}, vocab {m['n_vocab']}, "
            f"{'tied' if m['tied_output'] else 'untied'} LM head; tensors {types})")


def markdown(report):
    first = report["runs"][0]["helios"]
    c = first["config"]
    bw = report.get("bandwidth_gbs")
    lines = [
        f"# CPU engine benchmark, {report['date']}",
        "",
        f"- command: `{report['command']}`",
        f"- commit: {first['commit']}{' (work tree had uncommitted changes)' if first.get('worktree_dirty') else ''}",
        f"- CPU: {first['device']['cpu_model']}, {first['device']['n_cpus']} CPUs; "
        f"threads: {c['threads']} for both engines",
        f"- batch 1; a prompt of `depth` tokens (one forward pass), then decode {c['decode_tokens']} "
        f"tokens one at a time, greedy; median of {c['repeats']} repeats after {c['warmup']} warmup",
        f"- llama.cpp: llama-cpp-python {report['runs'][0]['llama_cpp'].get('llama_cpp_python_version', '?')}, "
        "same file, same prompt token ids, same KV cache type, flash attention off",
        "- GB/s: bytes each decode step reads (weights + KV at the mean context) / time per token"
        + (f"; % bw: of {bw:g} GB/s, the machine's read bandwidth" if bw else ""),
        "",
        "| model | depth | KV | prefill tok/s Helios | llama.cpp | ratio | decode tok/s Helios | llama.cpp | ratio "
        "| decode GB/s Helios | llama.cpp | % bw Helios | MB/token | greedy tokens = |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        h = run["helios"]["results"]
        for kv, r in run["llama_cpp"]["results"].items():
            model, depth = run["label"].split("@")[0], run["helios"]["config"]["prompt_tokens"]
            share = None if not bw else 100 * h["decode_gb_s"] / bw
            lines.append(
                f"| {model} | {depth} | {kv} | {fmt(h['prefill_tok_s'], 1)} | {fmt(r['prefill_tok_s'], 1)} | "
                f"**{fmt(ratio(h['prefill_tok_s'], r['prefill_tok_s']), 2)}** | {fmt(h['decode_tok_s'], 2)} | "
                f"{fmt(r['decode_tok_s'], 2)} | **{fmt(ratio(h['decode_tok_s'], r['decode_tok_s']), 2)}** | "
                f"{fmt(h['decode_gb_s'], 2)} | {fmt(r['decode_gb_s'], 2)} | {fmt(share, 0)} | "
                f"{h['bytes_per_decode_token']['total'] / 1e6:.1f} | {r['greedy_tokens_matching_helios']} |")
    lines += ["", "Models:", ""]
    seen = set()
    for run in report["runs"]:
        model = run["label"].split("@")[0]
        if model not in seen:
            seen.add(model)
            lines.append(f"- {model}: {model_line(run['helios'])}; prompt: {run['helios']['config']['prompt_source']}")
    lines += ["", "Load average (1/5/15 min) at start and end of each benchmark, a hint of "
              "how much other work shared the CPUs:", ""]
    for run in report["runs"]:
        for name, key in (("Helios", "helios"), ("llama.cpp", "llama_cpp")):
            d = run[key]["device"]
            lines.append(f"- {run['label']} {name}: {d.get('load_average_at_start')} → "
                         f"{d.get('load_average_at_end')}")
    lines += ["", "Each engine's own command and every repeat are in the JSON next to this file.", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--command", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    p.add_argument("--bandwidth-gbs", type=float, help="the machine's memory read bandwidth, GB/s")
    p.add_argument("runs", nargs="+", help="LABEL HELIOS_JSON LLAMA_JSON, repeated")
    args = p.parse_args()
    if len(args.runs) % 3:
        sys.exit("cpu_bench_report.py: runs come in threes: LABEL HELIOS_JSON LLAMA_JSON")
    report = {"benchmark": "cpu_engine", "date": args.date, "command": args.command,
              "bandwidth_gbs": args.bandwidth_gbs, "runs": []}
    for i in range(0, len(args.runs), 3):
        label, hp, lp = args.runs[i:i + 3]
        h, l = load(hp), load(lp)
        run = {"label": label, "helios": h, "llama_cpp": l, "ratios_helios_over_llama_cpp": {}}
        for kv, r in l["results"].items():
            run["ratios_helios_over_llama_cpp"][f"kv_{kv}"] = {
                "prefill": ratio(h["results"]["prefill_tok_s"], r["prefill_tok_s"]),
                "decode": ratio(h["results"]["decode_tok_s"], r["decode_tok_s"])}
        report["runs"].append(run)
    with open(args.out_json, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    md = markdown(report)
    with open(args.out_md, "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
