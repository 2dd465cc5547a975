"""The intercept benchmark's client: plays the tool and the human for heliosd's Session RPC.

For each request, at its (Poisson) arrival time, it opens a Session with on_length=true, the hold
policy under test and the request's kind, greedy sampling, ignore_eos and max_tokens = the first
segment's length; each segment then pauses with trigger "length". On each intercept it sleeps the
request's drawn pause and resumes with the segment's returned text and the next segment's
max_tokens; after the last segment it ends the session. Everything is timed with perf_counter;
a failure is recorded in the request's record, never raised.

Stubs: generated at run time by grpc_tools.protoc from proto/helios/v1/helios.proto into a
temporary folder (removed at exit), and handed to bench/helios_bench so that its SyncClient and
ManagedServer, reused here, use the same modules and write no cache.
Runs with Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools).
"""
from __future__ import annotations

import asyncio
import atexit
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2]
PROTO_DIR = SOURCE_DIR / "proto"
PROTO_FILE = Path("helios") / "v1" / "helios.proto"

_stubs = None


def load_stubs(proto_dir: Path = PROTO_DIR):
    """(helios_pb2, helios_pb2_grpc), generated into a fresh temporary folder on first use."""
    global _stubs
    if _stubs is not None:
        return _stubs
    out = Path(tempfile.mkdtemp(prefix="helios-intercept-stubs-"))
    atexit.register(shutil.rmtree, out, True)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(proto_dir), f"--python_out={out}",
                    f"--grpc_python_out={out}", str(Path(proto_dir) / PROTO_FILE)], check=True, timeout=120)
    for package in (out / "helios", out / "helios" / "v1"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    from helios.v1 import helios_pb2, helios_pb2_grpc  # noqa: E402  (generated above)
    _stubs = (helios_pb2, helios_pb2_grpc)
    # bench/helios_bench's helpers (SyncClient, ManagedServer) take these instead of caching theirs.
    from ..helios_bench import client as hb_client
    hb_client._stubs = _stubs
    return _stubs


@dataclass
class SegmentRecord:
    sent: float = 0.0            # open / resume written
    first_token: float = 0.0     # first token of the segment received (0: none)
    paused: float = 0.0          # the intercept (or the final message) received
    resumed: float = 0.0         # the next resume (or end) written
    tokens: int = 0
    trigger: str = ""
    context_tokens: int = 0      # Intercept.context_tokens


@dataclass
class RequestRecord:
    id: str
    kind: str
    policy: str
    arrival_s: float = 0.0       # scheduled offset from the run's start
    start: float = 0.0           # perf_counter when the open was written
    first_token: float = 0.0
    end: float = 0.0             # the stream's end
    pause_s: float = 0.0         # sum over intercepts of (resume written − intercept received)
    drawn_pause_s: float = 0.0   # what the workload asked for
    output_tokens: int = 0
    expected_tokens: int = 0
    intercepts: int = 0
    expected_intercepts: int = 0
    ok: bool = False
    error: str = ""
    finish_reason: str = ""
    session_id: str = ""
    server_prompt_tokens: int = 0
    server_completion_tokens: int = 0
    segments: list[SegmentRecord] = field(default_factory=list)

    def to_dict(self, t0: float = 0.0) -> dict:
        d = asdict(self)
        for key in ("start", "first_token", "end"):
            d[key] = (d[key] - t0) if d[key] else 0.0
        for s in d["segments"]:
            for key in ("sent", "first_token", "paused", "resumed"):
                s[key] = (s[key] - t0) if s[key] else 0.0
        return d


class SessionClient:
    """Sessions against one heliosd over one grpc.aio channel."""

    def __init__(self, address: str, model: str = "", request_timeout_s: float | None = None, metadata=None):
        import grpc.aio
        self.pb, self.pb_grpc = load_stubs()
        self.channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024)])
        self.stub = self.pb_grpc.HeliosStub(self.channel)
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.metadata = metadata

    async def close(self):
        await self.channel.close()

    def open_message(self, req, policy: str):
        pb = self.pb
        g = pb.GenerateRequest(request_id=req.id, model=self.model, text=req.prompt,
                               max_tokens=req.segments[0].tokens, ignore_eos=True,
                               sampling=pb.SamplingParams(temperature=0.0))
        opts = pb.InterceptOptions(on_length=True, hold=policy, kind=req.server_kind)
        return pb.SessionRequest(open=pb.SessionOpen(request=g, intercept=opts))

    async def run_one(self, req, policy: str, rec: RequestRecord) -> RequestRecord:
        """One session, start to end; fills rec."""
        import grpc
        import grpc.aio
        pb = self.pb
        rec.expected_tokens = req.output_tokens
        rec.expected_intercepts = req.n_intercepts
        rec.drawn_pause_s = req.total_pause_s
        call = None
        seg_i = 0
        try:
            call = self.stub.Session(timeout=self.request_timeout_s, metadata=self.metadata)
            rec.start = time.perf_counter()
            seg = SegmentRecord(sent=rec.start)
            rec.segments.append(seg)
            await call.write(self.open_message(req, policy))
            ended = False
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    break
                now = time.perf_counter()
                if msg.session_id:
                    rec.session_id = msg.session_id
                if msg.tokens:
                    n = len(msg.tokens)
                    if not seg.first_token:
                        seg.first_token = now
                    if not rec.first_token:
                        rec.first_token = now
                    seg.tokens += n
                    rec.output_tokens += n
                if msg.finish_reason:
                    rec.finish_reason = pb.FinishReason.Name(msg.finish_reason).removeprefix("FINISH_REASON_")
                    rec.server_prompt_tokens = msg.usage.prompt_tokens
                    rec.server_completion_tokens = msg.usage.completion_tokens
                    if not seg.paused:
                        seg.paused = now
                if msg.HasField("intercept"):
                    if ended:
                        continue
                    seg.paused = now
                    seg.trigger = msg.intercept.trigger
                    seg.context_tokens = msg.intercept.context_tokens
                    if seg_i + 1 < len(req.segments):
                        rec.intercepts += 1
                        pause = req.segments[seg_i].pause_s
                        if pause > 0:
                            await asyncio.sleep(pause)
                        nxt = req.segments[seg_i + 1]
                        seg.resumed = time.perf_counter()
                        rec.pause_s += seg.resumed - seg.paused
                        seg_i += 1
                        seg = SegmentRecord(sent=seg.resumed)
                        rec.segments.append(seg)
                        await call.write(pb.SessionRequest(resume=pb.SessionResume(
                            text=req.segments[seg_i - 1].tool_return, max_tokens=nxt.tokens)))
                    else:
                        seg.resumed = time.perf_counter()
                        ended = True
                        await call.write(pb.SessionRequest(end=pb.SessionEnd()))
                        await call.done_writing()
            rec.end = time.perf_counter()
            if rec.finish_reason == "ABORTED":
                rec.error = "ABORTED: the server aborted the session"
            elif not ended and seg_i + 1 < len(req.segments):
                rec.error = (f"the session ended after segment {seg_i} of {len(req.segments)} "
                             f"(finish {rec.finish_reason or 'none'})")
            elif rec.output_tokens < req.output_tokens:
                rec.error = f"{rec.output_tokens} of {req.output_tokens} tokens"
            else:
                rec.ok = True
        except asyncio.CancelledError:
            if call is not None:
                call.cancel()
            rec.end = rec.end or time.perf_counter()
            rec.error = "CANCELLED: stopped at the run's deadline"
        except grpc.aio.AioRpcError as e:
            rec.end = time.perf_counter()
            rec.error = f"{e.code().name}: {e.details()}"
        except Exception as e:  # noqa: BLE001 - one failed request, not a failed run
            if call is not None:
                call.cancel()
            rec.end = time.perf_counter()
            rec.error = f"{type(e).__name__}: {e}"
        return rec


async def run_requests(address: str, reqs: list, arrivals: list[float], policy: str, model: str = "",
                       request_timeout_s: float | None = None, max_seconds: float | None = None,
                       metadata=None) -> tuple[list[RequestRecord], float, float]:
    """Every request at its arrival offset (seconds from the start), concurrently. Returns the
    records, the run's start and its end (perf_counter). After max_seconds the unfinished
    sessions are cancelled (recorded as such)."""
    client = SessionClient(address, model, request_timeout_s, metadata)
    records = [RequestRecord(id=r.id, kind=r.kind, policy=policy, arrival_s=a) for r, a in zip(reqs, arrivals)]
    t0 = time.perf_counter()

    async def one(req, rec):
        delay = t0 + rec.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await client.run_one(req, policy, rec)

    tasks = [asyncio.ensure_future(one(r, rec)) for r, rec in zip(reqs, records)]
    try:
        done, pending = await asyncio.wait(tasks, timeout=max_seconds)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=30)
    finally:
        t1 = time.perf_counter()
        await client.close()
    for rec in records:
        if not rec.start and not rec.error:
            rec.error = "not sent before the run's deadline"
    return records, t0, t1
