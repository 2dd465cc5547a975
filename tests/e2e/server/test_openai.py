"""End-to-end tests of heliosd's OpenAI-compatible HTTP API (server.http_listen), driven by the
official `openai` Python client (pinned, from PyPI, in the test venv that scripts/setup_venv.sh
makes: .venv-test, with Debian's site packages for grpc) and by curl for the wire format.

Run: .venv-test/bin/python -m unittest -v test_openai   (from this directory); run_heliosd_e2e.sh
makes the venv and runs it so. The heliosd helpers (config, start, stop, gRPC status) are
test_heliosd's. Models: stories260K (fast; greedy outputs are compared with gRPC's), SmolLM2-135M
for chat, Qwen2.5-Coder-0.5B (models/, scripts/fetch_model.sh qwen2.5-coder-0.5b) for tool calls:
that one test is skipped, saying so, without it.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

import test_heliosd as base

OPENAI_VERSION = "1.54.0"
QWEN = os.path.join(base.SOURCE_DIR, "models", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf")
KEY = "test-key-1"
openai = None


def setUpModule():
    global openai
    try:
        import openai as openai_module  # noqa: E402  (from the test venv)
    except ImportError as e:
        raise RuntimeError(f"the 'openai' package is missing from {sys.executable} ({e}): run "
                           f"scripts/setup_venv.sh (it makes .venv-test with openai=={OPENAI_VERSION} from PyPI) "
                           f"and run this module with .venv-test/bin/python, as run_heliosd_e2e.sh does") from None
    if openai_module.__version__ != OPENAI_VERSION:
        raise RuntimeError(f"openai {openai_module.__version__} is installed, the tests pin {OPENAI_VERSION}: "
                           f"run scripts/setup_venv.sh")
    openai = openai_module
    base.setUpModule()


def tearDownModule():
    base.tearDownModule()


class HttpHeliosd(base.Heliosd):
    """A heliosd with the HTTP API on its own free port."""

    def __init__(self, name, models, config=None):
        self.http_port = base.free_port()
        super().__init__(name, models, base.merge({"server": {"http_listen": f"127.0.0.1:{self.http_port}"}},
                                                  config))

    @property
    def url(self):
        return f"http://127.0.0.1:{self.http_port}"

    def client(self, key=KEY, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120, **kw)


def curl(*args, timeout=60):
    p = subprocess.run(["curl", "-sS", "--max-time", "60", *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def sse_events(body):
    """The data payloads of an SSE body, checking the framing: events end with a blank line and
    each line is 'data: ...' (or an SSE comment)."""
    assert body.endswith("\n\n"), repr(body[-40:])
    events = []
    for event in body.split("\n\n")[:-1]:
        if event.startswith(":"):
            continue
        assert event.startswith("data: ") and "\n" not in event, repr(event)
        events.append(event[len("data: "):])
    return events


class OpenAiApiTest(unittest.TestCase):
    """One heliosd with stories260K and SmolLM2, an API key, HTTP on."""

    @classmethod
    def setUpClass(cls):
        cls.server = HttpHeliosd("openai", [("stories", base.STORIES), ("smollm2", base.SMOLLM2)],
                                 {"server": {"api_keys": [KEY]}, "limits": {"max_n": 3},
                                  "engine": {"kv_cache": "128MiB"}}).start()
        cls.client = cls.server.client()
        cls.meta = [("authorization", f"Bearer {KEY}")]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        if cls.server.exit_code != 0:
            raise AssertionError(f"heliosd exited with {cls.server.exit_code}:\n{cls.server.log_text()}")

    def grpc_text(self, prompt, max_tokens, model="stories"):
        """The greedy output over gRPC, for comparison."""
        return base.generate(self.server.stub, text=prompt, max_tokens=max_tokens, ignore_eos=True, model=model,
                             metadata=self.meta).text

    def wait_idle(self):
        deadline = time.monotonic() + base.FREE_WAIT_S
        while True:
            s = self.server.stub.GetServerStatus(base.pb.GetServerStatusRequest(), timeout=10, metadata=self.meta)
            if (s.kv_blocks_used, s.requests_running, s.requests_waiting) == (0, 0, 0) or time.monotonic() > deadline:
                return s
            time.sleep(0.02)

    # --- discovery

    def test_models_and_health(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["stories", "smollm2"])
        self.assertTrue(all(m.object == "model" and m.owned_by == "helios" for m in models.data))
        self.assertEqual(self.client.models.retrieve("smollm2").id, "smollm2")
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("nope")
        code, out, _ = curl("-o", "/dev/null", "-w", "%{http_code}", self.server.url + "/health")
        self.assertEqual((code, out), (0, "200"))

    # --- completions

    def test_completion_matches_grpc_greedy_output(self):
        r = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=16,
                                           temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.model, "stories")
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.index, 0)
        self.assertEqual(c.finish_reason, "length")
        self.assertEqual(c.text, self.grpc_text("Once upon a time", 16))
        self.assertEqual(r.usage.completion_tokens, 16)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 16)
        n_prompt = len(self.server.stub.Tokenize(base.pb.TokenizeRequest(text="Once upon a time", add_special=True),
                                                 timeout=10, metadata=self.meta).token_ids)
        self.assertEqual(r.usage.prompt_tokens, n_prompt)
        # The default max_tokens is OpenAI's 16; a list of token ids is a prompt too.
        ids = list(self.server.stub.Tokenize(base.pb.TokenizeRequest(text="Once upon a time", add_special=True),
                                             timeout=10, metadata=self.meta).token_ids)
        by_ids = self.client.completions.create(model="stories", prompt=ids, temperature=0,
                                                extra_body={"ignore_eos": True})
        self.assertEqual(by_ids.usage.completion_tokens, 16)
        self.assertEqual(by_ids.choices[0].text, c.text)

    def test_completion_stream_with_usage(self):
        whole = self.client.completions.create(model="stories", prompt="Lily went to the park", max_tokens=20,
                                               temperature=0, extra_body={"ignore_eos": True})
        chunks = list(self.client.completions.create(model="stories", prompt="Lily went to the park", max_tokens=20,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True}))
        self.assertGreater(len(chunks), 2)
        self.assertEqual(len({c.id for c in chunks}), 1)
        text = "".join(ch.text for c in chunks for ch in c.choices)
        self.assertEqual(text, whole.choices[0].text)
        finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
        self.assertEqual(finishes, ["length"])
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 20)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_stop_strings(self):
        full = self.grpc_text("Tom had a red ball", 24)
        word = full.strip().split()[3]
        for stop in (word, [word, "zzzz"]):
            r = self.client.completions.create(model="stories", prompt="Tom had a red ball", max_tokens=24,
                                               temperature=0, stop=stop, extra_body={"ignore_eos": True})
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertEqual(r.choices[0].text, full[:full.index(word)])

    def test_n_choices_and_seeds(self):
        kw = dict(model="stories", prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=1.0,
                  extra_body={"ignore_eos": True})
        two = self.client.completions.create(n=2, seed=7, **kw)
        self.assertEqual([c.index for c in two.choices], [0, 1])
        self.assertEqual(two.usage.completion_tokens, 24)
        self.assertEqual(two.usage.prompt_tokens, self.client.completions.create(seed=7, **kw).usage.prompt_tokens)
        # Choice j is the request with seed + j: deterministic, and the same as asking alone.
        again = self.client.completions.create(n=2, seed=7, **kw)
        self.assertEqual([c.text for c in again.choices], [c.text for c in two.choices])
        self.assertEqual(self.client.completions.create(seed=8, **kw).choices[0].text, two.choices[1].text)
        # Different seeds sample differently (at temperature 1, over a few seeds).
        texts = {self.client.completions.create(seed=s, **kw).choices[0].text for s in range(100, 104)}
        self.assertGreater(len(texts), 1)
        # n is capped by limits.max_n (3 here).
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(n=4, **kw)
        self.assertEqual(cm.exception.param, "n")
        # Streamed, each choice has its own index and finish.
        chunks = list(self.client.completions.create(n=2, seed=7, stream=True, **kw))
        for i in (0, 1):
            self.assertEqual("".join(ch.text for c in chunks for ch in c.choices if ch.index == i), two.choices[i].text)
            self.assertEqual([ch.finish_reason for c in chunks for ch in c.choices if ch.index == i and
                              ch.finish_reason], ["length"])

    def test_batch_of_prompts(self):
        r = self.client.completions.create(model="stories", prompt=["Once upon a time", "Tom had a red ball"],
                                           max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.choices[1].text, self.grpc_text("Tom had a red ball", 8))
        self.assertEqual(r.usage.completion_tokens, 16)

    def test_completion_logprobs(self):
        r = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=6, temperature=0,
                                           logprobs=3, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(len(lp.top_logprobs), 6)
        self.assertEqual(lp.text_offset[0], 0)
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(logprob, 0)
            self.assertLessEqual(len(top), 3)
            self.assertAlmostEqual(max(top.values()), logprob, places=4)  # greedy: the best token
            self.assertIn(token, top)

    def test_helios_extensions(self):
        r = self.client.completions.create(
            model="stories", prompt="Once upon a time", max_tokens=5, temperature=0,
            extra_body={"ignore_eos": True, "helios": {"return_tokens": True, "exit": {"policy": "full"}}})
        tokens = r.choices[0].model_dump()["helios"]["tokens"]
        self.assertEqual(len(tokens), 5)
        for t in tokens:
            self.assertEqual((t["exit_layer"], t["model"], t["loaded_depth"]), (5, "stories", 5))
            self.assertTrue(0 < t["confidence"] <= 1)
        ids = [t.token_id for t in base.generate(self.server.stub, text="Once upon a time", max_tokens=5,
                                                 ignore_eos=True, metadata=self.meta).tokens]
        self.assertEqual([t["id"] for t in tokens], ids)
        # The exit rule is validated as gRPC's is, and named as this API names it.
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model="stories", prompt="a", extra_body={"helios": {"exit": {"policy": "turbo"}}})
        self.assertEqual(cm.exception.param, "helios.exit.policy")
        self.assertIn("unknown policy 'turbo'", cm.exception.message)
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.completions.create(model="stories", prompt="a",
                                           extra_body={"helios": {"exit": {"policy": "fixed-depth", "depth": 3}}})
        self.assertEqual(cm.exception.param, "helios.exit.depth")
        # In a stream, per chunk.
        chunks = list(self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=5,
                                                     temperature=0, stream=True,
                                                     extra_body={"ignore_eos": True, "helios": {"return_tokens": True}}))
        streamed = [t["id"] for c in chunks for ch in c.choices for t in ch.model_dump()["helios"]["tokens"]]
        self.assertEqual(streamed, ids)

    def test_logit_bias_and_penalties(self):
        def ids(**kw):
            r = self.client.completions.create(
                model="stories", prompt="Once upon a time", max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True, "helios": {"return_tokens": True}}, **kw)
            return [t["id"] for t in r.choices[0].model_dump()["helios"]["tokens"]]
        plain = ids()
        # Clients send these as "off": the output is the plain greedy one.
        self.assertEqual(ids(presence_penalty=0, frequency_penalty=0, logit_bias={}), plain)
        # -100 bans the first greedy token; +100 forces a token everywhere.
        banned = ids(logit_bias={str(plain[0]): -100})
        self.assertNotEqual(banned[0], plain[0])
        self.assertNotIn(plain[0], banned)
        forced = plain[3]
        self.assertEqual(ids(logit_bias={str(forced): 100}), [forced] * 12)
        # Penalties, against their formula applied here to the raw top-20 log-probabilities the
        # server reports: each greedy choice is the best candidate after
        # logprob - frequency * count - presence * (count > 0), counting the tokens generated so far.
        freq, pres = 1.5, 0.5
        r = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=48, temperature=0,
                                           logprobs=20, frequency_penalty=freq, presence_penalty=pres,
                                           extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        counts, checked = {}, 0
        for token, top in zip(lp.tokens, lp.top_logprobs):
            if token in top:
                best = max(top, key=lambda s: top[s] - freq * counts.get(s, 0) - pres * (counts.get(s, 0) > 0))
                self.assertEqual(best, token, f"step {checked}: {top}")
                checked += 1
            counts[token] = counts.get(token, 0) + 1
        self.assertGreater(checked, 40)
        self.assertNotEqual(r.choices[0].text, self.grpc_text("Once upon a time", 48), "the penalties changed nothing")
        for kw, param in [(dict(presence_penalty=3), "presence_penalty"),
                          (dict(frequency_penalty=-2.5), "frequency_penalty"),
                          (dict(logit_bias={"abc": 1}), "logit_bias.abc"),
                          (dict(logit_bias={"5": 150}), "logit_bias.5"),
                          (dict(logit_bias={"99999999": 1}), "logit_bias.99999999")]:
            with self.subTest(param=param):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.client.completions.create(model="stories", prompt="Once", **kw)
                self.assertEqual(cm.exception.param, param)
                self.assertIn(param, cm.exception.message)

    # --- chat

    def test_chat_stream_and_whole_agree(self):
        messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
        whole = self.client.chat.completions.create(model="smollm2", messages=messages, max_completion_tokens=8,
                                                    temperature=0)
        self.assertEqual(whole.object, "chat.completion")
        self.assertTrue(whole.id.startswith("chatcmpl-"))
        m = whole.choices[0].message
        self.assertEqual(m.role, "assistant")
        self.assertTrue(m.content)
        self.assertIsNone(m.tool_calls)
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        self.assertLessEqual(whole.usage.completion_tokens, 8)
        stream = self.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual(chunks[0].object, "chat.completion.chunk")
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(content, m.content)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
                         [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_chat_logprobs_and_max_tokens(self):
        r = self.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                                extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 4)
        self.assertEqual(r.choices[0].finish_reason, "length")
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertEqual(t.top_logprobs[0].token, t.token)  # greedy
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
        # max_completion_tokens wins over max_tokens, and errors name the one given.
        r = self.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=9, max_completion_tokens=3, temperature=0,
                                                extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 3)
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                max_completion_tokens=100000)
        self.assertEqual(cm.exception.param, "max_completion_tokens")

    # --- errors

    def test_errors(self):
        cases = [
            (dict(temperature=-1), "temperature"),
            (dict(temperature=3), "temperature"),
            (dict(top_p=1.5), "top_p"),
            (dict(max_tokens=100000), "max_tokens"),
            (dict(logprobs=30), "logprobs"),
            (dict(echo=True), "echo"),
            (dict(extra_body={"helios": {"nope": 1}}), "helios.nope"),
        ]
        for kw, param in cases:
            with self.subTest(param=param, kw=kw):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.client.completions.create(model="stories", prompt="Once", **kw)
                self.assertEqual(cm.exception.status_code, 400)
                self.assertEqual(cm.exception.param, param)
                self.assertEqual(cm.exception.type, "invalid_request_error")
                self.assertIn(param.split(".")[-1], cm.exception.message)
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model="smollm2", messages=[{"role": "robot", "content": "x"}])
        self.assertEqual(cm.exception.param, "messages[0].role")
        with self.assertRaises(openai.NotFoundError) as cm:
            self.client.completions.create(model="nope", prompt="x")
        self.assertEqual(cm.exception.param, "model")
        self.assertEqual(cm.exception.code, "model_not_found")
        self.assertIn("nope", cm.exception.message)
        with self.assertRaises(openai.AuthenticationError) as cm:
            self.server.client(key="wrong-key").completions.create(model="stories", prompt="x")
        self.assertEqual(cm.exception.status_code, 401)
        self.assertEqual(cm.exception.code, "invalid_api_key")
        code, out, _ = curl("-w", "\n%{http_code}", "-d", "{}", self.server.url + "/v1/completions")  # no key
        body, status = out.rsplit("\n", 1)
        self.assertEqual(status, "401")
        self.assertIn("needs an API key", json.loads(body)["error"]["message"])
        # Not JSON, an unknown route: OpenAI error bodies too.
        code, out, _ = curl("-H", f"Authorization: Bearer {KEY}", "-d", "{oops", self.server.url + "/v1/completions")
        self.assertEqual(json.loads(out)["error"]["type"], "invalid_request_error")
        code, out, _ = curl("-w", "\n%{http_code}", self.server.url + "/v1/embeddings")
        body, status = out.rsplit("\n", 1)
        self.assertEqual(status, "404")
        self.assertEqual(json.loads(body)["error"]["code"], "unknown_route")
        s = self.wait_idle()
        self.assertEqual((s.kv_blocks_used, s.requests_running), (0, 0))

    # --- the client goes away

    # --- structured output

    PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
              "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                             "tags": {"type": "array", "maxItems": 3,
                                      "items": {"enum": ["friendly", "tall", "quiet"]}}}}

    def check_person(self, text):
        person = json.loads(text)  # the whole reply is one JSON value of the schema
        self.assertEqual(set(person), {"name", "age", "tags"}, text)
        self.assertIsInstance(person["name"], str)
        self.assertLessEqual(len(person["name"]), 24)
        self.assertIsInstance(person["age"], int)
        self.assertLessEqual(len(person["tags"]), 3)
        self.assertTrue(set(person["tags"]) <= {"friendly", "tall", "quiet"}, text)

    def test_structured_output_json_schema(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": self.PERSON, "strict": True}}
        messages = [{"role": "user", "content": "Describe a person called Ada as JSON."}]
        for kw in (dict(temperature=0), dict(temperature=1, seed=5), dict(temperature=0.8, top_p=0.9, seed=9)):
            with self.subTest(**kw):
                r = self.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=200,
                                                        response_format=fmt, **kw)
                self.assertEqual(r.choices[0].finish_reason, "stop")
                self.check_person(r.choices[0].message.content)
        # Streamed, the same greedy text; over gRPC too.
        whole = self.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=200,
                                                    response_format=fmt, temperature=0)
        chunks = self.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=200,
                                                     response_format=fmt, temperature=0, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                         whole.choices[0].message.content)
        conversation = base.pb.Conversation(messages=[base.pb.ChatMessage(role="user", content=messages[0]["content"])])
        via_grpc = base.generate(self.server.stub, conversation=conversation, max_tokens=200, model="smollm2",
                                 response_format=base.pb.ResponseFormat(json_schema=json.dumps(self.PERSON)),
                                 metadata=self.meta)
        self.assertEqual(via_grpc.text, whole.choices[0].message.content)
        self.assertEqual(via_grpc.final.finish_reason, base.pb.FINISH_REASON_STOP)

    def test_structured_output_json_object(self):
        # stories260K has never seen JSON: the constraint alone makes the text an object.
        r = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=300, temperature=0,
                                           extra_body={"response_format": {"type": "json_object"}})
        text = r.choices[0].text
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(text), dict, text)
        else:  # cut at max_tokens inside a value: still a prefix of an object
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertTrue(text.lstrip().startswith("{"), text)
        r = self.client.chat.completions.create(model="smollm2", max_tokens=200, temperature=0,
                                                messages=[{"role": "user", "content": "What is the capital of France? "
                                                                                      "Answer in JSON."}],
                                                response_format={"type": "json_object"})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        # A model that nests without end (SmolLM2 does here) is cut at max_tokens, its text still an
        # object's start.
        r = self.client.chat.completions.create(model="smollm2", max_tokens=120, temperature=0,
                                                messages=[{"role": "user", "content": "List three colours as JSON."}],
                                                response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        else:
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertTrue(r.choices[0].message.content.startswith("{"))

    def test_forced_tool_calls_are_valid_calls(self):
        # SmolLM2 has no tool-call markup and, left alone, writes a broken call (a name that is no
        # tool's, an unclosed string). Forced, the reply is held to a call of the tools: one of their
        # names, and the arguments that tool's parameters.
        tools = [{"type": "function", "function": {
                     "name": "get_weather", "description": "The weather in a city",
                     "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
                         "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
                 {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                                   "parameters": {"type": "object", "properties": {
                                                       "zone": {"type": "string", "maxLength": 40}}}}}]
        messages = [{"role": "user", "content": "What's the weather in Paris?"}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        for choice, listed, kw in (("required", tools, dict(temperature=0)),
                                   ("required", tools, dict(temperature=1, seed=4)),
                                   ("required", tools[:1], dict(temperature=0)),
                                   (named, tools, dict(temperature=0)), (named, tools, dict(temperature=0.9, seed=11))):
            with self.subTest(choice=choice, tools=len(listed), **kw):
                r = self.client.chat.completions.create(model="smollm2", messages=messages, tools=listed,
                                                        tool_choice=choice, max_tokens=120, **kw)
                c = r.choices[0]
                self.assertEqual(c.finish_reason, "tool_calls", c.message)
                self.assertEqual(len(c.message.tool_calls), 1, c.message)
                call = c.message.tool_calls[0].function
                arguments = json.loads(call.arguments)
                if choice == named or len(listed) == 1:
                    self.assertEqual(call.name, "get_weather")
                if call.name == "get_weather":
                    self.assertEqual(set(arguments), {"city", "unit"}, arguments)  # required, and no others
                    self.assertIsInstance(arguments["city"], str)
                    self.assertLessEqual(len(arguments["city"]), 40)
                    self.assertIn(arguments["unit"], ("celsius", "fahrenheit"))
                else:
                    self.assertEqual(call.name, "get_time")
                    self.assertLessEqual(set(arguments), {"zone"}, arguments)
        # Streamed: the same call, as one tool_calls delta.
        whole = self.client.chat.completions.create(model="smollm2", messages=messages, tools=tools,
                                                    tool_choice=named, max_tokens=120, temperature=0)
        chunks = list(self.client.chat.completions.create(model="smollm2", messages=messages, tools=tools,
                                                          tool_choice=named, max_tokens=120, temperature=0,
                                                          stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        self.assertEqual([d.function.name for d in deltas], ["get_weather"])
        self.assertEqual(json.loads(deltas[0].function.arguments),
                         json.loads(whole.choices[0].message.tool_calls[0].function.arguments))
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model="smollm2", messages=messages, tools=tools, tool_choice="required",
                                                response_format={"type": "json_object"})
        self.assertEqual(cm.exception.param, "response_format")

    def test_structured_output_top_level_union(self):
        # pydantic's Union[Circle, Square]: two objects no first character tells apart, followed
        # at once until the text shows which.
        shape = {"anyOf": [{"$ref": "#/$defs/Circle"}, {"$ref": "#/$defs/Square"}], "$defs": {
            "Circle": {"type": "object", "properties": {"radius": {"type": "number"}}, "required": ["radius"]},
            "Square": {"type": "object", "properties": {"side": {"type": "integer"}}, "required": ["side"]}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "shape", "schema": shape}}
        for kw in (dict(temperature=0), dict(temperature=1, seed=2)):
            with self.subTest(**kw):
                r = self.client.chat.completions.create(model="smollm2", max_tokens=60, response_format=fmt,
                                                        messages=[{"role": "user", "content": "A circle, as JSON."}],
                                                        **kw)
                self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
                value = json.loads(r.choices[0].message.content)
                self.assertIn(set(value), ({"radius"}, {"side"}), value)
                if "side" in value:
                    self.assertIsInstance(value["side"], int)

    def test_structured_output_errors(self):
        cases = [
            ({"type": "xml"}, "response_format.type", "xml"),
            ({"type": "json_schema"}, "response_format.json_schema", "schema"),
            ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "a+"}}},
             "response_format.json_schema.schema", "pattern"),
            ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {
                "x": {"anyOf": [{"type": "object"}, {"type": "object"}]}}}}},
             "response_format.json_schema.schema", "first character"),
        ]
        for fmt, param, says in cases:
            with self.subTest(param=param, says=says):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}],
                                                        response_format=fmt)
                self.assertEqual(cm.exception.param, param)
                self.assertIn(says, cm.exception.message)
        code, details = base.rpc_code(lambda: base.generate(
            self.server.stub, text="x", model="stories", metadata=self.meta,
            response_format=base.pb.ResponseFormat(json_schema='{"type": "integer", "minimum": 1}')))
        self.assertEqual(code, base.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("response_format.json_schema: schema at #: 'minimum'", details)

    def test_disconnect_mid_stream_frees_kv(self):
        stream = self.client.completions.create(model="stories", prompt="Once upon a time", max_tokens=450,
                                                temperature=0, stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        for _ in range(3):
            next(it)
        s = self.server.stub.GetServerStatus(base.pb.GetServerStatusRequest(), timeout=10, metadata=self.meta)
        before = s.generated_tokens_total
        stream.close()
        s = self.wait_idle()
        self.assertEqual((s.kv_blocks_used, s.requests_running, s.requests_waiting), (0, 0, 0),
                         f"KV not freed within {base.FREE_WAIT_S} s of the disconnect: {s}")
        self.assertLess(s.generated_tokens_total - before, 440, "the request was aborted, not run to its end")
        self.assertIn("the client went away", self.server.log_text())

    # --- the wire, with curl

    def test_curl_sse_framing_and_done(self):
        body = json.dumps({"model": "stories", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True})
        code, out, err = curl("-N", "-D", "-", "-H", "Content-Type: application/json", "-H",
                              f"Authorization: Bearer {KEY}", "-d", body, self.server.url + "/v1/completions")
        self.assertEqual(code, 0, err)
        head, _, sse = out.partition("\r\n\r\n")
        self.assertIn("200", head.splitlines()[0])
        self.assertIn("content-type: text/event-stream", head.lower())
        self.assertIn("transfer-encoding: chunked", head.lower())
        events = sse_events(sse)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 6)
        self.assertEqual("".join(c["choices"][0]["text"] for c in chunks[:-1]), self.grpc_text("Once upon a time", 6))
        for c in chunks[:-1]:
            self.assertEqual(set(c), {"id", "object", "created", "model", "choices", "usage"})
            self.assertEqual(set(c["choices"][0]), {"index", "text", "logprobs", "finish_reason"})
        # Chat over curl: the first delta has the role; [DONE] last.
        body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                           "stream": True})
        code, out, err = curl("-N", "-H", f"Authorization: Bearer {KEY}", "-d", body,
                              self.server.url + "/v1/chat/completions")
        events = sse_events(out)
        self.assertEqual(events[-1], "[DONE]")
        first = json.loads(events[0])
        self.assertEqual(first["object"], "chat.completion.chunk")
        self.assertEqual(first["choices"][0]["delta"]["role"], "assistant")
        self.assertIsNotNone(json.loads(events[-2])["choices"][0]["finish_reason"])
        # Not streamed: one JSON body.
        code, out, err = curl("-D", "-", "-H", f"Authorization: Bearer {KEY}", "-d",
                              json.dumps({"model": "stories", "prompt": "Once", "max_tokens": 2}),
                              self.server.url + "/v1/completions")
        head, _, rest = out.partition("\r\n\r\n")
        self.assertIn("content-type: application/json", head.lower())
        self.assertEqual(json.loads(rest)["object"], "text_completion")


class OpenAiQueueAndDrainTest(unittest.TestCase):
    def test_full_queue_is_429(self):
        server = HttpHeliosd("openai-queue", [("stories", base.STORIES)], {"engine": {"queue_limit": 1}}).start()
        self.addCleanup(server.stop)
        client = server.client()
        stream = client.completions.create(model="stories", prompt="Once", max_tokens=450, stream=True,
                                           extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        with self.assertRaises(openai.RateLimitError) as cm:
            client.completions.create(model="stories", prompt="Once", max_tokens=2)
        self.assertEqual(cm.exception.status_code, 429)
        self.assertEqual(cm.exception.code, "queue_full")
        stream.close()

    def test_drain_finishes_http_streams_and_answers_503(self):
        server = HttpHeliosd("openai-drain", [("smollm2", base.SMOLLM2)], {"server": {"drain_timeout_s": 60}}).start()
        self.addCleanup(server.stop)
        client = server.client()
        stream = client.chat.completions.create(model="smollm2", max_tokens=60, stream=True,
                                                messages=[{"role": "user", "content": "Tell me a story about a dragon."}],
                                                extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        it = iter(stream)
        chunks = [next(it)]
        server.signal(signal.SIGTERM)
        refused = None
        deadline = time.monotonic() + 10
        while refused is None and time.monotonic() < deadline:
            try:
                client.completions.create(model="smollm2", prompt="hi", max_tokens=1)
            except openai.InternalServerError as e:
                refused = e
            time.sleep(0.01)
        self.assertIsNotNone(refused, "no 503 while draining")
        self.assertEqual(refused.status_code, 503)
        self.assertEqual(refused.code, "draining")
        code, out, _ = curl("-o", "/dev/null", "-w", "%{http_code}", server.url + "/health")
        self.assertEqual(out, "503")
        chunks += list(it)  # the open stream finishes, [DONE] and all
        self.assertEqual(chunks[-1].usage.completion_tokens, 60)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
                         ["length"])
        self.assertEqual(server.wait_exit(), 0, server.log_text())


class OpenAiGroupTest(unittest.TestCase):
    """A model group by name over HTTP: the manager routes every choice and hears how it ended."""

    def test_group_routes_http_requests(self):
        repo = [dict(name=n, path=base.STORIES, early_exit={"exits": list(e)}) for n, e in
                (("s-a", (2, 4)), ("s-b", (1, 3)))]
        group = {"name": "grp", "memory_budget": "32MiB", "threshold": 0.5, "prefix_coverage": 0.3,
                 "evaluation_requests": 2, "reassess_every": 0}
        server = HttpHeliosd("openai-group", [("plain", base.STORIES)],
                             {"model_repository": repo, "groups": [group]}).start()
        self.addCleanup(server.stop)
        client = server.client()
        self.assertEqual([m.id for m in client.models.list().data], ["plain", "grp"])
        served = set()
        for i in range(3):
            r = client.completions.create(model="grp", prompt="Once upon a time", max_tokens=6, temperature=0, n=2,
                                          extra_body={"ignore_eos": True, "helios": {"return_tokens": True}})
            self.assertEqual(r.model, "grp")
            self.assertEqual(r.usage.completion_tokens, 12)
            for c in r.choices:
                tokens = c.model_dump()["helios"]["tokens"]
                self.assertEqual(len(tokens), 6)
                served |= {(t["model"], t["loaded_depth"]) for t in tokens}
        self.assertTrue({m for m, _ in served} <= {"s-a", "s-b"}, served)
        g = server.status().groups[0]
        self.assertEqual(g.requests_total, 6, "each choice is one routed request")
        # A group decides the exit rule: requests' own are refused as over gRPC.
        with self.assertRaises(openai.BadRequestError):
            client.completions.create(model="grp", prompt="a", extra_body={"helios": {"exit": {"policy": "full"}}})


class OpenAiToolsTest(unittest.TestCase):
    """Tool calls with a model whose chat template has them (Qwen2.5's <tool_call> markup)."""

    TOOLS = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                       "required": ["city"]}}}]
    MESSAGES = [{"role": "user", "content": "What is the weather like in Paris right now?"}]

    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(QWEN):
            raise unittest.SkipTest(f"no {QWEN} (tool calls need a template with tools): "
                                    "scripts/fetch_model.sh qwen2.5-coder-0.5b fetches it")
        cls.server = HttpHeliosd("openai-tools", [("qwen", QWEN)], {"engine": {"kv_cache": "256MiB"}}).start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_tool_calls(self):
        plain = self.client.chat.completions.create(model="qwen", messages=self.MESSAGES, max_tokens=1, temperature=0)
        r = self.client.chat.completions.create(model="qwen", messages=self.MESSAGES, tools=self.TOOLS,
                                                max_tokens=64, temperature=0)
        self.assertGreater(r.usage.prompt_tokens, plain.usage.prompt_tokens + 20, "the tools reach the template")
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls", c.message)
        self.assertEqual(len(c.message.tool_calls), 1)
        call = c.message.tool_calls[0]
        self.assertTrue(call.id.startswith("call_"))
        self.assertEqual(call.type, "function")
        self.assertEqual(call.function.name, "get_weather")
        self.assertIn("paris", json.loads(call.function.arguments)["city"].lower())
        self.assertNotIn("<tool_call>", c.message.content or "")
        # Streamed: the same call, as a tool_calls delta, and no markup in the content.
        chunks = list(self.client.chat.completions.create(model="qwen", messages=self.MESSAGES, tools=self.TOOLS,
                                                          max_tokens=64, temperature=0, stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        self.assertEqual([(d.index, d.function.name) for d in deltas], [(0, "get_weather")])
        self.assertEqual(json.loads(deltas[0].function.arguments), json.loads(call.function.arguments))
        self.assertNotIn("<tool_call>", "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        # The tool's answer goes back: an assistant turn with the call, a tool turn with the result.
        follow = self.client.chat.completions.create(
            model="qwen", tools=self.TOOLS, max_tokens=24, temperature=0,
            messages=self.MESSAGES + [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": "18 C and sunny"}])
        self.assertTrue(follow.choices[0].message.content)
        self.assertGreater(follow.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_tool_choice_forces_a_call(self):
        hello = [{"role": "user", "content": "Say hello to the people of Paris."}]
        auto = self.client.chat.completions.create(model="qwen", messages=hello, tools=self.TOOLS, max_tokens=32,
                                                   temperature=0)
        named = {"type": "function", "function": {"name": "get_weather"}}
        for choice in ("required", named):
            r = self.client.chat.completions.create(model="qwen", messages=hello, tools=self.TOOLS,
                                                    tool_choice=choice, max_tokens=48, temperature=0)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls", (choice, c.message))
            self.assertEqual([t.function.name for t in c.message.tool_calls], ["get_weather"])
            self.assertIsInstance(json.loads(c.message.tool_calls[0].function.arguments), dict)
            self.assertNotIn("<tool_call>", c.message.content or "")
            # The call's opening is part of the prompt: it counts there, not in the reply.
            self.assertGreater(r.usage.prompt_tokens, auto.usage.prompt_tokens)
        chunks = list(self.client.chat.completions.create(model="qwen", messages=hello, tools=self.TOOLS,
                                                          tool_choice=named, max_tokens=48, temperature=0,
                                                          stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        self.assertEqual([d.function.name for d in deltas], ["get_weather"])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        for bad in ({"type": "function", "function": {"name": "send_email"}}, "any"):
            with self.assertRaises(openai.BadRequestError) as e:
                self.client.chat.completions.create(model="qwen", messages=hello, tools=self.TOOLS,
                                                    tool_choice=bad, max_tokens=8)
            self.assertEqual(e.exception.param, "tool_choice")


if __name__ == "__main__":
    unittest.main()
