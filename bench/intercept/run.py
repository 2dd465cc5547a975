"""The intercept benchmark's sweep: for each request rate and each hold policy, the same workload
(same requests, same pauses, same arrival times per rate) against one heliosd, with
GetServerStatus's intercept counters read before and after each run.

    /usr/bin/python3 -m bench.intercept.run --rates 0.5,1,2 --n-requests 30 --pause-scale 0.1
    bench/intercept/run_intercept_bench.sh      (the same, with env vars; it fetches the model)

Starts heliosd from a YAML config it writes under /tmp (model, KV cache, threads, the
intercepts section with the pause priors scaled like the pauses), unless --address names a
running server. Writes bench/results/intercept_<model>_<UTC %Y-%m-%dT%H%MZ>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from . import report as rpt
from . import workloads as wl
from .client import SOURCE_DIR, load_stubs, run_requests


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="bench.intercept.run", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s = ap.add_argument_group("server")
    s.add_argument("--address", default=None, help="a running heliosd (HOST:PORT); default: start one")
    s.add_argument("--heliosd", default=os.environ.get("HELIOSD") or str(SOURCE_DIR / "build" / "heliosd"))
    s.add_argument("--model-path", default=str(SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    s.add_argument("--model-name", default="", help="served name (default: from the file name)")
    s.add_argument("--kv-cache", default="128MiB", help="engine.kv_cache: small, so that paused KV competes")
    s.add_argument("--prefix-caching", action="store_true",
                   help="engine.prefix_caching on (off by default: every run replays the same prompts on one server)")
    s.add_argument("--kv-cache-type", default="auto")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--backend", default="cpu")
    s.add_argument("--max-seqs", type=int, default=32)
    s.add_argument("--max-batched-tokens", type=int, default=256)
    s.add_argument("--swap-space", default="1GiB")
    s.add_argument("--no-intercepts-config", action="store_true",
                   help="leave the config's intercepts section out (server defaults: unscaled priors)")
    w = ap.add_argument_group("workload")
    w.add_argument("--workload", default="mixed", choices=wl.WORKLOADS)
    w.add_argument("--n-requests", type=int, default=30, help="per (policy, rate) run")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--data-dir", default=None, help="shared/data (default: ../shared/data or /work/shared/data)")
    w.add_argument("--max-context", type=int, default=wl.Scaling.max_context)
    w.add_argument("--max-segment-tokens", type=int, default=wl.Scaling.max_segment_tokens)
    w.add_argument("--max-intercepts", type=int, default=wl.Scaling.max_intercepts)
    w.add_argument("--max-return-tokens", type=int, default=wl.Scaling.max_return_tokens)
    w.add_argument("--pause-scale", type=float, default=1.0, help="multiplies every drawn pause (and the server's priors)")
    w.add_argument("--pause-scale-kinds", default=",".join(wl.ALL_KINDS),
                   help="pause kinds the scale applies to (e.g. chatbot,image,tts: only the human-scale ones)")
    w.add_argument("--pause-dist", default="gamma", choices=("gamma", "normal"))
    w.add_argument("--table1-spread", default="var", choices=("var", "std"),
                   help="Table 1's second number as the variance (its caption) or the standard deviation")
    w.add_argument("--token-counts", default="server", choices=("server", "estimate"),
                   help="segment lengths by the server's Tokenize, or 4 chars/token")
    r = ap.add_argument_group("sweep")
    r.add_argument("--rates", default="0.25,0.5,1", help="request rates (req/s), comma-separated")
    r.add_argument("--policies", default=",".join(rpt.POLICIES))
    r.add_argument("--max-seconds", type=float, default=None, help="per run: cancel what is left after this")
    r.add_argument("--request-timeout", type=float, default=None)
    r.add_argument("--target-factor", type=float, default=2.0,
                   help="latency target = this × min-waste's normalized latency at the lowest rate")
    r.add_argument("--target-s", type=float, default=None, help="an absolute latency target (s/token) instead")
    r.add_argument("--out-dir", default=str(SOURCE_DIR / "bench" / "results"))
    r.add_argument("--label", default="", help="output name: intercept_<label or model>_<date>")
    r.add_argument("--keep-log", action="store_true", help="copy heliosd's log next to the results")
    return ap.parse_args(argv)


# --------------------------------------------------------------------------------------------------

def server_config(a, port_placeholder: str = "127.0.0.1:0") -> str:
    name = a.model_name or model_name_of(a.model_path)
    lines = [
        "# written by bench/intercept/run.py",
        "server:",
        f'  listen: "{port_placeholder}"',
        '  metrics_listen: ""',
        "models:",
        f"  - name: {name}",
        f'    path: "{os.path.abspath(a.model_path)}"',
        "engine:",
        f"  backend: {a.backend}",
        f"  threads: {a.threads}",
        f"  kv_cache: {a.kv_cache}",
        f"  kv_cache_type: {a.kv_cache_type}",
        "  block_size: 16",
        f"  max_batched_tokens: {max(a.max_batched_tokens, a.max_seqs)}",
        f"  max_seqs: {a.max_seqs}",
        "  queue_limit: 1024",
        f"  swap_space: {a.swap_space}",
        # Off by default: one server serves every (policy, rate) run of the same prompts, and
        # cached prefixes would carry over between them (and turn every discard into a cache hit).
        f"  prefix_caching: {'true' if a.prefix_caching else 'false'}",
        "limits:",
        f"  max_tokens: {max(16, a.max_segment_tokens)}",
        f"  default_max_tokens: {max(16, a.max_segment_tokens)}",
        f"  max_prompt_tokens: {a.max_context + 64}",
        "logging:",
        "  level: info",
    ]
    if not a.no_intercepts_config:
        kinds = set(k.strip() for k in a.pause_scale_kinds.split(",") if k.strip())
        lines += ["intercepts:", "  hold: min-waste", "  pause_priors:"]
        for kind, (mean, _) in sorted(wl.TABLE1_PAUSE_S.items()):
            scale = a.pause_scale if kind in kinds else 1.0
            lines.append(f"    {kind}: {mean * scale:.6g}")
        lines += ["  profile_at_start: true", f"  paused_idle_timeout_s: {max(300, int(60 * max(1.0, a.pause_scale)))}"]
    return "\n".join(lines) + "\n"


def model_name_of(path: str) -> str:
    stem = Path(path).name.lower()
    for known, name in (("smollm2-135m", "smollm2-135m"), ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"),
                        ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b")):
        if known in stem:
            return name
    return Path(path).stem.lower().replace(".", "-")


def commit_of(root: Path = SOURCE_DIR) -> str:
    """HEAD's commit, read from .git's files (no git process)."""
    try:
        head = (root / ".git" / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        p = root / ".git" / ref
        if p.exists():
            return p.read_text().strip()
        packed = root / ".git" / "packed-refs"
        for line in packed.read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown"


def intercept_status(sync, model: str) -> dict | None:
    """This model's InterceptStatus as a dict (proto field names), or None when the server has none."""
    from google.protobuf.json_format import MessageToDict
    st = sync.status()
    items = list(getattr(st, "intercepts", []))
    for it in items:
        if not model or it.model == model:
            return MessageToDict(it, preserving_proto_field_name=True)
    return MessageToDict(items[0], preserving_proto_field_name=True) if items else None


