#!/usr/bin/python3
"""heliosd serving benchmark: output tok/s against client concurrency, and the batching speed-up
over sequential serving (concurrency 1), measured one level after the other in one run against a
running heliosd. Usually started by bench/serve/run_concurrency_bench.sh, which builds and starts
the daemon; this file only talks gRPC to it.

Runs with Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools): the helios.v1 and
grpc.health.v1 stubs are generated at run time into a temporary folder.
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The data folder beside the repository (an optional extra: pass --prompts FILE without it).
DEFAULT_PROMPTS = ROOT / "shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json"

COLUMNS = """\
columns of the table (one row per concurrency level):
  c               client concurrency: c client threads, each sending its next request as soon as
                  its previous one ends (closed loop), until the level's N requests are done
  requests        requests completed / N (N = max(--requests-per-client * c, --min-requests));
                  fewer than N when --max-seconds cut the level short
  errors          calls that ended with a gRPC error (not counting calls cancelled by the cut)
  wall s          from the start of the level's first request to the end of its last one (or to
                  the cut)
  output tok/s    generated tokens received by the clients (every streamed token, including
                  those of calls cut short) / wall s
  speed-up        output tok/s of this level / output tok/s of c = 1 (sequential serving, one
                  request at a time); "-" when level 1 was not run
  req/s           requests completed / wall s
  TTFT ms         mean time to first token, server-side (Timings.time_to_first_token_seconds of
                  the final message: arrival at the server to the first sampled token; includes
                  queueing and prefill)
  p90 TTFT ms     90th percentile of the same
  TPOT ms         mean time per output token after the first, per request
                  (total_seconds - time_to_first_token_seconds) / (completion_tokens - 1)
  latency s       mean end-to-end request time, server-side (Timings.total_seconds)
  queue ms        mean time from arrival to the first scheduled step (Timings.queue_seconds)
  mean batch      mean of ServerStatus.batch_size (sequences in the engine's last step) sampled
                  every --sample-interval s while the level ran
  max batch       largest sampled batch_size
  load 1m         1-minute load average of the machine when the level started (other work on
                  the CPUs slows everything; compare runs made on a quiet machine)
"""


def log(msg):
    print(f"[concurrency_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git_info():
    def run(*args):
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return run("rev-parse", "HEAD") or "?", bool(run("status", "--porcelain", "--untracked-files=no"))


def generate_stubs(out_dir):
    """helios.v1 from proto/, grpc.health.v1 from tests/e2e/server/health.proto (as health_pb2)."""
    out = Path(out_dir)
    cmds = [
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"), f"--python_out={out}",
         f"--grpc_python_out={out}", str(ROOT / "proto/helios/v1/helios.proto")],
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "tests/e2e/server"),
         f"--python_out={out}", f"--grpc_python_out={out}", str(ROOT / "tests/e2e/server/health.proto")],
    ]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"concurrency_bench: protoc failed ({' '.join(cmd)}):\n{r.stderr}\n"
                     "(needs python3-grpc-tools: apt-get install python3-grpc-tools)")
    (out / "helios").mkdir(exist_ok=True)
    (out / "helios/__init__.py").touch()
    (out / "helios/v1/__init__.py").touch()
    sys.path.insert(0, str(out))


def wait_ready(grpc, channel, health_pb2, health_grpc, pb, stub, seconds):
    health = health_grpc.HealthStub(channel)
    deadline = time.monotonic() + seconds
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                s = stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=2)
                if s.state == "SERVING":
                    return
                last = f"state {s.state}"
            else:
                last = f"health {r.status}"
        except grpc.RpcError as e:
            last = f"{e.code().name}: {e.details()}"
        time.sleep(0.2)
    sys.exit(f"concurrency_bench: heliosd not serving after {seconds} s ({last})")


def load_prompts(pb, stub, model, path, count, min_tokens, max_tokens):
    """First human turns of the ShareGPT file, in file order; those shorter than min_tokens are
    skipped, longer ones are cut at max_tokens (by the server's own tokenizer) and turned back
    into text."""
    with open(path) as f:
        data = json.load(f)
    import grpc
    prompts = []
    skipped = 0
    tokenize_failed = 0
    for entry in data:
        turns = entry.get("conversations") or []
        human = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
        if not human.strip():
            skipped += 1
            continue
        try:
            ids = list(stub.Tokenize(pb.TokenizeRequest(model=model, text=human[:max_tokens * 12]),
                                     timeout=30).token_ids)
        except grpc.RpcError as e:
            # heliosd (commit 4f9fa42) sends TokenizeResponse.pieces with invalid UTF-8 when a
            # byte-level piece holds part of a multi-byte character; the Python client cannot
            # parse that response. Such prompts are skipped and counted.
            tokenize_failed += 1
            if tokenize_failed == 1:
                log(f"Tokenize failed on prompt {len(prompts) + skipped + tokenize_failed - 1} "
                    f"({e.code().name}: {e.details()}); skipping such prompts")
            continue
        if len(ids) < min_tokens:
            skipped += 1
            continue
        text = None
        for cut in range(max_tokens, max(max_tokens - 4, min_tokens - 1), -1):
            try:  # a cut through a multi-byte character may not come back as valid text
                text = stub.Detokenize(pb.DetokenizeRequest(model=model, token_ids=ids[:cut]),
                                       timeout=30).text
                break
            except grpc.RpcError:
                continue
        if text is None:
            tokenize_failed += 1
            continue
        prompts.append(text)
        if len(prompts) == count:
            break
    if not prompts:
        sys.exit(f"concurrency_bench: no prompt of at least {min_tokens} tokens in {path}")
    return prompts, skipped, tokenize_failed


def mean(xs):
    return statistics.fmean(xs) if xs else None


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Level:
    """One concurrency level: c closed-loop clients until n requests are done or the cut."""

    def __init__(self, grpc, pb, stub, args, prompts, c, n):
        self.grpc, self.pb, self.stub, self.args = grpc, pb, stub, args
        self.prompts, self.c, self.n = prompts, c, n
        self.lock = threading.Lock()
        self.next_index = 0
        self.active = {}          # request index -> call object, for the cut
        self.records = []
        self.cut = False
        self.samples = []

    def request(self, i):
        return self.pb.GenerateRequest(
            request_id=f"bench-c{self.c}-{i}", model=self.args.model,
            text=self.prompts[i % len(self.prompts)], chat=self.args.chat,
            sampling=self.pb.SamplingParams(temperature=0.0), max_tokens=self.args.max_tokens,
            ignore_eos=True)

    def one(self, i):
        rec = {"index": i, "prompt": i % len(self.prompts), "tokens_received": 0, "messages": 0}
        rec["client_start"] = time.perf_counter() - self.t0
        call = self.stub.Generate(self.request(i), timeout=self.args.max_seconds + 120)
        with self.lock:
            self.active[i] = call
            cut_already = self.cut
        if cut_already:
            call.cancel()
        last = None
        try:
            for msg in call:
                now = time.perf_counter() - self.t0
                if rec["messages"] == 0:
                    rec["client_first_message"] = now
                rec["messages"] += 1
                rec["tokens_received"] += len(msg.tokens)
                last = msg
            rec["client_end"] = time.perf_counter() - self.t0
            rec["status"] = "OK"
            if last is not None:
                rec["finish_reason"] = self.pb.FinishReason.Name(last.finish_reason)
                rec["prompt_tokens"] = last.usage.prompt_tokens
                rec["completion_tokens"] = last.usage.completion_tokens
                rec["queue_s"] = last.timings.queue_seconds
                rec["ttft_s"] = last.timings.time_to_first_token_seconds
                rec["total_s"] = last.timings.total_seconds
        except self.grpc.RpcError as e:
            rec["client_end"] = time.perf_counter() - self.t0
            with self.lock:
                was_cut = self.cut
            rec["status"] = "CUT" if (was_cut and e.code() == self.grpc.StatusCode.CANCELLED) \
                else e.code().name
            rec["error"] = e.details()
        finally:
            with self.lock:
                self.active.pop(i, None)
        return rec

    def worker(self):
        while True:
            with self.lock:
                if self.cut or self.next_index >= self.n:
                    return
                i = self.next_index
                self.next_index += 1
            rec = self.one(i)
            with self.lock:
                self.records.append(rec)

    def sampler(self, stop):
        while not stop.wait(self.args.sample_interval):
            try:
                s = self.stub.GetServerStatus(self.pb.GetServerStatusRequest(), timeout=2)
                self.samples.append({"t": time.perf_counter() - self.t0, "batch_size": s.batch_size,
                                     "batch_tokens": s.batch_tokens, "running": s.requests_running,
                                     "waiting": s.requests_waiting, "kv_blocks_used": s.kv_blocks_used,
                                     "kv_blocks_total": s.kv_blocks_total,
                                     "steps_per_second": s.steps_per_second})
            except self.grpc.RpcError as e:
                self.samples.append({"t": time.perf_counter() - self.t0, "error": e.code().name})

    def server_counters(self):
        try:
            s = self.stub.GetServerStatus(self.pb.GetServerStatusRequest(), timeout=5)
            return {"requests_total": s.requests_total, "generated_tokens_total": s.generated_tokens_total,
                    "preemptions": s.preemptions}
        except self.grpc.RpcError as e:
            return {"error": e.code().name}

    def run(self):
        before = self.server_counters()
        load_start = load_average()
        stop = threading.Event()
        self.t0 = time.perf_counter()
        sampler = threading.Thread(target=self.sampler, args=(stop,), daemon=True)
        sampler.start()
        threads = [threading.Thread(target=self.worker, daemon=True) for _ in range(self.c)]
        for t in threads:
            t.start()
        deadline = self.t0 + self.args.max_seconds
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        if any(t.is_alive() for t in threads):
            with self.lock:
                self.cut = True
                calls = list(self.active.values())
            cut_at = time.perf_counter() - self.t0
            for call in calls:
                call.cancel()
            for t in threads:
                t.join(timeout=30)
        else:
            cut_at = None
        stop.set()
        sampler.join(timeout=5)
        after = self.server_counters()
        load_end = load_average()
        return self.summary(before, after, load_start, load_end, cut_at)

    def summary(self, before, after, load_start, load_end, cut_at):
        recs = sorted(self.records, key=lambda r: r["index"])
        done = [r for r in recs if r["status"] == "OK"]
        errors = [r for r in recs if r["status"] not in ("OK", "CUT")]
        ends = [r["client_end"] for r in recs]
        wall = cut_at if cut_at is not None else (max(ends) if ends else 0.0)
        tokens = sum(r["tokens_received"] for r in recs)
        ttft = [r["ttft_s"] for r in done if "ttft_s" in r]
        tpot = [(r["total_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1)
                for r in done if r.get("completion_tokens", 0) > 1]
        batches = [s["batch_size"] for s in self.samples if "batch_size" in s]
        finish = {}
        for r in done:
            finish[r.get("finish_reason", "?")] = finish.get(r.get("finish_reason", "?"), 0) + 1
        short = [r["index"] for r in done if r.get("completion_tokens") != self.args.max_tokens]
        error_kinds = {}
        for r in errors:
            key = f"{r['status']}: {r.get('error', '')}"
            error_kinds[key] = error_kinds.get(key, 0) + 1
        delta = None
        if "error" not in before and "error" not in after:
            delta = {k: after[k] - before[k] for k in before}
        return {
            "concurrency": self.c, "requests_planned": self.n, "requests_started": len(recs),
            "requests_completed": len(done), "requests_cut": sum(r["status"] == "CUT" for r in recs),
            "errors": len(errors), "error_kinds": error_kinds, "cut_at_max_seconds": cut_at is not None,
            "wall_seconds": wall, "output_tokens": tokens,
            "output_tok_s": tokens / wall if wall > 0 else None,
            "requests_s": len(done) / wall if wall > 0 else None,
            "mean_prompt_tokens": mean([r["prompt_tokens"] for r in done if "prompt_tokens" in r]),
            "mean_ttft_s": mean(ttft), "p50_ttft_s": pct(ttft, 0.5), "p90_ttft_s": pct(ttft, 0.9),
            "mean_tpot_s": mean(tpot), "p90_tpot_s": pct(tpot, 0.9),
            "mean_latency_s": mean([r["total_s"] for r in done if "total_s" in r]),
            "mean_queue_s": mean([r["queue_s"] for r in done if "queue_s" in r]),
            "mean_client_ttft_s": mean([r["client_first_message"] - r["client_start"]
                                        for r in done if "client_first_message" in r]),
            "mean_batch_size": mean(batches), "max_batch_size": max(batches) if batches else None,
            "status_samples": len(batches), "finish_reasons": finish,
            "completed_with_other_than_max_tokens": short,
            "server_counter_delta": delta, "load_average_at_start": load_start,
            "load_average_at_end": load_end, "requests": recs, "samples": self.samples,
        }


def fmt(x, digits, scale=1.0):
    return "-" if x is None else f"{x * scale:.{digits}f}"


def markdown(report):
    cfg = report["config"]
    m = report.get("model_info", {})
    lines = [
        f"# heliosd serving benchmark: output tok/s vs concurrency, {report['date']}",
        "",
        f"- command: `{report['command']}`",
        f"- commit: {report['commit']}{' (work tree had uncommitted changes)' if report['worktree_dirty'] else ''}",
        f"- CPU: {report['device']['cpu_model']}, {report['device']['n_cpus']} CPUs; "
        f"heliosd engine: {report.get('server_config_summary', '?')}",
        f"- model: {m.get('name', '?')} ({m.get('path', '?')}, {m.get('architecture', '?')}, "
        f"{m.get('n_layers', '?')} layers, backend {m.get('backend', '?')})",
        f"- workload: first human turns of {Path(cfg['prompts']).name}, cut to "
        f"{cfg['prompt_min_tokens']}–{cfg['prompt_max_tokens']} tokens ({report['n_prompts']} prompts, "
        f"sent as text, chat={'on' if cfg['chat'] else 'off'}; {report.get('prompts_skipped_tokenize_failed', 0)} "
        f"prompts skipped because Tokenize/Detokenize failed); max_tokens {cfg['max_tokens']}, "
        "ignore_eos, greedy; request i of every level gets prompt i",
        f"- per level: N = max({cfg['requests_per_client']} × c, {cfg['min_requests']}) requests from c "
        f"closed-loop client threads (one gRPC channel), cut at {cfg['max_seconds']} s; "
        f"one unmeasured warmup request first; ServerStatus sampled every {cfg['sample_interval']} s",
        f"- load average (1/5/15 min) at start → end: {report['device']['load_average_at_start']} → "
        f"{report['device']['load_average_at_end']}",
        "",
        "| c | requests | errors | wall s | output tok/s | speed-up vs c=1 | req/s | TTFT ms | "
        "p90 TTFT ms | TPOT ms | latency s | queue ms | mean batch | max batch | load 1m |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in report["levels"]:
        cut = " (cut)" if lv["cut_at_max_seconds"] else ""
        load = lv["load_average_at_start"][0] if lv["load_average_at_start"] else None
        lines.append(
            f"| {lv['concurrency']} | {lv['requests_completed']}/{lv['requests_planned']}{cut} | "
            f"{lv['errors']} | {fmt(lv['wall_seconds'], 1)} | {fmt(lv['output_tok_s'], 1)} | "
            f"{fmt(lv.get('speedup_vs_sequential'), 2)} | {fmt(lv['requests_s'], 2)} | "
            f"{fmt(lv['mean_ttft_s'], 0, 1e3)} | {fmt(lv['p90_ttft_s'], 0, 1e3)} | "
            f"{fmt(lv['mean_tpot_s'], 1, 1e3)} | {fmt(lv['mean_latency_s'], 2)} | "
            f"{fmt(lv['mean_queue_s'], 0, 1e3)} | {fmt(lv['mean_batch_size'], 1)} | "
            f"{'-' if lv['max_batch_size'] is None else lv['max_batch_size']} | {fmt(load, 2)} |")
    lines += ["", "Columns: output tok/s = generated tokens / wall time; speed-up = output tok/s ÷ "
              "output tok/s at c = 1 (sequential serving); TTFT, TPOT, latency, queue: server-side "
              "timings of the final message, means over the level's requests (TPOT = (total − TTFT) "
              "/ (completion tokens − 1)); mean/max batch: sampled ServerStatus.batch_size. "
              "`bench/serve/concurrency_bench.py --help` explains each.", ""]
    problems = []
    for lv in report["levels"]:
        if lv["errors"]:
            problems.append(f"- c={lv['concurrency']}: {lv['errors']} errors: " +
                            "; ".join(f"{k} ×{v}" for k, v in lv["error_kinds"].items()))
        if lv["cut_at_max_seconds"]:
            problems.append(f"- c={lv['concurrency']}: cut at {cfg['max_seconds']} s with "
                            f"{lv['requests_completed']}/{lv['requests_planned']} requests done "
                            f"({lv['requests_cut']} in flight cancelled)")
        if lv["completed_with_other_than_max_tokens"]:
            problems.append(f"- c={lv['concurrency']}: {len(lv['completed_with_other_than_max_tokens'])} "
                            f"requests ended with other than {cfg['max_tokens']} tokens")
        other = {k: v for k, v in lv["finish_reasons"].items() if k != "FINISH_REASON_LENGTH"}
        if other:
            problems.append(f"- c={lv['concurrency']}: finish reasons {lv['finish_reasons']}")
        d = lv.get("server_counter_delta")
        if d and d.get("preemptions"):
            problems.append(f"- c={lv['concurrency']}: {d['preemptions']} preemptions")
    if report.get("prompts_skipped_tokenize_failed"):
        problems.append(f"- while preparing prompts: {report['prompts_skipped_tokenize_failed']} "
                        "Tokenize/Detokenize calls failed on the client with INTERNAL 'Exception "
                        "deserializing response!' (heliosd sends TokenizeResponse.pieces that are "
                        "not valid UTF-8 for a proto3 string); those prompts were skipped")
    if report.get("server_exit"):
        problems.append(f"- heliosd: {report['server_exit']}")
    lines += ["Problems seen:", ""] + (problems or ["- none: every request finished with "
                                                    "FINISH_REASON_LENGTH and max_tokens tokens, "
                                                    "no errors, no preemptions"])
    lines += ["", "Every request's timings and every ServerStatus sample are in the JSON next to "
              "this file.", ""]
    return "\n".join(lines)


def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--levels takes comma-separated integers, not '{text}'")
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("--levels: every level must be at least 1")
    return levels


def main():
    p = argparse.ArgumentParser(
        description=__doc__, epilog=COLUMNS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", required=True, help="heliosd's gRPC address, HOST:PORT")
    p.add_argument("--model", default="", help="model name; empty = the server's first model")
    p.add_argument("--levels", type=parse_levels, default=parse_levels("1,2,4,8,16,32,64"),
                   help="concurrency levels, comma-separated (default 1,2,4,8,16,32,64)")
    p.add_argument("--requests-per-client", type=int, default=2,
                   help="N = max(this × c, --min-requests) requests per level (default 2)")
    p.add_argument("--min-requests", type=int, default=8, help="see --requests-per-client (default 8)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="tokens every request generates (ignore_eos, so exactly this many; default 64)")
    p.add_argument("--prompt-min-tokens", type=int, default=64,
                   help="skip prompts shorter than this many tokens (default 64)")
    p.add_argument("--prompt-max-tokens", type=int, default=128,
                   help="cut prompts at this many tokens (default 128)")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="ShareGPT-format JSON file")
    p.add_argument("--chat", action="store_true", help="send prompts as a user turn in the chat template")
    p.add_argument("--max-seconds", type=float, default=240,
                   help="cut a level after this many seconds: no new requests, in-flight calls "
                        "cancelled (default 240)")
    p.add_argument("--sample-interval", type=float, default=0.5,
                   help="seconds between GetServerStatus samples (default 0.5)")
    p.add_argument("--wait-ready", type=float, default=120,
                   help="seconds to wait for health SERVING and state SERVING (default 120)")
    p.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warmup request")
    p.add_argument("--command", default=None, help="the command line to record (default: this one)")
    p.add_argument("--date", default=None, help="date tag to record (default: now, UTC)")
    p.add_argument("--server-config", default=None, help="heliosd's config file, recorded in the JSON")
    p.add_argument("--server-summary", default="", help="one line on heliosd's engine settings, for the Markdown")
    p.add_argument("--out-json", default=None, help="write the results JSON here")
    p.add_argument("--out-md", default=None, help="write the Markdown table here (also printed)")
    args = p.parse_args()

    import grpc
    stub_dir = tempfile.TemporaryDirectory(prefix="helios-bench-stubs-")
    generate_stubs(stub_dir.name)
    from helios.v1 import helios_pb2 as pb, helios_pb2_grpc as pbg
    import health_pb2
    import health_pb2_grpc

    channel = grpc.insecure_channel(args.address, options=[("grpc.max_receive_message_length", 64 << 20)])
    stub = pbg.HeliosStub(channel)
    wait_ready(grpc, channel, health_pb2, health_pb2_grpc, pb, stub, args.wait_ready)
    info = stub.GetModelInfo(pb.GetModelInfoRequest(model=args.model), timeout=10)
    model_info = {f.name: v for f, v in info.ListFields()}

    n_max = max(max(args.requests_per_client * c, args.min_requests) for c in args.levels)
    if not Path(args.prompts).exists():
        raise SystemExit(f"concurrency_bench: {args.prompts} does not exist: it comes from the data folder beside "
                         f"the repository; pass --prompts with any ShareGPT-format JSON (e.g. the one "
                         f"scripts/fetch_sharegpt.sh installs, or tests/data/sharegpt/ for a short run)")
    prompts, skipped, tokenize_failed = load_prompts(pb, stub, args.model, args.prompts, n_max,
                                    args.prompt_min_tokens, args.prompt_max_tokens)
    log(f"{len(prompts)} prompts ({skipped} skipped as shorter than {args.prompt_min_tokens} tokens, "
        f"{tokenize_failed} because Tokenize failed); "
        f"model {model_info.get('name')}; levels {args.levels}")

    if not args.no_warmup:
        t = time.perf_counter()
        try:
            for _ in stub.Generate(pb.GenerateRequest(request_id="bench-warmup", model=args.model,
                                                      text=prompts[0], max_tokens=8, ignore_eos=True),
                                   timeout=120):
                pass
            log(f"warmup request done in {time.perf_counter() - t:.1f} s")
        except grpc.RpcError as e:
            log(f"warmup request failed: {e.code().name}: {e.details()}")

    report = {
        "benchmark": "serve_concurrency",
        "date": args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%MZ"),
        "command": args.command or " ".join([sys.argv[0]] + sys.argv[1:]),
        "config": {"address": args.address, "model": args.model, "levels": args.levels,
                   "requests_per_client": args.requests_per_client, "min_requests": args.min_requests,
                   "max_tokens": args.max_tokens, "prompt_min_tokens": args.prompt_min_tokens,
                   "prompt_max_tokens": args.prompt_max_tokens, "prompts": args.prompts,
                   "chat": args.chat, "max_seconds": args.max_seconds,
                   "sample_interval": args.sample_interval, "sampling": "greedy (temperature 0)",
                   "ignore_eos": True},
        "n_prompts": len(prompts),
        "prompts_skipped_short": skipped,
        "prompts_skipped_tokenize_failed": tokenize_failed,
        "model_info": model_info,
        "device": {"cpu_model": cpu_model(), "n_cpus": os.cpu_count(),
                   "load_average_at_start": load_average()},
        "client": {"python": platform.python_version(), "grpcio": grpc.__version__},
        "levels": [],
    }
    report["commit"], report["worktree_dirty"] = git_info()
    if args.server_config:
        with open(args.server_config) as f:
            report["server_config"] = f.read()

    for c in args.levels:
        n = max(args.requests_per_client * c, args.min_requests)
        lv = Level(grpc, pb, stub, args, prompts, c, n).run()
        report["levels"].append(lv)
        base = next((x for x in report["levels"] if x["concurrency"] == 1), None)
        if base and base["output_tok_s"] and lv["output_tok_s"] is not None:
            lv["speedup_vs_sequential"] = lv["output_tok_s"] / base["output_tok_s"]
        log(f"c={c:<3} {lv['requests_completed']}/{n} done, {lv['errors']} errors"
            f"{', CUT at --max-seconds' if lv['cut_at_max_seconds'] else ''}: "
            f"{fmt(lv['wall_seconds'], 1)} s, {fmt(lv['output_tok_s'], 1)} tok/s "
            f"(x{fmt(lv.get('speedup_vs_sequential'), 2)} vs c=1), TTFT {fmt(lv['mean_ttft_s'], 0, 1e3)} ms, "
            f"TPOT {fmt(lv['mean_tpot_s'], 1, 1e3)} ms, mean batch {fmt(lv['mean_batch_size'], 1)}, "
            f"load {lv['load_average_at_start']}")
    # speed-ups of levels run before c = 1, when it is not first
    base = next((x for x in report["levels"] if x["concurrency"] == 1), None)
    for lv in report["levels"]:
        if base and base["output_tok_s"] and lv["output_tok_s"] is not None:
            lv["speedup_vs_sequential"] = lv["output_tok_s"] / base["output_tok_s"]
        else:
            lv.setdefault("speedup_vs_sequential", None)
    report["device"]["load_average_at_end"] = load_average()
    report["server_config_summary"] = args.server_summary or "?"

    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    md = markdown(report)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(md)
    print(md)
    channel.close()
    total_errors = sum(lv["errors"] for lv in report["levels"])
    return 3 if total_errors else 0


if __name__ == "__main__":
    sys.exit(main())
