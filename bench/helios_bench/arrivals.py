"""Arrival processes for helios-bench (standard library only).

* Poisson at a request rate (burstiness 1): exponential inter-arrival times, mean 1/rate.
* Gamma (burstiness != 1): inter-arrival times ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)),
  as vLLM's benchmark_serving --burstiness: the mean stays 1/rate, the coefficient of variation is
  1/sqrt(burstiness) (< 1: more regular than Poisson, > 1: burstier).
* All at once: rate = inf, every offset 0.
* Rate sweeps: ``parse_rates("1,2,4,inf")`` or ``parse_rates("1:8:1")`` (start:stop:step, stop included).
* Fixed concurrency is not an arrival process: the runner keeps N requests in flight (rate inf + a
  concurrency limit, as vLLM's --max-concurrency).
"""

from __future__ import annotations

import math
import random


def arrival_times(num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send-time offsets in seconds from the start of the run, non-decreasing, the first at 0 (vLLM sends
    the first request at once and sleeps an inter-arrival time after each). rate=inf -> all 0."""
    if num_requests < 0:
        raise ValueError("num_requests must be >= 0")
    if math.isnan(request_rate) or request_rate <= 0:
        raise ValueError(f"request_rate must be > 0 (or inf), got {request_rate}")
    if math.isnan(burstiness) or burstiness <= 0 or math.isinf(burstiness):
        raise ValueError(f"burstiness must be a positive finite number, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    for i in range(num_requests):
        if i > 0:
            if burstiness == 1.0:
                t += rng.expovariate(request_rate)
            else:
                t += rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))
        out.append(t)
    return out


def parse_rates(spec: str) -> list[float]:
    """'1,2,4,inf' -> [1, 2, 4, inf]; '1:8:2' -> [1, 3, 5, 7]; '2:8:2' -> [2, 4, 6, 8] (stop included)."""
    rates: list[float] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            fields = part.split(":")
            if len(fields) != 3:
                raise ValueError(f"bad rate range {part!r}: expected start:stop:step")
            start, stop, step = (float(x) for x in fields)
            if step <= 0 or stop < start or math.isinf(stop):
                raise ValueError(f"bad rate range {part!r}: need finite start <= stop and step > 0")
            n = int(math.floor((stop - start) / step + 1e-9))
            rates.extend(round(start + k * step, 10) for k in range(n + 1))
        else:
            try:
                rates.append(float(part))
            except ValueError:
                raise ValueError(f"bad request rate {part!r}: expected a number or inf") from None
    for r in rates:
        if math.isnan(r) or r <= 0:
            raise ValueError(f"request rates must be > 0 (or inf), got {r}")
    if not rates:
        raise ValueError(f"no request rate in {spec!r}")
    return rates
