"""bench/intercept/: workload parsing and building, pause draws, the report's metrics and the
sustained-rate computation, and the Session client against an in-process fake server. Small inline
samples; the tests on the real files under shared/data skip when it is absent."""
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.intercept import report as rpt  # noqa: E402
from bench.intercept import workloads as wl  # noqa: E402


def count_words(texts):
    return [len(t.split()) for t in texts]


GSM = [
    {"question": "Janet has 16 eggs and eats 3. How many are left?",
     "answer": "She has 16 - 3 = <<16-3=13>>13 eggs.\nShe sells them for 2 each: 13 * 2 = $<<13*2=26>>26.\n#### 26"},
    {"question": "A robe takes 2 bolts of blue and half that of white. Total?",
     "answer": "White: 2/2=<<2/2=1>>1 bolt\nTotal: 2+1=<<2+1=3>>3\n#### 3"},
    {"question": "No calculator here?", "answer": "It is just 5.\n#### 5"},
]
REACT = {"webthink_simple": (
    "\nQuestion: Who is Milhouse named after?\n"
    "Thought 1: I need to search Milhouse.\nAction 1: Search[Milhouse]\n"
    "Observation 1: Milhouse is a character in The Simpsons.\n"
    "Thought 2: Look up named after.\nAction 2: Lookup[named after]\n"
    "Observation 2: (Result 1 / 1) Milhouse was named after Richard Nixon.\n"
    "Thought 3: So the answer is Richard Nixon.\nAction 3: Finish[Richard Nixon]\n"
    "Question: Which magazine was started first?\n"
    "Thought 1: Search both.\nAction 1: Search[Arthur's Magazine]\n"
    "Observation 1: Arthur's Magazine (1844-1846) was a periodical.\n"
    "Thought 2: Then the other.\nAction 2: Search[First for Women]\n"
    "Observation 2: First for Women was started in 1989.\n"
    "Thought 3: Arthur's was first.\nAction 3: Finish[Arthur's Magazine]\n"),
    "cotqa_simple": "\nQuestion: ignored\nThought: no actions\nAnswer: x\n"}
HOTPOT = [{"question": "Were Scott Derrickson and Ed Wood of the same nationality?", "answer": "yes"},
          {"question": "What government position was held by the woman who portrayed Corliss Archer?", "answer": "x"}]
ALF = {
    "react_put_0": "You are in a room with a cabinet 1 and a toilet 1.\nYour task is to: put a spraybottle on toilet.\n"
                   "> think: I need a spraybottle.\nOK.\n> go to cabinet 1\nOn the cabinet 1, you see a spraybottle 2.\n"
                   "> take spraybottle 2 from cabinet 1\nYou pick up the spraybottle 2.\n> go to toilet 1\n"
                   "On the toilet 1, you see nothing.\n> put spraybottle 2 in/on toilet 1\nYou put the spraybottle 2.\n",
    "react_put_1": "You are in a room with a shelf 1.\nYour task is to: put a pen on shelf.\n"
                   "> go to shelf 1\nOn the shelf 1, you see nothing.\n> think: done.\n",
    "react_put_2": "You are in a room with a desk 1.\nYour task is to: put a key on desk.\n"
                   "> go to desk 1\nOn the desk 1, you see a lamp.\n> put key 1 in/on desk 1\nYou put the key 1.\n",
    "act_put_0": "ignored\n> go to x\nNothing.\n",
}
CHATS = [{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi how can I help"},
                            {"from": "human", "value": "tell me a joke"}, {"from": "gpt", "value": "why did the chicken cross"},
                            {"from": "human", "value": "another"}, {"from": "gpt", "value": "knock knock"}]},
         {"conversations": [{"from": "human", "value": "one turn only"}, {"from": "gpt", "value": "ok"}]}]
