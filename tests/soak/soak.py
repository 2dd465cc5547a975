#!/usr/bin/python3
"""Soak test of heliosd: mixed traffic for a while, then checks that nothing leaked and nothing was lost.

It starts heliosd (stories260K by default, converted from tests/data; or SmolLM2-135M from the
models cache with --model smollm2; or any GGUF) and drives it from several threads, each with its
own seeded random plan: streaming generations read to the end, unary ones (the OpenAI-compatible
/v1/completions, not streamed), streams cancelled after a random number of tokens, tight deadlines,
Abort by request id, Tokenize, and every --burst-every seconds a burst of three times the queue
limit at once (some must get RESOURCE_EXHAUSTED). Every second it samples heliosd's RSS, open file
descriptors and threads from /proc.

It fails (exit 1) when:
  - a request ended in an outcome outside its kind's expected set, or never ended (lost);
  - a finished generation's token count disagrees with what it asked for or its usage;
  - after the warm-up, RSS max − min exceeds --rss-bound-mib;
  - open fds or threads, counted with the server idle after the warm-up and again at the end,
    grew by more than --fd-slack;
  - KV blocks are still in use once traffic stops, an engine stalled, or SIGTERM does not exit 0.

It prints a summary (requests by outcome, RSS start / after warm-up / max / end, fds, threads) and
with --json PATH writes it as JSON.

Run: /usr/bin/python3 tests/soak/soak.py --seconds 120   (ctest: soak.short; scripts/soak.sh for hours)
  HELIOS_BINARY_DIR  the build folder holding heliosd and helios (default SOURCE/build)
"""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.environ.get("HELIOS_SOURCE_DIR") or os.path.join(HERE, "..", ".."))
BINARY_DIR = os.path.abspath(os.environ.get("HELIOS_BINARY_DIR") or os.path.join(SOURCE_DIR, "build"))
E2E_DIR = os.path.join(SOURCE_DIR, "tests", "e2e", "server")
sys.path.insert(0, E2E_DIR)
from test_heliosd import free_port, metric_value, to_yaml  # noqa: E402  (the e2e suite's helpers)

SMOLLM2 = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20

# What each kind of request may end in. Anything else is a failure.
EXPECTED = {
    "stream": {"ok:length", "RESOURCE_EXHAUSTED"},
    "unary": {"http200:length", "http429"},
    "cancel": {"CANCELLED", "ok:length", "RESOURCE_EXHAUSTED"},    # ok: it finished before the cancel
    "deadline": {"DEADLINE_EXCEEDED", "ok:length", "RESOURCE_EXHAUSTED"},
    "abort": {"ok:aborted", "ok:length", "RESOURCE_EXHAUSTED"},
    "tokenize": {"ok"},
    "burst": {"ok:length", "RESOURCE_EXHAUSTED"},
}
KINDS = [("stream", 30), ("unary", 20), ("cancel", 15), ("deadline", 15), ("abort", 8), ("tokenize", 12)]
WORDS = ("Lily Tom Ben Sue Max Anna the a park ball dog cat bird sun tree went saw had liked to sing run "
         "big red little happy sad day time once upon").split()


# ---------------------------------------------------------------------------------------------
# Setup: stubs, the model, heliosd

def make_stubs(work):
    stubs = os.path.join(work, "stubs")
    os.makedirs(stubs)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"--python_out={stubs}", f"--grpc_python_out={stubs}",
                    "-I", os.path.join(SOURCE_DIR, "proto"),
                    os.path.join(SOURCE_DIR, "proto", "helios", "v1", "helios.proto")], check=True, timeout=60)
    for package in ("helios", os.path.join("helios", "v1")):
        open(os.path.join(stubs, package, "__init__.py"), "w").close()
    sys.path.insert(0, stubs)
    from helios.v1 import helios_pb2, helios_pb2_grpc  # noqa: E402  (generated above)
    return helios_pb2, helios_pb2_grpc


