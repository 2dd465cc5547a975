#!/usr/bin/env python3
"""Makes the early-exit benchmark's evaluation text disjoint from its calibration text: writes the
evaluation ShareGPT JSON less every conversation that shares a turn with any calibration file
(ShareGPT JSON or JSONL such as GSM8K), and a report of what was dropped."""
import argparse
import json


def load(path):
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return json.load(open(path, encoding="utf-8"))


def turns(record):
    """The texts of a record: conversation turns, or the string fields of a flat record."""
    if isinstance(record, str):
        return [record]
    texts = []
    for value in record.values():
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            texts += [t.get("value") or t.get("content") or "" for t in value if isinstance(t, dict)]
    return texts


def key(text):
    """Two turns are the same text if they agree on their first 200 non-space characters."""
    return "".join(text.split())[:200]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calibration", nargs="+", required=True)
    ap.add_argument("--evaluation", required=True)
    ap.add_argument("--out", required=True, help="the disjoint evaluation JSON")
    ap.add_argument("--report", required=True, help="JSON: files and counts")
    args = ap.parse_args()

    seen = set()
    calibration = {}
    for path in args.calibration:
        records = load(path)
        calibration[path] = len(records)
        seen.update(key(t) for r in records for t in turns(r) if len(t.strip()) >= 32)
    evaluation = load(args.evaluation)
    kept = [r for r in evaluation if not any(key(t) in seen for t in turns(r) if len(t.strip()) >= 32)]
    json.dump(kept, open(args.out, "w", encoding="utf-8"))
    report = {"calibration": calibration, "evaluation": args.evaluation,
              "evaluation_records": len(evaluation), "dropped_as_seen_in_calibration": len(evaluation) - len(kept),
              "evaluation_kept": len(kept)}
    json.dump(report, open(args.report, "w"), indent=2)
    print(f"split_text: {len(evaluation) - len(kept)} of {len(evaluation)} evaluation conversations share a turn "
          f"with the calibration text and are dropped; {len(kept)} kept")


if __name__ == "__main__":
    main()