GLAIVE = [
    {"conversations": [{"from": "human", "value": "Find a chicken recipe"},
                       {"from": "function_call", "value": "{\"name\": \"search_recipes\", \"arguments\": {\"q\": \"chicken\"}}"},
                       {"from": "observation", "value": "{\"recipes\": [\"stir fry\"]}"},
                       {"from": "gpt", "value": "I found stir fry."},
                       {"from": "human", "value": "Thanks, convert 5 USD to EUR"},
                       {"from": "function_call", "value": "{\"name\": \"convert\", \"arguments\": {\"a\": 5}}"},
                       {"from": "observation", "value": "{\"eur\": 4.6}"},
                       {"from": "gpt", "value": "That is 4.6 EUR."}],
     "tools": "[{\"name\": \"search_recipes\"}]"},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "tools": "[]"},
]


def inline_sources():
    return wl.Sources("/nonexistent", gsm8k=GSM, react_prompts=REACT, hotpot=HOTPOT, alfworld=ALF,
                      sharegpt_multi=CHATS, glaive=GLAIVE)


class ParseTest(unittest.TestCase):
    def test_gsm8k_segments_end_at_calls_and_round_trip(self):
        segs = wl.gsm8k_segments(GSM[0]["answer"])
        self.assertEqual([s for s, _ in segs], ["She has 16 - 3 = <<16-3=", "13 eggs.\nShe sells them for 2 each: 13 * 2 = $<<13*2=",
                                                "26.\n#### 26"])
        self.assertEqual([r for _, r in segs], ["13>>", "26>>", ""])
        for item in GSM:
            self.assertEqual("".join(s + r for s, r in wl.gsm8k_segments(item["answer"])), item["answer"])
        self.assertEqual(len(wl.gsm8k_segments(GSM[2]["answer"])), 1)

    def test_react_trajectories(self):
        trajs = wl.react_trajectories(REACT)
        self.assertEqual([t["question"] for t in trajs], ["Who is Milhouse named after?", "Which magazine was started first?"])
        segs = trajs[0]["segments"]
        self.assertEqual(len(segs), 3)
        self.assertTrue(segs[0][0].startswith("Thought 1:") and segs[0][0].endswith("Action 1: Search[Milhouse]"))
        self.assertEqual(segs[0][1], "\nObservation 1: Milhouse is a character in The Simpsons.\n")
        self.assertTrue(segs[1][0].endswith("Lookup[named after]"))
        self.assertTrue(segs[2][0].endswith("Finish[Richard Nixon]"))
        self.assertEqual(segs[2][1], "")
        self.assertTrue(trajs[0]["text"].startswith("Question: Who is Milhouse"))

    def test_alfworld_episode(self):
        head, segs = wl.alfworld_episode(ALF["react_put_0"])
        self.assertTrue(head.endswith("Your task is to: put a spraybottle on toilet."))
        self.assertEqual([a for a, _ in segs], [" think: I need a spraybottle.", " go to cabinet 1",
                                                " take spraybottle 2 from cabinet 1", " go to toilet 1",
                                                " put spraybottle 2 in/on toilet 1"])
        self.assertEqual(segs[0][1], "\nOK.\n>")
        self.assertEqual(segs[1][1], "\nOn the cabinet 1, you see a spraybottle 2.\n>")
        self.assertEqual(segs[-1][1], "")
        _, segs = wl.alfworld_episode("room\n> think: a\n> go to b\nseen b\n")
        self.assertEqual(segs[0][1], "\nOK.\n>")  # a think step without an observation

    def test_chat_rounds(self):
        self.assertEqual(len(wl.chat_rounds(CHATS[0]["conversations"])), 3)
        broken = [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}, {"from": "gpt", "value": "c"}]
        self.assertEqual(wl.chat_rounds(broken), [("a", "b")])

    def test_glaive_segments(self):
        prompt, segs = wl.glaive_segments(GLAIVE[0])
        self.assertIn("search_recipes", prompt)
        self.assertTrue(prompt.endswith("User: Find a chicken recipe\nAssistant:"))
        self.assertEqual([k for _, _, k in segs[:-1]], ["qa", "chatbot", "qa"])  # the last has no pause
        self.assertTrue(segs[0][0].startswith(" <functioncall> {"))
        self.assertTrue(segs[0][1].startswith("\nFunction response: {\"recipes\""))
        self.assertEqual(segs[1][1], "\nUser: Thanks, convert 5 USD to EUR\nAssistant:")
        self.assertEqual(segs[-1][1], "")
        self.assertIsNone(wl.glaive_segments(GLAIVE[1]))


