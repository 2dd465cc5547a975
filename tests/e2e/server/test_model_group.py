"""End-to-end tests of model groups: the Helios model manager in a real heliosd, driven over gRPC.

The candidates are stories260K under several repository names (one file, so one tokenizer), with
different exit points; a plain `models[]` entry of the same file is the reference every group
output is compared with, token for token. Requests are sent one at a time, so the tests can
replay what the manager sees (each token's confidence at the loaded depth) and check that it
decided exactly when the paper's rules say it must.

Run with the rest of the heliosd suite (run_heliosd_e2e.sh), or alone:
  /usr/bin/python3 -m unittest -v test_model_group
"""

import unittest

import grpc

import test_heliosd as base
from test_heliosd import Heliosd, generate, metric_value, rpc_code


def setUpModule():
    base.setUpModule()


def tearDownModule():
    base.tearDownModule()


PROMPTS = [f"{n} {o}" for o in base.OPENINGS for n in base.NAMES]
N_LAYERS = 5  # stories260K


def repository(entries):
    """(name, exits) → model_repository entries of stories260K (converted in setUpModule)."""
    return [dict(name=n, path=base.STORIES, early_exit={"exits": list(exits)}) for n, exits in entries]


def expected_depth(row, coverage):
    """choose_depth: the shallowest exit that `coverage` of the observed tokens leave by, else all."""
    for layer, share in zip(row.exit_layers, row.leave_share):
        if row.observed_tokens > 0 and share >= coverage:
            return layer
    return N_LAYERS


class GroupServer(unittest.TestCase):
    """One heliosd with a plain `stories` model and the class's GROUP over REPOSITORY."""
    REPOSITORY = []  # (name, exit points)
    GROUP = {}
    MAX_TOKENS = 24

    @classmethod
    def setUpClass(cls):
        config = {"model_repository": repository(cls.REPOSITORY), "groups": [cls.GROUP],
                  "limits": {"default_max_tokens": cls.MAX_TOKENS}}
        cls.server = Heliosd(cls.__name__, [("plain", base.STORIES, {"early_exit": {"exits": [1, 2, 3, 4]}})],
                             config).start()
        cls.stub = cls.server.stub

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        if cls.server.exit_code != 0:
            raise AssertionError(f"heliosd exited with {cls.server.exit_code} on SIGTERM:\n{cls.server.log_text()}")

    def group(self):
        return self.server.status().groups[0]

    def ask(self, prompt, **fields):
        return generate(self.stub, model=self.GROUP["name"], text=prompt, ignore_eos=True, max_tokens=self.MAX_TOKENS, **fields)

    def reference(self, prompt, depth):
        """The plain model's greedy output, at full depth or leaving every token at `depth`."""
        fields = {} if depth == N_LAYERS else {"exit": base.pb.ExitOptions(policy="fixed-depth", depth=depth)}
        return generate(self.stub, model="plain", text=prompt, ignore_eos=True, max_tokens=self.MAX_TOKENS, **fields).ids

    def full_log(self):
        with open(self.server.log_path) as f:
            return f.read()

    def decisions(self):
        return [(d.decision, d.model, d.loaded_depth) for d in self.group().decisions]


