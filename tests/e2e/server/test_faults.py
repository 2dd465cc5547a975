"""End-to-end tests of heliosd under faults: a device error mid-step, a model file that disappears
after load, a log that cannot be written, a client that vanishes mid-stream or during drain, and an
engine that stalls (the liveness watchdog). Each ends with the documented status for the requests
involved and a server that either keeps serving the rest or stops cleanly — never a hang.

Device faults come from heliosd's fault injection (HELIOS_FAULTS, compiled in with the CMake
option HELIOS_FAULT_INJECTION, on by default in builds with tests); the tests that need it skip,
saying so, when this heliosd was built without it. Faults count matmuls of a model's backend from
when heliosd starts serving (after loading and the start-up profile); stories260K runs 36 matmuls a
pass (5 layers of 7, the LM head).

Run with the rest of the heliosd suite (run_heliosd_e2e.sh), or alone:
  /usr/bin/python3 -m unittest -v test_faults
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import grpc

import test_heliosd as base
from test_heliosd import Heliosd, PROMPTS, free_port, generate, metric_value, rpc_code, run_concurrently

MATMULS_PER_STEP = 36     # stories260K, one pass
FAULTS_BUILT = None       # whether this heliosd has fault injection (setUpModule finds out)


def setUpModule():
    global FAULTS_BUILT
    base.setUpModule()
    FAULTS_BUILT = faults_built()


def tearDownModule():
    base.tearDownModule()


def pb():
    return base.pb


def health_pb():
    return base.health_pb2


def faults_built():
    """Asks heliosd itself: a build with fault injection refuses an unknown fault at start-up; one
    without it starts anyway (and says it ignores HELIOS_FAULTS)."""
    config = os.path.join(base.WORK, "faults-probe.yaml")
    with open(config, "w") as f:
        f.write(f"server:\n  listen: 127.0.0.1:{free_port()}\n  metrics_listen: \"\"\n"
                f"models:\n  - name: stories\n    path: {base.STORIES}\n")
    proc = subprocess.Popen([base.HELIOSD, "--config", config], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, HELIOS_FAULTS="probe=1"))
    try:
        _, err = proc.communicate(timeout=20)
        return proc.returncode == 2 and "unknown fault 'probe'" in err
    except subprocess.TimeoutExpired:  # it started: no fault injection in this build
        proc.kill()
        proc.communicate(timeout=10)
        return False


def fault_server(name, faults=None, models=None, config=None, cls=Heliosd):
    """A heliosd with HELIOS_FAULTS=`faults` (None: no faults) and its HTTP API on a free port."""
    if faults and not FAULTS_BUILT:
        raise unittest.SkipTest("this heliosd was built without fault injection (cmake -DHELIOS_FAULT_INJECTION=ON)")
    http_port = free_port()
    cfg = base.merge({"server": {"http_listen": f"127.0.0.1:{http_port}"}}, config)
    server = cls(name, models or [("stories", base.STORIES)], cfg, env={"HELIOS_FAULTS": faults} if faults else None)
    server.http_port = http_port
    return server


def http_health(server):
    """(HTTP status, body) of GET /health."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(server, service=""):
    return server.health.Check(health_pb().HealthCheckRequest(service=service), timeout=10).status


def metric(server, name, labels=None):
    return metric_value(server.metrics()[2], name, labels)


