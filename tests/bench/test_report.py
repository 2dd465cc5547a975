#!/usr/bin/python3
"""helios-bench without a server: the report (JSON, Markdown, compare ratios, plots) built from
synthetic request results is complete and consistent; check_report catches inconsistencies; the
load generator's bookkeeping (deadline, cancellation, concurrency limit, schedule) with a fake
client; the config rewrite for a managed heliosd; --help defines every metric.

Run: /usr/bin/python3 tests/bench/test_report.py   (ctest: bench.report)
"""
import asyncio
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
import unittest
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("HELIOS_SOURCE_DIR") or Path(__file__).resolve().parents[2])
sys.path.insert(0, str(SOURCE_DIR / "bench"))

try:
    import grpc  # noqa: F401  (client.py needs it at import)
except ImportError:
    print("bench.report skipped: this python lacks grpcio (use /usr/bin/python3; apt-get install python3-grpcio)")
    sys.exit(77)

from helios_bench import plots, report, runner  # noqa: E402
from helios_bench.client import Extra  # noqa: E402
from helios_bench.metrics import RequestResult, Slo  # noqa: E402
from helios_bench.server import rewrite_config  # noqa: E402
from helios_bench.workloads import BenchRequest  # noqa: E402

MACHINE = {"cpu": "test cpu", "cores": 2, "memory_gib": 4.0, "load_average_at_start": [0, 0, 0]}
COMMIT = {"commit": "0" * 40, "dirty": False, "describe": "test"}
MODEL = {"name": "m", "architecture": "llama", "n_layers": 4, "n_parameters": 1000, "backend": "cpu"}


