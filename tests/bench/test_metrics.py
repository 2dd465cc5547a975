"""Percentiles and per-request metrics of bench/helios_bench/metrics.py on synthetic timelines."""
import math
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.helios_bench.metrics import (METRIC_DEFINITIONS, RequestResult, Slo, describe,  # noqa: E402
                                        percentile, summarize)


def req(start, token_offsets, end_offset, prompt_len=10, ok=True, error=""):
    tt = [start + t for t in token_offsets]
    return RequestResult(ok=ok, error=error, prompt_len=prompt_len, output_len=len(tt), start=start,
                         token_times=tt, end=start + end_offset)


class PercentileTest(unittest.TestCase):
    def test_hand_computed(self):
        xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4; rank = p/100 * 3
        self.assertEqual(percentile(xs, 0), 1.0)
        self.assertEqual(percentile(xs, 100), 4.0)
        self.assertAlmostEqual(percentile(xs, 50), 2.5)
        self.assertAlmostEqual(percentile(xs, 90), 3.7)   # rank 2.7: 3 + 0.7
        self.assertAlmostEqual(percentile(xs, 99), 3.97)  # rank 2.97
        self.assertAlmostEqual(percentile(xs, 25), 1.75)  # rank 0.75
        xs = [10, 20, 30, 40, 50]
        self.assertAlmostEqual(percentile(xs, 50), 30)
        self.assertAlmostEqual(percentile(xs, 90), 46)    # rank 3.6: 40 + 0.6*10
        self.assertAlmostEqual(percentile(xs, 12.5), 15)  # rank 0.5
        self.assertEqual(percentile([7.0], 99), 7.0)
        self.assertEqual(xs, [10, 20, 30, 40, 50])  # input not modified

    def test_bad(self):
        with self.assertRaises(ValueError):
            percentile([], 50)
        with self.assertRaises(ValueError):
            percentile([1.0], 101)


class SummarizeTest(unittest.TestCase):
    def setUp(self):
        # A: sent at 100.0, tokens after 0.1, 0.15, 0.2, 0.3 s, done at 0.35 s.
        self.a = req(100.0, [0.1, 0.15, 0.2, 0.3], 0.35, prompt_len=10)
        # B: one token after 0.05 s, done at 0.06 s: no TPOT, no ITL.
        self.b = req(100.2, [0.05], 0.06, prompt_len=20)
        # C: two tokens in one message (same time) and a third 0.2 s later.
        self.c = req(101.0, [0.2, 0.2, 0.4], 0.5, prompt_len=30)
        # Failed: counted as failed only.
        self.f = req(101.1, [0.01, 0.02], 5.0, prompt_len=1000, ok=False, error="UNAVAILABLE: gone")

    def test_timeline(self):
        s = summarize([self.a, self.b, self.c, self.f], duration_s=2.0)
        self.assertEqual(s["completed"], 3)
        self.assertEqual(s["failed"], 1)
        self.assertEqual(s["errors"], {"UNAVAILABLE: gone": 1})
        self.assertEqual(s["total_input_tokens"], 60)
        self.assertEqual(s["total_output_tokens"], 8)
        self.assertAlmostEqual(s["request_throughput"], 1.5)
        self.assertAlmostEqual(s["input_throughput"], 30.0)
        self.assertAlmostEqual(s["output_throughput"], 4.0)
        self.assertAlmostEqual(s["total_token_throughput"], 34.0)
        # TTFT: 100, 50, 200 ms.
        self.assertAlmostEqual(s["mean_ttft_ms"], 350 / 3)
        self.assertAlmostEqual(s["median_ttft_ms"], 100)
        self.assertAlmostEqual(s["p90_ttft_ms"], 180)   # sorted 50 100 200, rank 1.8
        self.assertAlmostEqual(s["p99_ttft_ms"], 198)
        # TPOT: A (0.3-0.1)/3 = 66.67 ms, C (0.4-0.2)/2 = 100 ms; B excluded.
        self.assertEqual(s["count_tpot_ms"], 2)
        self.assertAlmostEqual(s["mean_tpot_ms"], (200 / 3 + 100) / 2)
        self.assertAlmostEqual(s["median_tpot_ms"], (200 / 3 + 100) / 2)
        self.assertAlmostEqual(s["p99_tpot_ms"], 200 / 3 + 0.99 * (100 - 200 / 3))
        # ITL pooled: A 50 50 100, C 0 200.
        self.assertEqual(s["count_itl_ms"], 5)
        self.assertAlmostEqual(s["mean_itl_ms"], 80)
        self.assertAlmostEqual(s["median_itl_ms"], 50)
        self.assertAlmostEqual(s["p90_itl_ms"], 160)    # sorted 0 50 50 100 200, rank 3.6
        # E2EL: 350, 60, 500 ms.
        self.assertAlmostEqual(s["mean_e2el_ms"], 910 / 3)
        self.assertAlmostEqual(s["median_e2el_ms"], 350)
        self.assertAlmostEqual(s["std_e2el_ms"], math.sqrt(((350 - 910 / 3) ** 2 + (60 - 910 / 3) ** 2
                                                            + (500 - 910 / 3) ** 2) / 3))
        self.assertNotIn("goodput", s)

    def test_vllm_keys_present_and_defined(self):
        s = summarize([self.a], 1.0, percentiles=(50, 90, 99, 99.9))
        for key in ("completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
                    "request_throughput", "input_throughput", "output_throughput"):
            self.assertIn(key, s)
        for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            for stat in ("mean", "median", "std", "p50", "p90", "p99", "p99.9"):
                self.assertIn(f"{stat}_{m}", s)
        for key in s:
            self.assertTrue(describe(key), key)
        self.assertIn("excluded", METRIC_DEFINITIONS["tpot_ms"])

    def test_goodput(self):
        results = [self.a, self.b, self.c, self.f]
        s = summarize(results, 2.0, slo=Slo(ttft_ms=150))  # A, B
        self.assertEqual((s["good_completed"], s["goodput"]), (2, 1.0))
        self.assertEqual(s["slo"], {"ttft_ms": 150})
        s = summarize(results, 2.0, slo=Slo(tpot_ms=70))  # A (66.7), B (one token: meets)
        self.assertEqual(s["good_completed"], 2)
        s = summarize(results, 2.0, slo=Slo(ttft_ms=150, tpot_ms=70, e2el_ms=300))  # B only
        self.assertEqual(s["good_completed"], 1)
        self.assertAlmostEqual(s["goodput"], 0.5)
        s = summarize(results, 4.0, slo=Slo())  # no SLO stated: every completed request is good
        self.assertAlmostEqual(s["goodput"], 0.75)
        s = summarize([req(0.0, [], 0.1)], 1.0, slo=Slo(ttft_ms=1000))  # no token: fails TTFT
        self.assertEqual(s["good_completed"], 0)

    def test_empty_and_all_failed(self):
        s = summarize([self.f], 1.0, slo=Slo(ttft_ms=1))
        self.assertEqual((s["completed"], s["failed"], s["goodput"]), (0, 1, 0.0))
        self.assertEqual(s["mean_ttft_ms"], 0.0)
        self.assertEqual(s["p99_itl_ms"], 0.0)
        self.assertEqual(summarize([], 1.0)["completed"], 0)
        with self.assertRaises(ValueError):
            summarize([self.a], 0.0)


if __name__ == "__main__":
    unittest.main()