class PauseTest(unittest.TestCase):
    def test_gamma_keeps_mean_and_variance(self):
        rng = random.Random(1)
        xs = [wl.draw_pause("qa", rng) for _ in range(20000)]
        self.assertAlmostEqual(statistics.fmean(xs), 0.69, delta=0.02)
        self.assertAlmostEqual(statistics.pvariance(xs), 0.17, delta=0.02)
        self.assertTrue(all(x >= 0 for x in xs))

    def test_normal_is_clipped_and_std_reading(self):
        rng = random.Random(2)
        xs = [wl.draw_pause("chatbot", rng, dist="normal", spread="std") for _ in range(20000)]
        self.assertTrue(all(x >= 0 for x in xs))
        self.assertAlmostEqual(statistics.pstdev(xs), 15.6, delta=1.5)  # a little clipped
        self.assertEqual(wl.pause_params("ve", "std"), (0.09, 0.014 ** 2))
        with self.assertRaises(ValueError):
            wl.draw_pause("qa", rng, dist="uniform")

    def test_scale_and_seed(self):
        a = [wl.draw_pause("tts", random.Random(5), scale=0.1) for _ in range(3)]
        b = [wl.draw_pause("tts", random.Random(5)) * 0.1 for _ in range(3)]
        for x, y in zip(a, b):
            self.assertAlmostEqual(x, y)


