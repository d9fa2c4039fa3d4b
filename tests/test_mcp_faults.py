"""`paravt mcp` under faults, each as a user's client meets it: a call past its deadline (its reads
stop, its worker is free for the next call), a client that leaves while a worker is wedged (the server
exits), HTTP bodies that trickle in or are dropped half-sent (a deadline, one log line each), a
browser front-end's CORS preflight, and a request holding a lone surrogate (answered, the server goes
on). The official `mcp` client where it can send what is tested; raw JSON-RPC lines or HTTP where the
fault is below what a well-behaved client sends."""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from servetools import Server, paravt_server
from videotools import make_test_video

# the SDK is imported by the tests that use it: a worker that runs no MCP test never loads it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mcp") is None,
                                reason="the mcp package is not installed (pip install -e '.[test]')")

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
JSON_SSE = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    """A media root with a small video (the harmless crop) and a 60 s one whose middle a slow server
    trickles (`Trickle`)."""
    root = tmp_path_factory.mktemp("mcp_faults")
    make_test_video(root / "small.mp4", seconds=4, fps=10)
    rng = np.random.default_rng(0)

    def frame(i: int) -> np.ndarray:  # ~1.3 KB a packet: a noisy patch on a plain frame
        img = np.zeros((96, 128, 3), np.uint8)
        img[..., 1] = (i * 3) % 256
        img[:24, :32] = rng.integers(0, 256, (24, 32, 3))
        return img

    make_test_video(root / "long.mp4", seconds=60, fps=10, size=(96, 128), gop=100, frames=frame)
    return root


