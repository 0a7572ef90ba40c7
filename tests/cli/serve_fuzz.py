#!/usr/bin/env python3
"""A bounded, seeded fuzz loop against a running `tessera serve` (stdlib only).

Run by tests/cli/serve_fuzz.sh:
  serve_fuzz.py --port P --key K --model ID --max-body B [--seed S] [--count N]
                [--budget SECONDS] [--case I]

Every case is one raw HTTP exchange over its own TCP connection, built only
from the seeded RNG (never from earlier answers), so `--seed S --case I`
replays case I alone. Kinds of case:
  valid      well-formed completions and chat completions (max_tokens <= 4),
             plain and streamed
  mutated    a valid body with one field set to a wrong type, a huge or
             negative number, deep nesting, a removed field, ...
  bytes      a valid body damaged as text: truncated, invalid UTF-8, NaN,
             random bytes, empty, deep '[' nesting
  headers    garbage, missing or wrong headers (Authorization, Content-Type,
             Content-Length, Transfer-Encoding, Expect, many or long ones)
  route      wrong methods and paths
  oversize   a body over --max-body, by Content-Length and chunked
  raw        malformed HTTP (request lines, framing) sent as bytes
  abandon    a streamed completion whose client hangs up after the first bytes
  pipeline   two or three requests in one write on a keep-alive connection,
             every answer awaited in order (the first only after a damaged body)

What every answer must be: an HTTP response within the timeout (for `raw`
and `oversize` a clean close or reset also passes), never 5xx; a 4xx has an
OpenAI-shaped JSON body {"error": {"message", "type", "param", "code"}};
a 200 completion is a completion object or an SSE stream ending in
`data: [DONE]`. Afterwards the server must be idle again (no running or
waiting request, no KV block in use), /metrics must count no 5xx, and a plain
completion must still work. Exits 1 on the first failure, after printing the
seed, the case, the request and the response.
"""
import argparse
import json
import random
import socket
import sys
import time
import zlib

TIMEOUT_S = 15.0  # the server's own read timeout is 10 s


# ---- raw HTTP ----------------------------------------------------------------

class Closed(Exception):
    """The server closed (or reset) the connection before a full response."""

    def __init__(self, how, data):
        super().__init__(how)
        self.how = how    # "close" or "reset"
        self.data = data  # bytes received before it


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.eof = False

    def fill(self):
        if self.eof:
            raise Closed("close", self.buf)
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            raise Closed("reset", self.buf)
        if not chunk:
            self.eof = True
            raise Closed("close", self.buf)
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            if len(self.buf) > 1 << 20:
                raise ValueError("a header line over 1 MiB")
            self.fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exactly(self, n):
        while len(self.buf) < n:
            self.fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until_eof(self):
        try:
            while True:
                self.fill()
        except Closed:
            pass
        out, self.buf = self.buf, b""
        return out


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value (last wins)
        self.body = body

    def __repr__(self):
        return f"HTTP {self.status} {self.headers} {clip(self.body)}"


def read_response(r, head_request):
    """One response, 1xx interim responses skipped."""
    while True:
        status_line = r.line()
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"bad status line {status_line!r}")
        status = int(parts[1])
        headers = {}
        while True:
            h = r.line()
            if not h:
                break
            name, _, value = h.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if 100 <= status < 200:
            continue
        break
    if head_request or status in (204, 304):
        body = b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(r.line().split(b";")[0], 16)
            if size == 0:
                while r.line():  # trailers
                    pass
                break
            body += r.exactly(size)
            if r.exactly(2) != b"\r\n":
                raise ValueError("a chunk not followed by CRLF")
    elif "content-length" in headers:
        body = r.exactly(int(headers["content-length"]))
    else:
        body = r.until_eof()
    if headers.get("content-encoding", "") in ("gzip", "deflate"):
        body = zlib.decompress(body, 47)
    return Response(status, headers, body)


