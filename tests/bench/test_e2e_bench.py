#!/usr/bin/python3
"""helios-bench end to end: short real runs of bench/helios-bench against heliosd on the CPU with
stories260K (converted at test time from tests/data/stories260K; tiny and fast), checking that the
report is complete and consistent.

1. --config (heliosd started and stopped by the harness): 20 synthetic requests at two rates
   (a Poisson rate and all at once): JSON, Markdown and PNGs exist; completed + failed = sent;
   output tokens = the sum of the requested output lengths; median ≤ p90 ≤ p99; server samples.
2. --address (a heliosd started by the test) with --max-concurrency and --max-seconds: the deadline
   cuts the run; cancelled streams count as failed, unsent requests as not sent; the server frees
   every KV block afterwards.
3. --backend openai: the same requests over heliosd's OpenAI-compatible HTTP API, with --config
   (server samples over gRPC, tokens counted by heliosd) and with --url alone (any such server).

Run: /usr/bin/python3 tests/bench/test_e2e_bench.py   (ctest: bench.e2e), with
  HELIOS_BINARY_DIR  the build folder holding heliosd and helios (default SOURCE/build)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("HELIOS_SOURCE_DIR") or Path(__file__).resolve().parents[2])
BINARY_DIR = Path(os.environ.get("HELIOS_BINARY_DIR") or SOURCE_DIR / "build")
HELIOSD = BINARY_DIR / "heliosd"
HELIOS = BINARY_DIR / "helios"
STORIES_DIR = SOURCE_DIR / "tests" / "data" / "stories260K"
BENCH = SOURCE_DIR / "bench" / "helios-bench"
sys.path.insert(0, str(SOURCE_DIR / "bench"))

WORK = None
STORIES = None

CONFIG = """\
server:
  listen: 127.0.0.1:50051
  metrics_listen: 127.0.0.1:9090
  drain_timeout_s: 10
models:
  - name: stories
    path: stories.gguf
engine:
  backend: cpu
  threads: 2
  kv_cache: 32MiB
  max_seqs: 16
  queue_limit: 256
limits:
  max_tokens: 480
  default_max_tokens: 16
logging:
  level: info