def wait_for(predicate, timeout, interval=0.02):
    """Polls until predicate() is true; returns the time it took, or None after `timeout` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(interval)
    return None


class Stream:
    """One streaming Generate read on its own thread: every token's arrival time, and how it ended
    (the gRPC status code and details, and the last message)."""

    def __init__(self, stub, **fields):
        self.call = stub.Generate(pb().GenerateRequest(**fields), timeout=base.RPC_TIMEOUT_S)
        self.arrivals = []   # monotonic time of each token
        self.final = None
        self.code = None
        self.details = ""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for message in self.call:
                now = time.monotonic()
                self.arrivals += [now] * len(message.tokens)
                self.final = message
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()

    def join(self, timeout=base.RPC_TIMEOUT_S):
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("the stream did not end")
        return self

    @property
    def n_tokens(self):
        return len(self.arrivals)


def client_process(port, model, max_tokens):
    """A separate client process streaming one Generate; prints 'streaming' after its first token
    and then waits (to be killed). Returns (process, whether it got its first token in time)."""
    code = (
        "import sys, time, grpc\n"
        f"sys.path.insert(0, {os.path.join(base.WORK, 'stubs')!r})\n"
        "from helios.v1 import helios_pb2 as pb, helios_pb2_grpc as pg\n"
        f"ch = grpc.insecure_channel('127.0.0.1:{port}')\n"
        f"call = pg.HeliosStub(ch).Generate(pb.GenerateRequest(model={model!r}, text='Tell me a long story.',\n"
        f"    chat=True, max_tokens={max_tokens}, ignore_eos=True, request_id='doomed'), timeout=300)\n"
        "next(call)\n"
        "print('streaming', flush=True)\n"
        "time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = [None]
    reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=60)
    return proc, line[0] == "streaming\n"


def kill(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# A device error mid-step (backend_error_after_matmuls). The contract (README, Errors): every live
# request ends with INTERNAL naming the failure, health turns NOT_SERVING for good and the model's
# new requests get INTERNAL; the process keeps answering status and metrics, and SIGTERM still
# drains and exits 0.

class DeviceErrorTest(unittest.TestCase):
    def test_requests_in_flight_fail_internal_and_the_server_stays_not_serving(self):
        fault_at = 20 * MATMULS_PER_STEP  # about 20 steps in; each request needs 300
        server = fault_server("device-error", f"backend_error_after_matmuls={fault_at}",
                              config={"server": {"liveness_timeout_s": 1}}).start()
        self.addCleanup(server.stop)
        self.assertIn("FAULT INJECTION ACTIVE", server.log_text())
        self.assertEqual(server.stub.GetModelInfo(pb().GetModelInfoRequest(), timeout=10).backend, "cpu+faults")
        streams = [Stream(server.stub, text=p, max_tokens=300, ignore_eos=True) for p in PROMPTS[:3]]
        for s in streams:
            s.join()
            self.assertEqual(s.code, grpc.StatusCode.INTERNAL, s.details)
            self.assertIn(f"injected device fault after {fault_at} matmuls", s.details)
            self.assertLess(s.n_tokens, 300)
        self.assertGreater(sum(s.n_tokens for s in streams), 0, "the fault was meant to come mid-generation")

        # Health: NOT_SERVING, overall and for the service, over gRPC and HTTP.
        for service in ("", "helios.v1.Helios"):
            self.assertEqual(health(server, service), health_pb().HealthCheckResponse.NOT_SERVING, service)
        self.assertEqual(http_health(server), (503, {"status": "faulted"}))
        # New work is refused with the fault; the rest of the API still answers.
        code, details = rpc_code(lambda: generate(server.stub, text="hi", max_tokens=2))
        self.assertEqual(code, grpc.StatusCode.INTERNAL, details)
        self.assertIn("injected device fault", details)
        status = server.status()
        self.assertEqual((status.kv_blocks_used, status.requests_running, status.requests_waiting), (0, 0, 0))
        self.assertEqual(metric(server, "helios_health_serving"), 0)
        # For good: still NOT_SERVING later, and no requests left to look stalled.
        time.sleep(2)
        self.assertEqual(health(server), health_pb().HealthCheckResponse.NOT_SERVING)
        self.assertEqual(metric(server, "helios_engine_stalled", {"model": "stories"}), 0)
        log = server.log_text()
        self.assertIn("stories: device fault, the model takes no more requests", log)
        self.assertNotIn("stalled: no engine step", log)
        server.signal(signal.SIGTERM)
        self.assertEqual(server.wait_exit(), 0, server.log_text())


class GroupDeviceErrorTest(unittest.TestCase):
    """The engines a model group loads get the same injected faults as models[]."""

    def test_a_group_engine_fault_fails_the_groups_requests_internal(self):
        fault_at = 20 * MATMULS_PER_STEP
        server = fault_server("group-device-error", f"backend_error_after_matmuls={fault_at}",
                              config={"model_repository": [{"name": "candidate", "path": base.STORIES}],
                                      "groups": [{"name": "group"}]}).start()
        self.addCleanup(server.stop)
        s = Stream(server.stub, model="group", text=PROMPTS[0], max_tokens=300, ignore_eos=True).join()
        self.assertEqual(s.code, grpc.StatusCode.INTERNAL, s.details)
        self.assertIn(f"injected device fault after {fault_at} matmuls", s.details)
        self.assertGreater(s.n_tokens, 0, "the fault was meant to come mid-generation")
        self.assertEqual(health(server), health_pb().HealthCheckResponse.NOT_SERVING)
        self.assertIn("group: device fault", server.log_text())
        server.signal(signal.SIGTERM)
        self.assertEqual(server.wait_exit(), 0, server.log_text())


# ---------------------------------------------------------------------------------------------
# The model file disappears after load: the weights are in memory (read or mapped at load), so
# serving goes on unchanged; only a restart needs the file.

class ModelFileGoneTest(unittest.TestCase):
    def test_serving_goes_on_after_the_gguf_is_deleted_or_renamed(self):
        work = os.path.join(base.WORK, "gone")
        os.makedirs(work, exist_ok=True)
        deleted, renamed = os.path.join(work, "deleted.gguf"), os.path.join(work, "renamed.gguf")
        shutil.copy(base.STORIES, deleted)
        shutil.copy(base.STORIES, renamed)
        server = fault_server("file-gone", models=[("deleted", deleted), ("renamed", renamed)]).start()
        self.addCleanup(server.stop)
        prompt = dict(text="Once upon a time", max_tokens=32, ignore_eos=True)
        before = {m: generate(server.stub, model=m, **prompt).ids for m in ("deleted", "renamed")}

        os.remove(deleted)
        os.rename(renamed, renamed + ".old")
        for m in ("deleted", "renamed"):
            self.assertEqual(generate(server.stub, model=m, **prompt).ids, before[m], m)
        results = run_concurrently([lambda p=p, m=m: generate(server.stub, model=m, text=p, max_tokens=40,
                                                              ignore_eos=True)
                                    for p in PROMPTS[:4] for m in ("deleted", "renamed")])
        for r in results:
            self.assertIsInstance(r, base.Result, r)
            self.assertEqual(len(r.tokens), 40)
        self.assertEqual(health(server), health_pb().HealthCheckResponse.SERVING)
        self.assertEqual(http_health(server), (200, {"status": "serving"}))
        self.assertEqual(server.status().state, "SERVING")
        info = server.stub.GetModelInfo(pb().GetModelInfoRequest(model="deleted"), timeout=10)
        self.assertEqual(info.path, deleted)  # where it was loaded from
        self.assertNotIn(" error ", server.log_text())
        server.signal(signal.SIGTERM)
        self.assertEqual(server.wait_exit(), 0, server.log_text())

        # A restart is what needs the file: it refuses, naming it.
        p = subprocess.run([base.HELIOSD, "--config", server.config_path], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("deleted.gguf", p.stderr)


# ---------------------------------------------------------------------------------------------
# A full disk for logs. heliosd logs to stderr (spdlog; there is no log file setting), so the
# full disk is stderr on /dev/full: every write fails with ENOSPC. The designed behaviour: the
# failed writes are dropped and the server serves on; it must not crash, block or exit.

class DevFullHeliosd(Heliosd):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_path = "/dev/full"

    def log_text(self):
        return "(heliosd's log went to /dev/full)"


class LogDiskFullTest(unittest.TestCase):
    def test_serving_goes_on_when_no_log_line_can_be_written(self):
        server = fault_server("log-full", config={"logging": {"level": "debug"}}, cls=DevFullHeliosd).start()
        self.addCleanup(server.stop)
        self.assertEqual(os.readlink(f"/proc/{server.proc.pid}/fd/2"), "/dev/full")
        for i in range(10):  # every request logs (debug: queued, then done)
            self.assertEqual(len(generate(server.stub, text=PROMPTS[i], max_tokens=16, ignore_eos=True).tokens), 16)
        results = run_concurrently([lambda p=p: generate(server.stub, text=p, max_tokens=24, ignore_eos=True)
                                    for p in PROMPTS[:8]])
        self.assertTrue(all(isinstance(r, base.Result) and len(r.tokens) == 24 for r in results), results)
        code, _ = rpc_code(lambda: generate(server.stub, model="nope", text="hi"))  # an error, logged too
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(health(server), health_pb().HealthCheckResponse.SERVING)
        self.assertEqual(http_health(server), (200, {"status": "serving"}))
        self.assertEqual(metric(server, "helios_health_serving"), 1)
        self.assertIsNone(server.proc.poll(), "heliosd died")
        t0 = time.monotonic()
        server.signal(signal.SIGTERM)
        self.assertEqual(server.wait_exit(), 0)
        self.assertLess(time.monotonic() - t0, 10)


# ---------------------------------------------------------------------------------------------
# A client that vanishes mid-stream: a separate process, SIGKILLed, so its connection just drops.
# Its request is cancelled and its KV blocks freed within a step or two, while another stream on
# the same engine goes on to the end. SmolLM2 (several seconds for 400 tokens) keeps both running.

class ClientVanishesTest(unittest.TestCase):
    def test_a_killed_client_is_cancelled_within_a_step_or_two_and_the_rest_serve_on(self):
        server = fault_server("vanish", models=[("smollm2", base.SMOLLM2)]).start()
        self.addCleanup(server.stop)
        aborted_before = metric(server, "helios_requests_finished_total", {"reason": "aborted"}) or 0
        proc, streaming = client_process(server.port, "smollm2", 400)
        self.addCleanup(kill, proc)
        self.assertTrue(streaming, "the client process never got its first token")
        other = Stream(server.stub, model="smollm2", text="Tell me about the sea.", chat=True, max_tokens=160,
                       ignore_eos=True)
        self.assertIsNotNone(wait_for(lambda: other.n_tokens > 0, 60), "the other stream never started")
        both = server.status()
        self.assertEqual(both.requests_running, 2)

        t_kill = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        took = wait_for(lambda: server.status().requests_running == 1, 5, interval=0.005)
        self.assertIsNotNone(took, f"the vanished client's request still runs 5 s later: {server.status()}")
        t_freed = t_kill + took
        # The steps between: the other stream gets one token per step.
        steps = sum(1 for t in other.arrivals if t_kill < t <= t_freed)
        self.assertLessEqual(steps, 4, f"cancelled {took:.3f} s and {steps} steps after the kill")
        self.assertLess(server.status().kv_blocks_used, both.kv_blocks_used)

        other.join()
        self.assertEqual(other.code, grpc.StatusCode.OK, other.details)
        self.assertEqual((other.n_tokens, other.final.finish_reason), (160, pb().FINISH_REASON_LENGTH))
        s = server.wait_idle()
        self.assertEqual((s.kv_blocks_used, s.requests_running, s.requests_waiting), (0, 0, 0))
        self.assertEqual(metric(server, "helios_requests_finished_total", {"reason": "aborted"}), aborted_before + 1)


# ---------------------------------------------------------------------------------------------
# SIGKILL of a client during drain: the stream it held was what the drain waited for, so heliosd
# exits 0 as soon as the request is cancelled, far sooner than drain_timeout_s.

class DrainClientKilledTest(unittest.TestCase):
    DRAIN_TIMEOUT_S = 60

    def test_heliosd_exits_0_at_once_when_the_draining_client_dies(self):
        server = fault_server("drain-kill", models=[("smollm2", base.SMOLLM2)],
                              config={"server": {"drain_timeout_s": self.DRAIN_TIMEOUT_S}}).start()
        self.addCleanup(server.stop)
        proc, streaming = client_process(server.port, "smollm2", 400)
        self.addCleanup(kill, proc)
        self.assertTrue(streaming, "the client process never got its first token")
        server.signal(signal.SIGTERM)

        def state():
            code, status = rpc_code(server.status)
            return status.state if code == grpc.StatusCode.OK else None

        self.assertIsNotNone(wait_for(lambda: state() == "DRAINING", 10), "heliosd never reported DRAINING")
        self.assertEqual(server.status().requests_running, 1, "the drain must be waiting for the stream")
        self.assertIsNone(server.proc.poll())
        t_kill = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        self.assertEqual(server.wait_exit(timeout=self.DRAIN_TIMEOUT_S), 0, server.log_text())
        took = time.monotonic() - t_kill
        self.assertLess(took, 10, f"heliosd took {took:.1f} s to exit after the client died")
        log = server.log_text()
        self.assertIn("draining", log)
        self.assertNotIn("drain timeout", log)


# ---------------------------------------------------------------------------------------------
# A stalled engine (stall_after_matmuls): the process answers, but no step completes. The
# watchdog turns health NOT_SERVING within liveness_timeout_s (and a tick) of the last step, says
# which model and for how long, and turns it SERVING again once steps resume; the stalled
# requests, and one sent during the stall, finish as if nothing had happened.

class StallTest(unittest.TestCase):
    LIVENESS_TIMEOUT_S = 1.5
    STALL_S = 6
    MARGIN_S = 1.5  # the watchdog's tick (timeout / 4) and this test's polling, with room to spare

    def test_health_turns_not_serving_during_a_stall_and_serving_after(self):
        server = fault_server("stall", f"stall_after_matmuls={20 * MATMULS_PER_STEP}:{self.STALL_S}",
                              config={"server": {"liveness_timeout_s": self.LIVENESS_TIMEOUT_S}}).start()
        self.addCleanup(server.stop)
        stream = Stream(server.stub, text="Once upon a time", max_tokens=300, ignore_eos=True)
        NOT_SERVING, SERVING = health_pb().HealthCheckResponse.NOT_SERVING, health_pb().HealthCheckResponse.SERVING
        self.assertIsNotNone(wait_for(lambda: health(server) == NOT_SERVING, self.STALL_S + 10),
                             "health never turned NOT_SERVING during the stall")
        t_not_serving = time.monotonic()
        n_at_stall = stream.n_tokens
        self.assertGreater(n_at_stall, 0, "the stall was meant to come mid-generation")
        t_last = stream.arrivals[-1]
        late = t_not_serving - t_last
        self.assertGreater(late, self.LIVENESS_TIMEOUT_S - 0.5, "NOT_SERVING before the timeout had passed")
        self.assertLess(late, self.LIVENESS_TIMEOUT_S + self.MARGIN_S,
                        f"NOT_SERVING {late:.2f} s after the last step (timeout {self.LIVENESS_TIMEOUT_S} s)")

        # While stalled: every signal says so, and a new request queues rather than failing.
        self.assertEqual(health(server, "helios.v1.Helios"), NOT_SERVING)
        self.assertEqual(http_health(server), (503, {"status": "stalled"}))
        self.assertEqual(metric(server, "helios_engine_stalled", {"model": "stories"}), 1)
        self.assertGreaterEqual(metric(server, "helios_engine_seconds_without_step", {"model": "stories"}),
                                self.LIVENESS_TIMEOUT_S)
        self.assertEqual(metric(server, "helios_health_serving"), 0)
        self.assertIn("stories: stalled: no engine step completed in", server.log_text())
        queued = Stream(server.stub, text="Lily went to the park", max_tokens=20, ignore_eos=True)

        took = wait_for(lambda: health(server) == SERVING, self.STALL_S + 10)
        self.assertIsNotNone(took, "health never turned SERVING again after the stall")
        t_serving = time.monotonic()
        resumed = [t for t in stream.arrivals if t > t_last]
        self.assertTrue(resumed, "SERVING again, but no step came after the stall")
        self.assertLess(t_serving - resumed[0], self.MARGIN_S, "SERVING came late after the steps resumed")
        self.assertGreater(resumed[0] - t_last, self.STALL_S - 1, "the stall was shorter than injected")

        for s in (stream.join(), queued.join()):
            self.assertEqual(s.code, grpc.StatusCode.OK, s.details)
            self.assertEqual(s.final.finish_reason, pb().FINISH_REASON_LENGTH)
        self.assertEqual((stream.n_tokens, queued.n_tokens), (300, 20))
        self.assertEqual(http_health(server), (200, {"status": "serving"}))
        self.assertEqual(metric(server, "helios_engine_stalled", {"model": "stories"}), 0)
        self.assertEqual(metric(server, "helios_engine_stalls_total", {"model": "stories"}), 1)
        self.assertIn("stories: engine steps resumed after", server.log_text())
        server.signal(signal.SIGTERM)
        self.assertEqual(server.wait_exit(), 0, server.log_text())

    def test_a_timeout_of_0_turns_the_watchdog_off(self):
        server = fault_server("stall-off", f"stall_after_matmuls={5 * MATMULS_PER_STEP}:3",
                              config={"server": {"liveness_timeout_s": 0}}).start()
        self.addCleanup(server.stop)
        stream = Stream(server.stub, text="Once upon a time", max_tokens=40, ignore_eos=True)
        while stream.thread.is_alive():
            self.assertEqual(health(server), health_pb().HealthCheckResponse.SERVING)
            time.sleep(0.1)
        self.assertEqual((stream.join().code, stream.n_tokens), (grpc.StatusCode.OK, 40))
        gaps = [b - a for a, b in zip(stream.arrivals, stream.arrivals[1:])]
        self.assertGreater(max(gaps), 2.5, "the stall did not happen")
        self.assertIsNone(metric(server, "helios_engine_stalled", {"model": "stories"}))


# ---------------------------------------------------------------------------------------------
# HELIOS_FAULTS itself: a spec heliosd cannot run stops the start, naming what is valid.

class FaultSpecTest(unittest.TestCase):
    def run_with(self, faults):
        if not FAULTS_BUILT:
            self.skipTest("this heliosd was built without fault injection (cmake -DHELIOS_FAULT_INJECTION=ON)")
        config = os.path.join(base.WORK, "faults-spec.yaml")
        with open(config, "w") as f:
            f.write(f"server:\n  listen: 127.0.0.1:{free_port()}\n  metrics_listen: \"\"\n"
                    f"models:\n  - name: stories\n    path: {base.STORIES}\n")
        return subprocess.run([base.HELIOSD, "--config", config], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, HELIOS_FAULTS=faults))

    def test_an_unknown_fault_stops_the_start_naming_the_valid_ones(self):
        p = self.run_with("backend_error_after_matmuls=5,disk_full=1")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("unknown fault 'disk_full'", p.stderr)
        self.assertIn("backend_error_after_matmuls=N", p.stderr)
        self.assertIn("stall_after_matmuls=N:SECONDS", p.stderr)

    def test_a_malformed_value_stops_the_start_naming_the_form(self):
        p = self.run_with("stall_after_matmuls=100")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("HELIOS_FAULTS='stall_after_matmuls=100'", p.stderr)
        self.assertIn("expected =N:SECONDS", p.stderr)


if __name__ == "__main__":
    unittest.main()
