"""End-to-end tests of heliosd, the Helios gRPC server daemon.

Each test class starts the real `heliosd` on free loopback ports with a YAML config written for
it, talks to it through Debian's python3-grpcio with stubs generated at test time from
proto/helios/v1/helios.proto (and the standard health and reflection protos next to this file),
and stops it (SIGTERM, then SIGKILL if it hangs). Every wait is bounded.

Run: /usr/bin/python3 -m unittest -v test_heliosd   (from this directory), with
  HELIOS_BINARY_DIR  the build directory holding heliosd and helios (default: SOURCE/build)
  HELIOS_SOURCE_DIR  the repository root (default: three directories above this file)
`run_heliosd_e2e.sh` (what ctest runs as e2e.heliosd) sets them.

Models: stories260K (converted at test time from the llama2.c checkpoint in tests/data/stories260K;
tiny and fast) wherever the model's quality does not matter, SmolLM2-135M (the models cache, which
scripts/fetch_model.sh fills) where realism does (chat output, drain of a real model).
"""

import concurrent.futures
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import uuid

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.environ.get("HELIOS_SOURCE_DIR") or os.path.join(HERE, "..", "..", ".."))
BINARY_DIR = os.path.abspath(os.environ.get("HELIOS_BINARY_DIR") or os.path.join(SOURCE_DIR, "build"))
HELIOSD = os.path.join(BINARY_DIR, "heliosd")
HELIOS = os.path.join(BINARY_DIR, "helios")
SMOLLM2 = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
STORIES_DIR = os.path.join(SOURCE_DIR, "tests", "data", "stories260K")

# stories260K: 5 layers, kv_dim 32 → one 16-token KV block of the default f16 cache holds
# 2 × 5 × 16 × 32 × 2 bytes.
STORIES_BLOCK_BYTES = 2 * 5 * 16 * 32 * 2

START_TIMEOUT_S = 60     # config → health SERVING
STOP_TIMEOUT_S = 30      # SIGTERM → exit
RPC_TIMEOUT_S = 120      # any single call
FREE_WAIT_S = 1.5        # cancellation → KV blocks back to 0 (the issue asks for ~1 s)

WORK = None              # module temp dir
STORIES = None           # converted stories260K GGUF
pb = pb_grpc = health_pb2 = health_grpc = refl_pb2 = refl_grpc = None


def setUpModule():
    global WORK, STORIES, pb, pb_grpc, health_pb2, health_grpc, refl_pb2, refl_grpc
    for path in (HELIOSD, HELIOS):
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"{path} is not built (cmake --build build --target heliosd helios)")
    if not os.path.isfile(SMOLLM2):
        raise RuntimeError(f"no model at {SMOLLM2}: run scripts/fetch_model.sh")
    WORK = tempfile.mkdtemp(prefix="heliosd-e2e-")
    stubs = os.path.join(WORK, "stubs")
    os.makedirs(stubs)
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"--python_out={stubs}", f"--grpc_python_out={stubs}"]
    subprocess.run(protoc + ["-I", os.path.join(SOURCE_DIR, "proto"),
                             os.path.join(SOURCE_DIR, "proto", "helios", "v1", "helios.proto")],
                   check=True, timeout=60)
    subprocess.run(protoc + ["-I", HERE, os.path.join(HERE, "health.proto"), os.path.join(HERE, "reflection.proto")],
                   check=True, timeout=60)
    for package in ("helios", os.path.join("helios", "v1")):
        open(os.path.join(stubs, package, "__init__.py"), "w").close()
    sys.path.insert(0, stubs)
    from helios.v1 import helios_pb2, helios_pb2_grpc  # noqa: E402  (generated above)
    import health_pb2 as h_pb2, health_pb2_grpc as h_grpc, reflection_pb2 as r_pb2, reflection_pb2_grpc as r_grpc
    pb, pb_grpc = helios_pb2, helios_pb2_grpc
    health_pb2, health_grpc, refl_pb2, refl_grpc = h_pb2, h_grpc, r_pb2, r_grpc

    STORIES = os.path.join(WORK, "stories260K.gguf")
    subprocess.run([HELIOS, "convert-llama2c", "--checkpoint", os.path.join(STORIES_DIR, "stories260K.bin"),
                    "--tokenizer", os.path.join(STORIES_DIR, "tok512.bin"), "--out", STORIES],
                   check=True, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tearDownModule():
    if WORK:
        shutil.rmtree(WORK, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Helpers

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_yaml(value, indent=0):
    """A tiny YAML writer for the config: dicts, lists of dicts (whose values may be dicts or lists),
    lists of scalars, scalars."""
    pad = "  " * indent
    lines = []
    for key, v in value.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{key}:")
            lines.append(to_yaml(v, indent + 1))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f"{pad}{key}:")
            for item in v:
                first = True
                for k2, v2 in item.items():
                    lead = f"{pad}  {'- ' if first else '  '}{k2}:"
                    if isinstance(v2, dict):  # e.g. models[].early_exit
                        lines.append(lead)
                        lines.append(to_yaml(v2, indent + 3))
                    elif isinstance(v2, list):
                        lines.append(f"{lead} [{', '.join(scalar(x) for x in v2)}]")
                    else:
                        lines.append(f"{lead} {scalar(v2)}")
                    first = False
        elif isinstance(v, list):
            lines.append(f"{pad}{key}: [{', '.join(scalar(x) for x in v)}]")
        else:
            lines.append(f"{pad}{key}: {scalar(v)}")
    return "\n".join(lines)


def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def merge(base, extra):
    out = dict(base)
    for k, v in (extra or {}).items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Heliosd:
    """One heliosd process with its own config, ports and log. `models`: (name, path) or
    (name, path, {more keys of the entry, e.g. early_exit}); `env`: more environment variables."""

    def __init__(self, name, models, config=None, env=None):
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=WORK)
        self.port = free_port()
        self.metrics_port = free_port()
        base = {
            "server": {"listen": f"127.0.0.1:{self.port}", "metrics_listen": f"127.0.0.1:{self.metrics_port}",
                       "drain_timeout_s": 10},
            "models": [dict(name=n, path=p, **(extra[0] if extra else {})) for n, p, *extra in models],
            "engine": {"backend": "cpu", "threads": 2, "kv_cache": "64MiB"},
            "logging": {"level": "info"},
        }
        self.config = merge(base, config)
        self.config_path = os.path.join(self.dir, "heliosd.yaml")
        with open(self.config_path, "w") as f:
            f.write(to_yaml(self.config) + "\n")
        self.log_path = os.path.join(self.dir, "heliosd.log")
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.channel = None
        self.exit_code = None

    def start(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([HELIOSD, "--config", self.config_path], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.HeliosStub(self.channel)
        self.health = health_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"heliosd exited with {self.proc.returncode} while starting:\n{self.log_text()}")
            try:
                if self.health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return self
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"heliosd not SERVING after {START_TIMEOUT_S} s:\n{self.log_text()}")

    def log_text(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def signal(self, signum=signal.SIGTERM):
        self.proc.send_signal(signum)

    def wait_exit(self, timeout=STOP_TIMEOUT_S):
        try:
            self.exit_code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.exit_code = None  # hung: never a pass
        return self.exit_code

    def stop(self):
        if self.channel:
            self.channel.close()
            self.channel = None
        if self.proc and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            self.wait_exit()
        elif self.proc:
            self.exit_code = self.proc.returncode
        if getattr(self, "log", None):
            self.log.close()

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()

    def status(self):
        return self.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)

    def wait_idle(self, timeout=FREE_WAIT_S):
        """Waits until no request runs or waits and no KV block is used; returns the last status."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if s.kv_blocks_used == 0 and s.requests_running == 0 and s.requests_waiting == 0:
                return s
            if time.monotonic() > deadline:
                return s
            time.sleep(0.02)


def metric_value(text, name, labels=None):
    """The value of one sample in Prometheus text (None if absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if labels and not all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            continue
        return float(m.group(3))
    return None


class Result:
    def __init__(self, responses):
        self.responses = responses
        self.tokens = [t for r in responses for t in r.tokens]
        self.ids = [t.token_id for t in self.tokens]
        self.text = "".join(t.text for t in self.tokens)
        self.final = responses[-1] if responses else None


def generate(stub, timeout=RPC_TIMEOUT_S, metadata=None, **fields):
    return Result(list(stub.Generate(pb.GenerateRequest(**fields), timeout=timeout, metadata=metadata)))


def rpc_code(fn):
    """Runs fn; returns (StatusCode, details) of the RpcError it raised, or (OK, result)."""
    try:
        return grpc.StatusCode.OK, fn()
    except grpc.RpcError as e:
        return e.code(), e.details()


def run_concurrently(fns, timeout=RPC_TIMEOUT_S):
    """Starts all fns at the same moment (a barrier) on their own threads; returns their results
    (or raised exceptions) in order."""
    barrier = threading.Barrier(len(fns))

    def call(fn):
        barrier.wait(timeout=30)
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            return e

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(fns)) as pool:
        futures = [pool.submit(call, fn) for fn in fns]
        return [f.result(timeout=timeout) for f in futures]


