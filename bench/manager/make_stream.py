#!/usr/bin/env python3
"""The model manager benchmark's mixed prompt stream: ShareGPT prompts, GSM8K questions and code
prompts (ShareGPT first turns that ask for code), in a fixed-seed shuffled order, as a prompt-only
JSON file helios-bench reads (--dataset prompts), and a report of the mix and its order."""
import argparse
import json
import random

CODE_WORDS = ("python", "javascript", "function", "code", "sql", "java ", "c++", "script", "class ", "regex")


def first_turns(path):
    out = []
    for conv in json.load(open(path, encoding="utf-8")):
        turns = conv.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            out.append(turns[0]["value"].strip())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sharegpt", required=True, help="ShareGPT JSON (prompts and code prompts)")
    ap.add_argument("--gsm8k", required=True, help="GSM8K JSONL (questions)")
    ap.add_argument("--num", type=int, default=60, help="prompts in all, a third of each kind")
    ap.add_argument("--max-chars", type=int, default=1200, help="drop longer prompts (the CPU has little time)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", required=True)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    turns = [t for t in first_turns(args.sharegpt) if len(t) <= args.max_chars]
    code = [t for t in turns if any(w in t.lower() for w in CODE_WORDS)]
    chat = [t for t in turns if t not in set(code)]
    questions = [json.loads(line)["question"] for line in open(args.gsm8k, encoding="utf-8") if line.strip()]
    per_kind = args.num // 3
    kinds = {"sharegpt": rng.sample(chat, per_kind), "gsm8k": rng.sample(questions, per_kind),
             "code": rng.sample(code, args.num - 2 * per_kind)}
    stream = [(kind, p) for kind, prompts in kinds.items() for p in prompts]
    rng.shuffle(stream)
    json.dump([{"prompt": p} for _, p in stream], open(args.out, "w", encoding="utf-8"))
    report = {"seed": args.seed, "sources": {"sharegpt": args.sharegpt, "gsm8k": args.gsm8k},
              "counts": {k: len(v) for k, v in kinds.items()}, "order": [k for k, _ in stream]}
    json.dump(report, open(args.report, "w"), indent=1)
    print(f"make_stream: {len(stream)} prompts: " + ", ".join(f"{k} {len(v)}" for k, v in kinds.items()) +
          f" (seed {args.seed})")


if __name__ == "__main__":
    main()
