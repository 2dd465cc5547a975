"""The load generator: sends benchmark requests to heliosd on an arrival schedule (Poisson / Gamma at
a rate, all at once, or a trace's own times), optionally under a concurrency limit, bounded by a
request count and a wall-clock deadline; samples the server meanwhile; runs rate sweeps and several
server configs (compare mode) on the same sampled requests."""
from __future__ import annotations

import asyncio
import collections
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from .arrivals import arrival_times
from .client import AsyncClient, Extra, SamplingOptions, SyncClient
from .metrics import RequestResult, Slo, summarize
from .server_sampler import ServerSampler, summarize_samples


# ---------------------------------------------------------------------------------------------
# Progress bar (stderr).

def message_dict(message) -> dict:
    """A protobuf message as plain JSON-ready values, every field present (nested and repeated too)."""
    def value(field, v):
        return message_dict(v) if field.type == field.TYPE_MESSAGE else v

    return {f.name: [value(f, x) for x in getattr(message, f.name)] if f.label == f.LABEL_REPEATED
            else value(f, getattr(message, f.name)) for f in message.DESCRIPTOR.fields}


class Progress:
    """One line on stderr, redrawn in place on a terminal (at most 10 times a second); elsewhere
    (logs, ctest) a line every 10 % of the requests or 10 s."""

    def __init__(self, total: int, label: str, enabled: bool = True, max_seconds: float | None = None):
        self.total = max(1, total)
        self.label = label
        self.enabled = enabled
        self.max_seconds = max_seconds
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.sent = self.done = self.failed = self.tokens = 0
        self._last_draw = 0.0
        self._last_pct = -1

    def update(self, force: bool = False):
        if not self.enabled:
            return
        now = time.perf_counter()
        elapsed = now - self.t0
        pct = int(100 * (self.done + self.failed) / self.total)
        if self.tty:
            if not force and now - self._last_draw < 0.1:
                return
        elif not force and pct // 10 == self._last_pct // 10 and now - self._last_draw < 10:
            return
        self._last_draw, self._last_pct = now, pct
        width = 30
        fill = int(width * (self.done + self.failed) / self.total)
        bar = "#" * fill + "-" * (width - fill)
        limit = f"/{self.max_seconds:.0f}" if self.max_seconds else ""
        line = (f"{self.label} [{bar}] {self.done + self.failed}/{self.total} done ({self.failed} failed), "
                f"{self.sent - self.done - self.failed} in flight, {elapsed:.0f}{limit} s, "
                f"{self.tokens / elapsed if elapsed > 0 else 0:.0f} tok/s")
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self):
        if not self.enabled:
            return
        self.update(force=True)
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# One run: the requests on one server at one arrival setting.

@dataclass
class RunSpec:
    request_rate: float | None            # req/s; inf = all at once; None = the trace's own times
    burstiness: float = 1.0
    max_concurrency: int | None = None
    max_seconds: float | None = None
    seed: int = 0


@dataclass
class RunOutcome:
    results: list[RequestResult]           # one per SENT request, in request order
    extras: list[Extra]                    # same order
    indices: list[int]                     # index into the request list of each sent request
    planned: int
    t0: float                              # perf_counter at the start
    duration_s: float
    cut_by_deadline: bool
    offsets: list[float] = field(default_factory=list)


def schedule(requests, spec: RunSpec) -> list[float]:
    """Send offsets (s from the start) of each request."""
    n = len(requests)
    if spec.request_rate is None:
        arr = [r.arrival_s for r in requests]
        if any(a is None for a in arr):
            raise ValueError("these requests have no arrival times: give --request-rate")
        first = min(arr) if arr else 0.0
        return [a - first for a in arr]
    return arrival_times(n, spec.request_rate, spec.burstiness, spec.seed)