NAMES = ["Lily", "Tom", "Ben", "Sue", "Max", "Anna", "Sam", "Mia"]
OPENINGS = ["went to the park", "had a red ball", "saw a big dog", "liked to sing"]
PROMPTS = [f"{n} {o}" for o in OPENINGS for n in NAMES]  # 32 different prompts


class ServerTestCase(unittest.TestCase):
    """Starts one heliosd for the class (MODELS, CONFIG) and stops it after."""
    CONFIG = None

    @classmethod
    def models(cls):
        return [("stories", STORIES)]

    @classmethod
    def setUpClass(cls):
        cls.server = Heliosd(cls.__name__, cls.models(), cls.CONFIG).start()
        cls.stub = cls.server.stub

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        if cls.server.exit_code != 0:
            raise AssertionError(f"heliosd exited with {cls.server.exit_code} on SIGTERM:\n{cls.server.log_text()}")

    def assertIdle(self, what):
        s = self.server.wait_idle()
        self.assertEqual((s.kv_blocks_used, s.requests_running, s.requests_waiting), (0, 0, 0),
                         f"{what}: KV blocks / running / waiting not back to 0 within {FREE_WAIT_S} s: {s}")


# ---------------------------------------------------------------------------------------------
# The API on a normal server: stories260K (default) + SmolLM2.

