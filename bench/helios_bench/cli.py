"""Command line of helios-bench (bench/helios-bench, or /usr/bin/python3 -m helios_bench with bench/ on
PYTHONPATH)."""
from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

from .client import SOURCE_DIR

PROG = os.environ.get("HELIOS_BENCH_PROG", "helios-bench")
SHARED_DATA_DIR = Path(os.environ.get("HELIOS_SHARED_DATA_DIR") or SOURCE_DIR.parent / "shared" / "data")

DATASETS = ("sharegpt", "prompts", "azure-conv", "azure-code", "mooncake", "llmservingsim", "synthetic")
TRACES = {"azure-conv": "azure", "azure-code": "azure", "mooncake": "mooncake", "llmservingsim": "llmservingsim"}
PROMPTS_FILE = SHARED_DATA_DIR / "sharegpt" / "mlenergy_ShareGPT_V3_filtered_1000_prompts.json"
SHAREGPT_FILES = [SOURCE_DIR / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json",
                  SOURCE_DIR / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.first17671.json"]
DEFAULT_PATHS = {
    "prompts": PROMPTS_FILE,
    "azure-conv": SHARED_DATA_DIR / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv",
    "azure-code": SHARED_DATA_DIR / "traces" / "azure2023" / "AzureLLMInferenceTrace_code.csv",
    "mooncake": SHARED_DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl",
    "llmservingsim": SHARED_DATA_DIR / "traces" / "llmservingsim" / "sharegpt-llama-3.1-8b-300-sps10.jsonl",
}

DESCRIPTION = """\
Serving benchmark of heliosd: sends a workload (ShareGPT, prompt files, timed traces or synthetic
lengths) over gRPC, one Generate stream per request (ignore_eos, max_tokens = the request's output
length, greedy unless --temperature), or over the OpenAI-compatible HTTP API (--backend openai, --url:
one streamed completion per request, to heliosd or any OpenAI-compatible server such as vLLM or
llama-server), on an arrival schedule, and measures what the client sees
(TTFT, TPOT, ITL, E2EL, throughput, goodput, as vLLM's benchmark_serving) and what the server reports
(GetServerStatus sampled during the run: batch size, KV cache use, queue, preemptions; exit layers of
the streamed tokens; loaded model and depth).

The server: --address HOST:PORT (a running heliosd), or --config FILE (started here from that YAML
on a free loopback port, stopped with SIGTERM afterwards). Several --config (or --address) = compare
mode: every server gets the same sampled requests and arrival times, and the report has one table of
ratios against the first.

Writes RESULT_DIR/NAME.json (everything: commit, command, configs, model, backend, machine, each
run's summary, server time series and per-request records), NAME.md (the tables) and NAME_*.png
(latency CDFs, throughput vs rate, server batch/KV/queue over time, exit layers)."""

EXAMPLES = f"""\
examples:
  {PROG} --config configs/cpu-dev.yaml --dataset sharegpt --num-prompts 200 --request-rate 1,4
  {PROG} --address 127.0.0.1:50051 --dataset synthetic --input-len 128 --output-len 64 \\
      --num-prompts 100 --request-rate inf --max-concurrency 16
  {PROG} --config a.yaml --config b.yaml --dataset azure-conv --num-prompts 300 --time-scale 4
  {PROG} --backend openai --config configs/cpu-dev.yaml --num-prompts 100   (heliosd over HTTP)
  {PROG} --url http://127.0.0.1:8080 --model m --dataset synthetic --input-len 128 --output-len 64
                              (any OpenAI-compatible server, e.g. llama-server)
  {PROG} --config configs/cpu-dev.yaml --request-rate 0.5:4:0.5 --max-seconds 120   (a sweep)

load modes:
  --request-rate R            Poisson arrivals at R req/s (--burstiness B: Gamma inter-arrival
                              times, mean 1/R, coefficient of variation 1/sqrt(B))
  --request-rate inf          every request at once (the default, except for traces)
  --max-concurrency C         at most C requests in flight (with or without a rate; with inf it
                              is a fixed concurrency, closed loop)
  traces                      replay their own arrival times (scaled by --time-scale) unless
                              --request-rate is given
  --request-rate 1,2,4        a rate sweep: each rate is one run on the same requests
  --num-prompts N / --max-seconds T   bounds: N requests; at T seconds sending stops and the
                              streams still open are cancelled (counted as failed, 'cancelled')
"""


def metrics_help() -> str:
    from .report import describe_all
    lines = ["metrics (client side, as vLLM's benchmark_serving; then server side):"]
    for name, text in describe_all():
        wrapped = textwrap.wrap(text, 68) or [""]
        lines.append(f"  {name:<28}{wrapped[0]}")
        lines += [" " * 30 + w for w in wrapped[1:]]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION,
                                epilog=EXAMPLES + "\n" + metrics_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--address", action="append", default=[], metavar="HOST:PORT",
                   help="a running heliosd (repeat to compare several)")
    g.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="start heliosd from this YAML on a free loopback port (listen and metrics_listen "
                        "are overridden, relative paths resolved against the file's folder), stop it "
                        "after; repeat to compare configs")
    g.add_argument("--url", action="append", default=[], metavar="URL",
                   help="an OpenAI-compatible server (heliosd's HTTP API, vLLM, llama.cpp's llama-server, ...), "
                        "e.g. http://127.0.0.1:8000: streamed /v1/completions requests (--chat: "
                        "/v1/chat/completions); repeat to compare several; implies --backend openai")
    g.add_argument("--backend", choices=("grpc", "openai"), default=None,
                   help="how requests reach the server: grpc (Generate streams; the default for --address and "
                        "--config) or openai (the OpenAI-compatible HTTP API: with --config, heliosd is started "
                        "with server.http_listen on a free port, and only generation goes over HTTP)")
    g.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="names of the servers, in the order given (default: the config file's stem, or "
                        "the address)")
    g.add_argument("--heliosd", metavar="PATH", help="heliosd binary for --config (default: $HELIOSD or "
                                                     "build/heliosd)")
    g.add_argument("--model", default="", help="model name on the server (default: its first model)")
    g.add_argument("--api-key", default=os.environ.get("HELIOS_API_KEY", ""),
                   help="sent as 'authorization: Bearer KEY' (default: $HELIOS_API_KEY)")
    g.add_argument("--keep-server-logs", action="store_true",
                   help="copy the log of each heliosd started here to RESULT_DIR/NAME_heliosd-LABEL.log")

    g = p.add_argument_group("workload")
    g.add_argument("--dataset", choices=DATASETS, default="sharegpt",
                   help="sharegpt: prompt = first human turn, output length = the reply's tokens "
                        "(default file: data/sharegpt/ from scripts/fetch_sharegpt.sh; without it the "
                        "prompt-only file of 'prompts' with --output-len); prompts: a prompt-only file "
                        "with a fixed --output-len (default ../shared/data/sharegpt/"
                        "mlenergy_ShareGPT_V3_filtered_1000_prompts.json); azure-conv, azure-code, "
                        "mooncake, llmservingsim: timed traces from ../shared/data/traces/ (lengths and "
                        "times; prompts made of exact token counts); synthetic: --input-len/--output-len "
                        "± --range-ratio")
    g.add_argument("--dataset-path", metavar="PATH", help="the dataset file (defaults above)")
    g.add_argument("--num-prompts", type=int, default=100, help="requests in the workload (default 100)")
    g.add_argument("--seed", type=int, default=0, help="sampling of the workload and of the arrival times")
    g.add_argument("--input-len", type=int, default=256, help="synthetic: prompt tokens (default 256)")
    g.add_argument("--output-len", type=int, default=128,
                   help="synthetic and prompt-only files: tokens to generate (default 128)")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="synthetic: lengths uniform in [len·(1-r), len·(1+r)] (default 0: fixed)")
    g.add_argument("--max-prompt-len", type=int, default=None,
                   help="sharegpt/prompts: drop longer prompts (default 1024); traces: clip to this")
    g.add_argument("--max-total-len", type=int, default=2048,
                   help="sharegpt/prompts: drop requests with prompt + output above this (default 2048)")
    g.add_argument("--max-output-len", type=int, default=None,
                   help="cap every request's output length (sharegpt replies, traces); say so in the report")
    g.add_argument("--time-scale", type=float, default=1.0, help="traces: replay speed (2 = twice as fast)")
    g.add_argument("--trace-start-offset", type=float, default=0.0,
                   help="traces: start this many seconds after the trace's first request")
    g.add_argument("--chat", action="store_true",
                   help="send prompts as a user turn in the model's chat format (prompt lengths then "
                        "count the template too: see server_prompt_tokens per request)")

    g = p.add_argument_group("load")
    g.add_argument("--request-rate", default=None, metavar="RATES",
                   help="req/s: a number, inf, a list '1,2,4,inf' or a range 'start:stop:step' (a sweep: "
                        "one run per rate, same requests); default inf (traces: their own times)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="1 = Poisson; otherwise Gamma inter-arrival times with this shape (< 1 burstier)")
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    g.add_argument("--max-seconds", type=float, default=None,
                   help="per run: stop sending at this time and cancel the open streams")
    g.add_argument("--request-timeout", type=float, default=None, help="gRPC deadline of each request (s)")
    g.add_argument("--warmup", type=int, default=1,
                   help="short unmeasured requests before each run (default 1)")

    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=0.0)
    g.add_argument("--sampling-seed", type=int, default=0)

    g = p.add_argument_group("results")
    g.add_argument("--result-dir", default=str(SOURCE_DIR / "bench" / "results"),
                   help="where the JSON, Markdown and PNG files go (default bench/results/)")
    g.add_argument("--result-name", default=None,
                   help="file name stem (default serving_<dataset>_<UTC date and time>)")
    g.add_argument("--percentiles", default="50,90,99", help="latency percentiles (default 50,90,99)")
    g.add_argument("--goodput", nargs="*", default=None, metavar="METRIC:MS",
                   help="SLOs for goodput, e.g. --goodput ttft:2000 tpot:100 e2el:30000")
    g.add_argument("--sample-interval-ms", type=float, default=250.0,
                   help="GetServerStatus sampling period (default 250 ms)")
    g.add_argument("--no-plots", action="store_true", help="skip the PNG files")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)

    if not args.address and not args.config and not args.url:
        p.error("give the server: --address HOST:PORT (running heliosd), --config FILE (started here) or "
                "--url URL (an OpenAI-compatible server)")
    if args.backend is None:
        args.backend = "openai" if args.url else "grpc"
    if args.url and args.backend != "openai":
        p.error("--url is an OpenAI-compatible server: --backend openai (the default with --url)")
    if args.backend == "openai" and args.address:
        p.error("--backend openai with --address: give the running server's HTTP API as --url http://HOST:PORT "
                "instead (or --config FILE to start heliosd with it)")
    if args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if args.max_seconds is not None and not args.max_seconds > 0:
        p.error("--max-seconds must be > 0")
    if args.label and len(args.label) != len(args.address) + len(args.config) + len(args.url):
        p.error("give one --label per server (--address, --config and --url, in that order)")
    from .arrivals import parse_rates
    try:
        args.rates = parse_rates(args.request_rate) if args.request_rate else None
    except ValueError as e:
        p.error(f"--request-rate: {e}")
    try:
        args.percentile_list = [float(x) for x in args.percentiles.split(",") if x.strip()]
        if not all(0 < x < 100 for x in args.percentile_list):
            raise ValueError
    except ValueError:
        p.error("--percentiles: numbers in (0, 100), comma-separated")
    args.slo = None
    if args.goodput:
        from .metrics import Slo
        slo = Slo()
        for item in args.goodput:
            try:
                k, v = item.split(":")
                if k not in ("ttft", "tpot", "e2el"):
                    raise ValueError
                setattr(slo, f"{k}_ms", float(v))
            except ValueError:
                p.error(f"--goodput: bad '{item}': expected ttft:MS, tpot:MS or e2el:MS")
        args.slo = slo
    return args


