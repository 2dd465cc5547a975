"""Loader rules of bench/helios_bench/workloads.py on small fixtures (tokens faked as words)."""
import json
import os
import random
import sys
import tempfile
import logging
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.helios_bench import workloads as wl  # noqa: E402
from bench.helios_bench.workloads import BenchRequest, load_prompts, load_sharegpt, load_trace, synthetic  # noqa: E402

logging.getLogger("helios_bench").addHandler(logging.NullHandler())  # notes are checked, not printed

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TEST_DATA = os.path.join(ROOT, "tests", "data")  # excerpts of real data (tests/data/SOURCES.md)
SHAREGPT = os.path.join(FIX, "sharegpt_tiny.json")


def count_words(texts):
    return [len(t.split()) for t in texts]


def make_prompt(n):
    return " ".join(["tok"] * n)


def ids_of(reqs):
    # Fixture prompts are "<tag>0 <tag>1 ..."; the tag names the conversation.
    return [r.prompt.split()[0][:-1] for r in reqs]


STRICT_KEPT = {"basic", "minlen", "maxlen", "three", "user"} | {f"extra{i}" for i in range(8)}


class ShareGPTTest(unittest.TestCase):
    def test_rules(self):
        reqs = load_sharegpt(SHAREGPT, 100, seed=0, count_tokens=count_words)
        self.assertEqual(set(ids_of(reqs)), STRICT_KEPT)
        self.assertEqual(len(reqs), len(STRICT_KEPT))
        by = {i: r for i, r in zip(ids_of(reqs), reqs)}
        self.assertEqual((by["basic"].prompt_len, by["basic"].output_len), (5, 6))
        self.assertEqual((by["minlen"].prompt_len, by["minlen"].output_len), (4, 4))   # min_len inclusive
        self.assertEqual((by["maxlen"].prompt_len, by["maxlen"].output_len), (1024, 1024))  # limits inclusive
        self.assertEqual((by["three"].prompt_len, by["three"].output_len), (7, 9))  # turns 0 and 1 only
        self.assertEqual((by["user"].prompt_len, by["user"].output_len), (6, 8))
        for r in reqs:
            self.assertIsInstance(r, BenchRequest)
            self.assertIsNone(r.arrival_s)
            self.assertEqual(r.prompt_len, len(r.prompt.split()))

    def test_dropped_cases(self):
        kept = set(ids_of(load_sharegpt(SHAREGPT, 100, 0, count_words)))
        for dropped in ("one", "shortp", "shorto", "longp", "total", "gptfirst"):
            self.assertNotIn(dropped, kept)

    def test_notes_count_drops(self):
        reqs = load_sharegpt(SHAREGPT, 100, 0, count_words)
        text = "\n".join(reqs.notes)
        self.assertIn("first turn not from the human: 1", text)
        self.assertIn("prompt or output < 4 tokens: 2", text)
        self.assertIn("prompt > 1024 tokens: 1", text)
        self.assertIn("prompt + output > 2048 tokens: 1", text)
        self.assertIn("only 13 of the 100", text)

    def test_vllm_mode_keeps_gpt_first_and_matches_vllm_order(self):
        reqs = load_sharegpt(SHAREGPT, 100, seed=7, count_tokens=count_words, require_human_first=False)
        self.assertEqual(set(ids_of(reqs)), STRICT_KEPT | {"gptfirst"})
        # vLLM: keep >= 2 turns, random.seed(seed); random.shuffle(dataset); then walk with the rules.
        with open(SHAREGPT) as f:
            data = [d for d in json.load(f) if len(d["conversations"]) >= 2]
        random.seed(7)
        random.shuffle(data)
        expected = []
        for d in data:
            p, c = d["conversations"][0]["value"], d["conversations"][1]["value"]
            pl, ol = len(p.split()), len(c.split())
            if pl < 4 or ol < 4 or pl > 1024 or pl + ol > 2048:
                continue
            expected.append(p)
        self.assertEqual([r.prompt for r in reqs], expected)

    def test_seeded_shuffle_reproducible(self):
        a = load_sharegpt(SHAREGPT, 100, 3, count_words)
        b = load_sharegpt(SHAREGPT, 100, 3, count_words)
        self.assertEqual([r.prompt for r in a], [r.prompt for r in b])
        orders = {tuple(ids_of(load_sharegpt(SHAREGPT, 100, s, count_words))) for s in range(6)}
        self.assertGreater(len(orders), 1)

    def test_num_requests_takes_prefix(self):
        full = load_sharegpt(SHAREGPT, 100, 5, count_words)
        part = load_sharegpt(SHAREGPT, 4, 5, count_words)
        self.assertEqual([r.prompt for r in part], [r.prompt for r in full[:4]])
        self.assertFalse(any("only" in n for n in part.notes))

    def test_custom_limits(self):
        reqs = load_sharegpt(SHAREGPT, 100, 0, count_words, max_prompt_len=10, max_total_len=20, min_len=5)
        for r in reqs:
            self.assertTrue(5 <= r.prompt_len <= 10 and r.output_len >= 5 and r.prompt_len + r.output_len <= 20)
        self.assertEqual(set(ids_of(reqs)), {"basic", "user", "three"})

    def test_count_tokens_batched(self):
        calls = []

        def counting(texts):
            calls.append(len(texts))
            return count_words(texts)

        load_sharegpt(SHAREGPT, 100, 0, counting)
        self.assertEqual(len(calls), 1)  # 19 conversations fit one batch
        self.assertEqual(calls[0], 2 * 17)  # prompt + reply of the 18 with >= 2 turns, less the gpt-first one

    def test_truncated_file_salvaged(self):
        reqs = load_sharegpt(os.path.join(FIX, "sharegpt_truncated.json"), 10, 0, count_words)
        self.assertEqual(ids_of(reqs), ["basic"])
        self.assertTrue(any("cut off" in n and "3 complete records" in n for n in reqs.notes))

    def test_wrong_formats(self):
        with tempfile.TemporaryDirectory() as d:
            def write(name, text):
                p = os.path.join(d, name)
                with open(p, "w") as f:
                    f.write(text)
                return p

            cases = {
                "prompts.json": (json.dumps([{"prompt": "hello there"}]), "ShareGPT format"),
                "noval.json": (json.dumps([{"conversations": [{"from": "human"}]}]), '"value"'),
                "csv.json": ("a,b\n1,2\n", "expected a JSON array"),
                "empty.json": ("", "empty"),
                "broken.json": ("[{]", "not valid JSON"),
                "oneturn.json": (json.dumps([{"conversations": [{"from": "human", "value": "x"}]}]),
                                 "load_prompts"),
            }
            for name, (text, msg) in cases.items():
                with self.subTest(name):
                    with self.assertRaises(ValueError) as cm:
                        load_sharegpt(write(name, text), 5, 0, count_words)
                    self.assertIn(msg, str(cm.exception))
            with self.assertRaisesRegex(ValueError, "no such file"):
                load_sharegpt(os.path.join(d, "missing.json"), 5, 0, count_words)

    def test_jsonl_accepted(self):
        with open(SHAREGPT) as f:
            data = json.load(f)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(d) for d in data) + "\n")
        try:
            a = load_sharegpt(f.name, 100, 1, count_words)
        finally:
            os.unlink(f.name)
        b = load_sharegpt(SHAREGPT, 100, 1, count_words)
        self.assertEqual([r.prompt for r in a], [r.prompt for r in b])