class ApiTest(ServerTestCase):
    CONFIG = {"limits": {"max_tokens": 1024, "default_max_tokens": 8}, "engine": {"kv_cache": "128MiB"}}
    solo_cache = {}

    @classmethod
    def models(cls):
        return [("stories", STORIES), ("smollm2", SMOLLM2)]

    def solo(self, prompt, max_tokens, model="stories", text=False):
        """The greedy output of `prompt` run alone (token ids, or its text)."""
        key = (prompt, max_tokens, model)
        if key not in self.solo_cache:
            self.solo_cache[key] = generate(self.stub, text=prompt, max_tokens=max_tokens, ignore_eos=True,
                                            model=model)
        return self.solo_cache[key].text if text else self.solo_cache[key].ids

    # --- health, reflection, discovery

    def test_health_serving(self):
        for service in ("", "helios.v1.Helios"):
            r = self.server.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, service)
        self.assertEqual(self.server.status().state, "SERVING")

    def test_reflection_lists_services(self):
        stub = refl_grpc.ServerReflectionStub(self.server.channel)
        responses = list(stub.ServerReflectionInfo(iter([refl_pb2.ServerReflectionRequest(list_services="")]),
                                                   timeout=10))
        names = {s.name for s in responses[0].list_services_response.service}
        self.assertIn("helios.v1.Helios", names)
        self.assertIn("grpc.health.v1.Health", names)

    def test_list_models_and_model_info(self):
        models = self.stub.ListModels(pb.ListModelsRequest(), timeout=10).models
        self.assertEqual([m.name for m in models], ["stories", "smollm2"])
        stories = self.stub.GetModelInfo(pb.GetModelInfoRequest(model="stories"), timeout=10)
        self.assertEqual((stories.n_layers, stories.n_vocab, stories.context_length), (5, 512, 512))
        self.assertEqual(stories.path, STORIES)
        self.assertEqual(stories.backend, "cpu")
        self.assertEqual(stories.loaded_layers, 5)
        smol = self.stub.GetModelInfo(pb.GetModelInfoRequest(model="smollm2"), timeout=10)
        self.assertEqual((smol.n_layers, smol.n_vocab, smol.n_embd), (30, 49152, 576))
        self.assertGreater(smol.n_parameters, 100_000_000)
        self.assertEqual(smol, models[1])
        # "" is the default (first) model.
        self.assertEqual(self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).name, "stories")

    def test_unknown_model_not_found(self):
        for call in (lambda: self.stub.GetModelInfo(pb.GetModelInfoRequest(model="nope"), timeout=10),
                     lambda: generate(self.stub, model="nope", text="hi", max_tokens=2),
                     lambda: self.stub.Tokenize(pb.TokenizeRequest(model="nope", text="hi"), timeout=10)):
            code, details = rpc_code(call)
            self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("nope", details)

    # --- tokenizer

    def test_tokenize_detokenize_round_trip(self):
        for model, text in (("stories", "Once upon a time, Lily saw a cat."),
                            ("smollm2", "Helios serves tokens: ünïcödé, 123 and émojis 🚀.")):
            tok = self.stub.Tokenize(pb.TokenizeRequest(model=model, text=text), timeout=10)
            self.assertGreater(len(tok.token_ids), 3)
            self.assertEqual(len(tok.pieces), len(tok.token_ids))
            back = self.stub.Detokenize(pb.DetokenizeRequest(model=model, token_ids=tok.token_ids), timeout=10)
            self.assertEqual(back.text.strip(), text, model)
            if model == "smollm2":
                # Tokens that split a character: each piece, and the text of each token alone, must
                # still be valid UTF-8 (proto3 strings), so the response parses at all.
                rocket = self.stub.Tokenize(pb.TokenizeRequest(model=model, text="🚀"), timeout=10)
                self.assertGreater(len(rocket.token_ids), 1, "expected byte-level pieces of a 4-byte character")
                for token_id in rocket.token_ids:
                    self.stub.Detokenize(pb.DetokenizeRequest(model=model, token_ids=[token_id]), timeout=10)
        code, details = rpc_code(lambda: self.stub.Detokenize(
            pb.DetokenizeRequest(model="stories", token_ids=[1, 512]), timeout=10))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("token_ids[1]", details)

    # --- one generation, every field

    def test_generate_fields(self):
        r = generate(self.stub, text="Once upon a time", max_tokens=12, ignore_eos=True, logprobs=True,
                     top_logprobs=3, request_id="fields-1")
        self.assertEqual(len(r.tokens), 12)
        for t in r.tokens:
            self.assertTrue(1 <= t.exit_layer <= 5, t)
            self.assertTrue(0 < t.confidence <= 1, t)
            self.assertTrue(math.isfinite(t.logprob) and t.logprob <= 0, t)
            self.assertEqual(len(t.top_logprobs), 3, t)
            lps = [p.logprob for p in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            # Greedy: the sampled token is the best one, and its confidence is its probability.
            self.assertEqual(t.top_logprobs[0].token_id, t.token_id)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
            self.assertAlmostEqual(math.exp(t.logprob), t.confidence, places=4)
        self.assertTrue(all(m.request_id == "fields-1" for m in r.responses))
        for m in r.responses[:-1]:
            self.assertEqual(m.finish_reason, pb.FINISH_REASON_UNSPECIFIED)
        f = r.final
        self.assertEqual(f.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertEqual(f.usage.completion_tokens, 12)
        n_prompt = len(self.stub.Tokenize(pb.TokenizeRequest(text="Once upon a time", add_special=True),
                                          timeout=10).token_ids)
        self.assertEqual(f.usage.prompt_tokens, n_prompt)
        self.assertGreaterEqual(f.timings.queue_seconds, 0)
        self.assertGreater(f.timings.time_to_first_token_seconds, 0)
        self.assertGreaterEqual(f.timings.total_seconds, f.timings.time_to_first_token_seconds)
        self.assertGreaterEqual(f.timings.time_to_first_token_seconds, f.timings.queue_seconds)
        self.assertEqual(r.ids, self.solo("Once upon a time", 12))  # logprobs don't change the output

    def test_generate_without_logprobs_has_exit_layer_and_confidence(self):
        r = generate(self.stub, model="smollm2", text="Name a colour.", chat=True, max_tokens=6)
        self.assertGreater(len(r.tokens), 0)
        for t in r.tokens:
            self.assertEqual(t.exit_layer, 30)
            self.assertTrue(0 < t.confidence <= 1)
            self.assertEqual(len(t.top_logprobs), 0)
        self.assertIn(r.final.finish_reason, (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS))

    def test_default_max_tokens_and_token_ids_input(self):
        ids = list(self.stub.Tokenize(pb.TokenizeRequest(text="Lily went to the park", add_special=True),
                                      timeout=10).token_ids)
        by_ids = generate(self.stub, token_ids=pb.TokenIds(ids=ids), ignore_eos=True)
        self.assertEqual(len(by_ids.tokens), 8)  # limits.default_max_tokens
        self.assertEqual(by_ids.ids, self.solo("Lily went to the park", 8))

    def test_stop_token_ids_and_stop_strings(self):
        ref = self.solo("Tom had a red ball", 24)
        r = generate(self.stub, text="Tom had a red ball", max_tokens=24, ignore_eos=True, stop_token_ids=[ref[5]])
        self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(r.ids, ref[:ref.index(ref[5]) + 1])
        full = generate(self.stub, text="Tom had a red ball", max_tokens=24, ignore_eos=True).text
        stop = full.strip().split()[3]
        r = generate(self.stub, text="Tom had a red ball", max_tokens=24, ignore_eos=True, stop=[stop])
        self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(r.text, full[:full.index(stop)])

    # --- validation

    def test_invalid_arguments_name_the_field(self):
        S = pb.SamplingParams
        cases = [
            ("NaN temperature", dict(text="hi", sampling=S(temperature=float("nan"))), "sampling.temperature"),
            ("negative temperature", dict(text="hi", sampling=S(temperature=-0.5)), "sampling.temperature"),
            ("top_p 1.5", dict(text="hi", sampling=S(top_p=1.5)), "sampling.top_p"),
            ("negative top_k", dict(text="hi", sampling=S(top_k=-1)), "sampling.top_k"),
            ("min_p 2", dict(text="hi", sampling=S(min_p=2)), "sampling.min_p"),
            ("negative repetition_penalty", dict(text="hi", sampling=S(repetition_penalty=-1)),
             "sampling.repetition_penalty"),
            ("max_tokens -1", dict(text="hi", max_tokens=-1), "max_tokens"),
            ("max_tokens above the limit", dict(text="hi", max_tokens=5000), "max_tokens"),
            ("prompt + max_tokens over the context", dict(text="Once upon a time", max_tokens=510), "context"),
            ("empty text", dict(text=""), "text"),
            ("empty token_ids", dict(token_ids=pb.TokenIds(ids=[])), "token_ids"),
            ("token id outside vocab", dict(token_ids=pb.TokenIds(ids=[1, 512])), "token_ids[1]"),
            ("negative token id", dict(token_ids=pb.TokenIds(ids=[-3])), "token_ids[0]"),
            ("stop_token_ids outside vocab", dict(text="hi", stop_token_ids=[2, 100000]), "stop_token_ids[1]"),
            ("empty stop string", dict(text="hi", stop=[""]), "stop[0]"),
            ("top_logprobs 21", dict(text="hi", logprobs=True, top_logprobs=21), "top_logprobs"),
            ("no input", dict(max_tokens=2), "input"),
        ]
        for name, fields, field in cases:
            with self.subTest(name):
                code, details = rpc_code(lambda: generate(self.stub, **fields))
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {details}")
                self.assertIn(field, details, name)
        # "prompt + max_tokens over the context" must also name max_tokens.
        code, details = rpc_code(lambda: generate(self.stub, text="Once upon a time", max_tokens=510))
        self.assertIn("max_tokens", details)
        self.assertIdle("after refused requests")

    # --- batching invariance

    def test_concurrent_streams_match_solo(self):
        prompts = PROMPTS[:8]
        solo = [self.solo(p, 32) for p in prompts]
        before = self.server.metrics()[2]
        results = run_concurrently([lambda p=p: generate(self.stub, text=p, max_tokens=32, ignore_eos=True)
                                    for p in prompts])
        after = self.server.metrics()[2]
        for p, ref, r in zip(prompts, solo, results):
            self.assertIsInstance(r, Result, f"{p}: {r}")
            self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(r.ids, ref, f"'{p}' differs when batched")
            self.assertEqual(r.text, self.solo(p, 32, text=True), f"'{p}' text differs when batched")
        # They really ran together: some steps had more than one sequence.
        steps = metric_value(after, "helios_batch_size_sequences_count") - \
            metric_value(before, "helios_batch_size_sequences_count")
        single = metric_value(after, "helios_batch_size_sequences_bucket", {"le": "1"}) - \
            metric_value(before, "helios_batch_size_sequences_bucket", {"le": "1"})
        self.assertGreater(steps - single, 0, "no step batched more than one sequence")
        self.assertIdle("after 8 streams")

    def test_batch_of_32_matches_solo(self):
        solo = [self.solo(p, 16) for p in PROMPTS]
        results = run_concurrently([lambda p=p: generate(self.stub, text=p, max_tokens=16, ignore_eos=True)
                                    for p in PROMPTS])
        for p, ref, r in zip(PROMPTS, solo, results):
            self.assertIsInstance(r, Result, f"{p}: {r}")
            self.assertEqual(r.ids, ref, f"'{p}' differs in a batch of 32")
        self.assertGreater(len({tuple(ids) for ids in solo}), 1, "the prompts should give different outputs")
        self.assertIdle("after 32 streams")

    def test_smollm2_chat_batched_matches_solo(self):
        questions = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?",
                     "Say hello in Spanish."]
        solo = [generate(self.stub, model="smollm2", text=q, chat=True, max_tokens=12) for q in questions]
        batched = run_concurrently([lambda q=q: generate(self.stub, model="smollm2", text=q, chat=True, max_tokens=12)
                                    for q in questions])
        for q, s, b in zip(questions, solo, batched):
            self.assertIsInstance(b, Result, f"{q}: {b}")
            self.assertTrue(s.text.strip(), q)
            self.assertEqual(b.ids, s.ids, q)
            self.assertEqual(b.text, s.text, q)
        self.assertTrue(all(s.text.isprintable() or "\n" in s.text for s in solo))

    # --- ending a stream early frees its KV blocks

    def long_stream(self, request_id=None, timeout=RPC_TIMEOUT_S):
        # SmolLM2, 400 tokens: several seconds even on an idle machine, so it is surely still
        # running when the test ends it.
        return self.stub.Generate(pb.GenerateRequest(model="smollm2", text="Tell me a long story.", chat=True,
                                                     max_tokens=400, ignore_eos=True, request_id=request_id or ""),
                                  timeout=timeout)

    def test_cancel_mid_stream_frees_blocks(self):
        call = self.long_stream()
        first = next(call)
        self.assertGreater(len(first.tokens), 0)
        self.assertGreater(self.server.status().kv_blocks_used, 0)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in call:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
        self.assertIdle("after a cancelled stream")

    def test_client_disconnect_frees_blocks(self):
        # A separate client process that is killed mid-stream: its TCP connection just drops.
        client = (
            "import sys, grpc\n"
            f"sys.path.insert(0, {os.path.join(WORK, 'stubs')!r})\n"
            "from helios.v1 import helios_pb2 as pb, helios_pb2_grpc as pg\n"
            f"ch = grpc.insecure_channel('127.0.0.1:{self.server.port}')\n"
            "call = pg.HeliosStub(ch).Generate(pb.GenerateRequest(model='smollm2', text='Tell me a long story.',\n"
            "    chat=True, max_tokens=400, ignore_eos=True), timeout=120)\n"
            "next(call)\n"
            "print('streaming', flush=True)\n"
            "import time; time.sleep(120)\n")
        proc = subprocess.Popen([sys.executable, "-c", client], stdout=subprocess.PIPE, text=True)
        try:
            line = [None]
            reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(timeout=60)
            self.assertEqual(line[0], "streaming\n", "the client process never got its first token")
            self.assertGreater(self.server.status().kv_blocks_used, 0)
            proc.kill()
            proc.wait(timeout=10)
            self.assertIdle("after the client process died")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def test_deadline_exceeded_frees_blocks(self):
        call = self.long_stream(timeout=1.0)
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in call:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIdle("after a deadline")

    def test_abort_by_request_id(self):
        rid = "abort-" + uuid.uuid4().hex
        call = self.long_stream(request_id=rid)
        first = next(call)
        self.assertEqual(first.request_id, rid)
        self.assertTrue(self.stub.Abort(pb.AbortRequest(request_id=rid), timeout=10).found)
        rest = list(call)  # ends normally (status OK), the last message says ABORTED
        self.assertGreater(len(rest), 0)
        final = rest[-1]
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_ABORTED)
        n = len(first.tokens) + sum(len(m.tokens) for m in rest)
        self.assertEqual(final.usage.completion_tokens, n)
        self.assertLess(n, 400)
        self.assertIdle("after Abort")
        self.assertFalse(self.stub.Abort(pb.AbortRequest(request_id=rid), timeout=10).found)
        code, details = rpc_code(lambda: self.stub.Abort(pb.AbortRequest(), timeout=10))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("request_id", details)

    def test_duplicate_request_id_refused(self):
        rid = "dup-" + uuid.uuid4().hex
        call = self.long_stream(request_id=rid)
        next(call)
        code, _ = rpc_code(lambda: generate(self.stub, model="smollm2", text="hi", max_tokens=2, request_id=rid))
        self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
        call.cancel()
        self.assertIdle("after the duplicate")

    # --- status and metrics

    def test_server_status_counts(self):
        before = self.server.status()
        generate(self.stub, text="Sue saw a big dog", max_tokens=5, ignore_eos=True)
        after = self.server.status()
        self.assertEqual(after.requests_total - before.requests_total, 1)
        self.assertEqual(after.generated_tokens_total - before.generated_tokens_total, 5)
        self.assertEqual(after.kv_block_size, 16)
        self.assertGreater(after.kv_blocks_total, 0)
        self.assertGreater(after.uptime_seconds, before.uptime_seconds)

    def test_prefix_cache_serves_a_second_turn_and_changes_nothing(self):
        # A first turn, then a second whose prompt is the first's prompt, output and more text:
        # its whole blocks come from the cache, and it generates what it would without one.
        first = generate(self.stub, model="smollm2", text="The history of the printing press begins", max_tokens=40,
                         ignore_eos=True)
        prompt = list(self.stub.Tokenize(pb.TokenizeRequest(model="smollm2", text="The history of the printing press begins",
                                                            add_special=True)).token_ids)
        second_prompt = prompt + first.ids + [13, 504, 1173]
        cache = lambda: next(m.prefix_cache for m in self.server.status().models if m.name == "smollm2")
        before = cache()
        second = generate(self.stub, model="smollm2", token_ids=pb.TokenIds(ids=second_prompt), max_tokens=12,
                          ignore_eos=True)
        after = cache()
        self.assertTrue(after.enabled)
        self.assertGreaterEqual(after.hit_tokens - before.hit_tokens, 16 * ((len(second_prompt) - 1) // 16) - 16)
        self.assertGreater(after.hit_rate, 0)
        alone = Heliosd("NoCache", [("smollm2", SMOLLM2)], merge(self.CONFIG, {"engine": {"prefix_caching": False}}))
        alone.start()
        try:
            again = generate(alone.stub, model="smollm2", token_ids=pb.TokenIds(ids=second_prompt), max_tokens=12,
                             ignore_eos=True)
            self.assertEqual(next(m.prefix_cache for m in alone.status().models).hit_tokens, 0)
        finally:
            alone.stop()
        self.assertEqual(second.ids, again.ids)
        text = subprocess.run([HELIOS, "status", "--address", f"127.0.0.1:{self.server.port}"], capture_output=True,
                              text=True, timeout=RPC_TIMEOUT_S).stdout
        self.assertIn("prefix cache:", text)

    def test_metrics_endpoint(self):
        generate(self.stub, text="Max liked to sing", max_tokens=4, ignore_eos=True)
        code, content_type, text = self.server.metrics()
        self.assertEqual(code, 200)
        self.assertIn("text/plain", content_type)
        for name in ("helios_requests_running", "helios_time_to_first_token_seconds_bucket",
                     "helios_generation_tokens_total"):
            self.assertIsNotNone(metric_value(text, name), f"{name} missing from /metrics")
        self.assertIn("# TYPE helios_time_to_first_token_seconds histogram", text)
        self.assertIn("# TYPE helios_generation_tokens_total counter", text)
        self.assertGreaterEqual(metric_value(text, "helios_generation_tokens_total"), 4)
        self.assertIsNotNone(metric_value(text, "helios_time_to_first_token_seconds_bucket", {"le": "+Inf"}))


# ---------------------------------------------------------------------------------------------
# Early exit: stories260K (5 layers) with exit points 1..4, per-token by default, and a second
# entry of the same file whose exit rule requests may not change.

STORIES_LAYERS = 5


class EarlyExitTest(ServerTestCase):
    EARLY_EXIT = {"policy": "per-token", "measure": "top1", "threshold": 0.5, "exits": [1, 2, 3, 4],
                  "allowed_policies": ["full", "per-token", "fixed-depth", "self-speculative"],
                  "min_threshold": 0.2}

    @classmethod
    def models(cls):
        return [("stories", STORIES, {"early_exit": cls.EARLY_EXIT}),
                ("stories-locked", STORIES, {"early_exit": {"allow_request_override": False}})]

    def exits(self, **fields):
        fields.setdefault("text", "Lily went to the park")
        fields.setdefault("max_tokens", 16)
        return generate(self.stub, ignore_eos=True, **fields)

    def test_model_info_shows_exit_points_and_default(self):
        info = self.stub.GetModelInfo(pb.GetModelInfoRequest(model="stories"), timeout=10)
        self.assertEqual(list(info.exit_layers), [1, 2, 3, 4])
        self.assertEqual(info.default_exit.policy, "per-token")
        self.assertEqual(info.default_exit.measure, "top1")
        self.assertAlmostEqual(info.default_exit.threshold, 0.5, places=6)
        self.assertTrue(info.default_exit.threshold_set)
        self.assertEqual(info.exit_heads_path, "")
        self.assertTrue(info.exit_override_allowed)
        self.assertEqual(list(info.allowed_exit_policies), ["full", "per-token", "fixed-depth", "self-speculative"])
        self.assertAlmostEqual(info.min_exit_threshold, 0.2, places=6)
        locked = self.stub.GetModelInfo(pb.GetModelInfoRequest(model="stories-locked"), timeout=10)
        self.assertEqual(list(locked.exit_layers), [])
        self.assertEqual(locked.default_exit.policy, "full")
        self.assertFalse(locked.exit_override_allowed)

    def test_every_token_has_exit_layer_and_confidence(self):
        r = self.exits()
        self.assertEqual(len(r.tokens), 16)
        for t in r.tokens:
            self.assertTrue(1 <= t.exit_layer <= STORIES_LAYERS, t)
            self.assertTrue(0 <= t.confidence <= 1, t)

    def test_full_policy_leaves_at_the_last_layer(self):
        r = self.exits(exit=pb.ExitOptions(policy="full"))
        self.assertEqual([t.exit_layer for t in r.tokens], [STORIES_LAYERS] * 16)

    def test_fixed_depth_leaves_at_the_depth(self):
        r = self.exits(exit=pb.ExitOptions(policy="fixed-depth", depth=2))
        self.assertEqual([t.exit_layer for t in r.tokens], [2] * 16)
        for t in r.tokens:
            self.assertTrue(0 <= t.confidence <= 1, t)

    def test_threshold_zero_counts_only_with_threshold_set(self):
        # threshold 0 ("leave at the first exit") is a real threshold, below this server's minimum.
        code, details = rpc_code(lambda: self.exits(exit=pb.ExitOptions(threshold=0, threshold_set=True)))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        self.assertIn("exit.threshold: 0 is below this server's minimum 0.2", details)
        # Without threshold_set, 0 is "not set": the default (0.5) applies.
        self.assertEqual(len(self.exits(exit=pb.ExitOptions(policy="per-token", threshold=0)).tokens), 16)

    def test_overrides_accepted(self):
        for options in (pb.ExitOptions(policy="per-token", threshold=0.9, measure="margin"),
                        pb.ExitOptions(threshold=1.0),
                        pb.ExitOptions(policy="self-speculative", depth=2, draft_tokens=3)):
            with self.subTest(str(options)):
                r = self.exits(exit=options, max_tokens=8)
                self.assertEqual(len(r.tokens), 8)
                self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_LENGTH)

    def test_refused_overrides_name_the_field(self):
        cases = [
            ("unknown policy", "stories", pb.ExitOptions(policy="turbo"), "exit.policy"),
            ("policy not allowed", "stories", pb.ExitOptions(policy="batch-sync"), "exit.policy"),
            ("threshold below the minimum", "stories", pb.ExitOptions(threshold=0.1), "exit.threshold"),
            ("threshold above 1", "stories", pb.ExitOptions(threshold=1.5), "exit.threshold"),
            ("depth not an exit point", "stories", pb.ExitOptions(policy="fixed-depth", depth=9), "exit.depth"),
            ("negative depth", "stories", pb.ExitOptions(depth=-1), "exit.depth"),
            ("draft_tokens 17", "stories", pb.ExitOptions(policy="self-speculative", draft_tokens=17),
             "exit.draft_tokens"),
            ("unknown measure", "stories", pb.ExitOptions(measure="top2"), "exit.measure"),
            ("probe without heads", "stories", pb.ExitOptions(measure="probe"), "exit"),
            ("overrides refused", "stories-locked", pb.ExitOptions(policy="fixed-depth", depth=5), "exit.policy"),
        ]
        for name, model, options, field in cases:
            with self.subTest(name):
                code, details = rpc_code(lambda: generate(self.stub, model=model, text="hi", max_tokens=2,
                                                          exit=options))
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {details}")
                self.assertIn(field, details, name)
        self.assertIn("allowed: full, per-token, fixed-depth, self-speculative",
                      rpc_code(lambda: generate(self.stub, text="hi", exit=pb.ExitOptions(policy="batch-sync")))[1])
        self.assertIn("allow_request_override", rpc_code(lambda: generate(
            self.stub, model="stories-locked", text="hi", exit=pb.ExitOptions(threshold=0.3)))[1])
        # Restating the locked model's default is not a change.
        r = generate(self.stub, model="stories-locked", text="hi", max_tokens=3, ignore_eos=True,
                     exit=pb.ExitOptions(policy="full"))
        self.assertEqual([t.exit_layer for t in r.tokens], [STORIES_LAYERS] * 3)
        self.assertIdle("after refused exit options")

    def test_server_status_counts_exits(self):
        self.exits(exit=pb.ExitOptions(policy="fixed-depth", depth=3), max_tokens=6)
        status = self.server.status()
        self.assertEqual([m.name for m in status.models], ["stories", "stories-locked"])
        stories = status.models[0]
        e = stories.early_exit
        self.assertEqual(e.default_policy, "per-token")
        self.assertEqual(list(e.exit_layers), [1, 2, 3, 4])
        self.assertEqual(len(e.exit_layer_counts), STORIES_LAYERS + 1)
        self.assertEqual(sum(e.exit_layer_counts), stories.generated_tokens_total)
        self.assertGreaterEqual(e.exit_layer_counts[3], 6)
        self.assertTrue(1 <= e.mean_exit_layer <= STORIES_LAYERS, e)
        mean = sum(i * n for i, n in enumerate(e.exit_layer_counts)) / sum(e.exit_layer_counts)
        self.assertAlmostEqual(e.mean_exit_layer, mean, places=6)
        self.assertGreater(e.layers_computed_total, 0)
        self.assertAlmostEqual(e.layers_per_token, e.layers_computed_total / stories.generated_tokens_total, places=6)
        self.assertEqual(sum(m.generated_tokens_total for m in status.models), status.generated_tokens_total)
        _, _, text = self.server.metrics()
        self.assertIsNotNone(metric_value(text, "helios_exit_layer_bucket", {"le": "+Inf"}))

        # K/V fill: a per-token run's token that leaves at layer k fills the K/V of the layers above k.
        r = self.exits(exit=pb.ExitOptions(policy="per-token", threshold=0.2))
        filled = sum(STORIES_LAYERS - t.exit_layer for t in r.tokens)
        self.assertGreater(filled, 0, "no token left early: the run checks nothing")
        after = self.server.status().models[0].early_exit
        self.assertEqual(after.kv_fill_layers_total - e.kv_fill_layers_total, filled)

        # Drafts: a self-speculative run that really drafts, with full's output.
        full = self.exits(exit=pb.ExitOptions(policy="full"))
        r = self.exits(exit=pb.ExitOptions(policy="self-speculative", depth=2, draft_tokens=3))
        self.assertEqual(r.ids, full.ids)
        spec = self.server.status().models[0].early_exit
        drafted = spec.draft_tokens_total - after.draft_tokens_total
        accepted = spec.draft_tokens_accepted - after.draft_tokens_accepted
        self.assertGreater(drafted, 0, spec)
        self.assertLessEqual(accepted, drafted)
        # Every round emits its accepted drafts and one more token: 15 tokens after the prompt's.
        self.assertLessEqual(drafted, 3 * (15 - accepted))
        self.assertAlmostEqual(spec.draft_acceptance_rate, spec.draft_tokens_accepted / spec.draft_tokens_total,
                               places=9)

    def test_cli_show_exits_and_status(self):
        address = ["--address", f"127.0.0.1:{self.server.port}"]
        p = subprocess.run([HELIOS, "complete", *address, "--prompt", "Tom had a red ball", "--max-tokens", "5",
                            "--policy", "fixed-depth", "--depth", "2", "--show-exits"],
                           capture_output=True, text=True, timeout=RPC_TIMEOUT_S)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [line for line in p.stderr.splitlines() if line.startswith("[exits]")]
        self.assertEqual(len(lines), 6, p.stderr)  # 5 tokens and the mean
        for line in lines[:5]:
            self.assertRegex(line, r"layer +2 +confidence [01]\.\d{3}$")
        self.assertIn("mean exit layer 2.00", lines[5])
        p = subprocess.run([HELIOS, "complete", *address, "--prompt", "hi", "--policy", "batch-sync"],
                           capture_output=True, text=True, timeout=RPC_TIMEOUT_S)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("exit.policy", p.stderr)
        p = subprocess.run([HELIOS, "status", *address], capture_output=True, text=True, timeout=RPC_TIMEOUT_S)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("exit points 1, 2, 3, 4; default per-token", p.stdout)
        self.assertIn("mean exit layer", p.stdout)


# ---------------------------------------------------------------------------------------------
# Overload: a queue of 4.

class OverloadTest(ServerTestCase):
    CONFIG = {"engine": {"queue_limit": 4}}

    def test_full_queue_refuses_and_accepted_complete(self):
        results = run_concurrently([lambda p=p: generate(self.stub, text=p, max_tokens=200, ignore_eos=True)
                                    for p in PROMPTS[:12]])
        refused = [r for r in results if isinstance(r, grpc.RpcError)]
        accepted = [r for r in results if isinstance(r, Result)]
        self.assertEqual(len(refused) + len(accepted), 12, results)
        for e in refused:
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
        self.assertGreater(len(refused), 0, "12 at once on a queue of 4: some must be refused")
        self.assertGreaterEqual(len(accepted), 4)
        for r in accepted:
            self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(len(r.tokens), 200)
        self.assertIdle("after the overload")
        # The queue has room again.
        self.assertEqual(len(generate(self.stub, text="hi", max_tokens=3, ignore_eos=True).tokens), 3)
        _, _, text = self.server.metrics()
        self.assertGreaterEqual(metric_value(text, "helios_rpc_errors_total"), len(refused))


# ---------------------------------------------------------------------------------------------
# Preemption: a KV cache of 12 blocks (192 tokens) for 6 requests of ~6 blocks each.

class PreemptionRecomputeTest(ServerTestCase):
    CONFIG = {"engine": {"kv_cache": 12 * STORIES_BLOCK_BYTES, "block_size": 16, "preemption": "recompute",
                         "swap_space": "1MiB"}}
    SWAPS = False

    def test_preempted_outputs_match_unpreempted(self):
        info = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        self.assertEqual(info.context_length, 12 * 16)
        prompts = PROMPTS[8:14]
        solo = [generate(self.stub, text=p, max_tokens=80, ignore_eos=True).ids for p in prompts]
        before = self.server.status().preemptions
        self.assertEqual(before, 0, "solo runs fit the cache and must not be preempted")
        # Watch GetServerStatus while they run: swap mode must really swap, recompute never.
        max_swapped, done = [0], threading.Event()

        def watch():
            while not done.is_set():
                max_swapped[0] = max(max_swapped[0], self.server.status().requests_swapped)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            results = run_concurrently([lambda p=p: generate(self.stub, text=p, max_tokens=80, ignore_eos=True)
                                        for p in prompts])
        finally:
            done.set()
            watcher.join(timeout=10)
        for p, ref, r in zip(prompts, solo, results):
            self.assertIsInstance(r, Result, f"{p}: {r}")
            self.assertEqual(r.final.finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(r.ids, ref, f"'{p}' differs after preemption")
        if self.SWAPS:
            self.assertGreater(max_swapped[0], 0, "preemption: swap never swapped a sequence out")
        else:
            self.assertEqual(max_swapped[0], 0, "preemption: recompute swapped")
        self.assertGreater(self.server.status().preemptions, 0, "the tiny cache should have forced preemption")
        _, _, text = self.server.metrics()
        self.assertGreater(metric_value(text, "helios_preemptions_total"), 0)
        self.assertIdle("after preemption")


class PreemptionSwapTest(PreemptionRecomputeTest):
    CONFIG = merge(PreemptionRecomputeTest.CONFIG, {"engine": {"preemption": "swap"}})
    SWAPS = True


class PreemptionEveryPolicyTest(ServerTestCase):
    """Recompute replays each generated token's exit layer, so under every policy whose exits do not
    depend on the other requests of a step (all but batch-sync) a preempted request generates what it
    generates alone, and leaves at the same layers."""
    CONFIG = {"engine": {"kv_cache": 12 * STORIES_BLOCK_BYTES, "block_size": 16, "preemption": "recompute",
                         "swap_space": "1MiB"}}
    # Exits after layers 2 and 3: at a 0.999 threshold per-token rows leave at either or run to the
    # end (the logit lens of stories260K is very confident once a story repeats itself).
    EARLY_EXIT = {"policy": "full", "exits": [2, 3]}
    POLICIES = [dict(policy="full"), dict(policy="per-token", measure="top1", threshold=0.999),
                dict(policy="fixed-depth", depth=3), dict(policy="self-speculative", depth=2, draft_tokens=3)]

    @classmethod
    def models(cls):
        return [("stories", STORIES, {"early_exit": cls.EARLY_EXIT})]

    def test_preempted_outputs_and_exits_match_unpreempted(self):
        prompts = PROMPTS[8:14]
        for fields in self.POLICIES:
            rule = pb.ExitOptions(**fields)

            def run(p, rule=rule):
                return generate(self.stub, text=p, max_tokens=80, ignore_eos=True, exit=rule)
            solo = [run(p) for p in prompts]
            before = self.server.status().preemptions
            results = run_concurrently([lambda p=p: run(p) for p in prompts])
            for p, ref, r in zip(prompts, solo, results):
                self.assertIsInstance(r, Result, f"{rule.policy} '{p}': {r}")
                self.assertEqual(r.ids, ref.ids, f"{rule.policy}: '{p}' differs after preemption")
                self.assertEqual([t.exit_layer for t in r.tokens], [t.exit_layer for t in ref.tokens],
                                 f"{rule.policy}: '{p}' left at other layers after preemption")
            if rule.policy == "per-token":
                layers = {t.exit_layer for r in results for t in r.tokens}
                self.assertGreater(len(layers), 1, f"per-token should mix exit layers, got {layers}")
            self.assertGreater(self.server.status().preemptions, before,
                               f"{rule.policy}: the tiny cache should have forced preemption")
        self.assertIdle("after preemption")


# ---------------------------------------------------------------------------------------------
# API keys.

class TensorParallelTest(ServerTestCase):
    """engine.tensor_parallel: 2 on the CPU: SmolLM2 split over two in-process ranks (its 3 KV heads
    as 1 and 2), batched and swapped out under preemption, generates what the same model generates on
    one rank, greedy, up to the first step where the one-rank model's two best tokens are within
    NEAR_TIE nats: there the split's other summation order may pick the other one (as an f16 against
    an f32 KV cache may). Its KV blocks come back."""
    CONFIG = {"engine": {"tensor_parallel": 2, "kv_cache": "2MiB", "block_size": 16, "preemption": "swap",
                         "swap_space": "64MiB"}}
    NEAR_TIE = 0.1

    @classmethod
    def models(cls):
        return [("smollm2", SMOLLM2)]

    def test_split_model_serves_what_one_rank_serves(self):
        prompts = PROMPTS[:6]
        one = Heliosd("TensorParallelReference", self.models(), {"engine": {"kv_cache": "64MiB"}}).start()
        try:
            ref = [generate(one.stub, text=p, max_tokens=40, ignore_eos=True, model="smollm2", logprobs=True,
                            top_logprobs=2) for p in prompts]
        finally:
            one.stop()
        self.assertIn("2 tensor-parallel ranks", self.server.log_text())
        before = self.server.status().preemptions
        results = run_concurrently([lambda p=p: generate(self.stub, text=p, max_tokens=40, ignore_eos=True,
                                                         model="smollm2") for p in prompts])
        compared = 0
        for p, want, r in zip(prompts, ref, results):
            self.assertIsInstance(r, Result, f"{p}: {r}")
            self.assertEqual(len(r.ids), 40, p)
            for i, t in enumerate(want.tokens):
                margin = t.top_logprobs[0].logprob - t.top_logprobs[1].logprob
                if margin < self.NEAR_TIE:
                    break
                self.assertEqual(r.ids[i], t.token_id,
                                 f"'{p}' token {i}: the split model picked another token with a margin of {margin:.3f}")
                compared += 1
        self.assertGreater(compared, 40 * len(prompts) // 3, "too few tokens before a near-tie to compare")
        self.assertGreater(self.server.status().preemptions, before,
                           "a 2 MiB cache should have swapped some of six 40-token generations out")
        self.assertIdle("after the split model's generations")


class ApiKeyTest(ServerTestCase):
    CONFIG = {"server": {"api_keys": ["s3cret-key", "other-key"]}}

    def test_no_key_unauthenticated(self):
        for call in (lambda: self.stub.ListModels(pb.ListModelsRequest(), timeout=10),
                     lambda: generate(self.stub, text="hi", max_tokens=2),
                     lambda: self.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)):
            code, _ = rpc_code(call)
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED)

    def test_wrong_key_unauthenticated(self):
        for md in ((("authorization", "Bearer wrong"),), (("authorization", "s3cret"),),
                   (("authorization", "Bearer "),)):
            code, _ = rpc_code(lambda: self.stub.ListModels(pb.ListModelsRequest(), timeout=10, metadata=md))
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED, md)
            code, _ = rpc_code(lambda: generate(self.stub, text="hi", max_tokens=2, metadata=md))
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED, md)

    def test_right_key_works(self):
        for key in ("s3cret-key", "other-key"):
            md = (("authorization", f"Bearer {key}"),)
            self.assertEqual(len(self.stub.ListModels(pb.ListModelsRequest(), timeout=10, metadata=md).models), 1)
            r = generate(self.stub, text="hi", max_tokens=3, ignore_eos=True, metadata=md)
            self.assertEqual(len(r.tokens), 3)

    def test_health_needs_no_key(self):
        r = self.server.health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)


