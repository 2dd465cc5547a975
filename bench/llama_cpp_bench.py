#!/usr/bin/env python3
"""llama.cpp's figures for the measurement helios-bench-engine makes, through llama-cpp-python.

It reads the JSON helios-bench-engine wrote and runs the same model file, thread count, prompt
token ids ("prompt_ids"), decode length, warmup and repeats, so the two are comparable:

  each repeat: clear the KV cache -> llm.eval(prompt) (prefill, timed) -> M times: argmax of the
  last logits, llm.eval([token]) (decode, each step timed). Median over the repeats.

The KV cache runs twice: F32 (what Helios stores, the like-for-like figure) and F16 (llama.cpp's
default). Decode bandwidth counts the bytes llama.cpp reads per token the same way Helios' does:
every tensor of the file once (the token-embedding table once more if the LM head is tied to it,
minus all but one row of it otherwise) + K and V of every layer at the mean context, at the
cache's element size.

llama-cpp-python is not a dependency of Helios and is not in CI; install it by hand:
    python3 -m venv .venv && .venv/bin/pip install llama-cpp-python gguf numpy
(/opt/golden-venv has it on the development VM.)
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

try:
    import numpy as np
    import llama_cpp
except ImportError as e:
    sys.exit(
        f"llama_cpp_bench.py: cannot import llama-cpp-python ({e}).\n"
        "Install it into a virtual environment and run this script with that Python:\n"
        "    python3 -m venv .venv && .venv/bin/pip install llama-cpp-python gguf numpy\n"
        "    .venv/bin/python bench/llama_cpp_bench.py --helios-json ...\n"
        "(on the development VM: /opt/golden-venv/bin/python)")

GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1
KV_TYPES = {"F32": (GGML_TYPE_F32, 4), "F16": (GGML_TYPE_F16, 2)}  # name -> (ggml type, bytes)


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def weight_bytes_per_token(model_path):
    """Bytes of weights one decode step reads, or None when the gguf package is missing."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None, "gguf package missing (pip install gguf): bandwidth not computed"
    reader = GGUFReader(model_path)
    total, embd, has_output = 0, 0, False
    for t in reader.tensors:
        total += int(t.n_bytes)
        if t.name == "token_embd.weight":
            embd = int(t.n_bytes)
        has_output |= t.name == "output.weight"
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    row = embd // n_vocab
    if has_output:  # the lookup reads one row of the table
        return total - embd + row, "file tensors, token_embd one row"
    # Tied: the LM head reads the whole table, the lookup one row more.
    return total + row, "file tensors (token_embd read in full as the tied LM head)"


def argmax_last(llm):
    n_vocab = llm.n_vocab()
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
    return int(np.argmax(logits))


def run_repeat(llm, prompt, n_decode):
    llm.reset()  # n_tokens = 0: eval() then drops every cached position
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    decoded = [argmax_last(llm)]
    step_ms = []
    for _ in range(n_decode):
        t0 = time.perf_counter()
        llm.eval([decoded[-1]])
        step_ms.append((time.perf_counter() - t0) * 1e3)
        decoded.append(argmax_last(llm))
    return {"prefill_s": prefill_s, "decode_s": sum(step_ms) / 1e3, "step_ms": step_ms,
            "decoded": decoded}


