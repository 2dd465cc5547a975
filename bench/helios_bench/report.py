"""The benchmark's results: one JSON file (commit, command line, configs, model, backend, machine,
every run's summary, server time series and per-request records), a Markdown summary (tables like
vLLM's benchmark_serving output; in compare mode one table of ratios against the first config),
and consistency checks of a report."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path

from .client import SOURCE_DIR
from .metrics import LATENCY_METRICS, describe

SCHEMA = "helios-bench/1"

# Rows of the per-run table: (summary key, label, format).
MAIN_ROWS = [
    ("completed", "Successful requests", "{:d}"),
    ("failed", "Failed requests", "{:d}"),
    ("not_sent", "Not sent (deadline)", "{:d}"),
    ("duration_s", "Benchmark duration (s)", "{:.2f}"),
    ("total_input_tokens", "Total input tokens", "{:d}"),
    ("total_output_tokens", "Total generated tokens", "{:d}"),
    ("request_throughput", "Request throughput (req/s)", "{:.2f}"),
    ("goodput", "Request goodput (req/s)", "{:.2f}"),
    ("output_throughput", "Output token throughput (tok/s)", "{:.2f}"),
    ("total_token_throughput", "Total token throughput (tok/s)", "{:.2f}"),
]
LATENCY_TITLES = {"ttft_ms": "Time to First Token", "tpot_ms": "Time per Output Token (excl. 1st token)",
                  "itl_ms": "Inter-token Latency", "e2el_ms": "End-to-end Latency"}
SERVER_ROWS = [
    ("server_mean_batch_size", "Mean batch size (busy samples)", "{:.2f}"),
    ("server_max_batch_size", "Max batch size", "{:d}"),
    ("server_mean_kv_use", "Mean KV cache use", "{:.1%}"),
    ("server_max_kv_use", "Max KV cache use", "{:.1%}"),
    ("server_max_requests_waiting", "Max queue length (waiting)", "{:d}"),
    ("server_preemptions", "Preemptions", "{:d}"),
    ("server_samples", "Server samples", "{:d}"),
]
# Columns of the sweep table and of the compare-mode ratio table: (key, header, higher is better).
KEY_METRICS = [
    ("request_throughput", "req/s", True),
    ("output_throughput", "out tok/s", True),
    ("goodput", "goodput", True),
    ("mean_ttft_ms", "mean TTFT", False),
    ("p99_ttft_ms", "p99 TTFT", False),
    ("mean_tpot_ms", "mean TPOT", False),
    ("p99_tpot_ms", "p99 TPOT", False),
    ("mean_itl_ms", "mean ITL", False),
    ("mean_e2el_ms", "mean E2EL", False),
    ("p99_e2el_ms", "p99 E2EL", False),
    ("server_mean_batch_size", "mean batch", True),
]

# Server-side definitions (metrics.METRIC_DEFINITIONS has the client-side ones).
SERVER_DEFINITIONS = {
    "planned": "requests in the workload for the run",
    "sent": "requests actually sent (completed + failed); fewer than planned when --max-seconds cut the run",
    "not_sent": "planned requests never sent because the deadline came first",
    "cancelled": "sent requests still streaming at the deadline, cancelled by the client (counted in failed)",
    "requested_output_tokens": "sum of max_tokens (= output_len) over the sent requests",
    "server_mean_batch_size": "mean of GetServerStatus.batch_size (sequences in the engine's last step) "
                              "over the samples taken while requests ran or waited",
    "server_max_batch_size": "largest sampled batch_size",
    "server_mean_kv_use": "mean of kv_blocks_used / kv_blocks_total over all samples",
    "server_max_kv_use": "largest sampled KV cache use",
    "server_max_requests_waiting": "longest sampled queue (requests_waiting)",
    "server_max_requests_running": "most requests running at a sample",
    "server_preemptions": "preemptions counter at the last sample minus at the first",
    "server_samples": "GetServerStatus samples taken (every --sample-interval-ms)",
    "exit_layer_histogram": "generated tokens by the layer they left the stack at (1-based; = n_layers "
                            "without early exit), from GeneratedToken.exit_layer",
}


# ---------------------------------------------------------------------------------------------
# Environment.

def _run(cmd, cwd=SOURCE_DIR) -> str:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit_info() -> dict:
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))
    return {"commit": commit or "unknown", "dirty": dirty, "describe": _run(["git", "log", "-1", "--format=%h %s"])}


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "memory_gib": round(mem / 2**30, 1) if mem else None, "platform": platform.platform(),
            "python": platform.python_version(), "load_average_at_start": load}


# ---------------------------------------------------------------------------------------------
# The report.

def build_report(*, command: str, args: dict, dataset: dict, targets: list[dict], runs: list[dict],
                 requests: list[dict] | None = None, started_at: str | None = None, machine: dict | None = None,
                 commit: dict | None = None) -> dict:
    models = [t.get("model", {}) for t in targets]
    backends = sorted({m.get("backend", "") for m in models if m.get("backend")})
    return {
        "schema": SCHEMA,
        "started_at": started_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "args": args,
        "commit": commit if commit is not None else commit_info(),
        "machine": machine if machine is not None else machine_info(),
        "backend": ",".join(backends),
        "model": models[0] if models else {},
        "dataset": dataset,
        "targets": targets,
        "runs": runs,
        "workload": requests or [],
        "metric_definitions": metric_definitions(),
    }


def metric_definitions() -> dict:
    from .metrics import METRIC_DEFINITIONS
    return {**METRIC_DEFINITIONS, **SERVER_DEFINITIONS}


def write_json(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=_json_default, allow_nan=True)
        f.write("\n")


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# ---------------------------------------------------------------------------------------------
# Markdown.

def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        if fmt == "{:d}":
            return f"{int(value):d}"
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _stat_keys(summary: dict, metric: str) -> list[str]:
    """mean, median, then the percentiles in order (std and count left out)."""
    keys = [k for k in (f"mean_{metric}", f"median_{metric}") if k in summary]
    ps = []
    for k in summary:
        m = re.fullmatch(rf"p(\d+(?:\.\d+)?)_{metric}", k)
        if m:
            ps.append((float(m.group(1)), k))
    return keys + [k for _, k in sorted(ps)]


def _stat_label(key: str, metric: str) -> str:
    stat = key[: -len(metric) - 1]
    name = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2EL"}[metric]
    if stat == "mean":
        return f"Mean {name} (ms)"
    if stat == "median":
        return f"Median {name} (ms)"
    return f"P{stat[1:]} {name} (ms)"


def run_table(run: dict) -> list[str]:
    """The run's numbers as vLLM's benchmark_serving prints them, as a two-column table."""
    s = run["summary"]
    lines = ["| metric | value |", "|---|---:|"]
    for key, label, fmt in MAIN_ROWS:
        if key in s:
            lines.append(f"| {label} | {_fmt(s[key], fmt)} |")
    for metric in LATENCY_METRICS:
        lines.append(f"| **{LATENCY_TITLES[metric]}** | |")
        for key in _stat_keys(s, metric):
            if key == f"p50_{metric}" and f"median_{metric}" in s:
                continue
            lines.append(f"| {_stat_label(key, metric)} | {s[key]:.2f} |")
    lines.append("| **Server (sampled GetServerStatus)** | |")
    for key, label, fmt in SERVER_ROWS:
        if key in s:
            lines.append(f"| {label} | {_fmt(s[key], fmt)} |")
    return lines


def sweep_table(runs: list[dict]) -> list[str]:
    """One row per run: the settings and the key metrics (ms for latencies)."""
    cols = [(k, h) for k, h, _ in KEY_METRICS if any(k in r["summary"] for r in runs)]
    head = "| run | rate (req/s) | completed | failed | duration s | " + " | ".join(h for _, h in cols) + " |"
    lines = [head, "|" + "---|" * (5 + len(cols))]
    for r in runs:
        s = r["summary"]
        vals = " | ".join(_fmt(s.get(k), "{:.2f}") for k, _ in cols)
        lines.append(f"| {r['label']} | {_rate_text(r['request_rate'])} | {s['completed']} | {s['failed']} | "
                     f"{s['duration_s']:.1f} | {vals} |")
    return lines


def _rate_text(rate) -> str:
    if rate is None:
        return "trace"
    return "inf" if rate == "inf" else f"{float(rate):g}"


def compare_rows(report: dict) -> list[dict]:
    """Compare mode: each run's key metrics divided by those of the first target's run at the same
    rate. Returns [{label, target, rate, ratios: {key: ratio or None}}]."""
    runs = report["runs"]
    targets = [t["label"] for t in report["targets"]]
    if len(targets) < 2:
        return []
    base = {str(r["request_rate"]): r for r in runs if r["target"] == targets[0]}
    rows = []
    for r in runs:
        b = base.get(str(r["request_rate"]))
        if b is None:
            continue
        ratios = {}
        for key, _, _ in KEY_METRICS:
            x, y = r["summary"].get(key), b["summary"].get(key)
            ratios[key] = (x / y) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None
        rows.append({"label": r["label"], "target": r["target"], "rate": r["request_rate"], "ratios": ratios})
    return rows


def markdown(report: dict, png_files: list[str] | None = None) -> str:
    c = report["commit"]
    m = report["machine"]
    model = report.get("model") or {}
    ds = report.get("dataset") or {}
    out = [f"# helios-bench: serving benchmark ({report['started_at']})", ""]
    out += ["```", report["command"], "```", ""]
    out.append(f"- commit: `{c.get('commit', '')[:12]}`{' (dirty tree)' if c.get('dirty') else ''} "
               f"{c.get('describe', '')}")
    out.append(f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB; "
               f"load average at start {m.get('load_average_at_start')}")
    if model:
        out.append(f"- model: {model.get('name')} ({model.get('architecture')}, {model.get('n_layers')} layers, "
                   f"{model.get('n_parameters', 0) / 1e6:.1f} M parameters), backend {report.get('backend')}")
    out.append(f"- dataset: {ds.get('name')} {ds.get('path') or ''} — {ds.get('num_requests')} requests, "
               f"{ds.get('total_prompt_tokens')} prompt and {ds.get('total_output_tokens')} output tokens")
    for note in ds.get("notes", []):
        out.append(f"  - {note}")
    for t in report["targets"]:
        where = f"started from `{t['config_path']}`" if t.get("managed") else f"running at {t['address']}"
        out.append(f"- server `{t['label']}`: heliosd {where}")
    a = report.get("args", {})
    out.append(f"- load: request rate(s) {a.get('request_rate')}, burstiness {a.get('burstiness')}, "
               f"max concurrency {a.get('max_concurrency') or 'none'}, max seconds {a.get('max_seconds') or 'none'}; "
               f"greedy unless a temperature is given (temperature {a.get('temperature', 0)}); ignore_eos, "
               "max_tokens = output length")
    out.append("")
    runs = report["runs"]
    out += ["## Summary", ""] + sweep_table(runs) + [""]
    out.append("Latencies in ms. req/s, out tok/s and goodput count completed requests only.")
    out.append("")
    rows = compare_rows(report)
    if rows:
        first = report["targets"][0]["label"]
        cols = [(k, h, hb) for k, h, hb in KEY_METRICS]
        out += [f"## Compare: ratios against `{first}` (same requests, same arrival times)", ""]
        out.append("| run | " + " | ".join(h for _, h, _ in cols) + " |")
        out.append("|---|" + "---:|" * len(cols))
        for r in rows:
            out.append(f"| {r['label']} | " + " | ".join(
                "-" if r["ratios"][k] is None else f"{r['ratios'][k]:.2f}" for k, _, _ in cols) + " |")
        out += ["", "Ratio > 1 is better for " + ", ".join(h for _, h, hb in cols if hb) +
                "; < 1 is better for the latencies.", ""]
    for r in runs:
        out += [f"## Run `{r['label']}`", ""] + run_table(r) + [""]
        la = r.get("load_average")
        if la:
            out += [f"Machine load average (1/5/15 min) at the run's start {la['start']}, end {la['end']}.", ""]
        hist = r.get("exit_layer_histogram") or {}
        if hist:
            total = sum(hist.values())
            out.append("Exit layers: " + ", ".join(f"{k}: {v} ({v / total:.0%})" for k, v in hist.items()))
            out.append("")
        errors = r["summary"].get("errors")
        if errors:
            out.append("Errors: " + "; ".join(f"{n} × {e}" for e, n in errors.items()))
            out.append("")
    if png_files:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in png_files] + [""]
    problems = check_report(report)
    out += ["## Consistency checks", ""]
    out += [f"- FAILED: {p}" for p in problems] if problems else ["- all passed (completed + failed = sent; output "
                                                                    "tokens = requested; percentiles ordered; "
                                                                    "server samples present)"]
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Consistency.

def check_report(report: dict) -> list[str]:
    """What is wrong with a report (empty when complete and consistent): required fields; per run
    completed + failed = sent ≤ planned, output tokens of completed requests = their requested
    output lengths (ignore_eos), statistics ordered (median ≤ p90 ≤ p99 ≤ max of requests),
    per-request records matching the summary, server samples present."""
    problems = []
    for key in ("schema", "command", "commit", "machine", "model", "backend", "dataset", "targets", "runs"):
        if key not in report:
            problems.append(f"missing top-level key {key}")
    if not report.get("runs"):
        problems.append("no runs")
    for r in report.get("runs", []):
        s, name = r["summary"], r["label"]
        reqs = r.get("requests", [])
        if s["completed"] + s["failed"] != s["sent"]:
            problems.append(f"{name}: completed {s['completed']} + failed {s['failed']} != sent {s['sent']}")
        if s["sent"] + s["not_sent"] != s["planned"]:
            problems.append(f"{name}: sent + not_sent != planned")
        if len(reqs) != s["sent"]:
            problems.append(f"{name}: {len(reqs)} request records for {s['sent']} sent")
        ok = [q for q in reqs if q["ok"]]
        if len(ok) != s["completed"]:
            problems.append(f"{name}: {len(ok)} ok records but completed = {s['completed']}")
        out_tokens = sum(q["output_len"] for q in ok)
        if out_tokens != s["total_output_tokens"]:
            problems.append(f"{name}: records hold {out_tokens} output tokens, summary {s['total_output_tokens']}")
        want = sum(q["requested_output_len"] for q in ok)
        if out_tokens != want:
            problems.append(f"{name}: completed requests generated {out_tokens} tokens, asked for {want}")
        for q in ok:
            if len(q["token_times_s"]) != q["output_len"]:
                problems.append(f"{name}: request {q['index']} has {len(q['token_times_s'])} token times for "
                                f"{q['output_len']} tokens")
                break
        if s["cancelled"] > s["failed"]:
            problems.append(f"{name}: cancelled > failed")
        for metric in LATENCY_METRICS:
            keys = [k for k in _stat_keys(s, metric) if not k.startswith("mean_")]
            vals = [s[k] for k in keys]
            if any(b < a - 1e-9 for a, b in zip(vals, vals[1:])):
                problems.append(f"{name}: {metric} statistics not ordered: " +
                                ", ".join(f"{k}={v:.3f}" for k, v in zip(keys, vals)))
            if s[f"count_{metric}"] and not all(v >= 0 for v in vals):
                problems.append(f"{name}: negative {metric}")
        if s["completed"] and not s["duration_s"] > 0:
            problems.append(f"{name}: duration not positive")
        if s["completed"] and abs(s["output_throughput"] * s["duration_s"] - s["total_output_tokens"]) > 1e-6 * max(1, s["total_output_tokens"]):
            problems.append(f"{name}: output_throughput × duration != total output tokens")
        if r.get("server_sampled", True) and (s.get("server_samples", 0) < 1 or not r.get("server_series")):
            problems.append(f"{name}: no server samples")
        hist = r.get("exit_layer_histogram") or {}
        tokens_streamed = sum(q["output_len"] for q in reqs)
        if hist and sum(hist.values()) != tokens_streamed:
            problems.append(f"{name}: exit-layer histogram holds {sum(hist.values())} tokens, "
                            f"{tokens_streamed} were streamed")
    return problems


def describe_all() -> list[tuple[str, str]]:
    """(name, definition) of every metric in the report, for --help."""
    from .metrics import METRIC_DEFINITIONS
    rows = [(k, v) for k, v in METRIC_DEFINITIONS.items()]
    rows += list(SERVER_DEFINITIONS.items())
    return rows


__all__ = ["build_report", "write_json", "markdown", "check_report", "compare_rows", "describe_all",
           "commit_info", "machine_info", "describe"]
