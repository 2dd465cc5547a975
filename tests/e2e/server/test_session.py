"""End-to-end tests of the Session RPC (intercepts): a generation that pauses for a trigger, a tool
call or the end of the model's turn, and resumes in place when the client answers.

A real heliosd on a loopback port, driven by Debian's python3-grpcio as test_heliosd.py drives it
(its helpers start the servers and generate the stubs). stories260K (tests/data) for everything a
string trigger can show; SmolLM2-135M (the models cache, which test_heliosd needs too) for chat
turns; Qwen2.5-Coder-0.5B-Instruct for tool calls when scripts/fetch_model.sh has fetched it
(skipped otherwise).

Run with the rest of the heliosd suite (run_heliosd_e2e.sh), or alone:
  /usr/bin/python3 -m unittest -v test_session
"""

import os
import queue
import subprocess
import time
import unittest

import grpc

import test_heliosd as base
from test_heliosd import STORIES_BLOCK_BYTES, generate, run_concurrently

QWEN = os.path.join(base.SOURCE_DIR, "models", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf")
POLICIES = ["discard", "improved-discard", "preserve", "swap", "min-waste"]
PAUSE_WAIT_S = 5  # status settles (paused back to 0) within this


def setUpModule():
    base.setUpModule()


def tearDownModule():
    base.tearDownModule()


def pb():
    return base.pb


class Session:
    """One Session call driven step by step: send() queues a message (the request iterator yields
    it), read() takes the next response, segment() reads up to the next pause or the end."""

    def __init__(self, stub, timeout=base.RPC_TIMEOUT_S, metadata=None):
        self.outbox = queue.Queue()
        self.call = stub.Session(self._requests(), timeout=timeout, metadata=metadata)
        self.responses = []

    def _requests(self):
        while True:
            message = self.outbox.get()
            if message is None:
                return
            yield message

    def send(self, **fields):
        self.outbox.put(pb().SessionRequest(**fields))

    def open(self, intercept=None, tools_json="", **request):
        self.send(open=pb().SessionOpen(request=pb().GenerateRequest(**request),
                                        intercept=pb().InterceptOptions(**(intercept or {})), tools_json=tools_json))
        return self

    def resume(self, max_tokens=0, **input):
        self.send(resume=pb().SessionResume(max_tokens=max_tokens, **input))

    def end(self):
        self.send(end=pb().SessionEnd())

    def half_close(self):
        self.outbox.put(None)

    def read(self):
        r = next(self.call)
        self.responses.append(r)
        return r

    def segment(self):
        """Messages up to and including the next one with an intercept or a finish reason."""
        out = []
        while True:
            r = self.read()
            out.append(r)
            if r.HasField("intercept") or r.finish_reason:
                return out

    def rest(self):
        """Every message left (the call must end OK)."""
        out = []
        for r in self.call:
            self.responses.append(r)
            out.append(r)
        return out

    def ids(self):
        return [t.token_id for r in self.responses for t in r.tokens]

    def text(self):
        return "".join(t.text for r in self.responses for t in r.tokens)


def session_error(fn):
    """(code, details) of the RpcError fn raises; fails the test when it raises none."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("expected the session to end with an error")


def tokenize(stub, text, model="stories", add_special=False):
    return list(stub.Tokenize(pb().TokenizeRequest(model=model, text=text, add_special=add_special), timeout=10).token_ids)


def paused_now(server):
    return sum(i.paused for i in server.status().intercepts)


def wait_paused(server, n, timeout=PAUSE_WAIT_S):
    deadline = time.monotonic() + timeout
    while paused_now(server) != n and time.monotonic() < deadline:
        time.sleep(0.02)
    return paused_now(server)


# The story script: pause at each sentence's end, append a few words, three times, then end.
PROMPT = "Once upon a time"
APPENDS = [" Then the dog", " The next day,", " At last"]


def run_script(stub, hold="", model="stories", request_id="", appends=APPENDS, max_tokens=40):
    """Runs the story script; returns (segments of generated ids, the final message)."""
    s = Session(stub).open(intercept={"triggers": ["."], "hold": hold}, text=PROMPT, max_tokens=max_tokens,
                           ignore_eos=True, model=model, request_id=request_id)
    segments = []
    for i, text in enumerate(appends + [None]):
        messages = s.segment()
        segments.append([t.token_id for m in messages for t in m.tokens])
        last = messages[-1]
        if not last.HasField("intercept"):
            raise AssertionError(f"segment {i} ended without a pause: {last}")
        if text is None:
            s.end()
        else:
            s.resume(text=text)
    final = s.rest()
    return segments, final[-1] if final else None


class SessionApiTest(base.ServerTestCase):
    CONFIG = {"limits": {"max_tokens": 1024, "default_max_tokens": 32}, "engine": {"kv_cache": "32MiB"},
              "intercepts": {"paused_idle_timeout_s": 60}}

    def test_string_trigger_pause_resume_end(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True,
                                    request_id="story-1")
        first = s.segment()
        pause = first[-1]
        self.assertTrue(pause.HasField("intercept"), pause)
        i = pause.intercept
        self.assertEqual((i.trigger, i.matched, i.index), ("string", ".", 1), i)
        seg0_text = "".join(t.text for m in first for t in m.tokens)
        self.assertTrue(seg0_text.endswith("."), seg0_text)
        self.assertTrue(i.text.endswith("."), i)
        self.assertIn(i.text.strip(), seg0_text)
        prompt_ids = tokenize(self.stub, PROMPT, add_special=True)
        self.assertEqual(i.context_tokens, len(prompt_ids) + sum(len(m.tokens) for m in first))
        self.assertEqual(pause.finish_reason, pb().FINISH_REASON_UNSPECIFIED)
        self.assertTrue(all(m.session_id == "story-1" and m.segment == 0 for m in first))
        for t in (t for m in first for t in m.tokens):
            self.assertEqual((t.model, t.loaded_depth), ("stories", 5), t)

        s.resume(text=" Then the dog")
        second = s.segment()
        self.assertTrue(all(m.segment == 1 for m in second))
        self.assertTrue(second[-1].HasField("intercept"), second[-1])
        self.assertEqual(second[-1].intercept.index, 2)
        self.assertGreater(sum(len(m.tokens) for m in second), 0)
        s.end()
        final = s.rest()
        self.assertEqual(len(final), 1, final)
        self.assertEqual(final[0].finish_reason, pb().FINISH_REASON_STOP)
        appended = tokenize(self.stub, " Then the dog")
        self.assertEqual(final[0].usage.prompt_tokens, len(prompt_ids) + len(appended))
        self.assertEqual(final[0].usage.completion_tokens, len(s.ids()))
        self.assertGreater(final[0].timings.total_seconds, 0)
        self.assertIdle("after a session")

    def test_many_intercepts_in_one_session(self):
        s = Session(self.stub).open(intercept={"triggers": [".", ","]}, text="Lily went to the park", max_tokens=40,
                                    ignore_eos=True)
        for n in range(1, 9):
            last = s.segment()[-1]
            self.assertTrue(last.HasField("intercept"), last)
            self.assertEqual(last.intercept.index, n)
            self.assertEqual(last.segment, n - 1)
            self.assertIn(last.intercept.matched, (".", ","))
            if n == 8:
                break
            if n % 2:
                s.resume(text=" and")
            else:
                s.resume(token_ids=pb().TokenIds(ids=tokenize(self.stub, " so")), max_tokens=20)
        s.end()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)

    def test_greedy_output_is_the_same_for_every_hold_policy_and_as_one_generate(self):
        runs = {p: run_script(self.stub, hold=p) for p in POLICIES}
        for p in POLICIES:
            self.assertEqual(runs[p][0], runs["min-waste"][0], f"hold {p}: the session's tokens differ from min-waste's")
        # Resuming in place must give what a request of the whole context would: each segment is the
        # greedy continuation of the prompt, the segments before it and the appended text.
        segments = runs["preserve"][0]
        context = tokenize(self.stub, PROMPT, add_special=True)
        for k, seg in enumerate(segments):
            if k > 0:
                context += tokenize(self.stub, APPENDS[k - 1])
            alone = generate(self.stub, token_ids=pb().TokenIds(ids=context), max_tokens=len(seg), ignore_eos=True)
            self.assertEqual(alone.ids, seg, f"segment {k}: resumed in place != the same context as one Generate")
            context += seg
        # Each run counted its intercepts under its policy.
        status = {i.model: i for i in self.server.status().intercepts}["stories"]
        self.assertGreaterEqual(status.intercepts_total, 4 * len(POLICIES))
        policies = {d.policy for d in status.decisions}
        self.assertTrue(policies <= set(POLICIES), policies)
        for d in status.decisions:
            self.assertIn(d.decision, ("preserve", "swap", "discard", "evict"), d)
            self.assertGreater(d.count, 0, d)
        for p in ("discard", "preserve", "swap"):
            self.assertIn(p, policies, f"no decision counted for hold {p}: {status}")

    def test_a_session_without_triggers_is_a_generate(self):
        s = Session(self.stub).open(text="Tom had a red ball", max_tokens=24, ignore_eos=True)
        s.half_close()
        messages = s.rest()
        self.assertEqual(messages[-1].finish_reason, pb().FINISH_REASON_LENGTH)
        self.assertFalse(any(m.HasField("intercept") for m in messages))
        self.assertEqual(s.ids(), generate(self.stub, text="Tom had a red ball", max_tokens=24, ignore_eos=True).ids)

    def test_token_trigger(self):
        dot = tokenize(self.stub, ".")[-1]
        s = Session(self.stub).open(intercept={"trigger_token_ids": [dot]}, text=PROMPT, max_tokens=40,
                                    ignore_eos=True)
        last = s.segment()[-1]
        self.assertEqual(last.intercept.trigger, "token", last)
        self.assertEqual(last.tokens[-1].token_id, dot)
        s.end()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)

    def test_on_length_pauses_each_segment_at_its_max_tokens(self):
        # A trace replay: each segment's length is known, the pause comes at it, not a finish.
        s = Session(self.stub).open(intercept={"on_length": True, "hold": "min-waste", "kind": "math"}, text=PROMPT,
                                    max_tokens=6, ignore_eos=True)
        for k, n in enumerate((6, 3, 9)):
            seg = s.segment()
            self.assertEqual(seg[-1].intercept.trigger, "length", seg[-1])
            self.assertEqual(sum(len(r.tokens) for r in seg), n)
            self.assertEqual(seg[-1].intercept.index, k + 1)
            if k < 2:
                s.resume(text=" and", max_tokens=(3, 9)[k])
        s.end()
        final = s.rest()[-1]
        self.assertEqual(final.finish_reason, pb().FINISH_REASON_STOP)
        self.assertEqual(final.usage.completion_tokens, 18)

    def test_abort_while_paused_ends_with_aborted(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True,
                                    request_id="abort-paused")
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        self.assertEqual(wait_paused(self.server, 1), 1)
        self.assertTrue(self.stub.Abort(pb().AbortRequest(request_id="abort-paused"), timeout=10).found)
        final = s.rest()
        self.assertEqual(final[-1].finish_reason, pb().FINISH_REASON_ABORTED, final)
        self.assertEqual(wait_paused(self.server, 0), 0)
        self.assertIdle("abort while paused")

    def test_end_while_generating_stops_it(self):
        s = Session(self.stub).open(text=PROMPT, max_tokens=250, ignore_eos=True)
        s.read()
        s.end()
        final = s.rest()
        self.assertIn(final[-1].finish_reason, (pb().FINISH_REASON_ABORTED, pb().FINISH_REASON_LENGTH))
        self.assertIdle("end while generating")

    def test_half_close_while_paused_ends_it(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        s.half_close()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)
        self.assertEqual(wait_paused(self.server, 0), 0)

    def test_cancel_while_paused_frees_the_session(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True,
                                    request_id="cancel-paused")
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        self.assertEqual(wait_paused(self.server, 1), 1)
        s.call.cancel()
        self.assertEqual(wait_paused(self.server, 0), 0, "a cancelled session is still paused")
        self.assertIdle("cancel while paused")
        # Its id is free again.
        segments, final = run_script(self.stub, request_id="cancel-paused", appends=[])
        self.assertEqual(final.finish_reason, pb().FINISH_REASON_STOP)

    def test_resume_when_not_paused_is_failed_precondition(self):
        s = Session(self.stub).open(text=PROMPT, max_tokens=250, ignore_eos=True)
        s.resume(text=" more")
        code, details = session_error(s.rest)
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, details)
        self.assertIn("not paused", details)
        self.assertIdle("a refused resume")

    def test_first_message_must_be_open(self):
        for first in ({"resume": pb().SessionResume(text="hi")}, {"end": pb().SessionEnd()}, None):
            s = Session(self.stub)
            if first is None:
                s.half_close()
            else:
                s.send(**first)
            code, details = session_error(s.rest)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (first, details))
            self.assertEqual(details, "the first message of a session must be `open`")
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        s.segment()
        s.open(text="again")
        code, details = session_error(s.rest)
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        self.assertIn("only the first", details)

    def test_invalid_opens(self):
        cases = [
            ({"hold": "keep"}, {}, "intercept.hold"),
            ({"trigger_token_ids": [512]}, {}, "intercept.trigger_token_ids[0]"),
            ({"triggers": [""]}, {}, "intercept.triggers[0]"),
            ({}, {"max_tokens": -1}, "max_tokens"),
            ({}, {"sampling": pb().SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ]
        for intercept, request, field in cases:
            s = Session(self.stub).open(intercept=intercept, text=PROMPT, **request)
            code, details = session_error(s.rest)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (intercept, request, details))
            self.assertIn(field, details)
        s = Session(self.stub).open(intercept={"hold": "keep"}, text=PROMPT)
        _, details = session_error(s.rest)
        for name in POLICIES:
            self.assertIn(name, details)
        s = Session(self.stub).open(text=PROMPT, tools_json="[]")
        code, details = session_error(s.rest)
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        self.assertIn("tools_json", details)
        code, details = session_error(Session(self.stub).open(text=PROMPT, model="nope").rest)
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND, details)

    def test_invalid_resumes(self):
        def paused():
            s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
            self.assertTrue(s.segment()[-1].HasField("intercept"))
            return s
        for resume, code, words in [
            ({"tool_result": pb().ToolResult(content="4")}, grpc.StatusCode.INVALID_ARGUMENT, "send `text`"),
            ({"user_turn": "hi"}, grpc.StatusCode.INVALID_ARGUMENT, "send `text`"),
            ({"token_ids": pb().TokenIds(ids=[1, 9999])}, grpc.StatusCode.INVALID_ARGUMENT, "token_ids[1]"),
            ({"text": ""}, grpc.StatusCode.INVALID_ARGUMENT, "resume"),
            ({"text": " x", "max_tokens": 100000}, grpc.StatusCode.INVALID_ARGUMENT, "resume.max_tokens"),
            ({"text": " x", "max_tokens": 600}, grpc.StatusCode.INVALID_ARGUMENT, "context"),
        ]:
            s = paused()
            s.resume(**resume)
            got, details = session_error(s.rest)
            self.assertEqual(got, code, (resume, details))
            self.assertIn(words, details)
        self.assertEqual(wait_paused(self.server, 0), 0)
        self.assertIdle("refused resumes")

    def test_status_counts_intercepts(self):
        before = {i.model: i for i in self.server.status().intercepts}["stories"]
        self.assertEqual(before.default_hold, "min-waste")
        run_script(self.stub, hold="preserve")
        after = {i.model: i for i in self.server.status().intercepts}["stories"]
        self.assertEqual(after.intercepts_total - before.intercepts_total, len(APPENDS) + 1)
        self.assertEqual(after.paused, 0)
        count = {(d.policy, d.decision): d.count for d in after.decisions}
        count_before = {(d.policy, d.decision): d.count for d in before.decisions}
        self.assertGreater(count.get(("preserve", "preserve"), 0), count_before.get(("preserve", "preserve"), 0),
                           after)
        self.assertGreater(after.kv_byte_seconds, 0)
        self.assertGreater(after.forward_seconds, 0)


class SessionIdleTimeoutTest(base.ServerTestCase):
    CONFIG = {"intercepts": {"paused_idle_timeout_s": 1}}

    def test_a_paused_session_without_an_answer_ends(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        t0 = time.monotonic()
        code, details = session_error(s.rest)
        waited = time.monotonic() - t0
        self.assertEqual(code, grpc.StatusCode.DEADLINE_EXCEEDED, details)
        self.assertIn("paused for 1 s without an answer", details)
        self.assertTrue(0.8 < waited < 5, waited)
        self.assertEqual(wait_paused(self.server, 0), 0)
        self.assertIdle("an idle session")

    def test_an_answered_session_is_not_ended(self):
        s = Session(self.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        for _ in range(3):
            self.assertTrue(s.segment()[-1].HasField("intercept"))
            time.sleep(0.6)  # each pause shorter than the timeout, together longer
            s.resume(text=" Then")
        s.segment()
        s.end()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)


class SessionApiKeyTest(base.ServerTestCase):
    CONFIG = {"server": {"api_keys": ["s3cret-key"]}}

    def test_a_session_needs_the_key(self):
        for md in (None, (("authorization", "Bearer wrong"),)):
            s = Session(self.stub, metadata=md).open(text=PROMPT, max_tokens=4)
            code, _ = session_error(s.rest)
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED, md)
        s = Session(self.stub, metadata=(("authorization", "Bearer s3cret-key"),)).open(
            intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        s.end()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)


class SessionDrainTest(unittest.TestCase):
    def test_sigterm_gives_a_paused_session_the_drain_timeout_then_ends_it(self):
        server = base.Heliosd("drain-session", [("stories", base.STORIES)], {"server": {"drain_timeout_s": 1}}).start()
        self.addCleanup(server.stop)
        s = Session(server.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True)
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        t0 = time.monotonic()
        server.signal()
        # While it drains the session may still be answered ...
        time.sleep(0.2)
        s.resume(text=" Then")
        self.assertGreater(len(s.segment()), 0)
        # ... and a session left paused ends with the server.
        code, details = session_error(s.rest)
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, details)
        self.assertIn("shut down", details)
        self.assertEqual(server.wait_exit(), 0, server.log_text())
        self.assertLess(time.monotonic() - t0, 15)


class GroupSessionTest(unittest.TestCase):
    """A session on a model group: routed once at its open, its tokens named by the group's engine."""

    def test_session_on_a_group(self):
        config = {"model_repository": [dict(name="tiny-a", path=base.STORIES, early_exit={"exits": [2, 4]})],
                  "groups": [{"name": "grp", "memory_budget": "32MiB", "evaluation_requests": 1,
                              "reassess_every": 0}]}
        server = base.Heliosd("group-session", [("plain", base.STORIES)], config).start()
        self.addCleanup(server.stop)
        script = run_script(server.stub, model="grp")
        plain = run_script(server.stub, model="plain")
        self.assertEqual(script[0], plain[0], "a group session's tokens differ from the plain model's")
        self.assertEqual(script[1].finish_reason, pb().FINISH_REASON_STOP)
        s = Session(server.stub).open(intercept={"triggers": ["."]}, text=PROMPT, max_tokens=40, ignore_eos=True,
                                      model="grp")
        first = s.segment()
        self.assertEqual({t.model for m in first for t in m.tokens}, {"tiny-a"})
        s.end()
        s.rest()
        status = server.status()
        self.assertGreaterEqual(status.groups[0].requests_total, 2)
        models = {i.model for i in status.intercepts}
        self.assertIn("plain", models)
        self.assertIn("tiny-a", models)


class SessionMemoryPressureTest(base.ServerTestCase):
    """A KV pool of 12 blocks (192 tokens) and six sessions of ~60 tokens each at once (one per hold
    policy, min-waste twice): running and paused contexts must give way (preemption, discard, swap or
    eviction), and still every session's greedy tokens are the ones it gets alone."""
    CONFIG = {"engine": {"kv_cache": 12 * STORIES_BLOCK_BYTES, "block_size": 16, "swap_space": "1MiB",
                         "max_seqs": 8}}

    def test_concurrent_sessions_under_memory_pressure(self):
        alone = run_script(self.stub, hold="preserve")[0]
        results = run_concurrently([lambda p=p: run_script(self.stub, hold=p) for p in POLICIES] +
                                   [lambda: run_script(self.stub, hold="min-waste")])
        for p, r in zip(POLICIES + ["min-waste"], results):
            if isinstance(r, Exception):
                raise AssertionError(f"hold {p} under memory pressure: {r}\n{self.server.log_text()}")
            self.assertEqual(r[0], alone, f"hold {p}: tokens under memory pressure differ from the session alone")
        server_status = self.server.status()
        status = {i.model: i for i in server_status.intercepts}["stories"]
        self.assertEqual(status.paused, 0)
        evictions = sum(d.count for d in status.decisions if d.decision == "evict")
        self.assertGreater(server_status.preemptions + evictions, 0, f"no memory pressure after all: {status}")
        self.assertIdle("sessions under memory pressure")


class ChatSessionTest(base.ServerTestCase):
    """Chat turns with SmolLM2 (ChatML): the end of the model's turn pauses for the next human turn."""
    CONFIG = {"limits": {"default_max_tokens": 96}, "engine": {"kv_cache": "64MiB"}}

    @classmethod
    def models(cls):
        return [("smollm2", base.SMOLLM2)]

    def test_user_turns_resume_in_place(self):
        system, user1, user2 = "Answer in one short sentence.", "What is the capital of France?", "And of Germany?"
        conversation = pb().Conversation(messages=[pb().ChatMessage(role="system", content=system),
                                                   pb().ChatMessage(role="user", content=user1)])
        s = Session(self.stub).open(intercept={"end_of_turn": True, "kind": "chatbot"}, conversation=conversation,
                                    max_tokens=96)
        first = s.segment()
        last = first[-1]
        if not last.HasField("intercept"):
            self.skipTest(f"SmolLM2 did not end its turn within 96 tokens: {last}")
        self.assertEqual(last.intercept.trigger, "end_of_turn", last)
        self.assertEqual(last.intercept.matched, "<|im_end|>")
        reply1 = "".join(t.text for m in first for t in m.tokens).replace("<|im_end|>", "")
        s.resume(user_turn=user2)
        second = s.segment()
        s.end()
        final = s.rest()[-1]
        self.assertEqual(final.finish_reason, pb().FINISH_REASON_STOP)
        seg1 = [t.token_id for m in second for t in m.tokens]
        # The same conversation as one Generate: the template's rendering of all three turns.
        whole = generate(self.stub, conversation=pb().Conversation(messages=[
            pb().ChatMessage(role="system", content=system), pb().ChatMessage(role="user", content=user1),
            pb().ChatMessage(role="assistant", content=reply1),
            pb().ChatMessage(role="user", content=user2)]), max_tokens=len(seg1))
        context_before_seg1 = final.usage.prompt_tokens + sum(len(m.tokens) for m in first)
        if whole.final.usage.prompt_tokens != context_before_seg1:
            self.skipTest("the reply retokenizes differently: not the same token sequence")
        self.assertEqual(whole.ids, seg1, "the resumed turn differs from the whole conversation as one request")

    def test_tool_result_needs_no_tool_markup_in_the_template(self):
        # SmolLM2's template knows no tools: a string trigger stands in for the call, and the tool's
        # answer is rendered as a "tool" turn after the assistant's raw text.
        conversation = pb().Conversation(messages=[
            pb().ChatMessage(role="system", content="Answer in one short sentence."),
            pb().ChatMessage(role="user", content="Name a color.")])
        s = Session(self.stub).open(intercept={"triggers": [" "]}, conversation=conversation, max_tokens=16)
        self.assertTrue(s.segment()[-1].HasField("intercept"))
        s.resume(tool_result=pb().ToolResult(content="blue", name="color"))
        s.segment()
        s.end()
        self.assertEqual(s.rest()[-1].finish_reason, pb().FINISH_REASON_STOP)


CALCULATOR_TOOLS = ('[{"type": "function", "function": {"name": "calculator", "description": "Evaluates an '
                    'arithmetic expression.", "parameters": {"type": "object", "properties": {"expression": '
                    '{"type": "string"}}, "required": ["expression"]}}}]')


@unittest.skipUnless(os.path.isfile(QWEN), f"no {QWEN} (scripts/fetch_model.sh qwen-pair)")
class ToolCallSessionTest(base.ServerTestCase):
    """Tool calls with Qwen2.5-Coder-0.5B-Instruct and its template (tools in the system turn,
    <tool_response> turns). Greedy, this model writes its calls as bare JSON ending its turn rather
    than in <tool_call> markup: the markup test skips when it does, the end-of-turn one runs."""
    CONFIG = {"limits": {"default_max_tokens": 96}, "engine": {"kv_cache": "256MiB"}}

    @classmethod
    def models(cls):
        return [("qwen", QWEN)]

    def conversation(self):
        return [pb().ChatMessage(role="system", content="You are a helpful assistant. Use the calculator for arithmetic."),
                pb().ChatMessage(role="user", content="What is 1234 * 5678?")]

    def resumed_like_one_request(self, first, second, final, assistant):
        """The segment after the tool's turn is what one request of the whole conversation gives."""
        messages = self.conversation() + [assistant, pb().ChatMessage(role="tool", content="7006652", name="calculator")]
        seg1 = [t.token_id for m in second for t in m.tokens]
        # A session without triggers is one request, and unlike Generate it takes the tools.
        whole = Session(self.stub).open(conversation=pb().Conversation(messages=messages), tools_json=CALCULATOR_TOOLS,
                                        max_tokens=len(seg1))
        whole.half_close()
        whole_final = whole.rest()[-1]
        context_before_seg1 = final.usage.prompt_tokens + sum(len(m.tokens) for m in first)
        self.assertEqual(whole_final.usage.prompt_tokens, context_before_seg1,
                         "the session's context is not the template's rendering of the conversation")
        self.assertEqual(whole.ids(), seg1, "the resumed segment differs from the whole conversation as one request")

    def finish(self, s, second):
        if second[-1].finish_reason:
            return second[-1]
        s.end()
        return s.rest()[-1]

    def open(self):
        return Session(self.stub).open(intercept={"tool_calls": True, "end_of_turn": True, "kind": "math"},
                                       conversation=pb().Conversation(messages=self.conversation()),
                                       tools_json=CALCULATOR_TOOLS, max_tokens=96)

    def test_tool_call_markup_pauses_and_the_result_resumes(self):
        s = self.open()
        first = s.segment()
        last = first[-1]
        if not (last.HasField("intercept") and last.intercept.trigger == "tool_call"):
            self.skipTest(f"the model wrote no <tool_call>: {''.join(t.text for m in first for t in m.tokens)!r}")
        call = last.intercept
        self.assertEqual(call.matched, "</tool_call>")
        self.assertEqual(call.parse_error, "", call)
        self.assertEqual(call.tool_name, "calculator", call)
        self.assertIn("expression", call.arguments_json)
        s.resume(tool_result=pb().ToolResult(content="7006652"))
        second = s.segment()
        final = self.finish(s, second)
        before = "".join(t.text for m in first for t in m.tokens)
        self.resumed_like_one_request(first, second, final, pb().ChatMessage(
            role="assistant", content=before[:before.rfind("<tool_call>")].rstrip(),
            tool_calls_json='[{"type": "function", "function": {"name": "calculator", "arguments": ' +
                            call.arguments_json + '}}]'))

    def test_a_call_that_ends_the_turn_is_answered_with_a_tool_turn(self):
        s = self.open()
        first = s.segment()
        last = first[-1]
        text = "".join(t.text for m in first for t in m.tokens)
        if not (last.HasField("intercept") and last.intercept.trigger == "end_of_turn" and '"calculator"' in text):
            self.skipTest(f"the model did not end its turn with a bare call: {text!r}")
        self.assertEqual(last.intercept.matched, "<|im_end|>")
        s.resume(tool_result=pb().ToolResult(content="7006652", name="calculator"))
        second = s.segment()
        answer = "".join(t.text for m in second for t in m.tokens)
        self.assertIn("7006652", answer.replace(",", ""), answer)
        final = self.finish(s, second)
        self.assertEqual(final.finish_reason, pb().FINISH_REASON_STOP)
        self.resumed_like_one_request(first, second, final, pb().ChatMessage(role="assistant", content=text))

    def test_helios_chat_calculator(self):
        out = subprocess.run(
            [base.HELIOS, "chat", "--calculator", "--address", f"127.0.0.1:{self.server.port}", "--temperature", "0",
             "--max-tokens", "96", "--timeout", "120"],
            input="What is 1234 * 5678?\n", capture_output=True, text=True, timeout=180)
        self.assertEqual(out.returncode, 0, out.stderr)
        if "[calculator]" not in out.stdout:
            self.skipTest(f"the model did not call the calculator: {out.stdout!r}")
        self.assertIn("[calculator] 1234 * 5678 = 7006652", out.stdout)
        self.assertIn("7006652", out.stdout.split("[calculator]")[1].split("\n", 1)[1].replace(",", ""), out.stdout)
        self.assertIn("FINISH_REASON_STOP", out.stderr)
        self.assertIn("segments", out.stderr)


class ChatCalculatorTest(base.ServerTestCase):
    """`helios chat --calculator` on SmolLM2: the human's turns resume the session; end of input ends it."""
    CONFIG = {"limits": {"default_max_tokens": 64}}

    @classmethod
    def models(cls):
        return [("smollm2", base.SMOLLM2)]

    def test_turns_and_end_of_input(self):
        out = subprocess.run(
            [base.HELIOS, "chat", "--calculator", "--address", f"127.0.0.1:{self.server.port}", "--temperature", "0",
             "--timeout", "120"],
            input="Hello!\nWhat is 2 + 2?\n", capture_output=True, text=True, timeout=180)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("FINISH_REASON_STOP", out.stderr)
        segments = int(out.stderr.rsplit(" segments", 1)[0].rsplit(" ", 1)[1])
        self.assertGreaterEqual(segments, 2, out.stderr)  # at least one turn resumed in place
        self.assertEqual(paused_now(self.server), 0)
        # An empty first line opens nothing.
        out = subprocess.run([base.HELIOS, "chat", "--calculator", "--address", f"127.0.0.1:{self.server.port}"],
                             input="\n", capture_output=True, text=True, timeout=60)
        self.assertEqual((out.returncode, out.stdout.strip()), (0, ""), out.stderr)


if __name__ == "__main__":
    unittest.main()
