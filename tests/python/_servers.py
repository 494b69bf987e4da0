"""Real servers for the remote tests, on loopback: a static HTTP file server with Range
requests and fault injection, and an S3 server (moto in server mode)."""

from __future__ import annotations

import http.server
import os
import socket
import socketserver
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def zrec_bin():
    """The `zrec` the tests run: ZREC_BIN, else the wheel's `zrec` console script next to this
    interpreter (what scripts/test_python.sh tests: pip users' zrec), else the cargo build's
    binary; skip if none."""
    import sys

    import pytest

    script = os.path.join(os.path.dirname(sys.executable), "zrec")
    default = script if os.path.exists(script) else os.path.join(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"), "debug", "zrec")
    zrec = os.environ.get("ZREC_BIN") or default
    if not os.path.exists(zrec):
        if os.environ.get("ZREC_BIN"):
            raise AssertionError(f"ZREC_BIN={zrec} does not exist")
        pytest.skip("zrec binary not built (set ZREC_BIN)")
    return zrec


def free_port():
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, deadline):
    """Wait until 127.0.0.1:`port` accepts connections; TimeoutError after `deadline`
    (time.time())."""
    import time

    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
            time.sleep(0.05)


class RangeServer:
    """A static file server over ``root`` with Range (``bytes=a-b``, ``bytes=-n``) and HEAD.

    ``fail_next``: answer that many requests with 503 first (transient faults); ``forbidden``:
    paths (relative, prefix match) answered with 403; ``requests``: (path, Range) of every GET.
    """

    def __init__(self, root):
        self.root = str(root)
        self.requests = []
        self.fail_next = 0
        self.failed = 0
        self.forbidden = set()
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _empty(self, code):
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _file(self):
                rel = self.path.lstrip("/").split("?")[0]
                with outer.lock:
                    if outer.fail_next > 0:
                        outer.fail_next -= 1
                        outer.failed += 1
                        self._empty(503)
                        return None
                if any(rel.startswith(f) for f in outer.forbidden):
                    self._empty(403)
                    return None
                p = os.path.normpath(os.path.join(outer.root, rel))
                if not p.startswith(outer.root) or not os.path.isfile(p):
                    self._empty(404)
                    return None
                with open(p, "rb") as f:
                    return f.read()

            def do_HEAD(self):
                b = self._file()
                if b is not None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(b)))
                    self.end_headers()

            def do_GET(self):
                with outer.lock:
                    outer.requests.append((self.path, self.headers.get("Range")))
                b = self._file()
                if b is None:
                    return
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, z = rng[6:].partition("-")
                    if a == "":
                        start, end = max(len(b) - int(z), 0), len(b) - 1
                    else:
                        start, end = int(a), min(int(z) if z else len(b) - 1, len(b) - 1)
                    if start >= len(b):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(b)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(b)}")
                    self.send_header("Content-Length", str(end - start + 1))
                    self.end_headers()
                    self.wfile.write(b[start : end + 1])
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(b)))
                    self.end_headers()
                    self.wfile.write(b)

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = S(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class S3Server:
    """moto's S3 in server mode on loopback, with a client and the environment zrecord reads."""

    def __init__(self):
        import boto3
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
        )

    def bucket(self, name):
        self.client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket, prefix=""):
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    def upload_folder(self, folder, bucket, prefix):
        for root, _, files in os.walk(folder):
            for f in files:
                full = os.path.join(root, f)
                self.client.upload_file(full, bucket, prefix + "/" + os.path.relpath(full, folder))

    def close(self):
        self.server.stop()


class DelayProxy:
    """TCP proxy: every chunk a client sends waits `latency` seconds before it is forwarded
    (one request = one chunk for GETs). Counts requests and bytes sent back."""

    def __init__(self, upstream_port, latency):
        self.upstream, self.latency = upstream_port, latency
        self.requests = 0
        self.lines = []
        self.bytes_back = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.sock.accept()
            u = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self.pipe, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(u, c, False), daemon=True).start()

    def pipe(self, a, b, upstream):
        try:
            while True:
                d = a.recv(1 << 20)
                if not d:
                    break
                if upstream:
                    if d[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                        with self.lock:
                            self.requests += 1
                            self.lines.append(d.split(b"\r\n", 1)[0].decode("latin-1"))
                        time.sleep(self.latency)
                else:
                    with self.lock:
                        self.bytes_back += len(d)
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def reset(self):
        with self.lock:
            r, b = self.requests, self.bytes_back
            self.requests = self.bytes_back = 0
        return r, b