def fake_outcome(n_ok=12, n_failed=2, n_cancelled=1, n_not_sent=1, t0=1000.0, speed=1.0, seed=0):
    """A RunOutcome with ok requests (output_len tokens each, 4 layers of exit), failed and
    cancelled ones, and planned-but-not-sent ones."""
    import random
    rng = random.Random(seed)
    requests, results, extras, indices = [], [], [], []
    t = t0
    i = 0
    for k in range(n_ok + n_failed + n_cancelled):
        out_len = rng.randint(1, 20)
        req = BenchRequest(prompt=f"p{k}", prompt_len=rng.randint(5, 50), output_len=out_len)
        requests.append(req)
        start = t + rng.random()
        if k < n_ok:
            ttft = (0.05 + rng.random() * 0.2) * speed
            times = [start + ttft + j * 0.02 * speed * (1 + rng.random()) for j in range(out_len)]
            res = RequestResult(True, "", req.prompt_len, out_len, start, times, times[-1] + 0.001)
            ex = Extra(request_id=f"r{k}", sent=True, finish_reason="LENGTH",
                       exit_layers={4: out_len - out_len // 3, 2: out_len // 3} if out_len // 3 else {4: out_len})
        elif k < n_ok + n_failed:
            res = RequestResult(False, "RESOURCE_EXHAUSTED: the request queue is full; retry later",
                                req.prompt_len, 0, start, [], start + 0.001)
            ex = Extra(request_id=f"r{k}", sent=True)
        else:
            times = [start + 0.1, start + 0.12]
            res = RequestResult(False, "CANCELLED: stopped at the --max-seconds deadline", req.prompt_len, 2,
                                start, times, start + 0.2)
            ex = Extra(request_id=f"r{k}", sent=True, cancelled=True, exit_layers={4: 2})
        results.append(res)
        extras.append(ex)
        indices.append(i)
        i += 1
    for _ in range(n_not_sent):
        requests.append(BenchRequest(prompt="late", prompt_len=5, output_len=5))
        i += 1
    end = max(r.end for r in results)
    outcome = runner.RunOutcome(results=results, extras=extras, indices=indices, planned=len(requests), t0=t0,
                                duration_s=end - t0, cut_by_deadline=n_not_sent > 0 or n_cancelled > 0,
                                offsets=[0.1 * j for j in range(len(requests))])
    return requests, outcome


def fake_samples(t0=1000.0, n=8):
    return [{"t": t0 + 0.25 * k, "state": "SERVING", "requests_waiting": max(0, 3 - k), "requests_running": 2,
             "requests_swapped": 0, "batch_size": 2 + k % 3, "batch_tokens": 10, "kv_blocks_used": k,
             "kv_blocks_total": 10, "kv_use": k / 10, "steps_per_second": 50.0, "preemptions": 1 + k // 4,
             "requests_total": k, "generated_tokens_total": 10 * k, "model": "m", "loaded_layers": 4}
            for k in range(n)]


def fake_report(targets=("a",), rates=(1.0, math.inf)):
    runs = []
    requests = None
    for ti, target in enumerate(targets):
        for rate in rates:
            reqs, outcome = fake_outcome(speed=1.0 + ti, seed=7)
            requests = reqs
            spec = runner.RunSpec(request_rate=rate, max_seconds=10.0)
            label = f"{target}@{runner.rate_label(rate)}" if len(targets) > 1 else runner.rate_label(rate)
            runs.append(runner.run_record(label, target, spec, outcome, fake_samples(), reqs, (50, 90, 99),
                                          Slo(ttft_ms=200)))
    tinfo = [{"label": t, "address": "127.0.0.1:1", "config_path": f"{t}.yaml", "config_text": "models: []\n",
              "managed": True, "model": MODEL} for t in targets]
    return report.build_report(command="helios-bench --test", args={"request_rate": "1,inf"},
                               dataset={"name": "synthetic", "num_requests": len(requests), "notes": ["n"]},
                               targets=tinfo, runs=runs, requests=runner.requests_as_dicts(requests),
                               machine=MACHINE, commit=COMMIT)


class ReportTest(unittest.TestCase):
    def test_complete_and_consistent(self):
        rep = fake_report()
        self.assertEqual(report.check_report(rep), [])
        for key in ("schema", "command", "commit", "machine", "model", "backend", "dataset", "targets", "runs",
                    "workload", "metric_definitions"):
            self.assertIn(key, rep)
        self.assertEqual(rep["backend"], "cpu")
        run = rep["runs"][0]
        s = run["summary"]
        self.assertEqual((s["planned"], s["sent"], s["not_sent"]), (16, 15, 1))
        self.assertEqual((s["completed"], s["failed"], s["cancelled"]), (12, 3, 1))
        self.assertEqual(s["completed"] + s["failed"], s["sent"])
        self.assertEqual(s["total_output_tokens"], sum(q["output_len"] for q in run["requests"] if q["ok"]))
        self.assertEqual(s["server_samples"], 8)
        self.assertEqual(s["server_preemptions"], 1)
        self.assertEqual(s["server_max_requests_waiting"], 3)
        self.assertAlmostEqual(s["server_max_kv_use"], 0.7)
        self.assertEqual(sum(run["exit_layer_histogram"].values()), sum(q["output_len"] for q in run["requests"]))
        self.assertEqual(run["server_series"][0]["t"], 0.0)
        self.assertLessEqual(s["median_ttft_ms"], s["p90_ttft_ms"])
        self.assertLessEqual(s["p90_ttft_ms"], s["p99_ttft_ms"])
        self.assertIn("goodput", s)
        self.assertEqual(run["request_rate"], 1.0)
        self.assertEqual(rep["runs"][1]["request_rate"], "inf")

    def test_json_round_trip(self):
        rep = fake_report()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            report.write_json(rep, path)
            with open(path) as f:
                back = json.load(f)
        self.assertEqual(report.check_report(back), [])
        self.assertEqual(back["runs"][1]["request_rate"], "inf")
        self.assertEqual(len(back["runs"][0]["requests"]), back["runs"][0]["summary"]["sent"])

    def test_markdown(self):
        rep = fake_report()
        md = report.markdown(rep, ["/x/r_latency_cdf.png"])
        for text in ("helios-bench --test", "| run | rate (req/s) |", "| 1 | 1 |", "| inf | inf |",
                     "Mean TTFT (ms)", "P99 E2EL (ms)", "Median ITL (ms)", "Mean batch size", "Preemptions",
                     "Exit layers: 2:", "RESOURCE_EXHAUSTED", "![r_latency_cdf](r_latency_cdf.png)",
                     "all passed"):
            self.assertIn(text, md)
        self.assertNotIn("Compare", md)        # one target: no ratios

    def test_compare_ratios(self):
        rep = fake_report(targets=("a", "b"), rates=(2.0,))
        rows = report.compare_rows(rep)
        self.assertEqual([r["label"] for r in rows], ["a@2", "b@2"])
        self.assertTrue(all(v == 1.0 for v in rows[0]["ratios"].values() if v is not None))
        a, b = (r["summary"] for r in rep["runs"])
        self.assertAlmostEqual(rows[1]["ratios"]["mean_ttft_ms"], b["mean_ttft_ms"] / a["mean_ttft_ms"])
        self.assertGreater(rows[1]["ratios"]["mean_ttft_ms"], 1.5)   # b is twice as slow
        md = report.markdown(rep)
        self.assertIn("## Compare: ratios against `a`", md)
        self.assertIn("| b@2 |", md)

    def test_check_report_finds_problems(self):
        rep = fake_report()
        rep["runs"][0]["summary"]["completed"] += 1
        rep["runs"][1]["summary"]["p90_ttft_ms"] = rep["runs"][1]["summary"]["p99_ttft_ms"] + 1
        rep["runs"][1]["requests"][0]["output_len"] -= 1
        rep["runs"][1]["server_series"] = []
        problems = "\n".join(report.check_report(rep))
        self.assertIn("!= sent", problems)
        self.assertIn("not ordered", problems)
        self.assertIn("asked for", problems)
        self.assertIn("no server samples", problems)

    def test_plots(self):
        self.assertTrue(plots.available(), "matplotlib missing: run scripts/install_deps.sh (python3-matplotlib)")
        rep = fake_report(targets=("a", "b"))
        with tempfile.TemporaryDirectory() as d:
            files = plots.make_plots(rep, os.path.join(d, "r"))
            names = sorted(os.path.basename(f) for f in files)
            self.assertEqual(names, ["r_exit_layers.png", "r_latency_cdf.png", "r_server.png",
                                     "r_throughput_vs_rate.png"])
            for f in files:
                with open(f, "rb") as fh:
                    self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

    def test_help_defines_every_metric(self):
        from helios_bench import cli
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit):
            cli.parse_args(["--help"])
        text = out.getvalue()
        s = fake_report()["runs"][0]["summary"]
        for key in s:
            if key in ("slo", "errors") or key.startswith(("mean_", "median_", "std_", "count_", "p")) and \
                    key.endswith("_ms"):
                continue
            self.assertIn(key, text, f"--help does not define {key}")
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "goodput", "pN_*", "exit_layer_histogram"):
            self.assertIn(key, text)
        for option in ("--request-rate", "--burstiness", "--max-concurrency", "--max-seconds", "--num-prompts",
                       "--config", "--address", "--dataset", "--result-dir"):
            self.assertIn(option, text)