# ---------------------------------------------------------------------------------------------
# Listeners open to the network without API keys: one warning line at start, saying how to fix it.

class NetworkWarningTest(unittest.TestCase):
    WARNING = "open to the network without API keys"

    def start_log(self, name, server):
        """heliosd's log from start to SIGTERM with these server keys; {port} and {metrics_port} are its ports."""
        h = Heliosd(name, [("stories", STORIES)])
        for key, value in server.items():
            h.config["server"][key] = value.format(port=h.port, metrics_port=h.metrics_port) \
                if isinstance(value, str) else value
        with open(h.config_path, "w") as f:
            f.write(to_yaml(h.config) + "\n")
        try:
            h.start()
        finally:
            h.stop()
        self.assertEqual(h.exit_code, 0, h.log_text())
        with open(h.log_path) as f:
            return f.read()

    def test_wildcard_without_keys_warns_once_naming_listeners_and_fix(self):
        log = self.start_log("open", {"listen": "0.0.0.0:{port}", "metrics_listen": "0.0.0.0:{metrics_port}"})
        lines = [line for line in log.splitlines() if self.WARNING in line]
        self.assertEqual(len(lines), 1, log)
        line = lines[0]
        self.assertIn("warning", line)
        for part in ("server.listen 0.0.0.0:", "server.metrics_listen 0.0.0.0:", "set server.api_keys",
                     "127.0.0.1"):
            self.assertIn(part, line)

    def test_api_keys_or_loopback_do_not_warn(self):
        log = self.start_log("keys", {"listen": "0.0.0.0:{port}", "api_keys": ["k3y"]})
        self.assertNotIn(self.WARNING, log)
        self.assertIn("serving", log)
        log = self.start_log("loopback", {"listen": "localhost:{port}", "metrics_listen": "127.0.0.1:{metrics_port}"})
        self.assertNotIn(self.WARNING, log)
        self.assertIn("serving", log)