def _targets(args):
    from .runner import Target
    targets = [Target(label=a, address=a) for a in args.address]
    targets += [Target(label=Path(c).stem, config=c) for c in args.config]
    targets += [Target(label=u, url=u) for u in args.url]
    if args.label:
        for t, name in zip(targets, args.label):
            t.label = name
    seen = {}
    for t in targets:          # unique labels
        n = seen.get(t.label, 0)
        seen[t.label] = n + 1
        if n:
            t.label = f"{t.label}-{n + 1}"
    return targets


def _pct(x: float):
    return int(x) if x == int(x) else x


def workload_loader(args, dataset_info: dict, log):
    """load_requests(sync_client) for runner.execute: samples the workload with the server's tokenizer."""
    from . import workloads

    def load(sync):
        name = args.dataset
        path = args.dataset_path
        notes = []
        if name == "sharegpt" and not path:
            found = [f for f in SHAREGPT_FILES if f.exists()]
            if found:
                path = str(found[0])
            else:
                path = str(PROMPTS_FILE)
                notes.append(f"no ShareGPT file with replies (run scripts/fetch_sharegpt.sh); using the prompt-only "
                             f"{PROMPTS_FILE.name} with a fixed output length of {args.output_len}")
                name = "prompts"
        elif not path and name in DEFAULT_PATHS:
            path = str(DEFAULT_PATHS[name])
        if path and not Path(path).exists():
            raise SystemExit(f"helios-bench: {path} does not exist. The default prompt and trace files come from "
                             f"the data folder beside the repository ({SHARED_DATA_DIR}, or set "
                             f"HELIOS_SHARED_DATA_DIR); ShareGPT with replies from scripts/fetch_sharegpt.sh; "
                             f"or pass --dataset-path FILE, or use --dataset synthetic")
        max_prompt = args.max_prompt_len or 1024
        if name == "sharegpt":
            reqs = workloads.load_sharegpt(path, args.num_prompts, args.seed, sync.count_tokens,
                                           max_prompt_len=max_prompt, max_total_len=args.max_total_len)
        elif name == "prompts":
            reqs = workloads.load_prompts(path, args.num_prompts, args.seed, sync.count_tokens, args.output_len,
                                          max_prompt_len=max_prompt, max_total_len=args.max_total_len)
        elif name in TRACES:
            reqs = workloads.load_trace(TRACES[name], path, args.num_prompts, sync.make_prompt,
                                        time_scale=args.time_scale, max_prompt_len=args.max_prompt_len,
                                        max_output_len=args.max_output_len, start_offset_s=args.trace_start_offset)
        else:
            reqs = workloads.synthetic(args.num_prompts, args.input_len, args.output_len, args.range_ratio,
                                       args.seed, sync.make_prompt)
        notes = list(getattr(reqs, "notes", [])) + notes
        if name in ("synthetic",) or name in TRACES:
            # make_prompt is exact when the tokenizer allows; count to be sure.
            counts = sync.count_tokens([r.prompt for r in reqs])
            off = sum(1 for r, c in zip(reqs, counts) if r.prompt_len != c)
            for r, c in zip(reqs, counts):
                r.prompt_len = c
            if off:
                notes.append(f"{off} made prompts came out a token or two off their target length; "
                             "prompt_len is the real count")
        if args.max_output_len and name not in TRACES:
            capped = sum(1 for r in reqs if r.output_len > args.max_output_len)
            for r in reqs:
                r.output_len = min(r.output_len, args.max_output_len)
            notes.append(f"output lengths capped at {args.max_output_len} tokens (--max-output-len): "
                         f"{capped} of {len(reqs)} requests")
        for n in notes:
            log(f"workload: {n}")
        dataset_info.update({
            "name": name, "requested": args.dataset, "path": path, "seed": args.seed,
            "num_requests": len(reqs), "total_prompt_tokens": sum(r.prompt_len for r in reqs),
            "total_output_tokens": sum(r.output_len for r in reqs), "notes": notes,
            "tokenized_by": sync.address,
        })
        return list(reqs)

    return load


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = " ".join([PROG] + [shlex.quote(a) for a in argv])

    def log(msg):
        print(f"[helios-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    logging.basicConfig(level=logging.WARNING, format="[helios-bench] %(message)s")
    from . import plots, report
    from .client import SamplingOptions
    from .runner import execute, requests_as_dicts

    started = datetime.datetime.now(datetime.timezone.utc)
    name = args.result_name or f"serving_{args.dataset}_{started.strftime('%Y-%m-%dT%H%MZ')}"
    os.makedirs(args.result_dir, exist_ok=True)
    prefix = os.path.join(args.result_dir, name)
    machine = report.machine_info()
    commit = report.commit_info()
    rates = args.rates if args.rates is not None else ([None] if args.dataset in TRACES else [math.inf])
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    dataset_info: dict = {}
    try:
        requests, runs, targets = execute(
            _targets(args), workload_loader(args, dataset_info, log), rates,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency, max_seconds=args.max_seconds,
            seed=args.seed, model=args.model,
            sampling=SamplingOptions(args.temperature, args.top_k, args.top_p, args.sampling_seed),
            chat=args.chat, request_timeout_s=args.request_timeout, sample_interval_ms=args.sample_interval_ms,
            percentiles=args.percentile_list, slo=args.slo, warmup=args.warmup, heliosd=args.heliosd,
            metadata=metadata, show_progress=not args.no_progress, log=log,
            server_log_prefix=prefix if args.keep_server_logs else None, backend=args.backend,
            api_key=args.api_key)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except (RuntimeError, ValueError, OSError) as e:
        log(f"error: {e}")
        return 1
    arg_record = {k: (v if not isinstance(v, float) or math.isfinite(v) else "inf") for k, v in vars(args).items()
                  if k not in ("slo", "api_key", "rates", "percentile_list")}
    arg_record["request_rate"] = args.request_rate or ("trace" if args.dataset in TRACES else "inf")
    arg_record["slo"] = args.slo.stated() if args.slo else None
    rep = report.build_report(command=command, args=arg_record, dataset=dataset_info, targets=targets, runs=runs,
                              requests=requests_as_dicts(requests), started_at=started.isoformat(timespec="seconds"),
                              machine=machine, commit=commit)
    pngs = []
    if not args.no_plots:
        if plots.available():
            pngs = plots.make_plots(rep, prefix)
        else:
            log("no plots: matplotlib is missing (apt-get install python3-matplotlib)")
    rep["files"] = {"json": prefix + ".json", "markdown": prefix + ".md", "png": pngs}
    report.write_json(rep, prefix + ".json")
    md = report.markdown(rep, pngs)
    with open(prefix + ".md", "w") as f:
        f.write(md)
    print("\n".join(report.sweep_table(runs)))
    rows = report.compare_rows(rep)
    if rows:
        print()
        for r in rows:
            print(f"{r['label']}: " + ", ".join(f"{k} ×{v:.2f}" for k, v in r["ratios"].items() if v is not None))
    problems = report.check_report(rep)
    for p in problems:
        log(f"consistency check FAILED: {p}")
    log(f"wrote {prefix}.json, {prefix}.md" + (f" and {len(pngs)} PNG files" if pngs else ""))
    return 0