class BuildTest(unittest.TestCase):
    def build(self, workload, n=12, **kw):
        sc = wl.Scaling(**kw)
        return wl.build_workload(workload, n, inline_sources(), count_words, sc, seed=3)

    def test_every_kind_builds(self):
        for kind in wl.ALL_KINDS:
            reqs = self.build(kind, 6)
            self.assertEqual(len(reqs), 6)
            for r in reqs:
                self.assertEqual(r.kind, kind)
                self.assertGreaterEqual(r.n_intercepts, 1, kind)
                self.assertEqual(r.segments[-1].tool_return, "")
                self.assertEqual(r.segments[-1].pause_s, 0.0)
                self.assertTrue(all(s.tool_return for s in r.segments[:-1]), kind)
                self.assertTrue(all(s.tokens >= 1 for s in r.segments))
                self.assertEqual(r.prompt_tokens, len(r.prompt.split()))

    def test_kind_specific_content(self):
        m = self.build("math", 1)[0]
        self.assertTrue(m.prompt.endswith("\nAnswer:"))
        self.assertTrue(m.segments[0].tool_return.endswith(">>"))
        q = self.build("qa", 1)[0]
        self.assertTrue(q.prompt.startswith("Solve a question answering task"))
        self.assertIn(q.prompt.rsplit("Question: ", 1)[1].strip(), [h["question"] for h in HOTPOT])
        self.assertTrue(q.segments[0].tool_return.startswith("\nObservation 1:"))
        v = self.build("ve", 1)[0]
        self.assertTrue(v.prompt.endswith("\n>") and "Here is the task." in v.prompt)
        im = self.build("image", 1)[0]
        self.assertTrue(im.segments[0].tool_return.startswith(wl.IMAGE_RETURN))
        self.assertIn("\nUser: ", im.segments[0].tool_return)
        self.assertTrue(self.build("tts", 1)[0].segments[0].tool_return.startswith(wl.TTS_RETURN))
        c = self.build("chatbot", 1)[0]
        self.assertEqual(c.source, "medicalgpt_sharegpt_zh_1K_format.jsonl:0")  # the one-turn chat is skipped
        self.assertEqual(c.n_intercepts, 2)
        t = self.build("toolcall", 1)[0]
        self.assertEqual(t.server_kind, "")  # a human turn among the calls: the server estimates
        self.assertEqual([s.pause_kind for s in t.segments[:-1]], ["qa", "chatbot", "qa"])

    def test_deterministic_and_mixed_uniform(self):
        a = [r.summary() for r in self.build("mixed", 60)]
        b = [r.summary() for r in self.build("mixed", 60)]
        self.assertEqual(a, b)
        kinds = {r["kind"] for r in a}
        self.assertEqual(kinds, set(wl.KINDS))
        c = [r.summary() for r in wl.build_workload("mixed", 60, inline_sources(), count_words, wl.Scaling(), seed=4)]
        self.assertNotEqual(a, c)

    def test_caps(self):
        for r in self.build("mixed", 30, max_segment_tokens=3, max_intercepts=1, max_context=400, max_return_tokens=5):
            self.assertLessEqual(r.n_intercepts, 1)
            self.assertTrue(all(s.tokens <= 3 for s in r.segments))
            self.assertTrue(all(s.return_tokens <= 5 for s in r.segments))
            self.assertLessEqual(r.total_context, 400)

    def test_few_shots_shrink_to_fit_the_context(self):
        big = self.build("math", 1, max_context=4000)[0]
        small = self.build("math", 1, max_context=40)[0]
        self.assertEqual(big.prompt.count("Question:"), 3)  # both other problems as shots
        self.assertEqual(small.prompt.count("Question:"), 1)
        self.assertLessEqual(small.total_context, 40)
        self.assertGreaterEqual(small.n_intercepts, 1)

    def test_too_small_a_context_fails_clearly(self):
        with self.assertRaises(ValueError):
            self.build("qa", 1, max_context=10)

    def test_pause_scale_kinds(self):
        full = self.build("chatbot", 4)
        scaled = self.build("chatbot", 4, pause_scale=0.01)
        other = self.build("chatbot", 4, pause_scale=0.01, pause_scale_kinds=("math",))
        for f, s, o in zip(full, scaled, other):
            self.assertAlmostEqual(s.total_pause_s, f.total_pause_s * 0.01)
            self.assertAlmostEqual(o.total_pause_s, f.total_pause_s)

    def test_context_at_intercepts_and_stats(self):
        r = self.build("math", 1)[0]
        ctx = r.context_at_intercepts()
        self.assertEqual(len(ctx), r.n_intercepts)
        self.assertEqual(ctx[0], r.prompt_tokens + r.segments[0].tokens)
        st = wl.workload_stats(self.build("mixed", 24))
        self.assertEqual(sum(v["requests"] for v in st.values()), 24)
        self.assertEqual(st["qa"]["table1_pause_s"], [0.69, 0.17])

    def test_estimate_tokens(self):
        self.assertEqual(wl.estimate_tokens(["abcdefgh", "中文ab", ""]), [2, 3, 0])


DATA = wl.default_data_dir()


@unittest.skipUnless(os.path.isfile(os.path.join(DATA, wl.PATHS["gsm8k"])), f"no shared data at {DATA}")
class RealFilesTest(unittest.TestCase):
    def test_gsm8k_has_the_sources_calls(self):
        data = wl.read_jsonl(os.path.join(DATA, wl.PATHS["gsm8k"]))
        self.assertEqual(len(data), 1319)
        self.assertEqual(sum(len(wl.gsm8k_segments(x["answer"])) - 1 for x in data), 4282)  # SOURCES.md

    def test_react_and_alfworld_files(self):
        trajs = wl.react_trajectories(wl.read_json(os.path.join(DATA, wl.PATHS["react_prompts"])))
        self.assertGreaterEqual(len(trajs), 9)
        self.assertTrue(all(len(t["segments"]) >= 2 for t in trajs))
        alf = wl.read_json(os.path.join(DATA, wl.PATHS["alfworld"]))
        episodes = [wl.alfworld_episode(v) for k, v in alf.items() if k.startswith("react_")]
        self.assertEqual(len(episodes), 18)
        self.assertTrue(all(len(s) >= 5 for _, s in episodes))

    def test_every_kind_from_the_real_files(self):
        sc = wl.Scaling(max_context=2048, max_segment_tokens=128)
        for kind in wl.ALL_KINDS:
            reqs = wl.build_workload(kind, 8, wl.Sources(DATA), wl.estimate_tokens, sc, seed=0)
            for r in reqs:
                self.assertGreaterEqual(r.n_intercepts, 1, kind)
                self.assertLessEqual(r.total_context, 2048)
        st = wl.workload_stats(wl.build_workload("mixed", 60, wl.Sources(DATA), wl.estimate_tokens, sc, seed=0))
        self.assertEqual(set(st), set(wl.KINDS))
        self.assertGreater(st["ve"]["intercepts_mean_var"][0], st["qa"]["intercepts_mean_var"][0])


