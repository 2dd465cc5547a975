"""OpenAI-compatible HTTP side of helios-bench (--backend openai): one streamed /v1/completions or
/v1/chat/completions request per benchmark request (stream_options.include_usage, ignore_eos,
max_tokens = the request's output length), timed as the gRPC client times Generate streams; and
the tokenizer helpers (CountTokens / MakePrompt of workloads.py) for servers reached by URL alone.

The same code drives heliosd's HTTP API, vLLM, llama.cpp's llama-server or any server that speaks
the API. Standard library only (asyncio streams, http.client, json), so /usr/bin/python3 runs it
without a virtual environment: the HTTP/1.1 client, its chunked-transfer decoder and the
server-sent-events parser are here.

Token times: each SSE chunk is stamped with the perf_counter time it arrived. heliosd says how
many tokens a chunk holds (helios.return_tokens, asked when the server is heliosd); other servers
are taken to send a token per chunk that has text, and when usage.completion_tokens says more
tokens came than such chunks, the extra ones get the time of the last chunk (they arrived with it).
"""
from __future__ import annotations

import asyncio
import collections
import http.client
import json
import ssl
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from .client import Extra, SamplingOptions, SyncClient
from .metrics import RequestResult

RPC_TIMEOUT_S = 30
TOKENIZE_PARALLEL = 16


# ---------------------------------------------------------------------------------------------
# Wire formats (pure: tests/bench/test_openai_sse.py).

class SseParser:
    """Server-sent events (the WHATWG event-stream format) from bytes as they arrive: lines end
    with LF, CRLF or CR; 'data:' lines (one optional space after the colon) of one event are joined
    with LF; a blank line ends the event; ':' lines are comments; other fields (event, id, retry)
    are kept in the event's dict. feed() returns the events the bytes completed."""

    def __init__(self):
        self._buf = b""
        self._data: list[str] = []
        self._fields: dict[str, str] = {}

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        events = []
        while True:
            # The first line end; a CR at the very end may be the first half of a CRLF.
            lf, cr = self._buf.find(b"\n"), self._buf.find(b"\r")
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == len(self._buf):
                    return events
                cut, width = cr, 2 if self._buf[cr + 1:cr + 2] == b"\n" else 1
            elif lf >= 0:
                cut, width = lf, 1
            else:
                return events
            line = self._buf[:cut].decode("utf-8", "replace")
            self._buf = self._buf[cut + width:]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def close(self) -> list[dict]:
        """The event left unterminated at the end of the stream, if any (a trailing line)."""
        events = []
        if self._buf:
            event = self._line(self._buf.decode("utf-8", "replace"))
            self._buf = b""
            if event is not None:
                events.append(event)
        if self._data:
            events.append(self._dispatch())
        return events

    def _line(self, line: str):
        if line == "":
            return self._dispatch() if self._data or self._fields else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        else:
            self._fields[name] = value
        return None

    def _dispatch(self) -> dict:
        event = dict(self._fields)
        event["data"] = "\n".join(self._data)
        self._data, self._fields = [], {}
        return event


class ChunkedDecoder:
    """HTTP/1.1 chunked transfer coding, incrementally: feed() returns the body bytes the input
    completed; done is True after the last (zero-size) chunk and its trailer."""

    def __init__(self):
        self._buf = b""
        self._need = None      # bytes left in the current chunk (+2 for its CRLF), None: at a size line
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out = bytearray()
        while not self.done:
            if self._need is None:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    break
                size_text = self._buf[:end].split(b";")[0].strip()
                self._buf = self._buf[end + 2:]
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {size_text!r}") from None
                if size == 0:
                    self._need = -1     # the trailer: lines until an empty one
                else:
                    self._need = size + 2
            elif self._need == -1:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    break
                line, self._buf = self._buf[:end], self._buf[end + 2:]
                if not line:
                    self.done = True
            else:
                take = min(self._need, len(self._buf))
                if take == 0:
                    break
                body_left = self._need - 2
                out += self._buf[:min(take, max(body_left, 0))]
                self._buf = self._buf[take:]
                self._need -= take
                if self._need == 0:
                    self._need = None
        return bytes(out)


