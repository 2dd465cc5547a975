"""bench/prefix_cache/multiturn_replay.py: which conversations and turns a replay takes."""
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.prefix_cache.multiturn_replay import load_conversations, server_config, parse_args  # noqa: E402


class LoadConversationsTest(unittest.TestCase):
    def write(self, records, jsonl):
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl" if jsonl else ".json", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write("\n".join(json.dumps(r) for r in records) if jsonl else json.dumps(records))
        f.close()
        return Path(f.name)

    def test_takes_human_turns_of_long_enough_conversations_cut_to_size(self):
        records = [
            {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
            {"conversations": [{"from": "human", "value": "one two"}, {"from": "gpt", "value": "x"},
                               {"from": "human", "value": "three"}, {"from": "gpt", "value": "y"},
                               {"from": "human", "value": "  "}, {"from": "human", "value": "four"}]},
            {"conversations": [{"from": "user", "value": "p"}, {"from": "user", "value": "q"},
                               {"from": "user", "value": "r"}]},
        ]
        for jsonl in (False, True):
            got = load_conversations(self.write(records, jsonl), n=5, turns=3, max_chars=3)
            self.assertEqual(got, [["one", "thr", "fou"], ["p", "q", "r"]])
            self.assertEqual(load_conversations(self.write(records, jsonl), n=1, turns=3, max_chars=99),
                             [["one two", "three", "four"]])

    def test_the_two_servers_differ_only_in_prefix_caching(self):
        a = parse_args(["--model-path", "/m.gguf"])
        on, off = server_config(a, True).splitlines(), server_config(a, False).splitlines()
        diff = [(x, y) for x, y in zip(on, off) if x != y]
        self.assertEqual(diff, [("  prefix_caching: true", "  prefix_caching: false")])


if __name__ == "__main__":
    unittest.main()