"""


def setUpModule():
    global WORK, STORIES
    for path in (HELIOSD, HELIOS):
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"{path} is not built (cmake --build build --target heliosd helios)")
    WORK = Path(tempfile.mkdtemp(prefix="helios-bench-e2e-"))
    STORIES = WORK / "stories.gguf"
    subprocess.run([str(HELIOS), "convert-llama2c", "--checkpoint", str(STORIES_DIR / "stories260K.bin"),
                    "--tokenizer", str(STORIES_DIR / "tok512.bin"), "--out", str(STORIES)],
                   check=True, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (WORK / "stories.yaml").write_text(CONFIG)   # relative model path: resolved by the harness


def tearDownModule():
    if WORK:
        shutil.rmtree(WORK, ignore_errors=True)


def bench(*args, timeout=300):
    env = dict(os.environ, HELIOSD=str(HELIOSD))
    p = subprocess.run([str(BENCH), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"helios-bench exited with {p.returncode}:\n{p.stderr[-4000:]}")
    return p


class BenchE2ETest(unittest.TestCase):
    def check_common(self, rep, runs):
        from helios_bench.report import check_report
        self.assertEqual(check_report(rep), [])
        self.assertEqual([r["label"] for r in rep["runs"]], runs)
        self.assertEqual(rep["model"]["name"], "stories")
        self.assertEqual(rep["model"]["n_layers"], 5)
        self.assertEqual(rep["backend"], "cpu")
        self.assertEqual(len(rep["commit"]["commit"]), 40)
        for key in ("cpu", "cores", "memory_bytes"):
            self.assertTrue(rep["machine"][key], key)
        for run in rep["runs"]:
            s = run["summary"]
            self.assertEqual(s["completed"] + s["failed"], s["sent"], run["label"])
            self.assertEqual(s["sent"] + s["not_sent"], s["planned"])
            ok = [q for q in run["requests"] if q["ok"]]
            self.assertEqual(s["total_output_tokens"], sum(q["requested_output_len"] for q in ok))
            for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
                self.assertLessEqual(s[f"median_{m}"], s[f"p90_{m}"], m)
                self.assertLessEqual(s[f"p90_{m}"], s[f"p99_{m}"], m)
                self.assertGreaterEqual(s[f"median_{m}"], 0, m)
            self.assertGreaterEqual(s["server_samples"], 2)
            self.assertTrue(run["server_series"])
            self.assertEqual(run["server_series"][0]["model"], "stories")
            self.assertEqual(run["server_series"][0]["loaded_layers"], 5)
            self.assertTrue(all(1 <= int(k) <= 5 for k in run["exit_layer_histogram"]))
            for q in ok:
                self.assertEqual(q["server_completion_tokens"], q["output_len"])
                self.assertEqual(q["server_prompt_tokens"], q["prompt_len"])
                self.assertEqual(q["finish_reason"], "LENGTH")

    def test_managed_server_two_rates(self):
        out = WORK / "results1"
        p = bench("--config", str(WORK / "stories.yaml"), "--dataset", "synthetic", "--input-len", "32",
                  "--output-len", "24", "--range-ratio", "0.5", "--num-prompts", "20", "--request-rate", "8,inf",
                  "--sample-interval-ms", "50", "--result-dir", str(out), "--result-name", "e2e")
        files = {f.name for f in out.iterdir()}
        for name in ("e2e.json", "e2e.md", "e2e_latency_cdf.png", "e2e_server.png", "e2e_throughput_vs_rate.png",
                     "e2e_exit_layers.png"):
            self.assertIn(name, files)
            self.assertGreater((out / name).stat().st_size, 100, name)
        rep = json.loads((out / "e2e.json").read_text())
        self.check_common(rep, ["8", "inf"])
        for run in rep["runs"]:
            s = run["summary"]
            self.assertEqual((s["planned"], s["sent"], s["completed"], s["failed"]), (20, 20, 20, 0), run["label"])
            self.assertEqual(s["total_output_tokens"], rep["dataset"]["total_output_tokens"])
            self.assertEqual(s["total_input_tokens"], rep["dataset"]["total_prompt_tokens"])
        self.assertEqual(rep["dataset"]["total_output_tokens"], sum(w["output_len"] for w in rep["workload"]))
        # All at once: every stream was open at the same time (the server batches them; whether a
        # sample catches a step with several sequences depends on timing, so it is not asserted).
        inf = rep["runs"][1]["requests"]
        self.assertTrue(all(q["start_s"] < min(r["end_s"] for r in inf) for q in inf))
        self.assertTrue(rep["targets"][0]["managed"])
        self.assertIn("path: stories.gguf", rep["targets"][0]["config_text"])
        self.assertEqual(rep["targets"][0]["exit_code"], 0)
        md = (out / "e2e.md").read_text()
        self.assertIn("| 8 | 8 | 20 | 0 |", md)
        self.assertIn("all passed", md)
        self.assertIn("| inf |", p.stdout)

    def test_running_server_deadline(self):
        from helios_bench.client import SyncClient
        from helios_bench.server import ManagedServer
        server = ManagedServer(config=str(WORK / "stories.yaml"), heliosd=str(HELIOSD), label="own").start()
        try:
            out = WORK / "results2"
            # 2000 requests × 400 tokens, 4 at a time: far more work than the 1.5 s before the cut
            # (stories260K decodes thousands of tokens a second, so a small plan could finish in time).
            bench("--address", server.address, "--dataset", "synthetic", "--input-len", "16", "--output-len", "400",
                  "--num-prompts", "2000", "--request-rate", "inf", "--max-concurrency", "4", "--max-seconds", "1.5",
                  "--no-plots", "--result-dir", str(out), "--result-name", "cut")
            rep = json.loads((out / "cut.json").read_text())
            self.check_common(rep, ["inf"])
            s = rep["runs"][0]["summary"]
            self.assertTrue(rep["runs"][0]["cut_by_deadline"])
            self.assertEqual(s["planned"], 2000)
            self.assertGreater(s["not_sent"], 0)
            # The streams open at the cut are cancelled: up to the 4 slots (a slot may be between
            # two requests at that instant on a loaded machine).
            self.assertGreaterEqual(s["cancelled"], 1)
            self.assertLessEqual(s["cancelled"], 4)
            self.assertGreaterEqual(s["failed"], s["cancelled"])
            self.assertLess(s["duration_s"], 3.0)
            self.assertFalse(rep["targets"][0]["managed"])
            self.assertFalse(list(out.glob("*.png")))
            # The cancelled streams are freed on the server.
            client = SyncClient(server.address)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                st = client.status()
                if st.kv_blocks_used == 0 and st.requests_running == 0:
                    break
                time.sleep(0.05)
            self.assertEqual((st.kv_blocks_used, st.requests_running, st.requests_waiting), (0, 0, 0))
            client.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_openai_backend(self):
        out = WORK / "results3"
        bench("--backend", "openai", "--config", str(WORK / "stories.yaml"), "--dataset", "synthetic",
              "--input-len", "32", "--output-len", "24", "--num-prompts", "10", "--request-rate", "inf",
              "--sample-interval-ms", "50", "--no-plots", "--result-dir", str(out), "--result-name", "http")
        rep = json.loads((out / "http.json").read_text())
        self.check_common(rep, ["inf"])
        self.assertEqual(rep["targets"][0]["backend"], "openai")
        self.assertTrue(rep["targets"][0]["url"].startswith("http://127.0.0.1:"))
        s = rep["runs"][0]["summary"]
        self.assertEqual((s["sent"], s["completed"]), (10, 10))
        self.assertEqual(sum(rep["runs"][0]["exit_layer_histogram"].values()), s["total_output_tokens"])
        # --url: heliosd's HTTP API known by its URL alone (prompt lengths from usage, no samples).
        from helios_bench.server import ManagedServer
        server = ManagedServer(config=str(WORK / "stories.yaml"), heliosd=str(HELIOSD), label="own", http=True).start()
        try:
            bench("--url", server.url, "--dataset", "synthetic", "--input-len", "16", "--output-len", "12",
                  "--num-prompts", "6", "--no-plots", "--result-dir", str(out), "--result-name", "url")
        finally:
            self.assertEqual(server.stop(), 0)
        from helios_bench.report import check_report
        rep = json.loads((out / "url.json").read_text())
        self.assertEqual(check_report(rep), [])
        run = rep["runs"][0]
        self.assertFalse(run["server_sampled"])
        self.assertEqual(run["summary"]["completed"], 6)
        for q in run["requests"]:
            self.assertEqual(q["output_len"], 12)
            self.assertEqual(q["server_prompt_tokens"], q["prompt_len"])
            self.assertEqual(q["finish_reason"], "LENGTH")


if __name__ == "__main__":
    try:
        import grpc, grpc.aio, grpc_tools.protoc  # noqa: F401,E401
    except ImportError:
        print("bench.e2e skipped: this python lacks grpcio / grpc_tools "
              "(use /usr/bin/python3; apt-get install python3-grpcio python3-grpc-tools)")
        sys.exit(77)
    unittest.main(verbosity=2)