async def run_load(client: AsyncClient, requests, spec: RunSpec, tag: str = "run",
                   progress: Progress | None = None) -> RunOutcome:
    """Sends every request at its offset (subject to the concurrency limit), until all are done or
    the deadline: then stops sending and cancels the streams still open (they count as failed, with
    error CANCELLED; requests never sent are not counted)."""
    offsets = schedule(requests, spec)
    sem = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    t0 = time.perf_counter()
    deadline = t0 + spec.max_seconds if spec.max_seconds else math.inf
    slots: list[tuple[RequestResult, Extra] | None] = [None] * len(requests)
    progress = progress or Progress(len(requests), tag, enabled=False)
    progress.t0 = t0

    async def one(i: int):
        req = requests[i]
        if sem is not None:
            await sem.acquire()       # cancelled while waiting here: never sent
        try:
            if time.perf_counter() >= deadline:
                return
            progress.sent += 1
            result, extra = await client.generate(f"{tag}-{i}", req.prompt, req.prompt_len, req.output_len)
            slots[i] = (result, extra)
            if result.ok:
                progress.done += 1
                progress.tokens += result.output_len
            else:
                progress.failed += 1
            progress.update()
        finally:
            if sem is not None:
                sem.release()

    async def ticker():
        while True:
            await asyncio.sleep(0.5)
            progress.update()

    tick = asyncio.create_task(ticker())
    tasks: list[asyncio.Task] = []
    cut = False
    try:
        order = sorted(range(len(requests)), key=lambda i: offsets[i])
        for i in order:
            when = t0 + offsets[i]
            if when >= deadline:
                cut = True
                break
            delay = when - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() >= deadline:
                cut = True
                break
            tasks.append(asyncio.create_task(one(i)))
        if tasks:
            timeout = None if deadline == math.inf else max(0.0, deadline - time.perf_counter())
            done, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                cut = True
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter()
    finally:
        tick.cancel()
        await asyncio.gather(tick, return_exceptions=True)
    progress.close()
    results, extras, indices = [], [], []
    for i, slot in enumerate(slots):
        if slot is not None:
            results.append(slot[0])
            extras.append(slot[1])
            indices.append(i)
    return RunOutcome(results=results, extras=extras, indices=indices, planned=len(requests), t0=t0,
                      duration_s=max(end - t0, 1e-9), cut_by_deadline=cut, offsets=offsets)


# ---------------------------------------------------------------------------------------------
# A run's record in the report.

def run_record(label: str, target: str, spec: RunSpec, outcome: RunOutcome, samples: list[dict],
               requests, percentiles, slo: Slo | None) -> dict:
    """Everything the report keeps of one run: settings, client summary (metrics.summarize) plus
    counts of sent/cancelled, server summary and time series, exit layers, per-request records."""
    summary = summarize(outcome.results, outcome.duration_s, percentiles, slo)
    cancelled = sum(1 for e in outcome.extras if e.cancelled)
    summary.update({
        "planned": outcome.planned,
        "sent": len(outcome.results),
        "not_sent": outcome.planned - len(outcome.results),
        "cancelled": cancelled,
        "requested_output_tokens": sum(requests[i].output_len for i in outcome.indices),
    })
    summary.update(summarize_samples(samples))
    layers = collections.Counter()
    for e in outcome.extras:
        layers.update(e.exit_layers)
    t0 = outcome.t0
    series = []
    for s in samples:
        row = dict(s)
        row["t"] = round(s["t"] - t0, 4)
        series.append(row)
    per_request = []
    for i, r, e in zip(outcome.indices, outcome.results, outcome.extras):
        tt = r.token_times
        per_request.append({
            "index": i, "request_id": e.request_id, "ok": r.ok, "error": r.error,
            "prompt_len": r.prompt_len, "requested_output_len": requests[i].output_len, "output_len": r.output_len,
            "scheduled_s": round(outcome.offsets[i], 6), "start_s": round(r.start - t0, 6),
            "ttft_s": round(tt[0] - r.start, 6) if tt else None, "end_s": round(r.end - t0, 6),
            "token_times_s": [round(t - r.start, 6) for t in tt],
            "finish_reason": e.finish_reason, "cancelled": e.cancelled, "messages": e.messages,
            "server_prompt_tokens": e.server_prompt_tokens, "server_completion_tokens": e.server_completion_tokens,
            "server_queue_s": e.server_queue_s, "server_ttft_s": e.server_ttft_s, "server_total_s": e.server_total_s,
            "exit_layers": {str(k): v for k, v in e.exit_layers.items()},
            "token_ids": e.token_ids, "served_by": e.served_by,
        })
    return {
        "label": label,
        "target": target,
        "request_rate": spec.request_rate if spec.request_rate is None or math.isfinite(spec.request_rate) else "inf",
        "burstiness": spec.burstiness,
        "max_concurrency": spec.max_concurrency,
        "max_seconds": spec.max_seconds,
        "arrival_seed": spec.seed,
        "cut_by_deadline": outcome.cut_by_deadline,
        "summary": summary,
        "exit_layer_histogram": {str(k): v for k, v in sorted(layers.items())},
        "server_series": series,
        "requests": per_request,
    }


