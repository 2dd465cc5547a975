"""Arrival processes of bench/helios_bench/arrivals.py."""
import math
import os
import statistics
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.helios_bench.arrivals import arrival_times, parse_rates  # noqa: E402


def gaps(ts):
    return [b - a for a, b in zip(ts, ts[1:])]


class ArrivalTest(unittest.TestCase):
    def test_poisson_mean_and_cv(self):
        ts = arrival_times(20001, 4.0, seed=1)
        g = gaps(ts)
        self.assertEqual(ts[0], 0.0)
        self.assertAlmostEqual(statistics.fmean(g), 0.25, delta=0.25 * 0.03)
        self.assertAlmostEqual(statistics.pstdev(g) / statistics.fmean(g), 1.0, delta=0.05)  # exponential
        self.assertEqual(ts, sorted(ts))

    def test_seeded(self):
        self.assertEqual(arrival_times(100, 2.0, 1.0, seed=3), arrival_times(100, 2.0, 1.0, seed=3))
        self.assertNotEqual(arrival_times(100, 2.0, 1.0, seed=3), arrival_times(100, 2.0, 1.0, seed=4))

    def test_inf_rate_all_at_once(self):
        self.assertEqual(arrival_times(5, math.inf), [0.0] * 5)
        self.assertEqual(arrival_times(3, float("inf"), burstiness=0.5), [0.0] * 3)

    def test_gamma_burstiness_changes_variance_not_mean(self):
        cvs = {}
        for b in (0.25, 1.0, 4.0):
            g = gaps(arrival_times(20001, 10.0, burstiness=b, seed=2))
            self.assertAlmostEqual(statistics.fmean(g), 0.1, delta=0.1 * 0.06, msg=f"burstiness {b}")
            cvs[b] = statistics.pstdev(g) / statistics.fmean(g)
            # Gamma(shape=b): coefficient of variation 1/sqrt(b).
            self.assertAlmostEqual(cvs[b], 1 / math.sqrt(b), delta=0.1 / math.sqrt(b), msg=f"burstiness {b}")
        self.assertGreater(cvs[0.25], cvs[1.0])
        self.assertGreater(cvs[1.0], cvs[4.0])

    def test_edge_cases(self):
        self.assertEqual(arrival_times(0, 1.0), [])
        self.assertEqual(arrival_times(1, 1.0), [0.0])
        for bad in (0.0, -1.0, float("nan")):
            with self.assertRaises(ValueError):
                arrival_times(3, bad)
        for bad in (0.0, -2.0, math.inf):
            with self.assertRaises(ValueError):
                arrival_times(3, 1.0, burstiness=bad)


class RatesTest(unittest.TestCase):
    def test_lists_and_ranges(self):
        self.assertEqual(parse_rates("1,2,4,inf"), [1.0, 2.0, 4.0, math.inf])
        self.assertEqual(parse_rates("2:8:2"), [2.0, 4.0, 6.0, 8.0])
        self.assertEqual(parse_rates("0.5:1.5:0.5, 10"), [0.5, 1.0, 1.5, 10.0])
        self.assertEqual(parse_rates("0.1:0.3:0.1"), [0.1, 0.2, 0.3])

    def test_bad(self):
        for spec in ("", "0", "-1", "x", "1:2", "3:1:1", "1:5:0"):
            with self.subTest(spec):
                with self.assertRaises(ValueError):
                    parse_rates(spec)


if __name__ == "__main__":
    unittest.main()
