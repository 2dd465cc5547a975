#!/usr/bin/env python3
"""Calibration text written by the model itself, for a lookahead head.

A lookahead head drafts while the model generates, so it should learn from text the model writes:
its own continuations of real prompts. This starts heliosd on the model (OpenAI API on a free
port), sends each prompt's first human turn as a greedy completion, several at once, and writes
one document per prompt, prompt and completion joined, as JSON `[{"text": ...}]`, which
`helios calibrate --text` reads.

    /usr/bin/python3 bench/early_exit/self_generated_text.py --model models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \
        --prompts data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.first17671.json --count 48 --max-tokens 384 \
        --out /tmp/self_text.json

Use prompts disjoint from the evaluation text (the ShareGPT split above is; see split_text.py).
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_turns(path, count, max_chars, skip=0):
    """The first human turn of each conversation after the first `skip`, cut to max_chars, skipping
    very short ones."""
    with open(path) as f:
        data = json.load(f)
    out = []
    for conv in data[skip:]:
        turns = conv.get("conversations") or conv.get("messages") or []
        for t in turns:
            if t.get("from", t.get("role")) in ("human", "user"):
                text = (t.get("value") or t.get("content") or "").strip()
                if len(text) >= 32:
                    out.append(text[:max_chars])
                break
        if len(out) == count:
            break
    return out


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF model file")
    ap.add_argument("--prompts", required=True, help="ShareGPT JSON whose first human turns are the prompts")
    ap.add_argument("--count", type=int, default=48, help="prompts (default 48)")
    ap.add_argument("--skip", type=int, default=0, help="conversations to pass over first (for another batch)")
    ap.add_argument("--max-tokens", type=int, default=384, help="tokens generated per prompt (default 384)")
    ap.add_argument("--prompt-chars", type=int, default=600, help="each prompt cut to this many characters")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ap.add_argument("--heliosd", default=os.path.join(ROOT, "build", "heliosd"))
    ap.add_argument("--out", required=True, help="where to write the JSON documents")
    args = ap.parse_args()

    prompts = first_turns(args.prompts, args.count, args.prompt_chars, args.skip)
    if not prompts:
        sys.exit(f"self_generated_text: no human turns in {args.prompts}")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "heliosd.yaml")
        with open(config, "w") as f:
            f.write(f"server:\n  listen: 127.0.0.1:0\n  http_listen: 127.0.0.1:{port}\n  metrics_listen: \"\"\n"
                    f"models:\n  - name: model\n    path: {os.path.abspath(args.model)}\n"
                    f"engine:\n  kv_cache: 1GiB\n")
        log = open(os.path.join(tmp, "heliosd.log"), "w")
        server = subprocess.Popen([args.heliosd, "--config", config], stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except Exception:
                    if server.poll() is not None:
                        sys.exit("self_generated_text: heliosd exited:\n" + open(log.name).read())
                    time.sleep(1)
            url = f"http://127.0.0.1:{port}/v1/completions"
            t0 = time.time()
            done = 0

            def one(prompt):
                r = post(url, {"model": "model", "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0})
                return prompt + r["choices"][0]["text"], r["usage"]["completion_tokens"]

            docs, tokens = [], 0
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                for text, n in pool.map(one, prompts):
                    docs.append({"text": text})
                    tokens += n
                    done += 1
                    print(f"self_generated_text: {done}/{len(prompts)} prompts, {tokens} tokens "
                          f"({tokens / (time.time() - t0):.1f} tok/s)", file=sys.stderr)
        finally:
            server.terminate()
            server.wait()
    with open(args.out, "w") as f:
        json.dump(docs, f)
    print(f"self_generated_text: wrote {len(docs)} documents, {tokens} generated tokens, to {args.out}")


if __name__ == "__main__":
    main()