def rate_label(rate) -> str:
    if rate is None:
        return "trace"
    if rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
        return "inf"
    return f"{float(rate):g}"


# ---------------------------------------------------------------------------------------------
# A whole benchmark: targets (servers) × rates, on one list of requests.

@dataclass
class Target:
    """A server to benchmark: a running heliosd (address), one to start (config), or any
    OpenAI-compatible server (url)."""
    label: str
    address: str | None = None
    config: str | None = None
    url: str | None = None


def execute(targets: list[Target], load_requests, rates: list[float | None], *, burstiness: float = 1.0,
            max_concurrency: int | None = None, max_seconds: float | None = None, seed: int = 0,
            model: str = "", sampling: SamplingOptions | None = None, chat: bool = False,
            request_timeout_s: float | None = None, sample_interval_ms: float = 250.0,
            percentiles=(50, 90, 99), slo: Slo | None = None, warmup: int = 1, heliosd: str | None = None,
            metadata=None, show_progress: bool = True, log=print, server_log_prefix: str | None = None,
            backend: str = "grpc", api_key: str = ""):
    """Runs every rate on every target, each on the same requests (sampled once, with the first
    target's tokenizer, by load_requests(sync_client) → list[BenchRequest]). Returns
    (requests, runs, targets_info).

    backend "grpc": Generate streams to heliosd. "openai": streamed /v1/completions (or, with chat,
    /v1/chat/completions) requests over HTTP: to a heliosd started from a config with its HTTP API
    on (the tokenizer, status samples and model info still over gRPC), or to a server at a URL
    (any OpenAI-compatible one; no server samples)."""
    from .openai_client import OpenAiAsyncClient, OpenAiSyncClient
    from .server import ManagedServer

    requests = None
    runs: list[dict] = []
    targets_info: list[dict] = []
    for ti, target in enumerate(targets):
        over_http = target.url is not None or backend == "openai"
        server = ManagedServer(address=target.address, config=target.config, heliosd=heliosd,
                               label=target.label, model=model, metadata=metadata, url=target.url,
                               http=over_http and target.config is not None, api_key=api_key)
        if server.managed:
            log(f"starting heliosd for {target.label} from {target.config}")
        server.start()
        info: dict = {"label": target.label, "address": server.address, "config_path": target.config,
                      "config_text": server.config_text, "run_config_text": server.run_config_text,
                      "managed": server.managed, "backend": "openai" if over_http else "grpc", "url": server.url}
        try:
            if target.url is not None:
                sync = OpenAiSyncClient(target.url, model, api_key, chat)
                entry = sync.model_entry()
                helios = entry.get("owned_by") == "helios"
                info["model"] = {"name": entry.get("id", ""), "backend": "openai-http", "url": sync.root,
                                 "served": entry}
                log(f"{target.label}: OpenAI-compatible server at {sync.root}, model {entry.get('id')}"
                    f"{' (heliosd)' if helios else ''}; no server samples")
                sampled = False
            else:
                sync = SyncClient(server.address, model, metadata)
                mi = sync.model_info()
                info["model"] = message_dict(mi)
                st = sync.status()
                info["status_at_start"] = message_dict(st)
                helios = True
                sampled = True
                log(f"{target.label}: heliosd at {server.address}{' (HTTP ' + server.url + ')' if over_http else ''}, "
                    f"model {mi.name} ({mi.n_layers} layers, backend {mi.backend}), {st.kv_blocks_total} KV blocks "
                    f"of {st.kv_block_size} tokens")
            if over_http:
                def make_client(url=server.url, helios=helios):
                    return OpenAiAsyncClient(url, model, sampling, request_timeout_s, api_key, chat, helios)
            else:
                def make_client(address=server.address):
                    return AsyncClient(address, model, sampling, request_timeout_s, metadata, chat)
            if requests is None:
                t = time.perf_counter()
                requests = load_requests(sync)
                if not requests:
                    raise RuntimeError("the workload gave no requests")
                log(f"sampled {len(requests)} requests in {time.perf_counter() - t:.1f} s "
                    f"(prompt tokens {sum(r.prompt_len for r in requests)}, "
                    f"output tokens {sum(r.output_len for r in requests)})")
            for rate in rates:
                spec = RunSpec(request_rate=rate, burstiness=burstiness, max_concurrency=max_concurrency,
                               max_seconds=max_seconds, seed=seed)
                label = f"{target.label}@{rate_label(rate)}" if len(targets) > 1 else rate_label(rate)
                runs.append(_one_run(make_client, server.address if sampled else None, model, metadata,
                                     requests, spec, label, target.label, sample_interval_ms, percentiles,
                                     slo, warmup, show_progress, sync, log))
            sync.close()
        finally:
            keep = None
            if server_log_prefix and server.managed:
                keep = f"{server_log_prefix}_heliosd-{target.label}.log"
                info["log"] = keep
            code = server.stop(keep_log_to=keep)
            if server.managed:
                info["exit_code"] = code
                if code != 0:
                    log(f"warning: heliosd for {target.label} exited with {code}")
        targets_info.append(info)
    return requests, runs, targets_info


