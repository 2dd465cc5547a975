#!/usr/bin/env python3
"""Paged-attention decode GB/s of Helios next to PyTorch's scaled_dot_product_attention.

Reads Helios' numbers (helios-bench-gpu attention --json) and times SDPA on the same shapes:
B decoding queries [B, H, 1, D] against contiguous K/V [B, KV, ctx, D], in float32 (Helios'
cache type) and float16, with GQA through enable_gqa where torch has it (else K/V expanded to H
heads before timing, which SDPA then reads H/KV times over). GB/s = (K + V + q + out bytes) /
time, as Helios counts them. Writes JSON and a Markdown table; exits 0 with a message when
torch or a GPU is missing.
"""
import argparse
import json
import sys


def time_sdpa(torch, F, batch, ctx, heads, kv_heads, head_dim, dtype, iters):
    q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, kv_heads, ctx, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, kv_heads, ctx, head_dim, device="cuda", dtype=dtype)
    kwargs = {}
    if heads != kv_heads:
        try:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            kwargs["enable_gqa"] = True
        except TypeError:
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1000.0 / iters
    elem = torch.tensor([], dtype=dtype).element_size()
    nbytes = 2.0 * batch * ctx * kv_heads * head_dim * elem + 2.0 * batch * heads * head_dim * elem
    return us, nbytes / (us * 1e-6) / 1e9, "enable_gqa" in kwargs or heads == kv_heads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--helios-json", required=True, help="helios-bench-gpu attention --json output")
    ap.add_argument("--json", required=True, help="where to write the side-by-side JSON")
    ap.add_argument("--md", required=True, help="where to write the Markdown table")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    with open(args.helios_json) as f:
        helios = json.load(f)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("attention_torch: PyTorch is not installed here; the SDPA comparison is skipped")
        return 0
    if not torch.cuda.is_available():
        print("attention_torch: torch sees no CUDA device; the SDPA comparison is skipped")
        return 0
    # One row per shape: Helios' runs of it (one per way of reading the cache), SDPA timed once.
    rows, by_shape = [], {}
    for r in helios["runs"]:
        shape = (r["batch"], r["context"], r["heads"], r["kv_heads"], r["head_dim"])
        if shape not in by_shape:
            by_shape[shape] = {k: r[k] for k in ("batch", "context", "heads", "kv_heads", "head_dim", "dtype")}
            rows.append(by_shape[shape])
        row = by_shape[shape]
        reads = r.get("reads", "general")
        row[f"helios_{reads}_us"] = r["us_per_call"]
        row[f"helios_{reads}_gb_s"] = r["gb_s"]
    for row in rows:
        for name, dtype in (("float32", torch.float32), ("float16", torch.float16)):
            us, gbs, native_gqa = time_sdpa(torch, F, row["batch"], row["context"], row["heads"], row["kv_heads"],
                                            row["head_dim"], dtype, args.iters)
            row[f"sdpa_{name}_us"] = us
            row[f"sdpa_{name}_gb_s"] = gbs
            row["sdpa_native_gqa"] = native_gqa
        # the default way: wide where the shape has it
        best = "wide" if "helios_wide_us" in row else "general"
        row["us_per_call"], row["gb_s"] = row[f"helios_{best}_us"], row[f"helios_{best}_gb_s"]
        row["sdpa_float32_speedup"] = row["sdpa_float32_us"] / row["us_per_call"]
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "helios": helios, "runs": rows}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    lines = [f"# Paged-attention decode: Helios vs torch SDPA ({out['device']}, torch {out['torch']})", "",
             "| batch | context | heads/kv | Helios f32 us | Helios f32 GB/s | element reads us | SDPA f32 us | SDPA f32 GB/s | SDPA / Helios | SDPA f16 us | SDPA f16 GB/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        general = f"{r['helios_general_us']:.1f}" if "helios_general_us" in r else "-"
        lines.append(f"| {r['batch']} | {r['context']} | {r['heads']}/{r['kv_heads']} | {r['us_per_call']:.1f} | "
                     f"{r['gb_s']:.0f} | {general} | {r['sdpa_float32_us']:.1f} | {r['sdpa_float32_gb_s']:.0f} | "
                     f"{r['sdpa_float32_speedup']:.2f}x | {r['sdpa_float16_us']:.1f} | {r['sdpa_float16_gb_s']:.0f} |")
    lines += ["", "Helios reads a paged f32 cache (blocks of 16, shuffled), 16 bytes at a time where the shape "
              "allows (the default; 'element reads': one element a load); SDPA reads contiguous K/V.",
              "GB/s counts K, V, q and out once each. SDPA / Helios > 1: Helios is faster."]
    with open(args.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