def base_url(url: str) -> str:
    """'http://host:port', 'http://host:port/', 'http://host:port/v1' → 'http://host:port/v1'."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def request_body(model: str, prompt: str, output_len: int, sampling: SamplingOptions, chat: bool,
                 helios: bool) -> dict:
    """The streamed request for one benchmark request: max_tokens = output_len, ignore_eos (vLLM's,
    llama.cpp's and heliosd's extension), include_usage; greedy unless the sampling says otherwise."""
    body: dict = {"max_tokens": output_len, "stream": True, "stream_options": {"include_usage": True},
                  "ignore_eos": True, "temperature": sampling.temperature}
    if model:
        body["model"] = model
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if sampling.top_p:
        body["top_p"] = sampling.top_p
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.seed:
        body["seed"] = sampling.seed
    if helios:
        body["helios"] = {"return_tokens": True}
    return body


def chunk_tokens(chunk: dict, chat: bool) -> tuple[int, str, list[dict]]:
    """(tokens it holds: -1 = unknown, its text, heliosd's per-token records) of one stream chunk."""
    text, tokens, known = "", [], False
    for c in chunk.get("choices") or []:
        if chat:
            text += (c.get("delta") or {}).get("content") or ""
        else:
            text += c.get("text") or ""
        h = c.get("helios")
        if isinstance(h, dict):
            known = True
            tokens += h.get("tokens") or []
    return (len(tokens) if known else -1), text, tokens


def token_times_of(chunks: list[tuple[float, int, str]], completion_tokens: int | None) -> list[float]:
    """One time per generated token from (time, tokens or -1, text) per chunk (module docstring)."""
    times: list[float] = []
    for t, n, text in chunks:
        if n >= 0:
            times += [t] * n
        elif text:
            times.append(t)
    if completion_tokens is not None and chunks:
        if len(times) < completion_tokens:
            times += [times[-1] if times else chunks[-1][0]] * (completion_tokens - len(times))
        del times[completion_tokens:]
    return times


# ---------------------------------------------------------------------------------------------
# Asynchronous generation.

class HttpError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


async def _open(url: str, timeout: float | None):
    u = urllib.parse.urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    ctx = ssl.create_default_context() if u.scheme == "https" else None
    return await asyncio.wait_for(asyncio.open_connection(u.hostname, port, ssl=ctx), timeout), u


async def stream_post(url: str, body: dict, headers: dict, timeout: float | None = None):
    """POST body as JSON to url over HTTP/1.1 (one connection, closed after) and yields the
    response body's bytes as they arrive (chunked or not). HttpError for a status other than 200."""
    (reader, writer), u = await _open(url, timeout)
    try:
        payload = json.dumps(body).encode()
        path = u.path + (("?" + u.query) if u.query else "")
        head = [f"POST {path} HTTP/1.1", f"Host: {u.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(payload)}", "Accept: text/event-stream", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(0, f"not an HTTP response: {status_line!r}")
        status = int(parts[1])
        response_headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            response_headers[k.strip().lower()] = v.strip()
        chunked = "chunked" in response_headers.get("transfer-encoding", "").lower()
        length = int(response_headers["content-length"]) if "content-length" in response_headers else None
        decoder = ChunkedDecoder() if chunked else None

        async def body_bytes():
            got = 0
            while True:
                if decoder is not None and decoder.done:
                    return
                if length is not None and not chunked and got >= length:
                    return
                data = await reader.read(65536)
                if not data:
                    return
                got += len(data)
                yield decoder.feed(data) if decoder is not None else data

        if status != 200:
            text = b"".join([b async for b in body_bytes()]).decode("utf-8", "replace")
            raise HttpError(status, text)
        async for data in body_bytes():
            if data:
                yield data
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


class OpenAiAsyncClient:
    """Streamed requests to one OpenAI-compatible server (AsyncClient's interface)."""

    def __init__(self, url: str, model: str = "", sampling: SamplingOptions | None = None,
                 request_timeout_s: float | None = None, api_key: str = "", chat: bool = False,
                 helios: bool = False):
        self.url = base_url(url) + ("/chat/completions" if chat else "/completions")
        self.model = model
        self.sampling = sampling or SamplingOptions()
        self.request_timeout_s = request_timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.chat = chat
        self.helios = helios

    async def close(self):
        pass

    async def generate(self, request_id: str, prompt: str, prompt_len: int, output_len: int):
        body = request_body(self.model, prompt, output_len, self.sampling, self.chat, self.helios)
        extra = Extra(request_id=request_id, sent=True)
        layers = collections.Counter()
        served = collections.Counter()
        chunks: list[tuple[float, int, str]] = []
        usage = None
        ok, error = False, ""
        start = time.perf_counter()
        try:
            parser = SseParser()
            done = False

            async def consume():
                nonlocal usage, done
                stream = stream_post(self.url, body, self.headers, self.request_timeout_s)
                try:
                    await read(stream)
                finally:
                    await stream.aclose()  # closes the connection: a cancelled request ends on the server too

            async def read(stream):
                nonlocal usage, done
                async for data in stream:
                    now = time.perf_counter()
                    for event in parser.feed(data):
                        if event["data"] == "[DONE]":
                            done = True
                            return
                        chunk = json.loads(event["data"])
                        if "error" in chunk:
                            raise HttpError(200, json.dumps(chunk["error"]))
                        extra.messages += 1
                        n, text, tokens = chunk_tokens(chunk, self.chat)
                        if n != 0 or text:
                            chunks.append((now, n, text))
                        for t in tokens:
                            layers[int(t.get("exit_layer", 0))] += 1
                            extra.token_ids.append(int(t.get("id", 0)))
                            served[f"{t.get('model', '')}@{t.get('loaded_depth', 0)}"] += 1
                        for c in chunk.get("choices") or []:
                            if c.get("finish_reason"):
                                extra.finish_reason = str(c["finish_reason"]).upper()
                        if chunk.get("usage"):
                            usage = chunk["usage"]

            if self.request_timeout_s:
                await asyncio.wait_for(consume(), self.request_timeout_s)
            else:
                await consume()
            if usage:
                extra.server_prompt_tokens = int(usage.get("prompt_tokens") or 0)
                extra.server_completion_tokens = int(usage.get("completion_tokens") or 0)
            if not done:
                error = "the stream ended without [DONE]"
            elif not extra.finish_reason:
                error = "the stream ended without a finish reason"
            else:
                ok = True
        except asyncio.CancelledError:
            extra.cancelled = True
            error = "CANCELLED: stopped at the --max-seconds deadline"
        except asyncio.TimeoutError:
            error = "DEADLINE_EXCEEDED: --request-timeout"
        except HttpError as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001 - any failure is one failed request, not a crash
            error = f"{type(e).__name__}: {e}"
        end = time.perf_counter()
        times = token_times_of(chunks, extra.server_completion_tokens if usage else None)
        extra.exit_layers = {int(k): v for k, v in sorted(layers.items())}
        extra.served_by = dict(served)
        result = RequestResult(ok=ok, error=error, prompt_len=prompt_len, output_len=len(times), start=start,
                               token_times=times, end=end)
        return result, extra


# ---------------------------------------------------------------------------------------------
# Synchronous helpers for a server known by URL alone.

class OpenAiSyncClient:
    """SyncClient's tokenizer interface (count_tokens, make_prompt) and model facts for any
    OpenAI-compatible server: counts by its /tokenize endpoint where it has one (vLLM's or
    llama.cpp's), else by the prompt_tokens of a one-token completion (exact, costs a prefill);
    prompts of a given length by a search over words of SyncClient.BASE_TEXT."""

    BASE_TEXT = SyncClient.BASE_TEXT

    def __init__(self, url: str, model: str = "", api_key: str = "", chat: bool = False):
        self.root = base_url(url)[:-len("/v1")]
        self.address = self.root
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.chat = chat
        self._counts: dict[str, int] = {}
        self._tokenize = None          # which /tokenize form works: "vllm", "llama.cpp" or "none"
        self._prompt_calls = 0
        self._words = self.BASE_TEXT.split()

    def close(self):
        pass

    def _call(self, method: str, path: str, body: dict | None = None, timeout: float = RPC_TIMEOUT_S):
        u = urllib.parse.urlsplit(self.root)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname, u.port or (443 if u.scheme == "https" else 80), timeout=timeout)
        try:
            conn.request(method, u.path + path, body=json.dumps(body) if body is not None else None,
                         headers=self.headers)
            r = conn.getresponse()
            data = r.read().decode("utf-8", "replace")
            return r.status, (json.loads(data) if data.strip().startswith(("{", "[")) else data)
        finally:
            conn.close()

    def models(self) -> list[dict]:
        status, body = self._call("GET", "/v1/models")
        if status != 200:
            raise RuntimeError(f"GET {self.root}/v1/models: HTTP {status}: {str(body)[:300]}")
        return body.get("data", [])

    def model_entry(self) -> dict:
        models = self.models()
        for m in models:
            if not self.model or m.get("id") == self.model:
                return m
        raise RuntimeError(f"{self.root} serves no model '{self.model}' (it has "
                           f"{', '.join(m.get('id', '?') for m in models)})")

    def is_heliosd(self) -> bool:
        try:
            return self.model_entry().get("owned_by") == "helios"
        except (RuntimeError, OSError):
            return False

    def wait_serving(self, timeout_s: float, proc=None) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                self.model_entry()
                return
            except (OSError, RuntimeError, ValueError) as e:
                last = str(e)
            time.sleep(0.2)
        raise RuntimeError(f"{self.root} does not answer GET /v1/models after {timeout_s:.0f} s ({last})")

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        return True  # nothing to ask

    def _count_one(self, text: str) -> int:
        if self._tokenize in (None, "vllm"):
            status, body = self._call("POST", "/tokenize", {"model": self.model, "prompt": text,
                                                           "add_special_tokens": True} if self.model else
                                      {"prompt": text, "add_special_tokens": True})
            if status == 200 and isinstance(body, dict) and "tokens" in body and "count" in body:
                self._tokenize = "vllm"
                return int(body["count"])
            if self._tokenize == "vllm":
                raise RuntimeError(f"POST /tokenize: HTTP {status}")
        if self._tokenize in (None, "llama.cpp"):
            status, body = self._call("POST", "/tokenize", {"content": text, "add_special": True})
            if status == 200 and isinstance(body, dict) and "tokens" in body:
                self._tokenize = "llama.cpp"
                return len(body["tokens"])
            if self._tokenize == "llama.cpp":
                raise RuntimeError(f"POST /tokenize: HTTP {status}")
        self._tokenize = "none"
        body = {"prompt": text, "max_tokens": 1, "temperature": 0}
        if self.model:
            body["model"] = self.model
        status, resp = self._call("POST", "/v1/completions", body, timeout=120)
        if status != 200:
            raise RuntimeError(f"counting prompt tokens with /v1/completions: HTTP {status}: {str(resp)[:300]}")
        return int(resp["usage"]["prompt_tokens"])

    def count_tokens(self, texts: list[str]) -> list[int]:
        """The prompt length of each text as the server counts it (cached; parallel)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._counts]
        if todo:
            self._counts[todo[0]] = self._count_one(todo[0])   # decides the method first
            with ThreadPoolExecutor(TOKENIZE_PARALLEL) as pool:
                for text, n in zip(todo[1:], pool.map(self._count_one, todo[1:])):
                    self._counts[text] = n
        return [self._counts[t] for t in texts]

    def make_prompt(self, n_tokens: int) -> str:
        """A text the server counts as about n_tokens prompt tokens: words of BASE_TEXT from a
        rotating offset, the count searched (8 tries at most; the closest wins)."""
        words = self._words
        offset = (self._prompt_calls * 7) % len(words)
        self._prompt_calls += 1

        def text_of(k):
            return " ".join(words[(offset + j) % len(words)] for j in range(max(1, k)))

        k = max(1, min(16, n_tokens))  # a probe: the tokens per word of this tokenizer
        best_text, best_err = None, None
        tried: dict[int, int] = {}
        for _ in range(12):
            text = text_of(k)
            try:
                got = self.count_tokens([text])[0]
            except RuntimeError:        # longer than the server takes: shorter
                if k == 1:
                    raise
                k = max(1, k // 2)
                continue
            err = got - n_tokens
            tried[k] = err
            if best_err is None or abs(err) < abs(best_err):
                best_text, best_err = text, err
            if err == 0:
                break
            # Proportional steps while far, a word at a time when near; words are several tokens
            # for some tokenizers, and then the closest length found is kept.
            step = round(k * n_tokens / max(got, 1))
            if step == k or abs(err) <= 3:
                step = k - 1 if err > 0 else k + 1
            if step < 1 or step in tried:
                break
            k = step
        return best_text
