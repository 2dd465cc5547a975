"""The intercept benchmark's metrics and report (INFERCEPT's evaluation, section 5).

Per (policy, rate), over the requests that completed:
  normalized latency  median over requests of (end-to-end − total pause) / output tokens (s/token);
                      the pauses (the client's sleeps, resume written − intercept received) are the
                      same for every policy, so the paper takes them out
  throughput          completed requests / the run's wall time (requests/s)
  TTFT                first token of the first segment − the open written: median and p90
  waste share         the server's waste by cause (InterceptStatus: preserve, recompute, swap, in
                      byte·seconds) over kv_byte_seconds (the KV pool's size × time), the deltas over
                      the run: INFERCEPT's "GPU memory waste" as a share of the memory-time there was
  recompute share     Δrecompute_seconds / Δforward_seconds: the forward time spent recomputing
Headline: the highest rate each policy sustains with its normalized latency at or below a target
(by default 2 × min-waste's value at the lowest rate; linear interpolation between the last rate
that meets it and the first that does not), min-waste's sustained rate over discard's (the paper:
1.6×–2×) and min-waste's waste share (the paper: 0.69%).

Standard library, and matplotlib for the figure (imported only there).
    python3 -m bench.intercept.report bench/results/intercept_X.json   # rewrites its .md and .png
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

POLICIES = ("discard", "improved-discard", "preserve", "swap", "min-waste")
WASTE_CAUSES = ("preserve", "recompute", "swap")
GOAL_RATIO = 1.6          # min-waste's sustained rate over discard's (INFERCEPT: 1.6×–2×)
GOAL_WASTE_SHARE = 0.05   # min-waste's waste share (INFERCEPT: 0.69%)


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------

def percentile(xs: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); 0 for an empty list."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def request_metrics(rec: dict) -> dict | None:
    """A completed request's latencies (None when it failed or produced no token): e2e, active
    (e2e − pauses), normalized (active / output tokens), TTFT, all in seconds."""
    if not rec.get("ok") or rec.get("output_tokens", 0) <= 0:
        return None
    e2e = rec["end"] - rec["start"]
    active = max(0.0, e2e - rec.get("pause_s", 0.0))
    ttft = rec["first_token"] - rec["start"] if rec.get("first_token") else None
    return {"e2e_s": e2e, "active_s": active, "normalized_s_per_token": active / rec["output_tokens"],
            "ttft_s": ttft}


# --------------------------------------------------------------------------------------------------
# Server counters
# --------------------------------------------------------------------------------------------------

_COUNTERS = ("waste_preserve_byte_seconds", "waste_recompute_byte_seconds", "waste_swap_byte_seconds",
             "kv_byte_seconds", "forward_seconds", "recompute_seconds", "intercepts_total")


def intercept_delta(before: dict | None, after: dict | None) -> dict:
    """after − before of one model's InterceptStatus (dicts with the proto's field names; a missing
    field is 0), with the decisions as {"policy/decision": count}."""
    before, after = before or {}, after or {}
    out = {k: float(after.get(k, 0) or 0) - float(before.get(k, 0) or 0) for k in _COUNTERS}

    def dec(s):
        return {f"{d.get('policy', '')}/{d.get('decision', '')}": int(d.get("count", 0) or 0)
                for d in s.get("decisions", []) or []}
    b, a = dec(before), dec(after)
    out["decisions"] = {k: a.get(k, 0) - b.get(k, 0) for k in sorted(set(a) | set(b)) if a.get(k, 0) - b.get(k, 0)}
    return out


def waste_shares(delta: dict) -> dict:
    """Waste by cause and in total as shares of kv_byte_seconds; the recompute share of forward time."""
    kv = delta.get("kv_byte_seconds", 0.0)
    out = {}
    total = 0.0
    for c in WASTE_CAUSES:
        w = delta.get(f"waste_{c}_byte_seconds", 0.0)
        total += w
        out[c] = (w / kv) if kv > 0 else None
    out["total"] = (total / kv) if kv > 0 else None
    fwd = delta.get("forward_seconds", 0.0)
    out["recompute_of_forward"] = (delta.get("recompute_seconds", 0.0) / fwd) if fwd > 0 else None
    return out


# --------------------------------------------------------------------------------------------------
# One run (policy, rate)
# --------------------------------------------------------------------------------------------------

def summarize_run(records: list[dict], duration_s: float, delta: dict | None = None) -> dict:
    """The metrics of one (policy, rate) run from its request records (RequestRecord.to_dict)."""
    ms = [(r, request_metrics(r)) for r in records]
    ok = [(r, m) for r, m in ms if m is not None]
    norm = [m["normalized_s_per_token"] for _, m in ok]
    ttft = [m["ttft_s"] for _, m in ok if m["ttft_s"] is not None]
    by_kind: dict[str, list[float]] = {}
    for r, m in ok:
        by_kind.setdefault(r["kind"], []).append(m["normalized_s_per_token"])
    errors: dict[str, int] = {}
    for r in records:
        if not r.get("ok"):
            key = (r.get("error") or "unknown").split(":")[0][:80]
            errors[key] = errors.get(key, 0) + 1
    out = {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": errors,
        "duration_s": duration_s,
        "throughput_rps": (len(ok) / duration_s) if duration_s > 0 else 0.0,
        "normalized_latency_s_per_token": {"median": median(norm), "mean": statistics.fmean(norm) if norm else 0.0,
                                           "p90": percentile(norm, 90)},
        "ttft_s": {"median": median(ttft), "p90": percentile(ttft, 90), "mean": statistics.fmean(ttft) if ttft else 0.0},
        "e2e_s_median": median([m["e2e_s"] for _, m in ok]),
        "pause_s_mean": statistics.fmean([r["pause_s"] for r, _ in ok]) if ok else 0.0,
        "output_tokens": sum(r["output_tokens"] for r, _ in ok),
        "intercepts": sum(r.get("intercepts", 0) for r in records),
        "normalized_latency_by_kind": {k: median(v) for k, v in sorted(by_kind.items())},
    }
    if delta is not None:
        out["server"] = delta
        out["waste_share"] = waste_shares(delta)
    return out


# --------------------------------------------------------------------------------------------------
# Sustained rate
# --------------------------------------------------------------------------------------------------

def sustained_rate(points: list[tuple[float, float | None]], target: float) -> dict:
    """The highest request rate whose normalized latency is at or below target, from (rate, latency)
    points (None latency = nothing completed: fails). Walks the rates upward to the first that fails:
      rate          interpolated linearly between the last passing rate and it (at the target);
                    the last passing rate when interpolation does not apply; None when the lowest fails
      measured      the last passing measured rate (None when the lowest fails)
      bounded       False when every rate passes (the true value is at least `rate`)"""
    pts = sorted((r, v) for r, v in points if r is not None and not math.isinf(r))
    last_ok = None
    for r, v in pts:
        if v is not None and v <= target:
            last_ok = (r, v)
            continue
        if last_ok is None:
            return {"rate": None, "measured": None, "bounded": True}
        r0, v0 = last_ok
        rate = r0
        if v is not None and v > v0:
            rate = r0 + (r - r0) * (target - v0) / (v - v0)
        return {"rate": rate, "measured": r0, "bounded": True}
    if last_ok is None:
        return {"rate": None, "measured": None, "bounded": True}
    return {"rate": last_ok[0], "measured": last_ok[0], "bounded": False}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return math.inf if a > 0 else None
    return a / b


def _ratio_note(sustained: dict, ref: str, base: str, by_policy: dict) -> str:
    rs, bs = sustained.get(ref), sustained.get(base)
    if not rs or not bs:
        return f"{ref} or {base} did not run"
    if rs["rate"] is None:
        return f"{ref} misses the target at the lowest rate"
    if bs["rate"] is None:
        low = min(r for r, _ in by_policy[base])
        return f"{base} misses the target at the lowest rate ({low:g} req/s): the ratio is above {rs['rate'] / low:.2f}×"
    if not rs["bounded"]:
        return "a lower bound: the reference meets the target at every rate"
    return ""


def headline(runs: list[dict], target_factor: float = 2.0, target_s: float | None = None,
             reference_policy: str = "min-waste", baseline_policy: str = "discard") -> dict:
    """runs: [{policy, rate, summary}]. The normalized-latency target (target_s, else target_factor ×
    the reference policy's median at its lowest rate; the lowest over all policies there when the
    reference did not run), each policy's sustained rate, the reference over the baseline."""
    by_policy: dict[str, list[tuple[float, float | None]]] = {}
    for run in runs:
        s = run["summary"]
        v = s["normalized_latency_s_per_token"]["median"] if s["completed"] else None
        by_policy.setdefault(run["policy"], []).append((run["rate"], v))
    basis = ""
    if target_s is None:
        ref = sorted(p for p in by_policy.get(reference_policy, []) if p[1] is not None)
        if ref:
            target_s = target_factor * ref[0][1]
            basis = f"{target_factor:g} × {reference_policy}'s normalized latency at {ref[0][0]:g} req/s"
        else:
            lows = [min((p for p in pts if p[1] is not None), default=None) for pts in by_policy.values()]
            lows = [p for p in lows if p is not None]
            if lows:
                low_rate = min(p[0] for p in lows)
                best = min(p[1] for p in lows if p[0] == low_rate)
                target_s = target_factor * best
                basis = f"{target_factor:g} × the best normalized latency at {low_rate:g} req/s"
            else:
                target_s = 0.0
                basis = "no completed run"
    else:
        basis = "given"
    sustained = {p: sustained_rate(pts, target_s) for p, pts in by_policy.items()}
    ref_rate = sustained.get(reference_policy, {}).get("rate")
    base_rate = sustained.get(baseline_policy, {}).get("rate")
    r = ratio(ref_rate, base_rate)
    # The baseline misses the target already at the lowest rate: the ratio is at least ref / lowest.
    lower = None
    if r is None and ref_rate is not None and baseline_policy in by_policy:
        lower = ref_rate / min(rt for rt, _ in by_policy[baseline_policy])
    met = (r >= GOAL_RATIO) if r is not None else ((lower >= GOAL_RATIO) or None) if lower is not None else None
    waste = {run["rate"]: (run["summary"].get("waste_share") or {}).get("total")
             for run in runs if run["policy"] == reference_policy}
    known = [w for w in waste.values() if w is not None]
    return {
        "target_s_per_token": target_s, "target_basis": basis,
        "sustained": sustained,
        "reference": reference_policy, "baseline": baseline_policy,
        "ratio": r, "ratio_lower_bound": lower, "ratio_goal": GOAL_RATIO, "ratio_met": met,
        "ratio_note": _ratio_note(sustained, reference_policy, baseline_policy, by_policy),
        "reference_waste_share_by_rate": waste,
        "reference_waste_share_max": max(known) if known else None,
        "waste_goal": GOAL_WASTE_SHARE,
        "waste_met": (max(known) <= GOAL_WASTE_SHARE) if known else None,
    }


