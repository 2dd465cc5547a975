"""The OpenAI backend's wire code (bench/helios_bench/openai_client.py) on hand-made bytes: the
server-sent-events parser, the chunked-transfer decoder, stream chunks → token times, and the
request bodies. No server."""
import json
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "bench") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "bench"))

try:
    import grpc  # noqa: F401  (helios_bench.client, imported by openai_client, needs it)
except ImportError:
    grpc = None

if grpc is not None:
    from helios_bench.client import SamplingOptions  # noqa: E402
    from helios_bench.openai_client import (ChunkedDecoder, SseParser, base_url, chunk_tokens,  # noqa: E402
                                            request_body, token_times_of)


def feed_all(parser, data: bytes, step: int):
    events = []
    for i in range(0, len(data), step):
        events += parser.feed(data[i:i + step])
    return events + parser.close()


@unittest.skipIf(grpc is None, "this python lacks grpcio (use /usr/bin/python3)")
class SseParserTest(unittest.TestCase):
    STREAM = (b'data: {"a": 1}\n\n'
              b": keep-alive\n\n"
              b'data: {"b":\ndata:  2}\n\n'         # two data lines, joined with LF; one space stripped
              b"event: note\r\nid: 7\r\ndata: x\r\n\r\n"
              b"data:no-space\r\r"                   # CR line ends
              b"data: [DONE]\n\n")

    def test_events_whatever_the_chunking(self):
        for step in (1, 2, 3, 5, 17, 1000):
            events = feed_all(SseParser(), self.STREAM, step)
            self.assertEqual([e["data"] for e in events],
                             ['{"a": 1}', '{"b":\n 2}', "x", "no-space", "[DONE]"], f"step {step}")
            self.assertEqual(events[2]["event"], "note")
            self.assertEqual(events[2]["id"], "7")
            self.assertEqual(json.loads(events[1]["data"]), {"b": 2})

    def test_partial_event_waits_for_its_blank_line(self):
        p = SseParser()
        self.assertEqual(p.feed(b'data: {"x": '), [])
        self.assertEqual(p.feed(b'1}\n'), [])
        self.assertEqual([e["data"] for e in p.feed(b"\n")], ['{"x": 1}'])
        # A CR at the end of the input may be half of a CRLF: no empty line is seen early.
        self.assertEqual(p.feed(b"data: y\r"), [])
        self.assertEqual(p.feed(b"\n"), [])
        self.assertEqual([e["data"] for e in p.feed(b"\r\n")], ["y"])

    def test_close_flushes_an_unterminated_event(self):
        p = SseParser()
        self.assertEqual(p.feed(b"data: last"), [])
        self.assertEqual([e["data"] for e in p.close()], ["last"])
        self.assertEqual(SseParser().close(), [])

    def test_utf8_split_across_feeds(self):
        data = 'data: {"t": "héllo 🚀"}\n\n'.encode()
        events = feed_all(SseParser(), data, 1)
        self.assertEqual(json.loads(events[0]["data"])["t"], "héllo 🚀")

    def test_comments_and_blank_lines_alone_make_no_event(self):
        self.assertEqual(feed_all(SseParser(), b": a\n\n\n\n: b\n\n", 3), [])


@unittest.skipIf(grpc is None, "this python lacks grpcio (use /usr/bin/python3)")
class ChunkedDecoderTest(unittest.TestCase):
    def test_chunks_whatever_the_split(self):
        body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n"
        for step in (1, 2, 3, 7, 1000):
            d = ChunkedDecoder()
            out = b"".join(d.feed(body[i:i + step]) for i in range(0, len(body), step))
            self.assertEqual(out, b"Wikipedia in\r\n\r\nchunks.", f"step {step}")
            self.assertTrue(d.done)

    def test_not_done_before_the_last_chunk(self):
        d = ChunkedDecoder()
        self.assertEqual(d.feed(b"3\r\nabc\r\n"), b"abc")
        self.assertFalse(d.done)
        self.assertEqual(d.feed(b"0\r\n\r\n"), b"")
        self.assertTrue(d.done)

    def test_bad_size(self):
        with self.assertRaises(ValueError):
            ChunkedDecoder().feed(b"zz\r\n")


@unittest.skipIf(grpc is None, "this python lacks grpcio (use /usr/bin/python3)")
class ChunksAndBodiesTest(unittest.TestCase):
    def test_chunk_tokens(self):
        c = {"choices": [{"index": 0, "text": " the", "helios": {"tokens": [{"id": 1}, {"id": 2}]}}]}
        self.assertEqual(chunk_tokens(c, chat=False), (2, " the", [{"id": 1}, {"id": 2}]))
        c = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]}
        self.assertEqual(chunk_tokens(c, chat=True), (-1, "Hi", []))
        self.assertEqual(chunk_tokens({"choices": [], "usage": {"completion_tokens": 3}}, chat=True), (-1, "", []))
        self.assertEqual(chunk_tokens({"choices": [{"delta": {"content": None}}]}, chat=True), (-1, "", []))

    def test_token_times(self):
        # Known token counts (heliosd): each chunk's time for each of its tokens.
        self.assertEqual(token_times_of([(1.0, 2, "ab"), (2.0, 1, "c"), (3.0, 0, "")], 3), [1.0, 1.0, 2.0])
        # Unknown (other servers): a token per chunk with text; what usage says is more gets the
        # last chunk's time; more chunks than tokens are cut.
        self.assertEqual(token_times_of([(1.0, -1, "a"), (2.0, -1, ""), (3.0, -1, "b")], 4), [1.0, 3.0, 3.0, 3.0])
        self.assertEqual(token_times_of([(1.0, -1, "a"), (2.0, -1, "b")], 1), [1.0])
        self.assertEqual(token_times_of([(1.0, -1, "a"), (2.0, -1, "b")], None), [1.0, 2.0])
        self.assertEqual(token_times_of([], 5), [])

    def test_request_body(self):
        b = request_body("m", "hello", 32, SamplingOptions(), chat=False, helios=True)
        self.assertEqual(b["prompt"], "hello")
        self.assertEqual(b["max_tokens"], 32)
        self.assertTrue(b["stream"] and b["ignore_eos"])
        self.assertEqual(b["stream_options"], {"include_usage": True})
        self.assertEqual(b["temperature"], 0.0)
        self.assertEqual(b["helios"], {"return_tokens": True})
        self.assertNotIn("top_p", b)
        b = request_body("", "hello", 8, SamplingOptions(temperature=0.7, top_k=5, top_p=0.9, seed=3), chat=True,
                         helios=False)
        self.assertEqual(b["messages"], [{"role": "user", "content": "hello"}])
        self.assertNotIn("model", b)
        self.assertNotIn("helios", b)
        self.assertEqual((b["top_k"], b["top_p"], b["seed"]), (5, 0.9, 3))

    def test_base_url(self):
        for u in ("http://h:1", "http://h:1/", "http://h:1/v1", "h:1"):
            self.assertEqual(base_url(u), "http://h:1/v1")


if __name__ == "__main__":
    unittest.main(verbosity=2)