class FakeClient:
    """Stands in for AsyncClient.generate: each request takes output_len × 10 ms."""

    def __init__(self):
        self.in_flight = self.max_in_flight = 0

    async def generate(self, request_id, prompt, prompt_len, output_len):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        start = time.perf_counter()
        times = []
        try:
            for _ in range(output_len):
                await asyncio.sleep(0.01)
                times.append(time.perf_counter())
            return (RequestResult(True, "", prompt_len, len(times), start, times, time.perf_counter()),
                    Extra(request_id=request_id, sent=True, finish_reason="LENGTH", exit_layers={1: len(times)}))
        except asyncio.CancelledError:
            return (RequestResult(False, "CANCELLED", prompt_len, len(times), start, times, time.perf_counter()),
                    Extra(request_id=request_id, sent=True, cancelled=True, exit_layers={1: len(times)}))
        finally:
            self.in_flight -= 1


class LoadTest(unittest.TestCase):
    def requests(self, n, out):
        return [BenchRequest(prompt="x", prompt_len=3, output_len=out) for _ in range(n)]

    def test_all_at_once(self):
        client = FakeClient()
        reqs = self.requests(30, 5)
        o = asyncio.run(runner.run_load(client, reqs, runner.RunSpec(request_rate=math.inf)))
        self.assertEqual(len(o.results), 30)
        self.assertTrue(all(r.ok for r in o.results))
        self.assertEqual(client.max_in_flight, 30)
        self.assertFalse(o.cut_by_deadline)

    def test_concurrency_limit(self):
        client = FakeClient()
        o = asyncio.run(runner.run_load(client, self.requests(20, 3),
                                        runner.RunSpec(request_rate=math.inf, max_concurrency=4)))
        self.assertEqual(client.max_in_flight, 4)
        self.assertEqual(sum(r.ok for r in o.results), 20)

    def test_deadline_cancels_and_counts(self):
        client = FakeClient()
        reqs = self.requests(40, 30)          # 0.3 s each; 4 at a time → 3 s in all
        spec = runner.RunSpec(request_rate=math.inf, max_concurrency=4, max_seconds=0.5)
        t = time.perf_counter()
        o = asyncio.run(runner.run_load(client, reqs, spec))
        self.assertLess(time.perf_counter() - t, 1.5)
        rec = runner.run_record("x", "t", spec, o, fake_samples(o.t0, 3), reqs, (50, 90, 99), None)
        s = rec["summary"]
        self.assertTrue(o.cut_by_deadline)
        self.assertEqual(s["completed"] + s["failed"], s["sent"])
        self.assertEqual(s["sent"] + s["not_sent"], 40)
        self.assertEqual(s["cancelled"], 4)
        self.assertGreater(s["completed"], 0)
        self.assertGreater(s["not_sent"], 0)
        self.assertLessEqual(s["duration_s"], 1.0)

    def test_poisson_schedule_and_trace(self):
        reqs = self.requests(50, 1)
        offs = runner.schedule(reqs, runner.RunSpec(request_rate=10.0, seed=3))
        self.assertEqual(offs, sorted(offs))
        self.assertEqual(offs[0], 0.0)
        self.assertAlmostEqual(offs[-1] / 49, 0.1, delta=0.05)
        trace = [BenchRequest("x", 3, 1, arrival_s=t) for t in (5.0, 5.5, 7.0)]
        self.assertEqual(runner.schedule(trace, runner.RunSpec(request_rate=None)), [0.0, 0.5, 2.0])
        with self.assertRaises(ValueError):
            runner.schedule(reqs, runner.RunSpec(request_rate=None))

    def test_rate_paces_requests(self):
        client = FakeClient()
        reqs = self.requests(10, 1)
        o = asyncio.run(runner.run_load(client, reqs, runner.RunSpec(request_rate=20.0, seed=1)))
        starts = [r.start - o.t0 for r in o.results]
        for got, want in zip(starts, o.offsets):
            self.assertAlmostEqual(got, want, delta=0.05)