def _one_run(make_client, sample_address, model, metadata, requests, spec: RunSpec, label: str,
             target_label: str, sample_interval_ms, percentiles, slo, warmup, show_progress, sync, log):
    """One run; make_client() gives the generation client (gRPC or HTTP); sample_address: the
    heliosd whose GetServerStatus is sampled (None: no samples)."""
    if not sync.wait_idle(120):
        log("warning: the server still has requests from before; starting anyway")

    async def go():
        client = make_client()
        try:
            for w in range(warmup):       # a short request to warm up the path; not measured
                r = requests[w % len(requests)]
                await client.generate(f"warmup-{label}-{w}", r.prompt, r.prompt_len, min(r.output_len, 8))
            sampler = ServerSampler(sample_address, model, sample_interval_ms, metadata).start() \
                if sample_address else None
            progress = Progress(len(requests), f"[{label}]", enabled=show_progress, max_seconds=spec.max_seconds)
            try:
                outcome = await run_load(client, requests, spec, tag=f"bench-{label}-{os.getpid()}", progress=progress)
            finally:
                samples = sampler.stop() if sampler else []
            return outcome, samples
        finally:
            await client.close()

    load_start = _loadavg()
    outcome, samples = asyncio.run(go())
    rec = run_record(label, target_label, spec, outcome, samples, requests, percentiles, slo)
    rec["server_sampled"] = sample_address is not None
    rec["load_average"] = {"start": load_start, "end": _loadavg()}   # other work on the machine skews runs
    s = rec["summary"]
    log(f"[{label}] {s['completed']} completed, {s['failed']} failed, {s['not_sent']} not sent in "
        f"{s['duration_s']:.1f} s: {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} out tok/s, "
        f"median TTFT {s['median_ttft_ms']:.0f} ms, median TPOT {s['median_tpot_ms']:.1f} ms")
    return rec


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def requests_as_dicts(requests) -> list[dict]:
    return [dict(asdict(r), prompt_chars=len(r.prompt)) for r in requests]
