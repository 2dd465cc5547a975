"""Multi-turn chat replay with prefix caching on and off, side by side in one run.

Each conversation of a ShareGPT-format file is replayed turn by turn on heliosd's Generate RPC:
turn k sends the conversation so far (every earlier human turn and the model's own earlier
replies, as a `conversation` rendered by the model's chat template) plus the k-th human turn, and
generates a fixed number of tokens (greedy, EOS ignored). Conversations run one after another
(concurrency 1), so a turn's time to first token is its prefill: with the cache on, the history's
full blocks come from the cache and only the new turn is computed. The same replay runs on two
servers started from the same config but engine.prefix_caching, and the report gives TTFT by
turn, the ratio, the cache's hit rate, and whether both servers generated the same tokens.

    /usr/bin/python3 -m bench.prefix_cache.multiturn_replay --conversations 12 --turns 4
Writes bench/results/prefix_cache_multiturn_<model>_<UTC date>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_DATASETS = [SOURCE_DIR / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.first17671.json",
                    SOURCE_DIR.parent / "shared" / "data" / "sharegpt" / "medicalgpt_sharegpt_zh_1K_format.jsonl"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-path", default=str(SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--heliosd", default=os.environ.get("HELIOSD", str(SOURCE_DIR / "build" / "heliosd")))
    p.add_argument("--dataset", default=None, help="ShareGPT-format JSON or JSONL (default: the first that exists of "
                   + ", ".join(str(d) for d in DEFAULT_DATASETS) + ")")
    p.add_argument("--conversations", type=int, default=12, help="conversations with at least --turns human turns")
    p.add_argument("--turns", type=int, default=4, help="human turns replayed per conversation")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens generated per turn")
    p.add_argument("--max-turn-chars", type=int, default=600, help="each human turn cut to this many characters")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache", default="256MiB")
    p.add_argument("--out-dir", default=str(SOURCE_DIR / "bench" / "results"))
    return p.parse_args(argv)


def load_conversations(path: Path, n: int, turns: int, max_chars: int) -> list[list[str]]:
    """The human turns of the first n conversations that have at least `turns` of them."""
    text = path.read_text(encoding="utf-8")
    records = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    out = []
    for r in records:
        human = [t.get("value", "") for t in r.get("conversations", []) if t.get("from") in ("human", "user")]
        human = [h[:max_chars] for h in human if h.strip()]
        if len(human) >= turns:
            out.append(human[:turns])
        if len(out) == n:
            break
    return out


def server_config(a, caching: bool) -> str:
    return "\n".join([
        "server:", '  listen: "127.0.0.1:0"', '  metrics_listen: ""',
        "models:", "  - name: model", f'    path: "{os.path.abspath(a.model_path)}"',
        "engine:", f"  threads: {a.threads}", f"  kv_cache: {a.kv_cache}",
        f"  prefix_caching: {'true' if caching else 'false'}",
        "limits:", "  max_tokens: 1024", "  max_prompt_tokens: 8192", ""])


def replay(sync, pb, conversations, max_tokens):
    """Per conversation, per turn: (ttft_s, prompt_tokens, ids)."""
    out = []
    for c, turns in enumerate(conversations):
        history, rows = [], []
        for k, human in enumerate(turns):
            history.append(pb.ChatMessage(role="user", content=human))
            req = pb.GenerateRequest(request_id=f"c{c}-t{k}", model=sync.model,
                                     conversation=pb.Conversation(messages=history), max_tokens=max_tokens,
                                     ignore_eos=True)
            t0 = time.perf_counter()
            ttft, ids, text, usage = None, [], "", None
            for r in sync.stub.Generate(req, timeout=600):
                if r.tokens and ttft is None:
                    ttft = time.perf_counter() - t0
                ids += [t.token_id for t in r.tokens]
                text += "".join(t.text for t in r.tokens)
                if r.finish_reason:
                    usage = r.usage
            rows.append({"ttft_s": ttft, "prompt_tokens": usage.prompt_tokens if usage else 0, "ids": ids})
            history.append(pb.ChatMessage(role="assistant", content=text))
        out.append(rows)
    return out


def cache_status(sync):
    s = sync.status()
    for m in s.models:
        if m.name == sync.model:
            c = m.prefix_cache
            return {"enabled": c.enabled, "hit_tokens": c.hit_tokens, "query_tokens": c.query_tokens,
                    "hit_rate": c.hit_rate, "cached_blocks": c.cached_blocks, "evictions": c.evictions}
    return {}


def main(argv=None) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(SOURCE_DIR))
    from bench.intercept.client import load_stubs
    from bench.helios_bench.client import SyncClient
    from bench.helios_bench.server import ManagedServer
    pb, _ = load_stubs()
    dataset = Path(a.dataset) if a.dataset else next((d for d in DEFAULT_DATASETS if d.exists()), None)
    if dataset is None or not dataset.exists():
        print("no dataset: scripts/fetch_sharegpt.sh fetches ShareGPT, or give --dataset", file=sys.stderr)
        return 2
    conversations = load_conversations(dataset, a.conversations, a.turns, a.max_turn_chars)
    print(f"{len(conversations)} conversations x {a.turns} turns from {dataset.name}", flush=True)
    results = {}
    for caching in (False, True, False):  # off first and last: drift shows as a difference between them
        label = "on" if caching else "off"
        cfg = Path(tempfile.mkdtemp(prefix="helios-prefix-")) / "heliosd.yaml"
        cfg.write_text(server_config(a, caching))
        server = ManagedServer(config=str(cfg), heliosd=a.heliosd, label=f"cache-{label}", model="model")
        server.start()
        try:
            sync = SyncClient(server.address, "model")
            t = time.perf_counter()
            rows = replay(sync, pb, conversations, a.max_tokens)
            key = label if label not in results else "off_again"
            results[key] = {"rows": rows, "cache": cache_status(sync), "seconds": time.perf_counter() - t}
            print(f"cache {label}: {results[key]['seconds']:.1f} s, {results[key]['cache']}", flush=True)
        finally:
            server.stop()

    def ttfts(key, turn):
        return [c[turn]["ttft_s"] for c in results[key]["rows"] if c[turn]["ttft_s"] is not None]

    by_turn = []
    for k in range(a.turns):
        off = statistics.median(ttfts("off", k) + ttfts("off_again", k))
        on = statistics.median(ttfts("on", k))
        prompt = statistics.median([c[k]["prompt_tokens"] for c in results["on"]["rows"]])
        by_turn.append({"turn": k + 1, "prompt_tokens_median": prompt, "ttft_off_s": off, "ttft_on_s": on,
                        "speedup": off / on if on > 0 else None})
    later_off = statistics.median([x for k in range(1, a.turns) for x in ttfts("off", k) + ttfts("off_again", k)])
    later_on = statistics.median([x for k in range(1, a.turns) for x in ttfts("on", k)])
    same = all(r_on["ids"] == r_off["ids"] for c_on, c_off in zip(results["on"]["rows"], results["off"]["rows"])
               for r_on, r_off in zip(c_on, c_off))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    model = Path(a.model_path).stem
    command = "/usr/bin/python3 -m bench.prefix_cache.multiturn_replay " + " ".join(sys.argv[1:])
    commit = subprocess.run(["git", "-C", str(SOURCE_DIR), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    summary = {"command": command, "commit": commit, "model": model, "dataset": dataset.name,
               "conversations": len(conversations), "turns": a.turns, "max_tokens": a.max_tokens,
               "threads": a.threads, "machine": platform.processor() or platform.machine(),
               "by_turn": by_turn, "later_turns_ttft_off_s": later_off, "later_turns_ttft_on_s": later_on,
               "later_turns_speedup": later_off / later_on if later_on > 0 else None,
               "same_tokens": same, "cache": results["on"]["cache"],
               "seconds": {k: v["seconds"] for k, v in results.items()}}
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Not with_suffix: a model's name has dots of its own (Qwen2.5-Coder-1.5B), which it would cut at.
    base = f"prefix_cache_multiturn_{model}_{stamp}"
    (out / f"{base}.json").write_text(json.dumps(summary | {"raw": {k: v["rows"] for k, v in results.items()}},
                                                    indent=1))
    md = [f"# Prefix caching on a multi-turn chat replay: {model}", "",
          f"`{command}` at {commit}; {len(conversations)} conversations of {dataset.name}, {a.turns} human turns each, "
          f"{a.max_tokens} tokens per turn, greedy, one request at a time, {a.threads} threads. Cache off ran before "
          "and after cache on (both in the median).", "",
          "| turn | prompt tokens (median) | TTFT off (s) | TTFT on (s) | off / on |", "|---|---|---|---|---|"]
    for r in by_turn:
        md.append(f"| {r['turn']} | {r['prompt_tokens_median']:.0f} | {r['ttft_off_s']:.3f} | {r['ttft_on_s']:.3f} | "
                  f"{r['speedup']:.2f}x |")
    c = results["on"]["cache"]
    md += ["", f"Turns 2–{a.turns}: median TTFT {later_off:.3f} s off, {later_on:.3f} s on: "
               f"**{later_off / later_on:.2f}x** (goal ≥ 2x).",
           f"Cache: {c.get('hit_tokens', 0)} of {c.get('query_tokens', 0)} looked-up prompt tokens found "
           f"({100 * c.get('hit_rate', 0):.0f}%), {c.get('evictions', 0)} evictions.",
           f"Greedy tokens identical with the cache on and off: {'yes' if same else 'NO'}."]
    (out / f"{base}.md").write_text("\n".join(md) + "\n")
    print((out / f"{base}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
