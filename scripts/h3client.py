#!/usr/bin/env python3
"""An HTTP/3 client on the kernel's UDP (aioquic), for the tests and by hand.

Fetches URL over HTTP/3, `--requests` times on each of `--connections` connections at once,
and prints one JSON object: how many answered, their statuses, and each body's length and
SHA-256 (in the order the requests were made). With `--post N`, each request is a POST of N
bytes (a pattern whose SHA-256 is printed as "sent_sha256").

    python3 scripts/h3client.py --ca /tmp/http3.pem https://10.77.0.3:4433/bytes/1000
"""

import argparse
import asyncio
import hashlib
import json
import ssl
import sys
import time
from urllib.parse import urlparse

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset


class H3Client(QuicConnectionProtocol):
    """A QUIC connection speaking HTTP/3: each request a stream, each answer a future."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            self._fail(event.stream_id, f"stream reset by the server (code {event.error_code})")
        if isinstance(event, ConnectionTerminated):
            for sid in list(self.waiting):
                self._fail(sid, f"connection closed: {event.reason_phrase or event.error_code}")
        for ev in self.h3.handle_event(event):
            got = self.waiting.get(ev.stream_id)
            if got is None:
                continue
            if isinstance(ev, HeadersReceived):
                got["headers"] = dict(ev.headers)
            elif isinstance(ev, DataReceived):
                got["body"].update(ev.data)
                got["len"] += len(ev.data)
            if getattr(ev, "stream_ended", False):
                del self.waiting[ev.stream_id]
                got["done"].set_result(got)

    def _fail(self, sid, why):
        got = self.waiting.pop(sid)
        if not got["done"].done():
            got["done"].set_exception(ConnectionError(why))

    async def request(self, method, url, body=None):
        u = urlparse(url)
        sid = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", u.netloc.encode()),
            (b":path", (u.path or "/").encode() + (b"?" + u.query.encode() if u.query else b"")),
            (b"user-agent", b"corelane-h3client"),
        ]
        if body is not None:
            headers.append((b"content-length", str(len(body)).encode()))
        got = {
            "headers": {},
            "body": hashlib.sha256(),
            "len": 0,
            "done": asyncio.get_running_loop().create_future(),
        }
        self.waiting[sid] = got
        self.h3.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            self.h3.send_data(sid, body, end_stream=True)
        self.transmit()
        got = await got["done"]
        status = int(got["headers"].get(b":status", b"0"))
        return {"status": status, "len": got["len"], "sha256": got["body"].hexdigest()}


def pattern(n):
    return bytes(((i * 31 + 7) ^ (i >> 8)) & 0xFF for i in range(n))


async def one_connection(args, host, port, config, body, out):
    async with connect(host, port, configuration=config, create_protocol=H3Client) as client:
        for _ in range(args.requests):
            method = "POST" if body is not None else "GET"
            out.append(await asyncio.wait_for(client.request(method, args.url, body), args.timeout))


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--ca", help="PEM certificate to trust (else the system's)")
    p.add_argument("--server-name", default="localhost", help="the name the certificate names")
    p.add_argument("--insecure", action="store_true", help="trust any certificate")
    p.add_argument("--requests", type=int, default=1, help="requests on each connection, in turn")
    p.add_argument("--connections", type=int, default=1, help="connections at once")
    p.add_argument("--post", type=int, default=None, metavar="N", help="POST N bytes each time")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each request may take")
    p.add_argument("--summary", action="store_true", help="one line for a person, not JSON")
    args = p.parse_args()

    u = urlparse(args.url)
    if u.scheme != "https" or not u.hostname:
        sys.exit(f"h3client: want an https:// URL, got {args.url!r}")
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = args.server_name
    config.max_data = 64 << 20
    config.max_stream_data = 16 << 20
    if args.insecure:
        config.verify_mode = ssl.CERT_NONE
    elif args.ca:
        config.load_verify_locations(args.ca)
    body = pattern(args.post) if args.post is not None else None

    started = time.monotonic()
    outs = [[] for _ in range(args.connections)]
    results = await asyncio.gather(
        *(one_connection(args, u.hostname, u.port or 443, config, body, o) for o in outs),
        return_exceptions=True,
    )
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    answers = [a for o in outs for a in o]
    summary = {
        "answered": len(answers),
        "asked": args.connections * args.requests,
        "statuses": sorted({a["status"] for a in answers}),
        "answers": answers,
        "errors": errors,
        "seconds": round(time.monotonic() - started, 3),
    }
    if body is not None:
        summary["sent_sha256"] = hashlib.sha256(body).hexdigest()
    if args.summary:
        lens = sorted({a["len"] for a in answers})
        print(f"answered {len(answers)}/{summary['asked']}, statuses {summary['statuses']}, "
              f"body lengths {lens}, {summary['seconds']} s, errors {errors}")
    else:
        print(json.dumps(summary))
    return 0 if not errors and len(answers) == summary["asked"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