class ConfigRewriteTest(unittest.TestCase):
    def test_rewrite(self):
        text = ("# c\nserver:\n  listen: 0.0.0.0:50051   # all\n  metrics_listen: 127.0.0.1:9090\n"
                "  tls:\n    cert: \"\"\n    key: \"\"\nmodels:\n  - name: a\n    path: ../models/a.gguf  # m\n"
                "  - name: b\n    path: /abs/b.gguf\nengine:\n  threads: 2\n")
        out = rewrite_config(text, Path("/cfg/dir"), 4242)
        self.assertIn('  listen: "127.0.0.1:4242"', out)
        self.assertIn('  metrics_listen: ""', out)
        self.assertIn('    path: "/cfg/models/a.gguf" # m', out)
        self.assertIn("    path: /abs/b.gguf", out)
        self.assertIn('    cert: ""', out)
        self.assertIn("engine:\n  threads: 2", out)

    def test_rewrite_early_exit_heads(self):
        out = rewrite_config("models:\n  - name: a\n    path: a.gguf\n    early_exit:\n      heads: h/a.exits.gguf\n"
                             "      exits: [2, 4]\n", Path("/d"), 7)
        self.assertIn('      heads: "/d/h/a.exits.gguf"', out)
        self.assertIn("      exits: [2, 4]", out)
        self.assertIn('      heads: ""', rewrite_config('models:\n  - name: a\n    path: /a\n    early_exit:\n'
                                                       '      heads: ""\n', Path("/d"), 7))

    def test_rewrite_adds_listen(self):
        out = rewrite_config("models:\n  - name: a\n    path: a.gguf\n", Path("/d"), 7)
        self.assertIn('server:\n  listen: "127.0.0.1:7"\n  metrics_listen: ""', out)
        self.assertIn('path: "/d/a.gguf"', out)
        out = rewrite_config("server:\n  drain_timeout_s: 5\nmodels:\n  - {name: a, path: /a}\n", Path("/d"), 7)
        self.assertIn('server:\n  listen: "127.0.0.1:7"\n  metrics_listen: ""\n  http_listen: ""\n  drain_timeout_s: 5',
                      out)

    def test_rewrite_http_listen(self):
        # Off for gRPC runs (configs/default.yaml turns it on at 127.0.0.1:8000), a free port for
        # --backend openai.
        text = "server:\n  listen: 0.0.0.0:50051\n  http_listen: 127.0.0.1:8000  # on\nmodels:\n  - {name: a, path: /a}\n"
        self.assertIn('  http_listen: ""\n', rewrite_config(text, Path("/d"), 7))
        self.assertIn('  http_listen: "127.0.0.1:9"\n', rewrite_config(text, Path("/d"), 7, http_port=9))
        out = rewrite_config("models:\n  - {name: a, path: /a}\n", Path("/d"), 7, http_port=9)
        self.assertIn('server:\n  listen: "127.0.0.1:7"\n  metrics_listen: ""\n  http_listen: "127.0.0.1:9"', out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