# --------------------------------------------------------------------------------------------------
# Report

def rec(ok=True, start=0.0, first=0.5, end=10.0, pause=6.0, tokens=40, kind="qa", error=""):
    return {"ok": ok, "start": start, "first_token": first, "end": end, "pause_s": pause, "output_tokens": tokens,
            "kind": kind, "error": error, "intercepts": 2}


class MetricsTest(unittest.TestCase):
    def test_request_metrics(self):
        m = rpt.request_metrics(rec())
        self.assertAlmostEqual(m["e2e_s"], 10.0)
        self.assertAlmostEqual(m["active_s"], 4.0)
        self.assertAlmostEqual(m["normalized_s_per_token"], 0.1)
        self.assertAlmostEqual(m["ttft_s"], 0.5)
        self.assertIsNone(rpt.request_metrics(rec(ok=False)))
        self.assertIsNone(rpt.request_metrics(rec(tokens=0)))

    def test_summarize_run(self):
        recs = [rec(end=10, pause=6), rec(end=6, pause=2, first=1.0, kind="math"), rec(end=14, pause=6),
                rec(ok=False, error="UNAVAILABLE: gone")]
        s = rpt.summarize_run(recs, 20.0)
        self.assertEqual((s["completed"], s["failed"]), (3, 1))
        self.assertEqual(s["errors"], {"UNAVAILABLE": 1})
        self.assertAlmostEqual(s["throughput_rps"], 0.15)
        self.assertAlmostEqual(s["normalized_latency_s_per_token"]["median"], 0.1)
        self.assertAlmostEqual(s["ttft_s"]["median"], 0.5)
        self.assertAlmostEqual(s["normalized_latency_by_kind"]["qa"], (0.1 + 0.2) / 2)
        self.assertNotIn("waste_share", s)

    def test_percentile(self):
        self.assertEqual(rpt.percentile([], 90), 0.0)
        self.assertAlmostEqual(rpt.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90), 9.1)

    def test_delta_and_waste(self):
        before = {"waste_preserve_byte_seconds": 10, "kv_byte_seconds": 1000, "forward_seconds": 5,
                  "recompute_seconds": 1, "decisions": [{"policy": "min-waste", "decision": "preserve", "count": 3}]}
        after = {"waste_preserve_byte_seconds": 30, "waste_recompute_byte_seconds": 20, "waste_swap_byte_seconds": 10,
                 "kv_byte_seconds": 2000, "forward_seconds": 15, "recompute_seconds": 3,
                 "decisions": [{"policy": "min-waste", "decision": "preserve", "count": 5},
                               {"policy": "min-waste", "decision": "swap", "count": 1}]}
        d = rpt.intercept_delta(before, after)
        self.assertEqual(d["decisions"], {"min-waste/preserve": 2, "min-waste/swap": 1})
        w = rpt.waste_shares(d)
        self.assertAlmostEqual(w["preserve"], 0.02)
        self.assertAlmostEqual(w["recompute"], 0.02)
        self.assertAlmostEqual(w["swap"], 0.01)
        self.assertAlmostEqual(w["total"], 0.05)
        self.assertAlmostEqual(w["recompute_of_forward"], 0.2)
        self.assertIsNone(rpt.waste_shares(rpt.intercept_delta(None, None))["total"])