def model_path(choice, work):
    if choice == "smollm2":
        if not os.path.isfile(SMOLLM2):
            sys.exit(f"soak: no model at {SMOLLM2}: run scripts/fetch_model.sh")
        return SMOLLM2
    if choice != "stories":
        return os.path.abspath(choice)
    out = os.path.join(work, "stories260K.gguf")
    data = os.path.join(SOURCE_DIR, "tests", "data", "stories260K")
    subprocess.run([os.path.join(BINARY_DIR, "helios"), "convert-llama2c", "--checkpoint",
                    os.path.join(data, "stories260K.bin"), "--tokenizer", os.path.join(data, "tok512.bin"),
                    "--out", out], check=True, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


class Server:
    def __init__(self, work, model, args):
        self.port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
        self.config = {
            "server": {"listen": f"127.0.0.1:{self.port}", "metrics_listen": f"127.0.0.1:{self.metrics_port}",
                       "http_listen": f"127.0.0.1:{self.http_port}", "drain_timeout_s": 10,
                       "liveness_timeout_s": 30},
            "models": [{"name": "soak", "path": model}],
            "engine": {"backend": "cpu", "threads": args.engine_threads, "kv_cache": args.kv_cache,
                       "queue_limit": args.queue_limit},
            "limits": {"max_tokens": 512},
            "logging": {"level": "info"},
        }
        self.config_path = os.path.join(work, "heliosd.yaml")
        with open(self.config_path, "w") as f:
            f.write(to_yaml(self.config) + "\n")
        self.log_path = os.path.join(work, "heliosd.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([os.path.join(BINARY_DIR, "heliosd"), "--config", self.config_path],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_serving(self, stub, pb):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"soak: heliosd exited with {self.proc.returncode} while starting; log: {self.log_path}")
            try:
                if stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=1).state == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        sys.exit(f"soak: heliosd not SERVING after 120 s; log: {self.log_path}")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        """SIGTERM; the exit code (None: it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                return None
        self.log.close()
        return self.proc.returncode


# ---------------------------------------------------------------------------------------------
# /proc sampling

def proc_sample(pid):
    """(RSS MiB, open fds, threads) of a process."""
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * PAGE_MIB
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return rss, fds, threads


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = pid, [], threading.Event()  # (seconds since start, rss, fds, threads)
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop.wait(1.0 - (time.monotonic() - self.t0) % 1.0):
            try:
                self.samples.append((time.monotonic() - self.t0, *proc_sample(self.pid)))
            except (OSError, StopIteration):
                return  # heliosd is gone; the run reports it


# ---------------------------------------------------------------------------------------------
# Traffic

class Tally:
    """Outcomes by (kind, outcome); every request sent is counted once when it starts and once
    when it ends, so sent − ended is what never ended."""

    def __init__(self):
        self.mu = threading.Lock()
        self.sent = 0
        self.ended = collections.Counter()
        self.unexpected = []  # (kind, outcome, detail), the first 20

    def start(self):
        with self.mu:
            self.sent += 1

    def end(self, kind, outcome, detail=""):
        with self.mu:
            self.ended[(kind, outcome)] += 1
            if outcome not in EXPECTED[kind] and len(self.unexpected) < 20:
                self.unexpected.append((kind, outcome, detail[:300]))


def prompt(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 24)))


class Traffic:
    def __init__(self, server, pb, pb_grpc, tally, seed):
        self.server, self.pb, self.pb_grpc, self.tally = server, pb, pb_grpc, tally
        self.seed = seed
        self.stop = threading.Event()
        self.hold = threading.Event()       # set: workers finish their request and wait
        self.idle = collections.Counter()   # worker → whether it is waiting on `hold`
        self.idle_mu = threading.Lock()
        self.ids = 0

    def channel(self):
        ch = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        return ch, self.pb_grpc.HeliosStub(ch)

    def next_id(self, rng):
        with self.idle_mu:
            self.ids += 1
            return f"soak-{self.ids}-{rng.randrange(1 << 30)}"

    # --- one request of each kind; each returns (outcome, detail)

    def generation(self, stub, rng, kind, max_tokens, timeout=300, cancel_after=None, abort_after=None):
        pb = self.pb
        rid = self.next_id(rng)
        call = stub.Generate(pb.GenerateRequest(text=prompt(rng), max_tokens=max_tokens, ignore_eos=True,
                                                request_id=rid,
                                                sampling=pb.SamplingParams(temperature=0.8, seed=rng.randrange(1000))),
                             timeout=timeout)
        n, final = 0, None
        try:
            for message in call:
                n += len(message.tokens)
                final = message
                if cancel_after is not None and n >= cancel_after:
                    call.cancel()
                if abort_after is not None and n >= abort_after:
                    stub.Abort(pb.AbortRequest(request_id=rid), timeout=10)
                    abort_after = None
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""
        reason = pb.FinishReason.Name(final.finish_reason) if final else "none"
        if reason == "FINISH_REASON_LENGTH":
            if n != max_tokens or final.usage.completion_tokens != n:
                return "bad:length-count", (f"{n} tokens streamed, usage {final.usage.completion_tokens}, "
                                            f"asked {max_tokens}")
            return "ok:length", ""
        if reason == "FINISH_REASON_ABORTED":
            if final.usage.completion_tokens != n:
                return "bad:abort-count", f"{n} tokens streamed, usage {final.usage.completion_tokens}"
            return "ok:aborted", ""
        return f"ok:{reason}", ""

    def unary(self, rng):
        max_tokens = rng.randint(4, 48)
        body = json.dumps({"model": "soak", "prompt": prompt(rng), "max_tokens": max_tokens,
                           "temperature": 0.8, "seed": rng.randrange(1000), "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.server.http_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            return f"http{e.code}", e.read().decode(errors="replace")
        except OSError as e:
            return "http-error", str(e)
        choice = reply["choices"][0]
        if choice["finish_reason"] != "length" or reply["usage"]["completion_tokens"] != max_tokens:
            return "bad:http-length", json.dumps(reply)[:300]
        return "http200:length", ""

    def one(self, stub, rng, kind):
        if kind == "stream":
            return self.generation(stub, rng, kind, rng.randint(8, 128))
        if kind == "unary":
            return self.unary(rng)
        if kind == "cancel":
            k = rng.randint(0, 24)
            return self.generation(stub, rng, kind, k + 200, cancel_after=k)
        if kind == "deadline":
            return self.generation(stub, rng, kind, 256, timeout=rng.uniform(0.002, 0.15))
        if kind == "abort":
            return self.generation(stub, rng, kind, 300, abort_after=rng.randint(1, 16))
        if kind == "tokenize":
            r = stub.Tokenize(self.pb.TokenizeRequest(text=prompt(rng)), timeout=30)
            return ("ok", "") if len(r.token_ids) > 0 else ("bad:tokenize", "no tokens")
        if kind == "burst":
            return self.generation(stub, rng, kind, 32)
        raise ValueError(kind)

    def run_one(self, stub, rng, kind):
        """One request, counted; its outcome."""
        self.tally.start()
        try:
            outcome, detail = self.one(stub, rng, kind)
        except grpc.RpcError as e:
            outcome, detail = e.code().name, e.details() or ""
        except Exception as e:  # noqa: BLE001 - a client-side failure is an outcome, not a crash
            outcome, detail = f"exception:{type(e).__name__}", str(e)
        self.tally.end(kind, outcome, detail)
        return outcome

    def wait_while_held(self, name):
        if not self.hold.is_set():
            return
        with self.idle_mu:
            self.idle[name] = 1
        while self.hold.is_set() and not self.stop.is_set():
            time.sleep(0.01)
        with self.idle_mu:
            self.idle[name] = 0

    def worker(self, index):
        rng = random.Random(self.seed * 1000 + index)
        ch, stub = self.channel()
        names, weights = zip(*KINDS)
        while not self.stop.is_set():
            self.wait_while_held(index)
            if self.stop.is_set():
                break
            if self.run_one(stub, rng, rng.choices(names, weights)[0]) in ("RESOURCE_EXHAUSTED", "http429"):
                time.sleep(rng.uniform(0.05, 0.25))  # "retry later", as a client should on a full queue
        ch.close()

    def burster(self, every_s, size):
        rng = random.Random(self.seed * 1000 + 999)
        ch, stub = self.channel()
        while not self.stop.wait(every_s):
            self.wait_while_held("burst")
            if self.stop.is_set():
                break
            barrier = threading.Barrier(size)

            def shot(r):
                barrier.wait(timeout=30)
                self.run_one(stub, r, "burst")

            shots = [threading.Thread(target=shot, args=(random.Random(rng.randrange(1 << 30)),)) for _ in range(size)]
            for t in shots:
                t.start()
            for t in shots:
                t.join(timeout=120)
        ch.close()

    def wait_all_idle(self, n_workers, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.idle_mu:
                if sum(self.idle.values()) == n_workers:
                    return True
            time.sleep(0.01)
        return False


def wait_server_idle(stub, pb, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        s = stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)
        if (s.kv_blocks_used, s.requests_running, s.requests_waiting) == (0, 0, 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The run

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120, help="traffic duration (default 120)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the RSS bound applies (default: a quarter of --seconds, at most 600)")
    ap.add_argument("--model", default="stories", help="stories (default), smollm2, or a GGUF path")
    ap.add_argument("--threads", type=int, default=6, help="client threads (default 6), plus the burst thread")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queue-limit", type=int, default=12, help="engine.queue_limit (default 12)")
    ap.add_argument("--burst-every", type=float, default=10, help="seconds between bursts (default 10)")
    ap.add_argument("--engine-threads", type=int, default=2)
    ap.add_argument("--kv-cache", default=None,
                    help="engine.kv_cache (default 16MiB for stories260K, 128MiB for other models: room for the "
                         "queue limit's requests, small enough that the prefix cache has touched all of it by the "
                         "end of the warm-up, so RSS after it is not the pool filling up)")
    ap.add_argument("--rss-bound-mib", type=float, default=8,
                    help="after the warm-up, RSS max - min at most this (default 8; the README says why)")
    ap.add_argument("--fd-slack", type=int, default=2, help="idle fds and threads may grow by this (default 2)")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (config, log)")
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else min(600.0, args.seconds / 4)
    if args.kv_cache is None:
        args.kv_cache = "16MiB" if args.model == "stories" else "128MiB"

    work = tempfile.mkdtemp(prefix="helios-soak-")
    pb, pb_grpc = make_stubs(work)
    model = model_path(args.model, work)
    server = Server(work, model, args)
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.HeliosStub(ch)
    server.wait_serving(stub, pb)
    sampler = Sampler(server.proc.pid)
    rss_start = proc_sample(server.proc.pid)[0]
    sampler.start()

    tally = Tally()
    traffic = Traffic(server, pb, pb_grpc, tally, args.seed)
    workers = [threading.Thread(target=traffic.worker, args=(i,), daemon=True) for i in range(args.threads)]
    workers.append(threading.Thread(target=traffic.burster, args=(args.burst_every, 3 * args.queue_limit),
                                    daemon=True))
    t0 = time.monotonic()
    print(f"soak: {args.seconds:g} s on {os.path.basename(model)}, seed {args.seed}, {args.threads} threads "
          f"+ a burst of {3 * args.queue_limit} every {args.burst_every:g} s (queue_limit {args.queue_limit}), "
          f"warm-up {warmup:g} s; heliosd pid {server.proc.pid}, log {server.log_path}", flush=True)
    for t in workers:
        t.start()

    failures = []
    # After the warm-up: a quiet moment (no request in flight, the server idle) to count fds and threads.
    time.sleep(max(0.0, warmup - (time.monotonic() - t0)))
    traffic.hold.set()
    if not traffic.wait_all_idle(len(workers)):
        failures.append("the clients did not come to rest for the after-warm-up count (a request hung?)")
    wait_server_idle(stub, pb)
    time.sleep(1.0)  # connections closed by clients are closed by the server too
    rss_warm, fds_warm, threads_warm = proc_sample(server.proc.pid)
    t_warm = time.monotonic() - sampler.t0
    traffic.hold.clear()

    while (left := args.seconds - (time.monotonic() - t0)) > 0 and server.proc.poll() is None:
        time.sleep(min(10.0, left))
        elapsed = time.monotonic() - t0
        with tally.mu:
            ended = sum(tally.ended.values())
        last = sampler.samples[-1] if sampler.samples else (0, 0, 0, 0)
        print(f"  {elapsed:6.0f} s: {ended} requests ended; RSS {last[1]:.1f} MiB, {last[2]} fds", flush=True)

    traffic.stop.set()
    for t in workers:
        t.join(timeout=180)
    hung = [t.name for t in workers if t.is_alive()]
    if hung:
        failures.append(f"{len(hung)} client thread(s) still waiting on a request 180 s after the end")
    if server.proc.poll() is not None:
        failures.append(f"heliosd exited with {server.proc.returncode} during the run")
    idle = wait_server_idle(stub, pb)
    if (idle.kv_blocks_used, idle.requests_running, idle.requests_waiting) != (0, 0, 0):
        failures.append(f"not idle after the traffic: {idle.kv_blocks_used} KV blocks used, "
                        f"{idle.requests_running} running, {idle.requests_waiting} waiting")
    time.sleep(1.0)
    rss_end, fds_end, threads_end = proc_sample(server.proc.pid)
    sampler.stop.set()
    sampler.join(timeout=5)
    text = server.metrics()
    stalls = metric_value(text, "helios_engine_stalls_total", {"model": "soak"}) or 0
    serving = metric_value(text, "helios_health_serving")
    ch.close()
    exit_code = server.stop()

    # --- checks
    after = [s for s in sampler.samples if s[0] >= t_warm]
    rss_after = [s[1] for s in after] + [rss_warm, rss_end]
    fds_all = [s[2] for s in sampler.samples]
    rss_spread = max(rss_after) - min(rss_after)
    if rss_spread > args.rss_bound_mib:
        failures.append(f"RSS after the warm-up spans {rss_spread:.1f} MiB ({min(rss_after):.1f} .. "
                        f"{max(rss_after):.1f}), over the bound of {args.rss_bound_mib:g} MiB")
    if fds_end > fds_warm + args.fd_slack:
        failures.append(f"open fds grew from {fds_warm} (idle after the warm-up) to {fds_end} (idle at the end)")
    if threads_end > threads_warm + args.fd_slack:
        failures.append(f"threads grew from {threads_warm} (idle after the warm-up) to {threads_end} (idle at the end)")
    ended = sum(tally.ended.values())
    if ended != tally.sent:
        failures.append(f"{tally.sent - ended} of {tally.sent} requests never ended")
    for kind, outcome, detail in tally.unexpected:
        failures.append(f"unexpected outcome of a {kind} request: {outcome} {detail}")
    bursts = {o: c for (k, o), c in tally.ended.items() if k == "burst"}
    if args.seconds >= 2 * args.burst_every and not bursts.get("RESOURCE_EXHAUSTED"):
        failures.append("no burst beyond the queue limit was refused with RESOURCE_EXHAUSTED")
    if stalls:
        failures.append(f"the liveness watchdog found the engine stalled {stalls:g} time(s)")
    if serving != 1:
        failures.append(f"helios_health_serving was {serving} at the end")
    if exit_code != 0:
        failures.append(f"heliosd exited with {exit_code} on SIGTERM (None: killed after 60 s)")

    summary = {
        "seconds": args.seconds, "warmup_seconds": warmup, "model": os.path.basename(model), "seed": args.seed,
        "threads": args.threads, "queue_limit": args.queue_limit, "burst_size": 3 * args.queue_limit,
        "requests_sent": tally.sent, "requests_ended": ended,
        "outcomes": {f"{k} {o}": c for (k, o), c in sorted(tally.ended.items())},
        "rss_mib": {"start": round(rss_start, 1), "after_warmup": round(rss_warm, 1),
                    "max": round(max(s[1] for s in sampler.samples), 1) if sampler.samples else None,
                    "end": round(rss_end, 1), "after_warmup_spread": round(rss_spread, 1),
                    "bound": args.rss_bound_mib},
        "fds": {"after_warmup_idle": fds_warm, "max": max(fds_all) if fds_all else None, "end_idle": fds_end},
        "threads": {"after_warmup_idle": threads_warm, "end_idle": threads_end},
        "stalls": stalls, "heliosd_exit": exit_code,
        "samples": [{"t": round(t, 1), "rss_mib": round(r, 2), "fds": f, "threads": th}
                    for t, r, f, th in sampler.samples],
        "failures": failures,
    }
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"summary written to {args.json}")
    if args.keep or failures:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def print_summary(s):
    print(f"\nrequests: {s['requests_sent']} sent, {s['requests_ended']} ended")
    print(f"  {'kind':<10} {'outcome':<22} {'count':>7}")
    for key, count in s["outcomes"].items():
        kind, outcome = key.split(" ", 1)
        mark = "" if outcome in EXPECTED[kind] else "   <- unexpected"
        print(f"  {kind:<10} {outcome:<22} {count:>7}{mark}")
    r, f, t = s["rss_mib"], s["fds"], s["threads"]
    print(f"heliosd RSS (MiB): start {r['start']}, after warm-up {r['after_warmup']}, max {r['max']}, end {r['end']}; "
          f"after warm-up max - min {r['after_warmup_spread']} (bound {r['bound']:g})")
    print(f"open fds (idle): after warm-up {f['after_warmup_idle']}, end {f['end_idle']}; "
          f"max during traffic {f['max']}")
    print(f"threads (idle): after warm-up {t['after_warmup_idle']}, end {t['end_idle']}")
    print(f"engine stalls: {s['stalls']:g}; heliosd exit on SIGTERM: {s['heliosd_exit']}")
    if s["failures"]:
        print("\nFAILED:")
        for line in s["failures"]:
            print(f"  - {line}")
    else:
        print("\nPASSED")


if __name__ == "__main__":
    sys.exit(main())
