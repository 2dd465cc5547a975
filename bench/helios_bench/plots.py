"""PNG plots of a report, with matplotlib's Agg backend (Debian: python3-matplotlib):
latency CDFs (TTFT, TPOT, E2EL; one line per run), output throughput against request rate (rate
sweeps; one line per server), server batch size / KV use / queue over time, exit-layer histogram."""
from __future__ import annotations

import os


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _request_latencies(run: dict):
    ttft, tpot, e2el = [], [], []
    for q in run.get("requests", []):
        if not q["ok"]:
            continue
        tt = q["token_times_s"]
        if tt:
            ttft.append(tt[0] * 1e3)
        if len(tt) >= 2:
            tpot.append((tt[-1] - tt[0]) / (len(tt) - 1) * 1e3)
        e2el.append((q["end_s"] - q["start_s"]) * 1e3)
    return {"TTFT (ms)": ttft, "TPOT (ms)": tpot, "E2E latency (ms)": e2el}


def latency_cdfs(report: dict, path: str) -> str:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for run in report["runs"]:
        for ax, (name, xs) in zip(axes, _request_latencies(run).items()):
            if not xs:
                continue
            xs = sorted(xs)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=run["label"])
    for ax, name in zip(axes, ("TTFT (ms)", "TPOT (ms)", "E2E latency (ms)")):
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
        ax.set_title(f"CDF of {name.split(' (')[0]}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, title="run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def throughput_vs_rate(report: dict, path: str) -> str | None:
    """Output tok/s and mean/p99 TTFT against the request rate (inf drawn at 1.5 × the largest
    finite rate, marked); None when fewer than two rates were run."""
    by_target: dict[str, list] = {}
    for run in report["runs"]:
        rate = run["request_rate"]
        if rate is None:
            continue
        by_target.setdefault(run["target"], []).append((rate, run["summary"]))
    if not any(len(v) >= 2 for v in by_target.values()):
        return None
    finite = [float(r) for v in by_target.values() for r, _ in v if r != "inf"]
    inf_x = (max(finite) * 1.5) if finite else 1.0
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for target, points in by_target.items():
        pts = sorted((((inf_x if r == "inf" else float(r)), s) for r, s in points), key=lambda p: p[0])
        xs = [x for x, _ in pts]
        ax1.plot(xs, [s["output_throughput"] for _, s in pts], marker="o", label=target)
        ax2.plot(xs, [s["mean_ttft_ms"] for _, s in pts], marker="o", label=f"{target} mean")
        p99 = [s.get("p99_ttft_ms") for _, s in pts]
        if all(v is not None for v in p99):
            ax2.plot(xs, p99, marker="x", linestyle="--", label=f"{target} p99")
    for ax in (ax1, ax2):
        ax.set_xlabel("request rate (req/s)" + ("; last point = inf (all at once)"
                                                if any(r == "inf" for v in by_target.values() for r, _ in v) else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ticks = sorted({x for target, points in by_target.items()
                    for x in ((inf_x if r == "inf" else float(r)) for r, _ in points)})
    for ax in (ax1, ax2):
        ax.set_xticks(ticks, ["inf" if x == inf_x and any(r == "inf" for v in by_target.values() for r, _ in v)
                              else f"{x:g}" for x in ticks])
    ax1.set_ylabel("output throughput (tok/s)")
    ax1.set_title("Output throughput vs request rate")
    ax2.set_ylabel("TTFT (ms)")
    ax2.set_title("TTFT vs request rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def server_timeseries(report: dict, path: str) -> str | None:
    runs = [r for r in report["runs"] if r.get("server_series")]
    if not runs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(13, 7), sharex=False)
    panels = [("batch_size", "batch size (sequences in the last step)"),
              ("kv_use", "KV cache use (fraction of blocks)"),
              ("requests_waiting", "queue length (requests waiting)"),
              ("preemptions", "preemptions (cumulative, from the run's start)")]
    for run in runs:
        series = run["server_series"]
        ts = [s["t"] for s in series]
        base_pre = series[0]["preemptions"]
        for ax, (key, _) in zip(axes.flat, panels):
            ys = [s[key] - base_pre if key == "preemptions" else s[key] for s in series]
            ax.plot(ts, ys, label=run["label"], linewidth=1)
    for ax, (_, title) in zip(axes.flat, panels):
        ax.set_title(title)
        ax.set_xlabel("time since the run's start (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes.flat[1].set_ylim(0, 1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def exit_layers(report: dict, path: str) -> str | None:
    runs = [r for r in report["runs"] if r.get("exit_layer_histogram")]
    if not runs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    layers = sorted({int(k) for r in runs for k in r["exit_layer_histogram"]})
    width = 0.8 / len(runs)
    for j, run in enumerate(runs):
        h = run["exit_layer_histogram"]
        total = sum(h.values()) or 1
        ax.bar([x + j * width for x in range(len(layers))], [h.get(str(l), 0) / total for l in layers],
               width=width, label=run["label"])
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(layers))], [str(l) for l in layers])
    ax.set_xlabel("exit layer (1-based)")
    ax.set_ylabel("fraction of generated tokens")
    ax.set_title("Exit-layer histogram")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def make_plots(report: dict, prefix: str) -> list[str]:
    """Writes PREFIX_latency_cdf.png, PREFIX_throughput_vs_rate.png (sweeps), PREFIX_server.png,
    PREFIX_exit_layers.png; returns the paths written."""
    out = [latency_cdfs(report, prefix + "_latency_cdf.png"),
           throughput_vs_rate(report, prefix + "_throughput_vs_rate.png"),
           server_timeseries(report, prefix + "_server.png"),
           exit_layers(report, prefix + "_exit_layers.png")]
    return [p for p in out if p and os.path.exists(p)]


__all__ = ["available", "make_plots", "latency_cdfs", "throughput_vs_rate", "server_timeseries", "exit_layers"]