class PromptsTest(unittest.TestCase):
    PATH = os.path.join(FIX, "prompts_tiny.json")

    def test_fixed_output_len_and_rules(self):
        reqs = load_prompts(self.PATH, 10, 0, count_words, output_len=200)
        self.assertEqual(sorted(r.prompt_len for r in reqs), [5, 12, 30, 900])
        self.assertTrue(all(r.output_len == 200 for r in reqs))
        reqs = load_prompts(self.PATH, 10, 0, count_words, output_len=1200)  # 900 + 1200 > 2048
        self.assertEqual(sorted(r.prompt_len for r in reqs), [5, 12, 30])
        self.assertIn("1 without a human turn", reqs.notes[0])

    def test_seeded_and_limited(self):
        a = load_prompts(self.PATH, 2, 4, count_words, output_len=16)
        b = load_prompts(self.PATH, 2, 4, count_words, output_len=16)
        self.assertEqual(len(a), 2)
        self.assertEqual([r.prompt for r in a], [r.prompt for r in b])

    def test_strings_and_prompt_objects(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(["one two three four five", {"prompt": "a b c d e f"}, {"text": "x y z w v"}], f)
        try:
            reqs = load_prompts(f.name, 10, 0, count_words, output_len=8)
        finally:
            os.unlink(f.name)
        self.assertEqual(sorted(r.prompt_len for r in reqs), [5, 5, 6])

    def test_bad_output_len(self):
        with self.assertRaises(ValueError):
            load_prompts(self.PATH, 10, 0, count_words, output_len=0)

    def test_real_prompt_only_file_parses(self):
        # The first 80 prompts of ML.ENERGY's ShareGPT V3 sample (tests/data/SOURCES.md).
        path = os.path.join(TEST_DATA, "sharegpt", "ShareGPT_V3_filtered_first80_prompts.json")
        reqs = load_prompts(path, 50, 0, count_words, output_len=128)
        self.assertEqual(len(reqs), 50)
        # Prompt-only: load_sharegpt must refuse with a pointer to load_prompts.
        with self.assertRaisesRegex(ValueError, "load_prompts"):
            load_sharegpt(path, 5, 0, count_words)


class TraceTest(unittest.TestCase):
    def made(self):
        calls = []

        def mp(n):
            calls.append(n)
            return make_prompt(n)

        return calls, mp

    def test_azure(self):
        calls, mp = self.made()
        reqs = load_trace("azure", os.path.join(FIX, "azure_tiny.csv"), 10, mp)
        self.assertEqual([r.prompt_len for r in reqs], [374, 3000, 120, 5000, 96])
        self.assertEqual([r.output_len for r in reqs], [44, 109, 1, 900, 12])  # 0 raised to 1
        for got, want in zip([r.arrival_s for r in reqs], [0.0, 0.5, 2.0, 4.0, 10.0]):
            self.assertAlmostEqual(got, want, places=6)
        self.assertEqual(calls, [374, 3000, 120, 5000, 96])
        self.assertEqual(reqs[0].prompt, make_prompt(374))
        self.assertIn("raised to 1 token: 1", reqs.notes[0])

    def test_mooncake_scaled_clipped(self):
        reqs = load_trace("mooncake", os.path.join(FIX, "mooncake_tiny.jsonl"), 10, make_prompt,
                          time_scale=2.0, max_prompt_len=1024, max_output_len=256)
        self.assertEqual([r.arrival_s for r in reqs], [0.0, 0.0, 0.75, 2.0, 5.0])
        self.assertEqual([r.prompt_len for r in reqs], [1024, 700, 1024, 300, 512])
        self.assertEqual([r.output_len for r in reqs], [256, 49, 12, 256, 64])
        note = reqs.notes[0]
        self.assertIn("clipped prompt to 1024: 1", note)  # 1024 itself is not clipped
        self.assertIn("output to 256: 2", note)

    def test_llmservingsim_slow_down_and_limit(self):
        reqs = load_trace("llmservingsim", os.path.join(FIX, "llmservingsim_tiny.jsonl"), 2, make_prompt,
                          time_scale=0.5)
        self.assertEqual(len(reqs), 2)
        self.assertEqual([(r.prompt_len, r.output_len) for r in reqs], [(5, 3), (4, 2)])
        self.assertAlmostEqual(reqs[1].arrival_s, (0.347938951 - 0.046926808) * 2, places=9)

    def test_start_offset(self):
        reqs = load_trace("mooncake", os.path.join(FIX, "mooncake_tiny.jsonl"), 2, make_prompt,
                          start_offset_s=1.0)
        self.assertEqual([r.prompt_len for r in reqs], [1024, 300])
        self.assertEqual([r.arrival_s for r in reqs], [0.0, 2.5])
        short = load_trace("mooncake", os.path.join(FIX, "mooncake_tiny.jsonl"), 10, make_prompt,
                           start_offset_s=5.0)
        self.assertEqual(len(short), 1)
        self.assertTrue(any("only 1 of the 10" in n for n in short.notes))

    def test_errors(self):
        azure = os.path.join(FIX, "azure_tiny.csv")
        with self.assertRaisesRegex(ValueError, "unknown trace kind"):
            load_trace("burstgpt", azure, 1, make_prompt)
        with self.assertRaisesRegex(ValueError, "time_scale"):
            load_trace("azure", azure, 1, make_prompt, time_scale=0)
        with self.assertRaisesRegex(ValueError, "input_length"):
            load_trace("mooncake", os.path.join(FIX, "llmservingsim_tiny.jsonl"), 1, make_prompt)
        with self.assertRaisesRegex(ValueError, "TIMESTAMP"):
            load_trace("azure", os.path.join(FIX, "mooncake_tiny.jsonl"), 1, make_prompt)

    def test_real_traces_parse(self):
        # The first 100 requests of each trace (tests/data/SOURCES.md).
        files = {"azure": "AzureLLMInferenceTrace_code_first100.csv",
                 "mooncake": "mooncake_synthetic_trace_first100.jsonl",
                 "llmservingsim": "llmservingsim_sharegpt_first100_lengths.jsonl"}
        for kind, name in files.items():
            path = os.path.join(TEST_DATA, "traces", name)
            with self.subTest(kind):
                reqs = load_trace(kind, path, 100, lambda n: "x", max_prompt_len=2048, max_output_len=512)
                self.assertEqual(len(reqs), 100)
                self.assertEqual(reqs[0].arrival_s, 0.0)
                arr = [r.arrival_s for r in reqs]
                self.assertEqual(arr, sorted(arr))
                self.assertTrue(all(1 <= r.prompt_len <= 2048 and 1 <= r.output_len <= 512 for r in reqs))


class SyntheticTest(unittest.TestCase):
    def test_fixed(self):
        reqs = synthetic(5, 100, 20, 0.0, 0, make_prompt)
        self.assertEqual([(r.prompt_len, r.output_len) for r in reqs], [(100, 20)] * 5)
        self.assertEqual(reqs[0].prompt, make_prompt(100))

    def test_random_range_and_seed(self):
        reqs = synthetic(2000, 100, 20, 0.5, 1, make_prompt)
        ins = [r.prompt_len for r in reqs]
        outs = [r.output_len for r in reqs]
        self.assertEqual((min(ins), max(ins)), (50, 150))
        self.assertEqual((min(outs), max(outs)), (10, 30))
        self.assertAlmostEqual(sum(ins) / len(ins), 100, delta=3)
        again = synthetic(2000, 100, 20, 0.5, 1, make_prompt)
        self.assertEqual([(r.prompt_len, r.output_len) for r in again], list(zip(ins, outs)))

    def test_bad_args(self):
        with self.assertRaises(ValueError):
            synthetic(1, 10, 10, 1.0, 0, make_prompt)
        with self.assertRaises(ValueError):
            synthetic(1, 0, 10, 0.1, 0, make_prompt)


if __name__ == "__main__":
    unittest.main()