@pytest.fixture(scope="module")
def page():
    """A web page on another origin than the server's (another port): a browser front-end."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    with Server(Starlette(routes=[Route("/", lambda request: HTMLResponse(PAGE))])) as srv:
        yield srv


@pytest.fixture(scope="module")
def http_server(media, page, tmp_path_factory):
    """`paravt mcp --http`, letting the page's origin in (given as a user might: with a slash); yields
    (its /mcp URL, its log file)."""
    log = tmp_path_factory.mktemp("mcp_http") / "server.log"
    with paravt_server("mcp", "--http", "--media-root", str(media), "--allow-origin",
                       f"http://localhost:{page.port}/", ready="/mcp", any_answer=True, log=log) as (url, _):
        yield url + "/mcp", log


# ---------- raw JSON-RPC over stdio (what no well-behaved client sends) ----------

class RawStdio:
    """`python -m paravt mcp ARGS` with JSON-RPC lines written to its stdin and read from its stdout."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "paravt", "mcp", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def send(self, line: bytes | dict) -> None:
        self.proc.stdin.write(line if isinstance(line, bytes) else (json.dumps(line) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout_s: float = 60.0) -> dict | None:
        """The next message, or None when none came within `timeout_s`."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        return json.loads(line) if line else None

    def initialize(self) -> dict:
        self.send(INIT)
        answer = self.recv()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def call(rid: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


# ---------- servers a video URL may point at ----------

class Trickle:
    """An HTTP server of one file with byte ranges (as FFmpeg seeks), sending the bytes in [lo, hi) at
    `rate` bytes per second (a slow CDN) and the rest at once; it counts the slow bytes it sent and the
    connections still being sent slow bytes (0 once every reader of them hung up)."""

    def __init__(self, path: Path, lo: int, hi: int, rate: float = 1000.0) -> None:
        self.data, self.lo, self.hi, self.rate = path.read_bytes(), lo, hi, rate
        self.slow_bytes = self.slow_readers = self.slow_requests = 0
        self.lock = threading.Lock()
        trickle = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                trickle.answer(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{path.name}"

    def answer(self, h) -> None:
        size = len(self.data)
        a, _, b = h.headers.get("Range", "bytes=0-")[6:].partition("-")
        lo, hi = int(a or 0), min(int(b) if b else size - 1, size - 1)
        h.send_response(206)
        h.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(hi - lo + 1))
        h.end_headers()
        pos, slow = lo, False
        try:
            while pos <= hi:
                inside = self.lo <= pos < self.hi
                n = 256 if inside else min(hi + 1, self.lo if pos < self.lo else hi + 1) - pos
                if inside and not slow:
                    slow = True
                    with self.lock:
                        self.slow_readers += 1
                        self.slow_requests += 1
                if inside:
                    time.sleep(n / self.rate)
                h.wfile.write(self.data[pos:pos + n])
                h.wfile.flush()
                pos += n
                if inside:
                    with self.lock:
                        self.slow_bytes += n
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if slow:
                with self.lock:
                    self.slow_readers -= 1

    def __enter__(self) -> "Trickle":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.05)


# ---------- a deadline stops the work (issue 61 case 5) ----------

def test_a_call_past_its_deadline_stops_reading_and_frees_its_worker(media):
    """Two decode workers; two crops of a URL whose middle trickles in (a window needing ~200 KB at
    1 KB/s) pass their 6 s deadline, then a crop of a small file must get a worker and its frames.
    The timed-out reads stop: the slow server sees its readers hang up and no byte more is read."""
    import av
    from mcp import Client, StdioServerParameters

    with av.open(str(media / "long.mp4")) as c:  # the bytes of 10-40 s trickle: a crop of 21-36 s reads there
        s = c.streams.video[0]
        pos = {round(float(p.pts * s.time_base), 1): p.pos for p in c.demux(s) if p.pts is not None}
    with Trickle(media / "long.mp4", pos[10.0], pos[40.0]) as slow:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "paravt", "mcp", "--media-root", str(media), "--allow-urls", "--timeout", "6"],
            env={"PARAVT_DECODE_WORKERS": "2", "HF_HUB_OFFLINE": "1"})

        async def work(client):
            window = {"video_path": slow.url, "start_time": 21, "end_time": 36}
            late = await asyncio.gather(*(client.call_tool("crop_video", window) for _ in range(2)))
            harmless = await client.call_tool("crop_video", {"video_path": "small.mp4", "start_time": 0, "end_time": 3})
            return late, harmless

        async def session():
            async with Client(params) as client:
                return await work(client)

        late, harmless = asyncio.run(session())
        for r in late:
            assert r.is_error and "crop_video took longer than 6 s" in r.content[0].text, r
        assert not harmless.is_error, harmless.content[0].text
        assert len([c for c in harmless.content if c.type == "image"]) == 3
        # the session is over (the server too); the slow reads ended when the calls did, not at the window's end
        wait_for(lambda: slow.slow_readers == 0, 60, "the timed-out crops still read the URL")
        sent, requests = slow.slow_bytes, slow.slow_requests
        time.sleep(1.0)
        assert (slow.slow_bytes, slow.slow_requests) == (sent, requests), "reads went on after the calls ended"
        print(f"the two timed-out crops read {sent} of their window's {pos[36.0] - pos[20.0]} bytes")
        assert sent < (pos[36.0] - pos[20.0]) / 4, f"{sent} slow bytes read: the crops read on past their deadline"


# ---------- the server ends with its client (case 6) ----------

def test_the_server_exits_when_stdin_closes_with_a_worker_wedged(media):
    """A crop of a URL whose server accepts and never answers wedges a worker (FFmpeg waits up to the
    600 s --timeout for it); the client then closes stdin: the server exits, cleanly, at once."""
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(4)
    accepted: list = []
    threading.Thread(target=lambda: accepted.append(stall.accept()), daemon=True).start()
    raw = RawStdio("--media-root", str(media), "--allow-urls")
    try:
        assert raw.initialize()["result"]["serverInfo"]["name"] == "paravt"
        raw.send(call(1, "crop_video", {"video_path": f"http://127.0.0.1:{stall.getsockname()[1]}/v.mp4",
                                        "start_time": 0, "end_time": 5}))
        wait_for(lambda: accepted, 60, "the crop never connected")
        raw.proc.stdin.close()
        try:
            code = raw.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not exit after stdin closed (a worker is wedged)")
        assert code == 0, raw.proc.stderr.read().decode()[-2000:]
    finally:
        raw.close()
        stall.close()
        for conn, _ in accepted:
            conn.close()


# ---------- a request holding a lone surrogate (case 17, the MCP part) ----------

SURROGATE = b'"a\\ud800b.mp4"'  # JSON text: an escape of a UTF-16 high half, no low half after it


def test_a_lone_surrogate_over_stdio_is_answered_and_the_server_goes_on(media):
    raw = RawStdio("--media-root", str(media))
    try:
        raw.initialize()
        raw.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"crop_video","arguments":'
                 b'{"video_path":' + SURROGATE + b',"start_time":0,"end_time":2}}}\n')
        answer = raw.recv(60)
        assert answer is not None, "no answer to a request holding a lone surrogate"
        assert answer["id"] == 1 and answer["error"]["code"] == -32700
        assert "lone surrogate ('\\ud800')" in answer["error"]["message"]
        raw.send(b'{"jsonrpc":"2.0","id":"two","method":"tools/call","params":{"name":"crop\\udfffx","arguments":{}}}\n')
        assert raw.recv(60)["id"] == "two"
        raw.send(call(3, "crop_video", {"video_path": "small.mp4", "start_time": 0, "end_time": 2}))
        after = raw.recv(60)
        assert after["id"] == 3 and not after["result"].get("isError"), after
    finally:
        raw.close()


def test_a_lone_surrogate_in_process_and_over_http_is_answered(media, http_server):
    """In process (the SDK's direct dispatch: the tool refuses it) and over HTTP (the body is
    answered before the SDK reads it), and the session goes on."""
    from mcp import Client

    from paravt.integrations.mcp.server import build_server
    from paravt.integrations.mcp.settings import McpSettings

    async def in_process():
        async with Client(build_server(McpSettings(media_root=str(media)))) as c:
            return await c.call_tool("crop_video", {"video_path": "a\ud800", "start_time": 0, "end_time": 2})

    r = asyncio.run(in_process())
    assert r.is_error and "the call['arguments']['video_path'] holds a lone surrogate" in r.content[0].text

    url = http_server[0]
    init = httpx.post(url, json=INIT, headers=JSON_SSE)
    sid = {"Mcp-Session-Id": init.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-06-18"}
    httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**JSON_SSE, **sid})
    body = (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"crop_video","arguments":'
            b'{"video_path":' + SURROGATE + b',"start_time":0,"end_time":2}}}')
    r = httpx.post(url, content=body, headers={**JSON_SSE, **sid}, timeout=60)
    assert r.status_code == 400 and r.json()["id"] == 7 and "lone surrogate" in r.json()["error"]["message"]
    r = httpx.post(url, json=call(8, "crop_video", {"video_path": "small.mp4", "start_time": 0, "end_time": 2}),
                   headers={**JSON_SSE, **sid}, timeout=60)
    assert r.status_code == 200 and '"id":8' in r.text and "image/png" in r.text


# ---------- HTTP bodies (case 8) ----------

def _head(port: int, length: int) -> bytes:
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n\r\n").encode()


def test_http_a_body_that_trickles_in_gets_408(media):
    """A body trickled a byte at a time is cut at the body deadline (1 s here; 30 s served) with 408,
    and the server answers the next request."""
    from paravt.integrations.mcp.server import build_server
    from paravt.integrations.mcp.settings import McpSettings
    from paravt.integrations.mcp.web import http_app
    from paravt.webguard import h11_protocol

    body = json.dumps(INIT).encode()
    app = http_app(build_server(McpSettings(media_root=str(media))), body_timeout_s=1.0)
    with Server(app, http=h11_protocol()) as srv:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.settimeout(0.2)
        s.sendall(_head(srv.port, len(body)))
        got, t0 = b"", time.monotonic()
        for byte in body[:-1]:  # never the last one
            s.sendall(bytes([byte]))
            try:
                got = s.recv(4096)
            except socket.timeout:
                continue
            break
        s.close()
        assert got.startswith(b"HTTP/1.1 408"), (got[:200], f"after {time.monotonic() - t0:.1f} s")
        r = httpx.post(srv.url + "/mcp", content=body, headers=JSON_SSE, timeout=30)
        assert r.status_code == 200 and "serverInfo" in r.text


def test_http_300_bodies_dropped_half_sent_are_one_line_each(http_server):
    """300 clients send half a body and leave: each is one short log line (no traceback), and the
    server answers the next request (it froze ~100 s rendering 300 rich tracebacks)."""
    url, log = http_server
    port = int(url.split(":")[2].split("/")[0])
    before = log.read_text().splitlines()
    body = json.dumps(INIT).encode()
    socks = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(_head(port, len(body)) + body[:40])
        socks.append(s)
    time.sleep(0.5)
    for s in socks:
        s.close()
    t0 = time.monotonic()
    r = httpx.post(url, content=body, headers=JSON_SSE, timeout=300)
    print(f"the next request answered {time.monotonic() - t0:.2f} s after 300 half-sent bodies were dropped")
    assert r.status_code == 200 and "serverInfo" in r.text
    wait_for(lambda: log.read_text().count("client left") >= 300, 60, "300 log lines")
    lines = log.read_text().splitlines()[len(before):]
    left = [line for line in lines if "client left" in line]
    assert len(left) == 300 and all(len(line) < 200 for line in left), left[:3]
    assert len(lines) == 300 and not any("Traceback" in line or "│" in line for line in lines), lines[:20]


# ---------- CORS for a browser front-end (case 9) ----------

PAGE = """<!doctype html><script>
async function mcp(url) {
  const post = (body, headers) => fetch(url, {method: "POST", body: JSON.stringify(body), headers: {
    "Content-Type": "application/json", "Accept": "application/json, text/event-stream", ...headers}});
  try {
    const init = await post({jsonrpc: "2.0", id: 1, method: "initialize", params: {protocolVersion: "2025-06-18",
      capabilities: {}, clientInfo: {name: "page", version: "0"}}}, {});
    const session = {"Mcp-Session-Id": init.headers.get("mcp-session-id"), "MCP-Protocol-Version": "2025-06-18"};
    await init.text();
    await post({jsonrpc: "2.0", method: "notifications/initialized"}, session);
    const tools = await post({jsonrpc: "2.0", id: 2, method: "tools/list"}, session);
    return tools.status + " " + (await tools.text());
  } catch (e) { return "blocked: " + e; }
}
</script>"""


def test_http_answers_a_cors_preflight_from_an_allowed_origin(http_server, page):
    url, origin = http_server[0], f"http://localhost:{page.port}"
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type,mcp-protocol-version,mcp-session-id"}
    r = httpx.options(url, headers={"Origin": origin, **ask})
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers["access-control-allow-origin"] == origin and "POST" in r.headers["access-control-allow-methods"]
    assert "mcp-session-id" in r.headers["access-control-allow-headers"].lower()
    r = httpx.options(url, headers={"Origin": "http://evil.example", **ask})
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    r = httpx.post(url, json=INIT, headers={**JSON_SSE, "Origin": origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert "mcp-session-id" in r.headers["access-control-expose-headers"].lower()


def test_a_browser_page_on_an_allowed_origin_lists_the_tools(http_server, page, browser):
    """Debian's chromium: a page on another port calls the MCP server (initialize, tools/list, the
    session id read from a response header); the same page on an origin not let in is blocked."""
    ctx = browser.new_context()
    try:
        tab = ctx.new_page()
        tab.goto(f"http://localhost:{page.port}/")
        got = tab.evaluate("url => mcp(url)", http_server[0])
        assert got.startswith("200 ") and "crop_video" in got, got[:300]
        tab.goto(f"http://127.0.0.1:{page.port}/")  # the same page on an origin not let in
        assert tab.evaluate("url => mcp(url)", http_server[0]).startswith("blocked"), "a foreign origin got in"
    finally:
        ctx.close()