# ---------------------------------------------------------------------------------------------
# Configuration errors (no server left running).

class ConfigTest(unittest.TestCase):
    def write(self, name, text):
        d = tempfile.mkdtemp(prefix="cfg-", dir=WORK)
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_heliosd(self, *args, timeout=30):
        return subprocess.run([HELIOSD, *args], capture_output=True, text=True, timeout=timeout)

    def good_config(self):
        return self.write("good.yaml", f"server:\n  listen: 127.0.0.1:{free_port()}\n  metrics_listen: \"\"\n"
                                       f"models:\n  - name: stories\n    path: {STORIES}\n")

    def test_check_config_good(self):
        path = self.good_config()
        p = self.run_heliosd("--check-config", path)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("valid", p.stdout)
        for example in ("default.yaml", "cpu-dev.yaml", "early-exit-cpu.yaml"):
            p = self.run_heliosd("--check-config", os.path.join(SOURCE_DIR, "configs", example))
            self.assertEqual(p.returncode, 0, f"{example}: {p.stderr}")

    def test_bad_configs_name_file_line_and_column(self):
        models = f"models:\n  - name: stories\n    path: {STORIES}\n"
        cases = [  # (what, text, line, key the message names)
            ("block_size not a power of two", models + "engine:\n  threads: 1\n  block_size: 12\n", 6, "block_size"),
            ("unknown key", models + "engine:\n  bogus_key: 3\n", 5, "bogus_key"),
            ("wrong type", models + "limits:\n  max_tokens: lots\n", 5, "max_tokens"),
            ("bad preemption", models + "engine:\n  preemption: sometimes\n", 5, "preemption"),
            ("negative drain", "server:\n  drain_timeout_s: -1\n" + models, 2, "drain_timeout_s"),
            ("YAML syntax", models + "engine: [1, 2\n", None, "YAML"),
            ("unknown exit policy", models + "    early_exit:\n      policy: turbo\n", 5, "early_exit.policy"),
            ("draft_tokens 0", models + "    early_exit: {draft_tokens: 0}\n", 4, "early_exit.draft_tokens"),
        ]
        for what, text, line, key in cases:
            with self.subTest(what):
                path = self.write("bad.yaml", text)
                for flag in ("--check-config", "--config"):
                    p = self.run_heliosd(flag, path)
                    self.assertNotEqual(p.returncode, 0, f"{what} {flag}: accepted")
                    m = re.search(r"bad\.yaml:(\d+):(\d+)", p.stderr)
                    self.assertIsNotNone(m, f"{what} {flag}: no FILE:LINE:COL in {p.stderr!r}")
                    if line is not None:
                        self.assertEqual(int(m.group(1)), line, f"{what} {flag}: {p.stderr!r}")
                    self.assertIn(key, p.stderr, what)
                    self.assertLessEqual(len(p.stderr.strip().splitlines()), 12, p.stderr)

    def test_missing_model_file_refuses_to_start(self):
        path = self.write("missing.yaml", f"server:\n  listen: 127.0.0.1:{free_port()}\n  metrics_listen: \"\"\n"
                                          "models:\n  - name: gone\n    path: no-such-model.gguf\n")
        p = self.run_heliosd("--config", path)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no-such-model.gguf", p.stderr)

    def test_exit_points_past_the_model_refuse_to_start(self):
        path = self.write("exits.yaml", f"server:\n  listen: 127.0.0.1:{free_port()}\n  metrics_listen: \"\"\n"
                                        f"models:\n  - name: stories\n    path: {STORIES}\n"
                                        "    early_exit: {policy: per-token, exits: [2, 7]}\n")
        p = self.run_heliosd("--check-config", path)  # the config alone cannot know the depth
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.run_heliosd("--config", path)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("stories", p.stderr)
        self.assertIn("early_exit.exits", p.stderr)

    def test_usage(self):
        p = self.run_heliosd("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("--check-config", p.stdout)
        p = self.run_heliosd()
        self.assertNotEqual(p.returncode, 0)
        p = self.run_heliosd("--frobnicate")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--frobnicate", p.stderr)


# ---------------------------------------------------------------------------------------------
# SIGTERM: drain. One server per test (each ends it).

class DrainTest(unittest.TestCase):
    def start(self, drain_timeout_s):
        self.server = Heliosd("drain", [("smollm2", SMOLLM2)],
                              {"server": {"drain_timeout_s": drain_timeout_s}}).start()
        self.addCleanup(self.server.stop)
        return self.server

    def wait_not_serving(self, server, timeout=10):
        """Health after SIGTERM: NOT_SERVING while draining, or unreachable once stopped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                s = server.health.Check(health_pb2.HealthCheckRequest(service="helios.v1.Helios"), timeout=2).status
            except grpc.RpcError as e:
                return e.code()
            if s != health_pb2.HealthCheckResponse.SERVING:
                return s
            time.sleep(0.01)
        return health_pb2.HealthCheckResponse.SERVING

    def test_sigterm_lets_streams_finish_and_exits_0(self):
        server = self.start(drain_timeout_s=60)
        call = server.stub.Generate(pb.GenerateRequest(text="Tell me a story about a dragon.", chat=True,
                                                       max_tokens=80, ignore_eos=True), timeout=RPC_TIMEOUT_S)
        messages = [next(call)]
        server.signal(signal.SIGTERM)
        self.assertEqual(self.wait_not_serving(server), health_pb2.HealthCheckResponse.NOT_SERVING,
                         "health must turn NOT_SERVING while the stream drains")
        # Still draining (the stream runs): new work is refused, status says DRAINING.
        code, details = rpc_code(lambda: generate(server.stub, text="hi", max_tokens=2))
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, details)
        self.assertEqual(server.status().state, "DRAINING")
        messages += list(call)
        final = messages[-1]
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertEqual(sum(len(m.tokens) for m in messages), 80)
        self.assertEqual(server.wait_exit(), 0, server.log_text())
        self.assertIn("draining", server.log_text())

    def test_short_drain_timeout_ends_stream_unavailable_and_exits_0(self):
        server = self.start(drain_timeout_s=0.3)
        call = server.stub.Generate(pb.GenerateRequest(text="Tell me a long story.", chat=True, max_tokens=400,
                                                       ignore_eos=True), timeout=RPC_TIMEOUT_S)
        next(call)
        t0 = time.monotonic()
        server.signal(signal.SIGTERM)
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in call:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        self.assertIn("shut down", cm.exception.details())
        self.assertEqual(server.wait_exit(), 0, server.log_text())
        self.assertIn("drain timeout", server.log_text())
        self.assertLess(time.monotonic() - t0, 15, "drain_timeout_s 0.3 should end the server quickly")

    def test_sigterm_idle_exits_0(self):
        server = self.start(drain_timeout_s=30)
        t0 = time.monotonic()
        server.signal(signal.SIGINT)
        self.assertEqual(server.wait_exit(), 0, server.log_text())
        self.assertLess(time.monotonic() - t0, 10, "an idle server should stop at once")


if __name__ == "__main__":
    unittest.main()