class EvaluateChooseTest(GroupServer):
    """Step 2 and 3: evaluation of each candidate, the choice, prefix loading and its memory."""
    REPOSITORY = [("tiny-a", [1, 2, 3, 4]), ("tiny-b", [2, 3, 4])]
    GROUP = {"name": "stories", "memory_budget": "32MiB", "threshold": 0.5, "prefix_coverage": 0.3,
             "evaluation_requests": 2, "reassess_every": 0}

    def test_evaluation_then_prefix_serving(self):
        # Evaluation: two requests per candidate, at full depth, outputs kept.
        g = self.group()
        self.assertEqual(g.phase, "evaluating")
        self.assertEqual(list(g.candidates), ["tiny-a", "tiny-b"])
        full_blocks = g.memory.kv_blocks
        for i, prompt in enumerate(PROMPTS[:4]):
            r = self.ask(prompt)
            want = "tiny-a" if i < 2 else "tiny-b"
            self.assertEqual({(t.model, t.loaded_depth) for t in r.tokens}, {(want, N_LAYERS)}, f"request {i}")
            self.assertEqual(r.ids, self.reference(prompt, N_LAYERS), f"request {i}: full depth is the plain model")
        g = self.group()
        self.assertEqual(g.phase, "serving")
        rows = {(p.model, p.depth): p for p in g.performance_history}
        a, b = rows[("tiny-a", N_LAYERS)], rows[("tiny-b", N_LAYERS)]
        self.assertEqual((a.requests, b.requests), (2, 2))
        self.assertEqual(list(a.exit_layers), [1, 2, 3, 4])
        self.assertEqual(a.observed_tokens, a.tokens, "every evaluated token is observed at every exit")
        shares = list(a.leave_share)
        self.assertEqual(shares, sorted(shares), "a token that left by an exit has left by every deeper one")
        # The choice: the faster (SLO throughput), at its covering prefix.
        best = a if a.throughput_tok_s >= b.throughput_tok_s else b
        depth = expected_depth(best, 0.3)
        self.assertEqual((g.model, g.loaded_depth), (best.model, depth))
        self.assertEqual([d[0] for d in self.decisions()], ["evaluate", "evaluate", "choose"])

        # Serving the prefix: every token leaves at its depth, as the plain model's fixed-depth does.
        prompt = PROMPTS[4]
        r = self.ask(prompt)
        self.assertEqual({(t.model, t.loaded_depth, t.exit_layer) for t in r.tokens}, {(best.model, depth, depth)})
        self.assertEqual(r.ids, self.reference(prompt, depth))

        # One budget: the prefix's freed weights and its smaller K/V (depth layers, not 5) are blocks.
        g = self.group()
        self.assertEqual(len(g.engines), 1, "the evaluation engines were released")
        self.assertEqual(g.engines[0].loaded_depth, depth)
        self.assertLessEqual(g.memory.weight_bytes + g.memory.kv_bytes, g.memory.budget_bytes)
        if depth < N_LAYERS:
            self.assertGreaterEqual(g.memory.kv_blocks, int(full_blocks * N_LAYERS / depth * 0.95),
                                    f"{g.memory.kv_blocks} blocks at {depth} layers vs {full_blocks} at {N_LAYERS}")

        status, _, text = self.server.metrics()
        self.assertEqual(status, 200)
        labels = {"group": "stories"}
        self.assertEqual(metric_value(text, "helios_manager_decisions_total", {**labels, "decision": "evaluate"}), 2)
        self.assertEqual(metric_value(text, "helios_manager_decisions_total", {**labels, "decision": "choose"}), 1)
        self.assertEqual(metric_value(text, "helios_loaded_layers", {"model": best.model}), depth)
        self.assertIsNotNone(metric_value(text, "helios_kv_blocks_total"))

    def test_group_refuses_exit_overrides_and_is_listed(self):
        code, details = rpc_code(lambda: self.ask("Tom had a red ball",
                                                  exit=base.pb.ExitOptions(policy="fixed-depth", depth=2)))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        code, details = rpc_code(lambda: generate(self.stub, model="nope", text="x"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("stories (group)", details)
        names = [m.name for m in self.stub.ListModels(base.pb.ListModelsRequest(), timeout=10).models]
        self.assertEqual(names, ["plain", "stories"])
        toks = self.stub.Tokenize(base.pb.TokenizeRequest(model="stories", text="Lily"), timeout=10).token_ids
        self.assertEqual(list(toks), list(self.stub.Tokenize(base.pb.TokenizeRequest(model="plain", text="Lily"),
                                                             timeout=10).token_ids))


class ConcurrentTransitionsTest(GroupServer):
    """Requests in flight while the manager moves on: each finishes on the engine it started on,
    whole and as the plain model would write it, and the released engines' memory returns."""
    REPOSITORY = [("tiny-a", [1, 2, 3, 4]), ("tiny-b", [2, 3, 4])]
    GROUP = {"name": "stories", "memory_budget": "32MiB", "threshold": 0.5, "prefix_coverage": 0.3,
             "evaluation_requests": 2, "reassess_every": 5}

    def test_concurrent_requests_across_transitions(self):
        prompts = PROMPTS[:16]
        results = base.run_concurrently([lambda p=p: self.ask(p) for p in prompts])
        for prompt, r in zip(prompts, results):
            self.assertNotIsInstance(r, Exception, f"{prompt}: {r}")
            served = {(t.model, t.loaded_depth) for t in r.tokens}
            self.assertEqual(len(served), 1, f"{prompt}: one engine serves a request from start to end")
            (_, depth), = served
            self.assertEqual(len(r.ids), self.MAX_TOKENS)
            self.assertEqual(r.ids, self.reference(prompt, depth), f"{prompt} at depth {depth}")
        g = self.group()
        self.assertGreaterEqual(len(g.decisions), 3, "evaluate, evaluate, choose at least")
        self.server.wait_idle(timeout=5)
        self.ask(PROMPTS[20])  # a route releases what no request uses any more
        g = self.group()
        self.assertEqual(len(g.engines), 1, [(e.model, e.loaded_depth, e.running) for e in g.engines])
        self.assertLessEqual(g.memory.weight_bytes + g.memory.kv_bytes, g.memory.budget_bytes)
        out = base.subprocess.run([base.HELIOS, "status", "--address", f"127.0.0.1:{self.server.port}"],
                                  capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        for part in ("group stories (slo throughput)", "performance history (PHT)", "decisions (latest last)",
                     "memory: budget 32 MiB"):
            self.assertIn(part, out.stdout)


class BreachTest(GroupServer):
    """Step 4: confidence breaches over the sliding window, extend or switch, replayed by the test
    from the tokens' own confidences."""
    REPOSITORY = [("deep", [3, 4]), ("other", [3, 4])]
    GROUP = {"name": "stories", "memory_budget": "32MiB", "threshold": 0.5, "prefix_coverage": 0.3,
             "evaluation_requests": 2, "cbc_window": 10, "cbc_max": 3, "reassess_every": 0}

    def test_breaches_beyond_cbc_max_extend_or_switch(self):
        self.replay_breaches(n_eval=4)

    def replay_breaches(self, n_eval):
        """Serves the stream one request at a time, replaying CBC from the tokens' confidences;
        returns the decisions the replay expected (model, depth)."""
        for prompt in PROMPTS[:n_eval]:
            self.ask(prompt)
        g = self.group()
        self.assertEqual(g.phase, "serving")
        current = (g.model, g.loaded_depth)
        window, expected, served = [], [], 0
        for prompt in PROMPTS[4:24]:
            r = self.ask(prompt)
            served += 1
            start = current
            by = [(t.model, t.loaded_depth) for t in r.tokens]
            lead = next((i for i, x in enumerate(by) if x != start), len(by))
            self.assertGreater(lead, 0, f"request {served} starts on {by[0]}, not on {start}")
            # Until an extension in place takes effect, the tokens are the plain model's at that depth.
            self.assertEqual(r.ids[:lead], self.reference(prompt, start[1])[:lead], f"{start}: as the plain model")
            if current[1] == N_LAYERS:
                self.assertEqual(lead, len(by))
                continue  # all layers: nothing to breach
            for t in r.tokens:
                window = (window + [t.confidence < 0.5])[-10:]
                if sum(window) > 3:
                    window = []
                    g = self.group()
                    d = g.decisions[-1]
                    self.assertIn(d.decision, ("extend", "switch"), d.reason)
                    if d.decision == "extend":
                        self.assertEqual(d.model, current[0])
                        self.assertEqual(d.loaded_depth, 4 if current[1] == 3 else N_LAYERS)
                    else:
                        self.assertNotEqual(d.model, current[0])
                    current = (d.model, d.loaded_depth)
                    expected.append(current)
                    break  # the rest of this request's tokens belong to the old target
            # A request in flight when its engine was extended carries on at the new depth.
            rest = set(by[lead:])
            self.assertTrue(rest <= {current} and (not rest or current[0] == start[0]),
                            f"request {served}: {start} then {rest}; decisions {expected}")
        kinds = [d[0] for d in self.decisions()]
        after_choice = kinds[kinds.index("choose") + 1:]
        self.assertEqual(len(after_choice), len(expected), f"decisions {self.decisions()} vs replay {expected}")
        self.assertGreater(len(expected), 0, "this stream breaches at exit 3: some decision must come")
        status, _, text = self.server.metrics()
        breaches = metric_value(text, "helios_confidence_breaches_total", {"group": "stories"})
        self.assertGreater(breaches, 3)
        return expected


class ExtendInPlaceTest(BreachTest):
    """One candidate: breaches can only extend, and the engine grows in place (no second engine)."""
    REPOSITORY = [("deep", [3, 4])]
    GROUP = dict(BreachTest.GROUP, extend_kv="recompute")

    def test_breaches_beyond_cbc_max_extend_or_switch(self):
        expected = self.replay_breaches(n_eval=2)
        self.assertTrue(all(model == "deep" for model, _ in expected), expected)
        g = self.group()
        self.assertEqual(len(g.engines), 1, "extended in place, not loaded again")
        self.assertEqual(g.engines[0].loaded_depth, expected[-1][1])
        self.assertIn("extended deep in place", self.full_log())
        status, _, text = self.server.metrics()
        self.assertEqual(metric_value(text, "helios_loaded_layers", {"model": "deep"}), expected[-1][1])
        self.assertEqual(metric_value(text, "helios_manager_decisions_total", {"group": "stories", "decision": "extend"}),
                         len(expected))



class ExtendInFlightTest(GroupServer):
    """Concurrent requests while breaches extend the engine under them: none is lost or cut, and
    those in flight carry on at the new depth."""
    REPOSITORY = ExtendInPlaceTest.REPOSITORY
    GROUP = ExtendInPlaceTest.GROUP

    def test_requests_in_flight_through_an_extension_finish_whole(self):
        for prompt in PROMPTS[:2]:
            self.ask(prompt)
        self.assertEqual(self.group().phase, "serving")
        results = base.run_concurrently([lambda p=p: self.ask(p) for p in PROMPTS[2:18]])
        for r in results:
            self.assertNotIsInstance(r, Exception, str(r))
            self.assertEqual(len(r.ids), self.MAX_TOKENS)
            self.assertTrue(all(t.exit_layer == t.loaded_depth for t in r.tokens), "fixed-depth at the loaded depth")
            depths = [t.loaded_depth for t in r.tokens]
            self.assertEqual(depths, sorted(depths), "a request's depth only grows")
        self.assertIn("extend", [d[0] for d in self.decisions()], "this stream breaches at exit 3")
        self.assertIn("extended deep in place", self.full_log())
        self.server.wait_idle(timeout=5)


class ReassessTest(GroupServer):
    """Step 5: every RI requests the candidates are evaluated again."""
    REPOSITORY = [("tiny-a", [2, 3, 4])]
    GROUP = {"name": "stories", "memory_budget": "32MiB", "evaluation_requests": 2, "reassess_every": 3,
             "threshold": 0.01, "prefix_coverage": 0.5}
    MAX_TOKENS = 8

    def test_reassessment_every_ri_requests(self):
        for prompt in PROMPTS[:2]:
            self.ask(prompt)
        self.assertEqual(self.group().phase, "serving")
        depth = self.group().loaded_depth
        self.assertEqual(depth, 2, "threshold 0.01: every token leaves at the first exit")
        for prompt in PROMPTS[2:5]:
            r = self.ask(prompt)
            self.assertEqual({t.loaded_depth for t in r.tokens}, {2})
        r = self.ask(PROMPTS[5])  # the 4th since the choice: RI 3 reached, evaluate again
        self.assertEqual({t.loaded_depth for t in r.tokens}, {N_LAYERS})
        self.assertEqual(self.group().phase, "evaluating")
        self.ask(PROMPTS[6])
        g = self.group()
        self.assertEqual(g.phase, "serving")
        self.assertEqual([d[0] for d in self.decisions()], ["evaluate", "choose", "reassess", "choose"])


class GroupConfigTest(unittest.TestCase):
    def test_candidates_with_different_tokenizers_are_refused(self):
        # setUpModule has checked that SmolLM2, the model with the other tokenizer, is there.
        server = Heliosd("tokenizers", [("plain", base.STORIES)],
                         {"model_repository": [dict(name="stories", path=base.STORIES),
                                               dict(name="smollm2", path=base.SMOLLM2)],
                          "groups": [{"name": "mixed"}]})
        with self.assertRaises(AssertionError) as ctx:
            server.start()
        server.stop()
        text = str(ctx.exception)
        self.assertIn("different tokenizers", text)
        self.assertIn("'stories' and 'smollm2'", text)


if __name__ == "__main__":
    unittest.main()