def server_count_tokens(sync):
    """CountTokens over the Tokenize RPC without special tokens (segment and return texts are
    appended to a context, not sent as prompts), in parallel batches."""
    pb = sync.pb

    def count(texts):
        out = []
        for i in range(0, len(texts), 32):
            futs = [sync.stub.Tokenize.future(pb.TokenizeRequest(model=sync.model, text=t, add_special=False),
                                              timeout=60, metadata=sync.metadata) for t in texts[i:i + 32]]
            out += [len(f.result().token_ids) for f in futs]
        return out
    return count


def main(argv=None) -> int:
    a = parse_args(argv)
    from ..helios_bench.arrivals import arrival_times, parse_rates
    from ..helios_bench.report import machine_info
    load_stubs()
    from ..helios_bench.client import SyncClient
    from ..helios_bench.server import ManagedServer

    rates = parse_rates(a.rates)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in rpt.POLICIES]
    if bad:
        print(f"unknown policies {bad}; known: {', '.join(rpt.POLICIES)}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    command = os.environ.get("INTERCEPT_BENCH_COMMAND") or " ".join(
        ["/usr/bin/python3 -m bench.intercept.run"] + [shlex.quote(x) for x in argv_used])
    scaling = wl.Scaling(max_context=a.max_context, max_segment_tokens=a.max_segment_tokens,
                         max_intercepts=a.max_intercepts, max_return_tokens=a.max_return_tokens,
                         pause_scale=a.pause_scale,
                         pause_scale_kinds=tuple(k.strip() for k in a.pause_scale_kinds.split(",") if k.strip()),
                         pause_dist=a.pause_dist, table1_spread=a.table1_spread)
    model = a.model_name or (model_name_of(a.model_path) if not a.address else "")
    cfg_dir = None
    if a.address:
        server = ManagedServer(address=a.address, model=model)
    else:
        if not os.path.exists(a.model_path):
            print(f"no model at {a.model_path} (scripts/fetch_model.sh fetches SmolLM2)", file=sys.stderr)
            return 2
        cfg_dir = tempfile.mkdtemp(prefix="helios-intercept-")
        cfg = os.path.join(cfg_dir, "heliosd.yaml")
        with open(cfg, "w") as f:
            f.write(server_config(a))
        server = ManagedServer(config=cfg, heliosd=a.heliosd, label="intercept", model=model)
    print(f"starting heliosd ({a.heliosd})" if not a.address else f"using heliosd at {a.address}", flush=True)
    server.start()
    notes: list[str] = []
    runs: list[dict] = []
    try:
        sync = SyncClient(server.address, model)
        info = sync.model_info()
        model = model or info.name
        sync.model = model
        counter = server_count_tokens(sync) if a.token_counts == "server" else wl.estimate_tokens
        t = time.perf_counter()
        reqs = wl.build_workload(a.workload, a.n_requests, wl.Sources(a.data_dir), counter, scaling, a.seed)
        stats = wl.workload_stats(reqs)
        print(f"workload: {len(reqs)} {a.workload} requests, {sum(r.n_intercepts for r in reqs)} intercepts, "
              f"{sum(r.output_tokens for r in reqs)} output tokens, built in {time.perf_counter() - t:.1f} s", flush=True)
        if intercept_status(sync, model) is None:
            notes.append("the server's GetServerStatus has no intercepts entry: no waste figures")
        for rate in rates:
            arrivals = arrival_times(len(reqs), rate, seed=a.seed)
            for policy in policies:
                sync.wait_idle(120)
                before = intercept_status(sync, model)
                print(f"run: {policy} at {rate:g} req/s ...", flush=True)
                records, t0, t1 = asyncio.run(run_requests(server.address, reqs, arrivals, policy, model,
                                                           a.request_timeout, a.max_seconds))
                sync.wait_idle(60)
                after = intercept_status(sync, model)
                delta = rpt.intercept_delta(before, after) if (before is not None or after is not None) else None
                recs = [r.to_dict(t0) for r in records]
                summary = rpt.summarize_run(recs, t1 - t0, delta)
                w = (summary.get("waste_share") or {}).get("total")
                print(f"  {summary['completed']}/{summary['requests']} done in {t1 - t0:.1f} s, normalized latency "
                      f"{summary['normalized_latency_s_per_token']['median']:.4f} s/token, TTFT median "
                      f"{summary['ttft_s']['median']:.3f} s, waste {rpt._pct(w)}"
                      + (f", errors {summary['errors']}" if summary["errors"] else ""), flush=True)
                runs.append({"policy": policy, "rate": rate, "summary": summary, "requests": recs,
                             "intercept_status_before": before, "intercept_status_after": after})
    finally:
        log_copy = None
        if a.keep_log and server.managed:
            os.makedirs(a.out_dir, exist_ok=True)
            log_copy = os.path.join(a.out_dir, f"intercept_heliosd_{started.strftime('%Y-%m-%dT%H%MZ')}.log")
        config_text = server.run_config_text
        server.stop(keep_log_to=log_copy)
        if cfg_dir:
            import shutil
            shutil.rmtree(cfg_dir, ignore_errors=True)
    rep = {
        "schema": "helios.intercept_bench.v1",
        "started_at": started.isoformat(timespec="seconds"),
        "command": command,
        "argv": argv_used,
        "commit": commit_of(),
        "machine": _machine_line(machine_info()),
        "machine_info": machine_info(),
        "model": model, "model_path": a.model_path, "workload": a.workload,
        "config": {"rates": rates, "policies": policies, "n_requests": a.n_requests, "seed": a.seed,
                   "kv_cache": a.kv_cache, "prefix_caching": a.prefix_caching, "engine": f"{a.backend}, {a.threads} threads, max_seqs {a.max_seqs}, "
                   f"max_batched_tokens {a.max_batched_tokens}, kv {a.kv_cache_type}",
                   "server_config": config_text, "address": a.address or ""},
        "scaling": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(scaling).items()},
        "workload_stats": stats,
        "workload_requests": [r.summary() for r in reqs],
        "headline": rpt.headline(runs, a.target_factor, a.target_s),
        "runs": runs,
        "notes": notes,
    }
    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, f"intercept_{a.label or model}_{started.strftime('%Y-%m-%dT%H%MZ')}")
    for p in rpt.write(rep, base):
        print(p)
    return 0


def _machine_line(m: dict) -> str:
    return f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, load {m.get('load_average_at_start')}"


if __name__ == "__main__":
    sys.exit(main())