def bench_kv_type(args, cfg, kv_name, prompt, helios):
    ggml_type, kv_elem_bytes = KV_TYPES[kv_name]
    n_prompt, n_decode = len(prompt), args.decode_tokens
    n_ctx = ((n_prompt + n_decode + 255) // 256) * 256
    n_batch = max(512, n_prompt)  # the whole prompt in one batch, as Helios does it
    print(f"llama.cpp: loading {args.model} (KV {kv_name}, {args.threads} threads)",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          type_k=ggml_type, type_v=ggml_type, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    runs = []
    for i in range(args.warmup + args.repeats):
        warm = i < args.warmup
        r = run_repeat(llm, prompt, n_decode)
        label = f"warmup {i + 1}/{args.warmup}" if warm else f"repeat {i - args.warmup + 1}/{args.repeats}"
        print(f"  {label}: prefill {n_prompt / r['prefill_s']:.1f} tok/s, "
              f"decode {n_decode / r['decode_s']:.2f} tok/s", file=sys.stderr, flush=True)
        if not warm:
            runs.append(r)
    del llm

    prefill_s = statistics.median(r["prefill_s"] for r in runs)
    decode_s = statistics.median(r["decode_s"] for r in runs)
    s_per_token = decode_s / n_decode
    mean_ctx = n_prompt + (n_decode + 1) / 2
    kv_bytes = int(2 * cfg["n_layer"] * cfg["kv_dim"] * kv_elem_bytes * mean_ctx)
    weights, weights_note = weight_bytes_per_token(args.model)
    result = {
        "kv_type": kv_name,
        "prefill_tok_s": n_prompt / prefill_s,
        "prefill_ms": prefill_s * 1e3,
        "decode_tok_s": n_decode / decode_s,
        "decode_ms_per_token": s_per_token * 1e3,
        "decode_gb_s": (weights + kv_bytes) / s_per_token / 1e9 if weights else None,
        "bytes_per_decode_token": {"weights": weights, "kv": kv_bytes,
                                   "total": weights + kv_bytes if weights else None,
                                   "mean_context_tokens": mean_ctx, "weights_counted": weights_note},
        "load_s": load_s,
        "llama_params": {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_batch,
                         "flash_attn": False, "type_k": kv_name, "type_v": kv_name,
                         "use_mmap": True},
        "repeats": [{"prefill_s": r["prefill_s"], "decode_s": r["decode_s"],
                     "prefill_tok_s": n_prompt / r["prefill_s"],
                     "decode_tok_s": n_decode / r["decode_s"],
                     "decode_step_ms_median": statistics.median(r["step_ms"]),
                     "decode_step_ms": r["step_ms"]} for r in runs],
        "decoded_ids": runs[0]["decoded"],
    }
    # Same prompt, both greedy: the tokens should agree until rounding differences pile up.
    theirs = helios.get("decoded_ids", [])
    same = 0
    while same < min(len(theirs), len(result["decoded_ids"])) and theirs[same] == result["decoded_ids"][same]:
        same += 1
    result["greedy_tokens_matching_helios"] = f"{same}/{len(result['decoded_ids'])}"
    return result


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--helios-json", required=True,
                   help="JSON from helios-bench-engine --json: model, threads, prompt_ids, lengths")
    p.add_argument("--model", help="GGUF file (default: the one in --helios-json)")
    p.add_argument("--threads", type=int, help="threads (default: as in --helios-json)")
    p.add_argument("--decode-tokens", type=int, help="default: as in --helios-json")
    p.add_argument("--repeats", type=int, help="default: as in --helios-json")
    p.add_argument("--warmup", type=int, help="default: as in --helios-json")
    p.add_argument("--kv-types", default="F32,F16", help="KV cache types to run (default F32,F16)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    with open(args.helios_json) as f:
        helios = json.load(f)
    hc, hm = helios["config"], helios["model"]
    args.model = args.model or hm["path"]
    args.threads = args.threads or hc["threads"]
    args.decode_tokens = args.decode_tokens or hc["decode_tokens"]
    args.repeats = args.repeats or hc["repeats"]
    args.warmup = hc.get("warmup", 1) if args.warmup is None else args.warmup
    prompt = helios["prompt_ids"]
    cfg = {"n_layer": hm["n_layer"], "n_embd": hm["n_embd"],
           "kv_dim": hm["n_head_kv"] * (hm["n_embd"] // hm["n_head"])}
    kv_names = [k.strip().upper() for k in args.kv_types.split(",") if k.strip()]
    for k in kv_names:
        if k not in KV_TYPES:
            sys.exit(f"llama_cpp_bench.py: unknown KV type {k} (valid: {', '.join(KV_TYPES)})")

    out = {
        "engine": "llama.cpp",
        "llama_cpp_python_version": llama_cpp.__version__,
        "commit": git_commit(),
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": {"backend": "cpu", "cpu_model": cpu_model(), "n_cpus": os.cpu_count(),
                   "load_average_at_start": load_average()},
        "model": {"path": args.model, "file_bytes": os.path.getsize(args.model)},
        "config": {"threads": args.threads, "batch": 1, "prompt_tokens": len(prompt),
                   "decode_tokens": args.decode_tokens, "repeats": args.repeats,
                   "warmup": args.warmup, "sampling": "greedy",
                   "prompt_source": "prompt_ids of " + args.helios_json},
        "results": {},
    }
    for k in kv_names:
        out["results"][k] = bench_kv_type(args, cfg, k, prompt, helios)
    out["device"]["load_average_at_end"] = load_average()

    print(f"llama.cpp {llama_cpp.__version__} | {args.model} | {args.threads} threads")
    print(f"{'engine':<15} {'prefill t/s':>12} {'prefill ms':>12} {'decode t/s':>12} "
          f"{'ms/token':>10} {'GB/s':>8} {'greedy=helios':>14}")
    for k, r in out["results"].items():
        gb = f"{r['decode_gb_s']:.2f}" if r["decode_gb_s"] else "-"
        print(f"{'llama.cpp ' + k:<15} {r['prefill_tok_s']:12.1f} {r['prefill_ms']:12.1f} "
              f"{r['decode_tok_s']:12.2f} {r['decode_ms_per_token']:10.2f} {gb:>8} "
              f"{r['greedy_tokens_matching_helios']:>14}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