class SustainedRateTest(unittest.TestCase):
    def test_interpolates_at_the_first_crossing(self):
        s = rpt.sustained_rate([(1, 0.1), (2, 0.15), (4, 0.35), (8, 0.1)], 0.25)
        self.assertAlmostEqual(s["rate"], 3.0)
        self.assertEqual(s["measured"], 2)
        self.assertTrue(s["bounded"])

    def test_edges(self):
        self.assertEqual(rpt.sustained_rate([(1, 0.5), (2, 0.6)], 0.25), {"rate": None, "measured": None, "bounded": True})
        self.assertEqual(rpt.sustained_rate([(2, 0.1), (1, 0.1)], 0.25), {"rate": 2, "measured": 2, "bounded": False})
        s = rpt.sustained_rate([(1, 0.1), (2, None)], 0.25)  # nothing completed at 2: fails there
        self.assertEqual((s["rate"], s["measured"]), (1, 1))
        self.assertEqual(rpt.sustained_rate([], 1.0)["rate"], None)

    def runs(self, table):
        return [{"policy": p, "rate": r, "summary": {"completed": 1, "normalized_latency_s_per_token": {"median": v},
                                                    "waste_share": {"total": w}}}
                for p, pts in table.items() for r, v, w in pts]

    def test_headline(self):
        runs = self.runs({"min-waste": [(1, 0.1, 0.01), (2, 0.12, 0.02), (4, 0.3, 0.03)],
                          "discard": [(1, 0.15, 0.3), (2, 0.4, 0.4), (4, 0.9, 0.5)]})
        h = rpt.headline(runs)
        self.assertAlmostEqual(h["target_s_per_token"], 0.2)
        self.assertAlmostEqual(h["sustained"]["min-waste"]["rate"], 2 + 2 * (0.08 / 0.18))
        self.assertAlmostEqual(h["sustained"]["discard"]["rate"], 1 + 0.05 / 0.25)
        self.assertAlmostEqual(h["ratio"], h["sustained"]["min-waste"]["rate"] / h["sustained"]["discard"]["rate"])
        self.assertTrue(h["ratio_met"])
        self.assertAlmostEqual(h["reference_waste_share_max"], 0.03)
        self.assertTrue(h["waste_met"])
        h2 = rpt.headline(runs, target_s=0.12)
        self.assertIsNone(h2["sustained"]["discard"]["rate"])
        self.assertIsNone(h2["ratio"])
        self.assertIn("misses the target at the lowest rate", h2["ratio_note"])
        self.assertAlmostEqual(h2["ratio_lower_bound"], 2.0)  # min-waste sustains 2, discard < 1
        self.assertTrue(h2["ratio_met"])
        h3 = rpt.headline([r for r in runs if r["policy"] == "discard"])  # no min-waste: best at the lowest rate
        self.assertAlmostEqual(h3["target_s_per_token"], 0.3)

    def test_markdown_and_write(self):
        runs = self.runs({"min-waste": [(1, 0.1, 0.01), (2, 0.12, 0.02)], "discard": [(1, 0.15, 0.3), (2, 0.4, None)]})
        for r in runs:
            r["summary"].update({"requests": 1, "errors": {}, "throughput_rps": 0.5, "ttft_s": {"median": 0.2, "p90": 0.3},
                                 "server": {"decisions": {"min-waste/preserve": 3}}})
            r["summary"]["normalized_latency_s_per_token"]["p90"] = 0.2
        report = {"model": "m", "workload": "mixed", "command": "cmd --x", "config": {"policies": ["discard", "min-waste"],
                  "rates": [1, 2], "n_requests": 1, "seed": 0}, "scaling": {"pause_scale": 0.1, "pause_scale_kinds": ["qa"]},
                  "runs": runs, "headline": rpt.headline(runs), "workload_stats": {}}
        md = rpt.markdown(report, "x.png")
        self.assertIn("`cmd --x`", md)
        self.assertIn("pause scale 0.1", md)
        self.assertIn("| min-waste | 2 | 1/1 |", md)
        self.assertIn("preserve 3", md)
        with tempfile.TemporaryDirectory() as d:
            files = rpt.write(report, os.path.join(d, "intercept_m_x"))
            with open(files[0]) as f:
                self.assertEqual(json.load(f)["model"], "m")
            self.assertTrue(all(os.path.exists(p) for p in files))