# --------------------------------------------------------------------------------------------------
# Markdown and figure
# --------------------------------------------------------------------------------------------------

def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _met(flag) -> str:
    return "no data" if flag is None else ("met" if flag else "not met")


def _num(x, fmt=".3f") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return format(x, fmt)


def markdown(report: dict, png_name: str | None = None) -> str:
    h = report["headline"]
    cfg = report.get("config", {})
    out = [f"# Intercept benchmark: {report.get('model', '')}, {report.get('workload', '')} workload", ""]
    out.append(f"- started: {report.get('started_at', '')} · commit `{str(report.get('commit', ''))[:12]}`"
               f" · machine: {report.get('machine', '')}")
    out.append(f"- command: `{report.get('command', '')}`")
    sc = report.get("scaling", {})
    out.append(f"- requests per run: {cfg.get('n_requests')} · rates: {', '.join(_num(r, 'g') for r in cfg.get('rates', []))} req/s"
               f" (Poisson) · policies: {', '.join(cfg.get('policies', []))} · seed {cfg.get('seed')}")
    out.append(f"- scaling: max context {sc.get('max_context')} tokens, max segment {sc.get('max_segment_tokens')},"
               f" max intercepts {sc.get('max_intercepts')}, max return {sc.get('max_return_tokens')},"
               f" **pause scale {sc.get('pause_scale')}** (on {', '.join(sc.get('pause_scale_kinds', []))};"
               f" the server's pause priors scaled alike), pauses {sc.get('pause_dist')}"
               f" from Table 1 read as (mean, {sc.get('table1_spread')})")
    out.append(f"- server: KV cache {cfg.get('kv_cache')}, {cfg.get('engine', '')}")
    out.append("")
    out.append("## Headline")
    out.append("")
    out.append(f"Normalized-latency target: **{_num(h['target_s_per_token'], '.4f')} s/token** ({h['target_basis']}).")
    out.append("")
    out.append("| policy | sustained rate (req/s, interpolated) | last measured rate meeting it |")
    out.append("|---|---|---|")
    for p in report.get("config", {}).get("policies", sorted(h["sustained"])):
        s = h["sustained"].get(p)
        if not s:
            continue
        mark = "" if s["bounded"] else " (every rate met it: ≥)"
        out.append(f"| {p} | {_num(s['rate'], '.3g')}{mark} | {_num(s['measured'], 'g')} |")
    out.append("")
    r = h["ratio"]
    out.append(f"- {h['reference']} / {h['baseline']} sustained rate: **{_num(r, '.2f')}×** "
               f"(goal ≥ {h['ratio_goal']}×: {_met(h['ratio_met'])}){' — ' + h['ratio_note'] if h['ratio_note'] else ''}")
    out.append(f"- {h['reference']} waste share (max over rates): **{_pct(h['reference_waste_share_max'])}** "
               f"(goal ≤ {_pct(h['waste_goal'])}: {_met(h['waste_met'])})")
    out.append("")
    out.append("## Per policy and rate")
    out.append("")
    out.append("| policy | rate | done/sent | req/s | norm. latency median (s/tok) | p90 | TTFT median (s) | TTFT p90 (s) "
               "| waste total | preserve | recompute | swap | recompute of forward | decisions |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in report["runs"]:
        s = run["summary"]
        w = s.get("waste_share") or {}
        dec = ", ".join(f"{k.split('/', 1)[-1]} {v}" for k, v in (s.get("server") or {}).get("decisions", {}).items())
        out.append(f"| {run['policy']} | {_num(run['rate'], 'g')} | {s['completed']}/{s['requests']} | {_num(s['throughput_rps'])} "
                   f"| {_num(s['normalized_latency_s_per_token']['median'], '.4f')} | {_num(s['normalized_latency_s_per_token']['p90'], '.4f')} "
                   f"| {_num(s['ttft_s']['median'])} | {_num(s['ttft_s']['p90'])} "
                   f"| {_pct(w.get('total'))} | {_pct(w.get('preserve'))} | {_pct(w.get('recompute'))} | {_pct(w.get('swap'))} "
                   f"| {_pct(w.get('recompute_of_forward'))} | {dec or '–'} |")
    errs = [(run["policy"], run["rate"], run["summary"]["errors"]) for run in report["runs"] if run["summary"]["errors"]]
    if errs:
        out.append("")
        out.append("Failed requests: " + "; ".join(f"{p} @ {_num(r, 'g')}: " + ", ".join(f"{k} ×{v}" for k, v in e.items())
                                                  for p, r, e in errs))
    ws = report.get("workload_stats") or {}
    if ws:
        out.append("")
        out.append("## Workload (what was sent) next to INFERCEPT Table 1")
        out.append("")
        out.append("| kind | requests | intercepts mean (Table 1) | context at intercept mean (Table 1) | pause s mean (Table 1) | output tokens mean |")
        out.append("|---|---|---|---|---|---|")
        for k, v in ws.items():
            out.append(f"| {k} | {v['requests']} | {v['intercepts_mean_var'][0]:.2f} ({v['table1_intercepts'][0]}) "
                       f"| {v['context_mean_std'][0]:.0f} ({v['table1_context'][0]}) "
                       f"| {v['pause_s_mean_var'][0]:.4g} ({v['table1_pause_s'][0]}) | {v['output_tokens_mean']:.0f} |")
    notes = report.get("notes") or []
    if notes:
        out.append("")
        out.append("## Notes")
        out.append("")
        out += [f"- {n}" for n in notes]
    out.append("")
    out.append("Definitions: normalized latency = median over completed requests of (end-to-end − total pause) / output "
               "tokens; waste share = the server's waste (byte·s) over kv_byte_seconds, deltas over the run; recompute of "
               "forward = Δrecompute_seconds / Δforward_seconds. bench/intercept/report.py has the details.")
    if png_name:
        out.append("")
        out.append(f"![normalized latency and waste share vs rate]({png_name})")
    return "\n".join(out) + "\n"


def plot(report: dict, path: str) -> bool:
    """Normalized latency vs rate (one line per policy, the target dashed) and waste share vs rate."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    policies = report.get("config", {}).get("policies") or sorted({r["policy"] for r in report["runs"]})
    for p in policies:
        runs = sorted((r for r in report["runs"] if r["policy"] == p), key=lambda r: r["rate"])
        if not runs:
            continue
        xs = [r["rate"] for r in runs]
        ys = [r["summary"]["normalized_latency_s_per_token"]["median"] if r["summary"]["completed"] else float("nan")
              for r in runs]
        ax1.plot(xs, ys, marker="o", label=p)
        ws = [((r["summary"].get("waste_share") or {}).get("total") or float("nan")) * 100 for r in runs]
        ax2.plot(xs, ws, marker="o", label=p)
    t = report["headline"]["target_s_per_token"]
    if t:
        ax1.axhline(t, color="grey", linestyle="--", linewidth=1, label="target")
    ax1.set_xlabel("request rate (req/s)")
    ax1.set_ylabel("normalized latency (s/token, median)")
    ax1.set_title("latency without pauses / output tokens")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("request rate (req/s)")
    ax2.set_ylabel("waste (% of KV byte·seconds)")
    ax2.set_title("memory waste share (preserve + recompute + swap)")
    ax2.grid(alpha=0.3)
    fig.suptitle(f"{report.get('model', '')}: {report.get('workload', '')} workload, pause scale "
                 f"{report.get('scaling', {}).get('pause_scale')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(report: dict, base: str) -> list[str]:
    """base.json, base.md and base.png (when matplotlib is there); returns the files written."""
    files = [base + ".json"]
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isinf(o) else str(o))
    png = base + ".png"
    have_png = plot(report, png)
    with open(base + ".md", "w") as f:
        f.write(markdown(report, os.path.basename(png) if have_png else None))
    files.append(base + ".md")
    if have_png:
        files.append(png)
    return files


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Rewrites an intercept benchmark's .md and .png from its .json "
                                             "(optionally with another latency target).")
    ap.add_argument("json")
    ap.add_argument("--target-factor", type=float, default=None)
    ap.add_argument("--target-s", type=float, default=None)
    a = ap.parse_args(argv)
    with open(a.json) as f:
        report = json.load(f)
    for run in report["runs"]:
        run["rate"] = float(run["rate"])
    if a.target_factor is not None or a.target_s is not None:
        report["headline"] = headline(report["runs"], a.target_factor or 2.0, a.target_s)
    base = a.json[:-5] if a.json.endswith(".json") else a.json
    for p in write(report, base):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
