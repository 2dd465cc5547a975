"""Client-side serving metrics for helios-bench, as vLLM's benchmark_serving computes them
(standard library only). Times are measured by the client with time.perf_counter().

Per request (successful ones only):
  TTFT  = first token time - send time
  TPOT  = (last token time - first token time) / (tokens - 1)   (requests with < 2 tokens excluded)
  ITL   = gaps between consecutive tokens, pooled over all requests (tokens that arrive in the same
          message give gaps of 0)
  E2EL  = end - send time
Totals: tokens and throughputs count successful requests only. Statistics of an empty set are 0 (as
vLLM). Goodput = successful requests meeting every stated SLO, per second of the run.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    ok: bool
    error: str
    prompt_len: int
    output_len: int  # tokens actually received
    start: float  # time.perf_counter() when sent
    token_times: list[float] = field(default_factory=list)  # perf_counter() when each token arrived
    end: float = 0.0


@dataclass
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def stated(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms),
                                  ("e2el_ms", self.e2el_ms)) if v is not None}


LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")

METRIC_DEFINITIONS: dict[str, str] = {
    "completed": "requests that finished without error",
    "failed": "requests that ended with an error (not counted in tokens, throughputs or latencies)",
    "duration_s": "wall time of the run, from the first request sent to the last response done (s)",
    "total_input_tokens": "sum of prompt tokens of the completed requests",
    "total_output_tokens": "sum of generated tokens received by the completed requests",
    "request_throughput": "completed requests per second (completed / duration_s)",
    "input_throughput": "prompt tokens of completed requests per second (tok/s)",
    "output_throughput": "generated tokens received per second (tok/s)",
    "total_token_throughput": "input plus output tokens per second (tok/s)",
    "ttft_ms": "time to first token: first token received - request sent (ms)",
    "tpot_ms": "time per output token after the first: (last token - first token) / (tokens - 1), "
               "per request; requests with one token excluded (ms)",
    "itl_ms": "inter-token latency: gap between consecutive tokens of a request, pooled over all "
              "requests; tokens sharing a message give 0 (ms)",
    "e2el_ms": "end-to-end latency: response done - request sent (ms)",
    "goodput": "completed requests per second that meet every stated SLO (TTFT, TPOT, E2EL); "
               "a one-token request meets a TPOT SLO",
    "good_completed": "completed requests that meet every stated SLO",
    "mean_*": "arithmetic mean over the requests (or gaps, for ITL)",
    "median_*": "50th percentile (linear interpolation)",
    "std_*": "population standard deviation",
    "pN_*": "N-th percentile, linear interpolation between order statistics (numpy's default)",
    "count_*": "how many values the statistics are over (requests, or gaps for ITL)",
    "slo": "the stated SLOs (ms) that goodput is measured against",
    "errors": "the most frequent error messages of failed requests, with counts",
}


def describe(key: str) -> str:
    """Definition of a summary key, e.g. 'p99_ttft_ms' -> 'N-th percentile ...: time to first token ...'."""
    if key in METRIC_DEFINITIONS:
        return METRIC_DEFINITIONS[key]
    for base in LATENCY_METRICS:
        if key.endswith("_" + base):
            stat = key[: -len(base) - 1]
            stat_key = "pN_*" if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit() else stat + "_*"
            if stat_key in METRIC_DEFINITIONS:
                return f"{METRIC_DEFINITIONS[stat_key]}; {METRIC_DEFINITIONS[base]}"
    raise KeyError(key)


def percentile(values: list[float], p: float) -> float:
    """p-th percentile (0..100) with linear interpolation between order statistics, like
    numpy.percentile's default ('linear'): rank = p/100 * (n-1)."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= p <= 100 or math.isnan(p):
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    xs = sorted(values)
    rank = p / 100.0 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    frac = rank - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def _pword(p: float) -> str:
    return str(int(p)) if float(p) == int(p) else str(p)


def request_latencies(r: RequestResult) -> dict[str, float | None]:
    """TTFT, TPOT, E2EL of one request in ms (None where undefined) and its ITL gaps."""
    tt = r.token_times
    ttft = (tt[0] - r.start) * 1e3 if tt else None
    tpot = (tt[-1] - tt[0]) / (len(tt) - 1) * 1e3 if len(tt) >= 2 else None
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": (r.end - r.start) * 1e3}


def meets_slo(r: RequestResult, slo: Slo) -> bool:
    """Whether a completed request meets every stated SLO (no token at all fails a TTFT SLO;
    a request with fewer than two tokens meets a TPOT SLO, as vLLM, where its TPOT is 0)."""
    if not r.ok:
        return False
    lat = request_latencies(r)
    if slo.ttft_ms is not None and (lat["ttft_ms"] is None or lat["ttft_ms"] > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None and lat["tpot_ms"] is not None and lat["tpot_ms"] > slo.tpot_ms:
        return False
    if slo.e2el_ms is not None and lat["e2el_ms"] > slo.e2el_ms:
        return False
    return True


def summarize(results: list[RequestResult], duration_s: float, percentiles=(50, 90, 99),
              slo: Slo | None = None) -> dict:
    """Aggregates request results into vLLM-style metrics (see METRIC_DEFINITIONS)."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    series: dict[str, list[float]] = {m: [] for m in LATENCY_METRICS}
    for r in ok:
        lat = request_latencies(r)
        for m in ("ttft_ms", "tpot_ms", "e2el_ms"):
            if lat[m] is not None:
                series[m].append(lat[m])
        tt = r.token_times
        series["itl_ms"].extend((b - a) * 1e3 for a, b in zip(tt, tt[1:]))

    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    out: dict = {
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": total_in / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
    }
    if slo is not None:
        good = sum(1 for r in ok if meets_slo(r, slo))
        out["slo"] = slo.stated()
        out["good_completed"] = good
        out["goodput"] = good / duration_s
    for m in LATENCY_METRICS:
        xs = series[m]
        out[f"mean_{m}"] = statistics.fmean(xs) if xs else 0.0
        out[f"median_{m}"] = percentile(xs, 50) if xs else 0.0
        out[f"std_{m}"] = statistics.pstdev(xs) if xs else 0.0
        for p in percentiles:
            out[f"p{_pword(p)}_{m}"] = percentile(xs, p) if xs else 0.0
        out[f"count_{m}"] = len(xs)
    if failed:
        out["errors"] = dict(Counter(r.error or "(no message)" for r in failed).most_common(10))
    return out