# --------------------------------------------------------------------------------------------------
# The client against a fake Session server (grpc.aio in process)

def _have_grpc():
    try:
        import grpc.aio  # noqa: F401
        import grpc_tools.protoc  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_have_grpc(), "no grpcio / grpc_tools")
class ClientTest(unittest.TestCase):
    def test_sessions_against_a_fake_server(self):
        from bench.intercept import client as cl
        pb, pb_grpc = cl.load_stubs()
        import grpc.aio
        seen = []

        class Fake(pb_grpc.HeliosServicer):
            async def Session(self, request_iterator, context):
                it = request_iterator.__aiter__()
                first = await it.__anext__()
                seen.append(first)
                n, seg, idx = first.open.request.max_tokens, 0, 0
                while True:
                    for k in range(n):
                        yield pb.SessionResponse(session_id="s1", segment=seg, tokens=[pb.GeneratedToken(token_id=k)])
                    idx += 1
                    yield pb.SessionResponse(session_id="s1", segment=seg,
                                             intercept=pb.Intercept(trigger="length", index=idx, context_tokens=10 * idx))
                    msg = await it.__anext__()
                    if msg.HasField("end"):
                        yield pb.SessionResponse(session_id="s1", finish_reason=pb.FINISH_REASON_LENGTH)
                        return
                    seen.append(msg)
                    n, seg = msg.resume.max_tokens, seg + 1

        reqs = wl.build_workload("math", 3, inline_sources(), count_words, wl.Scaling(pause_scale=0.0), seed=0)
        reqs[1].segments[0].pause_s = 0.05

        async def go():
            server = grpc.aio.server()
            pb_grpc.add_HeliosServicer_to_server(Fake(), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                return await cl.run_requests(f"127.0.0.1:{port}", reqs, [0.0, 0.01, 0.02], "min-waste", model="m")
            finally:
                await server.stop(None)

        records, t0, t1 = asyncio.run(go())
        for r, q in zip(records, reqs):
            self.assertTrue(r.ok, r.error)
            self.assertEqual(r.output_tokens, q.output_tokens)
            self.assertEqual(r.intercepts, q.n_intercepts)
            self.assertEqual(len(r.segments), len(q.segments))
            self.assertEqual([s.tokens for s in r.segments], [s.tokens for s in q.segments])
            self.assertEqual(r.finish_reason, "LENGTH")
            self.assertEqual(r.segments[0].trigger, "length")
        self.assertGreaterEqual(records[1].pause_s, 0.05)
        opens = [m for m in seen if m.HasField("open")]
        self.assertEqual(len(opens), 3)
        o = opens[0].open
        self.assertTrue(o.intercept.on_length and o.request.ignore_eos)
        self.assertEqual((o.intercept.hold, o.intercept.kind, o.request.model), ("min-waste", "math", "m"))
        self.assertEqual(o.request.sampling.temperature, 0.0)
        resumes = [m.resume for m in seen if m.HasField("resume")]
        self.assertEqual(len(resumes), sum(q.n_intercepts for q in reqs))
        self.assertTrue(all(r.text.endswith(">>") for r in resumes))
        d = records[0].to_dict(t0)
        self.assertGreaterEqual(d["start"], 0.0)
        s = rpt.summarize_run([r.to_dict(t0) for r in records], t1 - t0)
        self.assertEqual(s["completed"], 3)

    def test_errors_are_recorded(self):
        from bench.intercept import client as cl
        reqs = wl.build_workload("qa", 1, inline_sources(), count_words, wl.Scaling(), seed=0)
        records, _, _ = asyncio.run(cl.run_requests("127.0.0.1:1", reqs, [0.0], "discard", request_timeout_s=5))
        self.assertFalse(records[0].ok)
        self.assertTrue(records[0].error)


if __name__ == "__main__":
    unittest.main()
