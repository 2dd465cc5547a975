"""Server-side time series of a benchmark run: GetServerStatus (and GetModelInfo, for the loaded
model and depth) every N ms, on a thread of its own with a blocking channel, so that a busy
asyncio loop in the load generator does not delay the samples."""
from __future__ import annotations

import threading
import time

import grpc

from .client import SyncClient

# The fields kept from each sample, in the report's order.
FIELDS = ("t", "state", "requests_waiting", "requests_running", "requests_swapped", "batch_size",
          "batch_tokens", "kv_blocks_used", "kv_blocks_total", "kv_use", "steps_per_second", "preemptions",
          "requests_total", "generated_tokens_total", "model", "loaded_layers",
          "group_phase", "group_model", "group_depth", "group_decisions", "group_last_decision")


class ServerSampler:
    """Start before the run, stop after it; samples are dicts with t = perf_counter seconds
    (the runner makes them relative to the run's start)."""

    def __init__(self, address: str, model: str = "", interval_ms: float = 250.0, metadata=None):
        self.client = SyncClient(address, model, metadata=metadata)
        self.interval_s = max(0.01, interval_ms / 1000.0)
        self.samples: list[dict] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> dict | None:
        try:
            s = self.client.status(timeout=5)
        except grpc.RpcError:
            self.errors += 1
            return None
        t = time.perf_counter()
        model, loaded = "", 0
        try:
            info = self.client.model_info(timeout=5)
            model, loaded = info.name, info.loaded_layers
        except grpc.RpcError:
            pass
        row = {
            "t": t, "state": s.state,
            "requests_waiting": s.requests_waiting, "requests_running": s.requests_running,
            "requests_swapped": s.requests_swapped, "batch_size": s.batch_size, "batch_tokens": s.batch_tokens,
            "kv_blocks_used": s.kv_blocks_used, "kv_blocks_total": s.kv_blocks_total,
            "kv_use": (s.kv_blocks_used / s.kv_blocks_total) if s.kv_blocks_total else 0.0,
            "steps_per_second": s.steps_per_second, "preemptions": s.preemptions,
            "requests_total": s.requests_total, "generated_tokens_total": s.generated_tokens_total,
            "model": model, "loaded_layers": loaded,
        }
        # A model group (the first): what its manager serves and how many decisions it has made.
        groups = list(getattr(s, "groups", []))
        g = groups[0] if groups else None
        row.update({
            "group_phase": g.phase if g else "", "group_model": g.model if g else "",
            "group_depth": g.loaded_depth if g else 0, "group_decisions": len(g.decisions) if g else 0,
            "group_last_decision": g.decisions[-1].decision if g and g.decisions else "",
        })
        self.samples.append(row)
        return row

    def _loop(self):
        next_t = time.perf_counter()
        while not self._stop.is_set():
            self.sample_once()
            next_t += self.interval_s
            delay = next_t - time.perf_counter()
            if delay < 0:             # fell behind (slow answers): do not burst to catch up
                next_t = time.perf_counter()
                delay = 0
            self._stop.wait(delay)

    def start(self):
        self._thread = threading.Thread(target=self._loop, name="server-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.sample_once()            # the state right after the run
        self.client.close()
        return self.samples


def summarize_samples(samples: list[dict]) -> dict:
    """Server-side numbers of a run from its samples: mean/max batch size (of samples with a batch),
    mean/max KV use, max queue length, preemptions during the run."""
    if not samples:
        return {"server_samples": 0}
    busy = [s for s in samples if s["requests_running"] > 0 or s["requests_waiting"] > 0]
    batch = [s["batch_size"] for s in busy] or [0]
    kv = [s["kv_use"] for s in samples]
    return {
        "server_samples": len(samples),
        "server_mean_batch_size": sum(batch) / len(batch),
        "server_max_batch_size": max(s["batch_size"] for s in samples),
        "server_mean_kv_use": sum(kv) / len(kv),
        "server_max_kv_use": max(kv),
        "server_max_requests_waiting": max(s["requests_waiting"] for s in samples),
        "server_max_requests_running": max(s["requests_running"] for s in samples),
        "server_preemptions": samples[-1]["preemptions"] - samples[0]["preemptions"],
    }