def exchange(port, raw, n_responses=1, head_request=False, shut_write=False, hang_up_after=None):
    """Sends raw bytes; returns a list of Responses, or raises Closed/timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    try:
        try:
            s.sendall(raw)
            if shut_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) and close before reading it all
        r = Reader(s)
        if hang_up_after is not None:
            while len(r.buf) < hang_up_after:
                r.fill()
            return []
        return [read_response(r, head_request) for _ in range(n_responses)]
    finally:
        s.close()


def clip(b, n=600):
    b = bytes(b)
    return repr(b[:n]) + (f"... ({len(b)} bytes)" if len(b) > n else "")


# ---- cases -------------------------------------------------------------------

class Case:
    def __init__(self, kind, raw, **kw):
        self.kind = kind
        self.raw = raw
        self.n_responses = kw.get("n_responses", 1)
        self.head_request = kw.get("head_request", False)
        self.shut_write = kw.get("shut_write", False)
        self.close_ok = kw.get("close_ok", False)  # a clean close or reset passes
        self.hang_up_after = kw.get("hang_up_after")
        self.completion = kw.get("completion", False)  # a 200 must be a completion
        self.want_status = kw.get("want_status")  # when only one status is right


class Gen:
    FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
              "top_k", "seed", "n", "best_of", "stream", "stream_options", "logprobs", "top_logprobs", "stop",
              "echo", "presence_penalty", "frequency_penalty", "logit_bias", "suffix", "user", "ignore_eos"]
    WORDS = ["the", "licence", "GNU", "software", "you", "may", "copy", "Program", "\u00e9t\u00e9", "\u4e2d\u6587",
             "\U0001F600", "\n", "User:", "\\", "\"", "\t", "\u0000"]
    BAD_UTF8 = [b"\xff", b"\xfe", b"\xc3(", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xed\xa0\x80", b"\xc0\xaf",
                b"\xf8\xa1\xa1\xa1\xa1", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"]

    def __init__(self, rng, port, key, model, max_body):
        self.rng = rng
        self.port = port
        self.key = key
        self.model = model
        self.max_body = max_body

    # -- bodies --
    def text(self, max_words=6):
        return " ".join(self.rng.choice(self.WORDS) for _ in range(self.rng.randint(0, max_words)))

    def valid_body(self, chat):
        rng = self.rng
        b = {}
        if rng.random() < 0.7:
            b["model"] = self.model
        if chat:
            roles = ["system", "user", "assistant", "developer"]
            msgs = [{"role": rng.choice(roles), "content": self.text()} for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.2:
                msgs[-1]["content"] = [{"type": "text", "text": self.text()}]
            b["messages"] = msgs
        else:
            b["prompt"] = (self.text() if rng.random() < 0.8
                           else [rng.randrange(256) for _ in range(rng.randint(1, 20))])
        b["max_tokens"] = rng.randint(1, 4)
        if rng.random() < 0.5:
            b["temperature"] = rng.choice([0, 0.5, 1.0, 2.0])
        if rng.random() < 0.2:
            b["top_p"] = rng.choice([0.1, 0.9, 1])
        if rng.random() < 0.2:
            b["top_k"] = rng.choice([-1, 0, 1, 50])
        if rng.random() < 0.2:
            b["seed"] = rng.randint(-2**63, 2**63 - 1)
        if rng.random() < 0.3:
            b["stream"] = True
            if rng.random() < 0.5:
                b["stream_options"] = {"include_usage": rng.random() < 0.5}
        if rng.random() < 0.15:
            b["stop"] = rng.choice(["e", ["\n", "th"], "  "])
        if rng.random() < 0.15:
            if chat:
                b["logprobs"] = True
                b["top_logprobs"] = rng.randint(0, 20)
            else:
                b["logprobs"] = rng.randint(0, 5)
        if rng.random() < 0.1:
            b["ignore_eos"] = True
        return b

    def nested(self, depth, opener="["):
        closer = "]" if opener == "[" else "}"
        if opener == "{":
            return '{"a":' * depth + "1" + "}" * depth
        return opener * depth + closer * depth

    def weird_value(self):
        rng = self.rng
        pool = [
            lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: 1,
            lambda: -(2**31), lambda: 2**31, lambda: 2**63 - 1, lambda: 2**63, lambda: 2**64, lambda: -(2**63),
            lambda: -(2**64), lambda: 10**30, lambda: -(10**30), lambda: 1e308, lambda: -1e308, lambda: 5e-324,
            lambda: 0.5, lambda: -0.0, lambda: 1.5, lambda: 2.0000001, lambda: "", lambda: "x" * rng.randint(1, 5000),
            lambda: self.text(), lambda: "1", lambda: "true", lambda: [], lambda: {}, lambda: [1, 2, 3],
            lambda: ["a", "b"], lambda: [[1], [2]], lambda: [None], lambda: {"a": 1}, lambda: {"include_usage": 1},
            lambda: [{"role": "user"}], lambda: [{"role": "user", "content": 5}],
            lambda: [{"role": "tool", "content": "x"}], lambda: [{"role": "user", "content": [{"type": "image"}]}],
            lambda: [{"role": "user", "content": [{"type": "text", "text": 3}]}], lambda: [{}], lambda: ["x"],
            lambda: [rng.randrange(-5, 300) for _ in range(rng.randint(0, 300))],
            lambda: [rng.randrange(256) for _ in range(rng.randint(200, 400))],
            lambda: ["s"] * rng.randint(1, 40), lambda: [""], lambda: ["x" * 5000],
            lambda: {str(i): i for i in range(rng.randint(1, 50))},
        ]
        return rng.choice(pool)()

    def mutated_body(self, chat):
        """(bytes, description) of a valid body with one thing wrong."""
        rng = self.rng
        b = self.valid_body(chat)
        r = rng.random()
        if r < 0.1 and b:
            del b[rng.choice(list(b))]
        elif r < 0.2:
            b["max_tokens" if rng.random() < 0.7 else "max_completion_tokens"] = rng.choice(
                [0, -1, 2**20, 2**20 + 1, 10**6, 2**31 - 1, 2**31, 2**53, 2**63, 2**64, 256, 255, 1e6, "8"])
        elif r < 0.3:
            # Deep nesting as a field's value, inside the body limit.
            depth = rng.choice([100, 1000, 10000, 30000])
            field = rng.choice(["prompt", "messages", "stop", "max_tokens", "x"])
            body = json.dumps(b)[:-1] + (", " if b else "") + f'"{field}": ' + self.nested(
                depth, rng.choice("[{")) + "}"
            return body.encode(), f"{field} nested {depth}"
        elif r < 0.4:
            b[f"unknown_{rng.randint(0, 9)}"] = self.weird_value()
        else:
            b[rng.choice(self.FIELDS)] = self.weird_value()
        return json.dumps(b, ensure_ascii=rng.random() < 0.5).encode(), "mutated"

    def damaged_body(self, chat):
        rng = self.rng
        good = json.dumps(self.valid_body(chat), ensure_ascii=False).encode()
        r = rng.random()
        if r < 0.15:
            return good[:rng.randrange(len(good))]  # truncated
        if r < 0.35:
            # invalid UTF-8 inside a string value, or anywhere
            bad = rng.choice(self.BAD_UTF8)
            q = [i for i, c in enumerate(good) if c == ord('"')]
            at = rng.choice(q) + 1 if q and rng.random() < 0.8 else rng.randrange(len(good) + 1)
            return good[:at] + bad + good[at:]
        if r < 0.45:
            return rng.randbytes(rng.randint(1, 2000))
        if r < 0.5:
            return b""
        if r < 0.6:
            depth = rng.choice([10000, 30000, self.max_body - 10])
            return rng.choice([b"[" * depth, b"{" * depth, b'{"a":' * (depth // 5), b"[" * (depth // 2) +
                               b"]" * (depth // 2)])
        if r < 0.7:
            lit = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999999", b"-1e999999", b"0x10", b"01",
                              b"undefined", b"1.e5", b".5", b"+1", b"18446744073709551616000"])
            field = rng.choice([b"max_tokens", b"temperature", b"top_p", b"seed", b"top_k"])
            return good[:-1] + b', "' + field + b'": ' + lit + b"}"
        if r < 0.8:
            # flip, drop or insert single bytes
            out = bytearray(good)
            for _ in range(rng.randint(1, 5)):
                op = rng.random()
                i = rng.randrange(len(out) + 1)
                if op < 0.4 and i < len(out):
                    out[i] = rng.randrange(256)
                elif op < 0.7 and i < len(out):
                    del out[i]
                else:
                    out.insert(i, rng.randrange(256))
            return bytes(out)
        return rng.choice([
            b"\xef\xbb\xbf" + good, good + b"garbage", good + b"\x00", b"\x00" + good, good + good,
            b"/* c */" + good, b"null", b"true", b"1", b'"string"', b"[]", b"[" + good + b"]", b"{}",
            good.replace(b'"max_tokens"', b'"max_tokens": 1, "max_tokens"', 1), b" " * 1000,
            good.replace(b"\"", b"'"),
        ])

    # -- requests --
    def request(self, method, path, body, headers=None, auth=True, content_length=True):
        h = [("Host", f"127.0.0.1:{self.port}")]
        if auth:
            h.append(("Authorization", f"Bearer {self.key}"))
        if body is not None:
            h.append(("Content-Type", "application/json"))
            if content_length:
                h.append(("Content-Length", str(len(body))))
        h.extend(headers or [])
        if not any(n.lower() == "connection" for n, _ in h if isinstance(n, str)):
            h.append(("Connection", "close"))
        head = f"{method} {path} HTTP/1.1\r\n".encode("latin-1", "replace")
        for n, v in h:
            n = n if isinstance(n, bytes) else n.encode("latin-1", "replace")
            v = v if isinstance(v, bytes) else v.encode("latin-1", "replace")
            head += n + b": " + v + b"\r\n"
        return head + b"\r\n" + (body or b"")

    def endpoint(self):
        chat = self.rng.random() < 0.5
        return chat, "/v1/chat/completions" if chat else "/v1/completions"

    def case(self):
        rng = self.rng
        r = rng.random()
        chat, path = self.endpoint()
        if r < 0.15:
            return Case("valid", self.request("POST", path, json.dumps(self.valid_body(chat)).encode()),
                        completion=True)
        if r < 0.40:
            body, _ = self.mutated_body(chat)
            return Case("mutated", self.request("POST", path, body), completion=True)
        if r < 0.60:
            return Case("bytes", self.request("POST", path, self.damaged_body(chat)), completion=True)
        if r < 0.72:
            return self.header_case(chat, path)
        if r < 0.82:
            return self.route_case()
        if r < 0.85:
            return self.oversize_case(path)
        if r < 0.95:
            return self.raw_case()
        if r < 0.97:
            body = self.valid_body(chat)
            body.update(stream=True, max_tokens=rng.randint(20, 60))
            return Case("abandon", self.request("POST", path, json.dumps(body).encode()),
                        hang_up_after=rng.randint(1, 300))
        return self.pipeline_case()

    def header_case(self, chat, path):
        rng = self.rng
        body = json.dumps(self.valid_body(chat)).encode()
        r = rng.random()
        auth, cl, extra = True, True, []
        kw = {"completion": True}
        if r < 0.2:
            auth = False
            extra.append(("Authorization", rng.choice([
                "", "Bearer", "Bearer ", f"bearer {self.key}", f"Bearer {self.key}x", f"Bearer {self.key[:-1]}",
                f"Basic {self.key}", "Bearer " + "k" * 5000, f"Bearer  {self.key}", b"Bearer \xff\xfe",
                f"Bearer {self.key}\t"])) if rng.random() < 0.9 else ("X-Nothing", "1"))
        elif r < 0.35:
            extra.append(("Content-Type", rng.choice([
                "text/plain", "", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                "application/json; charset=latin-1", "\x00", "a" * 3000])))
        elif r < 0.5:
            # Transfer-Encoding: chunked, well-formed or not.
            cl = False
            if rng.random() < 0.5:
                chunks = b""
                i = 0
                while i < len(body):
                    n = rng.randint(1, 50)
                    chunks += b"%x\r\n" % len(body[i:i + n]) + body[i:i + n] + b"\r\n"
                    i += n
                body = chunks + b"0\r\n\r\n"
            else:
                body = rng.choice([b"zz\r\n" + body + b"\r\n0\r\n\r\n", b"ffffffffffffffff\r\nab\r\n0\r\n\r\n",
                                   b"-5\r\nhello\r\n0\r\n\r\n", b"5\r\nhello", b"3\r\nhello\r\n0\r\n\r\n",
                                   b"0\r\n\r\n"])
                kw["shut_write"] = True
                kw["close_ok"] = True
            te = rng.choice(["chunked", "chunked", "gzip, chunked"])
            if te != "chunked":
                # Not framed for cpp-httplib: the body would run to EOF.
                kw["shut_write"] = True
                kw["close_ok"] = True
            extra.append(("Transfer-Encoding", te))
        elif r < 0.6:
            # Content-Length that does not match the body (the rest is ignored, or EOF ends it).
            cl = False
            extra.append(("Content-Length", rng.choice([
                str(max(0, len(body) - rng.randint(1, 20))), str(len(body) + rng.randint(1, 100)), "-1", "abc",
                "1e3", " 12", str(2**64), "99999999999999999999", f"{len(body)}, {len(body)}"])))
            if rng.random() < 0.3:
                extra.append(("Content-Length", str(len(body))))
            kw["shut_write"] = True
            kw["close_ok"] = True
        elif r < 0.7:
            extra.append(("Expect", "100-continue"))
        elif r < 0.8:
            # Not br: the server may answer in it, and the stdlib cannot read it.
            extra.append(("Accept-Encoding", rng.choice(["gzip", "deflate", "gzip, deflate", "*", "identity;q=0"])))
        else:
            for _ in range(rng.randint(1, 300 if rng.random() < 0.2 else 5)):
                name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz-_.!#$%&'*+^`|~0123456789")
                               for _ in range(rng.randint(1, 30)))
                value = (rng.randbytes(rng.randint(0, 100)).replace(b"\r", b"").replace(b"\n", b"")
                         if rng.random() < 0.5 else "v" * rng.randint(0, 9000))
                extra.append((name, value))
            kw["close_ok"] = True  # header limits may end it with a close
        return Case("headers", self.request("POST", path, body, extra, auth=auth, content_length=cl), **kw)

    def route_case(self):
        rng = self.rng
        method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "POST", "post", "FOO",
                             "GET"])
        path = rng.choice([
            "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1/completions/",
            "//v1/completions", "/v1/completions?x=1&&=", "/v1/Completions", "/v2/completions", "/v1",
            "/v1/models/model", "/%00", "/..%2f..%2fetc%2fpasswd", "/../../etc/passwd", "*", "/" + "a" * 9000,
            "/v1/chat/completions%20", "/\u00e9", "/v1/completions#frag", "/?" + "q=1&" * 500, "/favicon.ico"])
        body = json.dumps(self.valid_body("chat" in path)).encode() if rng.random() < 0.5 else None
        if body is None and method not in ("GET", "HEAD"):
            body = b""  # Content-Length: 0 (without one, see unframed_post())
        return Case("route", self.request(method, path, body), head_request=method == "HEAD", close_ok=True)

    def oversize_case(self, path):
        rng = self.rng
        n = self.max_body + rng.choice([1, 100, 10000, 3 * self.max_body])
        body = b'{"prompt": "' + b"a" * (n - 14) + b'"}'
        if rng.random() < 0.3:
            chunks = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
            raw = self.request("POST", path, chunks, [("Transfer-Encoding", "chunked")], content_length=False)
        elif rng.random() < 0.3:
            # Only the header claims it; no body follows.
            raw = self.request("POST", path, None, [("Content-Length", str(n))])
            return Case("oversize", raw, shut_write=True, close_ok=True, want_status=413)
        else:
            raw = self.request("POST", path, body)
        return Case("oversize", raw, close_ok=True)

    def raw_case(self):
        rng = self.rng
        p = self.port
        good = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.key}\r\n".encode()
        raw = rng.choice([
            b"\r\n\r\n", b"\r\n", b"GET\r\n\r\n", b"GET /\r\n\r\n", b"GET / HTTP/1.1\r\n", b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n", b"GET / HTTP/1.1 extra\r\n\r\n", b"GET  /  HTTP/1.1\r\n\r\n",
            b"GET /health HTTP/1.1\n\n", b"GET /health HTTP/1.0\r\n\r\n", b"get /health http/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),
            b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", b"GET /health HTTP/1.1\r\n folded: x\r\n\r\n",
            b"GET /health HTTP/1.1\r\n: empty-name\r\n\r\n", b"GET /he\x00alth HTTP/1.1\r\n\r\n",
            b"GET /" + b"x" * 10000 + b" HTTP/1.1\r\n\r\n", b"GET /health HTTP/1.1\r\nX: " + b"y" * 10000 + b"\r\n\r\n",
            b"GET /health HTTP/1.1\r\n" + b"H: v\r\n" * 2000 + b"\r\n",
            good + b"Content-Length: -5\r\n\r\n", good + b"Content-Length: abc\r\n\r\n",
            good + b"Content-Length: 99999999999999999999\r\n\r\n{}",
            good + b"Content-Length: 5\r\nContent-Length: 7\r\n\r\n{}{}{}{",
            good + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
            good + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            good + b"Content-Length: 2\r\n\r\n{}" + rng.randbytes(50),
            rng.randbytes(rng.randint(1, 3000)), rng.randbytes(rng.randint(1, 200)) + b"\r\n\r\n",
            ("GET /health HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % p).encode()[:rng.randint(1, 30)],
        ])
        return Case("raw", raw, shut_write=True, close_ok=True)

    def pipeline_case(self):
        rng = self.rng
        n = rng.randint(2, 3)
        raw = b""
        damaged = False
        for i in range(n):
            chat, path = self.endpoint()
            body = json.dumps(self.valid_body(chat) | {"stream": False}).encode()
            if rng.random() < 0.3:
                body = self.damaged_body(chat)
                damaged = True
            conn = [("Connection", "keep-alive" if i < n - 1 else "close")]
            raw += self.request("POST", path, body, conn)
        # Every answer is awaited, in order (the front end frames each request
        # before it runs the next); after a damaged body only the first, since
        # a body that is not what its headers say may close the connection.
        return Case("pipeline", raw, n_responses=1 if damaged else n, completion=True)



# ---- judging -----------------------------------------------------------------

def error_shape_problem(resp):
    try:
        j = json.loads(resp.body)
    except ValueError:
        return "the error body is not JSON"
    e = j.get("error") if isinstance(j, dict) else None
    if not isinstance(e, dict):
        return "the error body has no 'error' object"
    for k in ("message", "type", "param", "code"):
        if k not in e:
            return f"error.{k} is missing"
    if not isinstance(e["message"], str) or not e["message"]:
        return "error.message is not a non-empty string"
    if not isinstance(e["type"], str):
        return "error.type is not a string"
    for k in ("param", "code"):
        if e[k] is not None and not isinstance(e[k], str):
            return f"error.{k} is neither a string nor null"
    if "application/json" not in resp.headers.get("content-type", ""):
        return f"an error with Content-Type {resp.headers.get('content-type')!r}"
    return None


def completion_problem(resp):
    ctype = resp.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        events = [e for e in resp.body.split(b"\n\n") if e.strip()]
        if not events or events[-1].strip() != b"data: [DONE]":
            return "a stream that does not end in 'data: [DONE]'"
        for e in events[:-1]:
            if not e.startswith(b"data: "):
                return f"an SSE event without 'data: ': {clip(e, 100)}"
            try:
                j = json.loads(e[6:])
            except ValueError:
                return f"an SSE event that is not JSON: {clip(e, 100)}"
            if "error" in j:
                return f"an error inside a 200 stream: {clip(e, 200)}"
        return None
    try:
        j = json.loads(resp.body)
    except ValueError:
        return "a 200 completion that is not JSON"
    if not isinstance(j, dict) or not isinstance(j.get("choices"), list) or not j["choices"]:
        return "a 200 completion without choices"
    c = j["choices"][0]
    if not (isinstance(c.get("text"), str) or isinstance(c.get("message", {}).get("content"), str)):
        return "a 200 completion without text or message.content"
    if c.get("finish_reason") not in ("stop", "length"):
        return f"finish_reason {c.get('finish_reason')!r}"
    return None


def judge(case, outcome):
    """None, or what is wrong."""
    if isinstance(outcome, Closed):
        if case.close_ok:
            return None
        return f"the connection was {'reset' if outcome.how == 'reset' else 'closed'} without a full response " \
               f"(received {clip(outcome.data, 200)})"
    if isinstance(outcome, Exception):
        return f"{type(outcome).__name__}: {outcome}"
    if case.hang_up_after is not None:
        return None
    for resp in outcome:
        if resp.status >= 500:
            return f"HTTP {resp.status}"
        if case.want_status and resp.status != case.want_status:
            return f"HTTP {resp.status}, want {case.want_status}"
        if 400 <= resp.status < 500 and not case.head_request:
            if problem := error_shape_problem(resp):
                return f"HTTP {resp.status}: {problem}"
        if resp.status == 200 and case.completion:
            if problem := completion_problem(resp):
                return f"HTTP 200: {problem}"
        if resp.status < 200 or resp.status >= 600:
            return f"HTTP {resp.status}"
    return None


def run_case(port, case):
    try:
        return exchange(port, case.raw, case.n_responses, case.head_request, case.shut_write, case.hang_up_after)
    except Closed as c:
        return c
    except (socket.timeout, TimeoutError):
        return TimeoutError(f"no response within {TIMEOUT_S:.0f} s")
    except Exception as e:  # a malformed response, a refused connection
        return e


# ---- after the loop ----------------------------------------------------------

def simple(port, key, method, path, body=None):
    raw = Gen(random.Random(0), port, key, "", 0).request(method, path, body)
    return exchange(port, raw)[0]


def pipelining(port):
    """None, or what is wrong with two GET /health sent in one write."""
    h = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    raw = h + h.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        s.sendall(raw)
        r = Reader(s)
        got = 0
        try:
            for _ in range(2):
                read_response(r, False)
                got += 1
        except (Closed, socket.timeout, TimeoutError):
            pass
        return None if got == 2 else f"{got} of 2 pipelined GET /health answered within 2 s"
    finally:
        s.close()


def unframed_post(port, key):
    """None, or what is wrong with a POST that has neither Content-Length nor
    Transfer-Encoding: the server refuses it at once with 411 (Length
    Required), before reading any body."""
    raw = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
           "Connection: close\r\n\r\n").encode()
    start = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        s.sendall(raw)
        resp = read_response(Reader(s), False)
        return None if resp.status == 411 else f"HTTP {resp.status}, want 411"
    except (Closed, socket.timeout, TimeoutError) as e:
        return f"no answer within {time.time() - start:.0f} s ({type(e).__name__})"
    finally:
        s.close()


def final_checks(port, key, model, router=False):
    """None, or what is wrong with the server (or router) after the fuzz loop."""
    deadline = time.time() + 10
    while True:
        h = simple(port, key, "GET", "/health")
        if h.status != 200:
            return f"GET /health: HTTP {h.status} {clip(h.body)}"
        s = json.loads(h.body)
        if router and s.get("requests_running") == 0 and all(
                w["up"] and w["requests_running"] == 0 for t in s["tiers"] for w in t["workers"]):
            break
        if not router and s.get("running") == 0 and s.get("waiting") == 0 and s.get("kv_blocks_used") == 0:
            break
        if time.time() > deadline:
            return f"the server is not idle 10 s after the loop (leaked requests or KV blocks?): {s}"
        time.sleep(0.1)
    m = simple(port, key, "GET", "/metrics")
    for line in m.body.decode().splitlines():
        if (line.startswith("tessera_request_errors_total") or line.startswith("tessera_route_requests_total")) \
                and 'code="5' in line and not line.endswith(" 0"):
            return f"/metrics counts server errors: {line}"
    r = simple(port, key, "POST", "/v1/completions",
               json.dumps({"model": model, "prompt": "The ", "max_tokens": 8, "temperature": 0}).encode())
    if r.status != 200 or completion_problem(r):
        return f"a plain completion after the loop: {r}"
    if json.loads(r.body)["usage"]["completion_tokens"] != 8:
        return f"a plain completion after the loop: {r}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-body", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--budget", type=float, default=40, help="seconds; the loop stops early past it")
    ap.add_argument("--case", type=int, default=None, help="replay only this case")
    ap.add_argument("--router", action="store_true", help="the port is a `tessera route` (its /health and metrics)")
    a = ap.parse_args()

    gen = Gen(random.Random(a.seed), a.port, a.key, a.model, a.max_body)
    start = time.time()
    kinds, statuses = {}, {}
    ran = 0
    for i in range(a.count):
        case = gen.case()
        if a.case is not None and i != a.case:
            continue
        if a.case is None and time.time() - start > a.budget:
            print(f"serve_fuzz: budget of {a.budget:.0f} s spent after {ran} cases")
            break
        outcome = run_case(a.port, case)
        ran += 1
        kinds[case.kind] = kinds.get(case.kind, 0) + 1
        key = ("close" if isinstance(outcome, Closed) else type(outcome).__name__ if isinstance(outcome, Exception)
               else "abandoned" if not outcome else str(outcome[-1].status))
        statuses[key] = statuses.get(key, 0) + 1
        if problem := judge(case, outcome):
            print(f"FAIL serve_fuzz seed {a.seed} case {i} ({case.kind}): {problem}")
            print(f"  request:  {clip(case.raw, 1500)}")
            print(f"  response: {outcome!r}"[:2000])
            print(f"  replay:   serve_fuzz.py --port PORT --key KEY --model {a.model} --max-body {a.max_body} "
                  f"--seed {a.seed} --case {i}")
            return 1
        if a.case is not None:
            break
    took = time.time() - start
    print(f"serve_fuzz: seed {a.seed}, {ran} cases in {took:.1f} s; kinds {dict(sorted(kinds.items()))}")
    print(f"serve_fuzz: answers {dict(sorted(statuses.items()))}")
    if problem := final_checks(a.port, a.key, a.model, a.router):
        print(f"FAIL serve_fuzz seed {a.seed}: after the loop: {problem}")
        return 1
    print("serve_fuzz: the server is idle, counts no 5xx, and still completes")
    if problem := unframed_post(a.port, a.key):
        print(f"FAIL serve_fuzz: a POST without Content-Length: {problem}")
        return 1
    if problem := pipelining(a.port):
        print(f"FAIL serve_fuzz: pipelining: {problem}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
