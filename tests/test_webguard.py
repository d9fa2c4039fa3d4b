"""No web page can drive a paravt server on loopback: cross-site bodies (text/plain, forms), foreign
Origins and DNS-rebinding Host names are refused, the RL API included; a connection that never
finishes its headers is closed. (`paravt.webguard`; the app's own cases are in test_app.py.)"""

import socket
import time

import httpx
import pytest
from servetools import Server
from test_openai_backend import FakeBackend

from paravt.serve import create_app
from paravt.webguard import h11_protocol, host_name, is_loopback, refusal


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.0.0.2", True), ("127.255.0.9", True),
                                       ("localhost", True), ("::1", True), ("[::1]", True), ("LOCALHOST.", True),
                                       ("0.0.0.0", False), ("10.0.0.1", False), ("attacker.example", False),
                                       ("127.0.0.1.attacker.example", False), ("", False)])
def test_loopback_names(host, loop):
    assert is_loopback(host) is loop


def test_host_names():
    assert host_name("127.0.0.1:8000") == "127.0.0.1"
    assert host_name("[::1]:8000") == "::1"
    assert host_name("localhost") == "localhost"


def test_refusal_rules():
    ok = {"host": "127.0.0.1:8000", "content-type": "application/json"}
    assert refusal("POST", "/v1/chat/completions", ok, True, ("/v1/chat/completions",)) is None
    assert refusal("POST", "/v1/chat/completions", {**ok, "origin": "http://127.0.0.1:8000"}, True,
                   ("/v1/chat/completions",)) is None
    assert refusal("GET", "/health", {"host": "attacker.example"}, True)[0] == 421
    assert refusal("GET", "/health", {"host": "attacker.example"}, False) is None  # bound elsewhere: its own names
    assert refusal("POST", "/pause", {**ok, "origin": "https://evil.example"}, True)[0] == 403
    assert refusal("POST", "/pause", {**ok, "origin": "null"}, True)[0] == 403
    assert refusal("POST", "/pause", {**ok, "origin": "http://localhost:3000"}, True, (),
                   ("http://localhost:3000",)) is None
    text = {**ok, "content-type": "text/plain;charset=UTF-8"}
    assert refusal("POST", "/v1/chat/completions", text, True, ("/v1/chat/completions",))[0] == 415
    assert refusal("POST", "/v1/chat/completions", {"host": "127.0.0.1:8000"}, True, ("/v1/chat/completions",))[0] == 415


@pytest.fixture
def rl_server():
    b = FakeBackend()
    b.reload_weights = lambda path: setattr(b, "reloaded", path)
    with Server(create_app(b, "fake-model", rl_api=True, loopback_only=True)) as s:
        yield b, s


CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'


def test_a_cross_site_page_cannot_drive_the_server(rl_server):
    """What a page on another site can send without a CORS preflight, refused one by one; the same
    requests from a same-origin client (or curl, which sends no Origin) are served."""
    b, s = rl_server
    page = {"origin": "https://attacker.example"}
    with httpx.Client(base_url=s.url, timeout=30) as c:
        # a simple cross-site POST: text/plain body read as JSON before
        r = c.post("/v1/chat/completions", content=CHAT, headers={"content-type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json", **page})
        assert r.status_code == 403
        assert c.post("/pause", params={"mode": "abort"}, headers=page).status_code == 403
        assert c.get("/is_paused").json() == {"is_paused": False}
        r = c.post("/update_weight_version", content='{"new_version": "evil"}',
                   headers={"content-type": "text/plain"})
        assert r.status_code == 415
        r = c.post("/collective_rpc", content='{"method": "reload_weights", "kwargs": {"weights_path": "/tmp"}}',
                   headers={"content-type": "application/x-www-form-urlencoded", **page})
        assert r.status_code == 403 and not hasattr(b, "reloaded")
        # DNS rebinding: the page's own name in Host
        assert c.get("/health", headers={"host": "attacker.example"}).status_code == 421
        r = c.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json",
                                                                  "host": f"rebind.attacker.example:{s.port}"})
        assert r.status_code == 421
        # any loopback name is the server's own
        assert c.get("/health", headers={"host": f"127.0.0.2:{s.port}"}).status_code == 200
        assert c.get("/health", headers={"host": f"localhost:{s.port}"}).status_code == 200
        r = c.post("/v1/chat/completions", content=CHAT,
                   headers={"content-type": "application/json; charset=utf-8", "origin": s.url})
        assert r.status_code == 200
        assert c.post("/update_weight_version", json={"new_version": "7"}).status_code == 200
        assert c.get("/weight_info").json() == {"weight_version": "7"}


def test_a_connection_that_never_finishes_its_headers_is_closed():
    app = create_app(FakeBackend(), "fake-model")
    with Server(app, http=h11_protocol(header_timeout_s=0.5), timeout_keep_alive=30) as s:
        slow = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        t0 = time.monotonic()
        assert slow.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t0 < 8
        slow.close()
        # complete requests are answered, each within its own deadline on one connection
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as ok:
            for _ in range(3):
                ok.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                got = b""
                while b"fake-model" not in got:
                    chunk = ok.recv(4096)
                    assert chunk, f"closed after {got!r}"
                    got += chunk
                assert got.startswith(b"HTTP/1.1 200")
                time.sleep(0.3)  # 0.9 s in all: longer than one deadline, shorter than each request's own


def test_only_the_image_formats_a_chat_client_sends_reach_a_decoder():
    import base64

    from paravt.serve.errors import PayloadError
    from paravt.serve.images import open_image

    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nnewpath 0 0 moveto showpage\n%%EOF\n"
    with pytest.raises(PayloadError, match="could not be decoded as PNG, JPEG, WEBP, GIF, BMP, TIFF"):
        open_image("data:image/png;base64," + base64.b64encode(eps).decode())
    import io

    from PIL import Image

    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        buf = io.BytesIO()
        Image.new("RGB", (8, 6), "red").save(buf, format=fmt)
        assert open_image("data:image/x;base64," + base64.b64encode(buf.getvalue()).decode()).size == (8, 6)


def test_a_body_that_stops_arriving_gets_408(monkeypatch):
    import paravt.serve.app as serve_app

    monkeypatch.setattr(serve_app, "BODY_TIMEOUT_S", 0.5)
    with Server(create_app(FakeBackend(), "fake-model")) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"messages\": [")
            got = b""
            while b"did not arrive" not in got:
                chunk = c.recv(4096)
                assert chunk, got
                got += chunk
        assert got.startswith(b"HTTP/1.1 408")


def test_a_client_that_leaves_mid_body_is_one_log_line(caplog):
    import logging

    caplog.set_level(logging.INFO, logger="paravt.serve")
    with Server(create_app(FakeBackend(), "fake-model")) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"messages\": [")
            time.sleep(0.3)
        deadline = time.time() + 10
        while not [r for r in caplog.records if "disconnected" in r.getMessage()] and time.time() < deadline:
            time.sleep(0.05)
        assert httpx.get(s.url + "/health").status_code == 200
    mine = [r for r in caplog.records if r.name == "paravt.serve"]
    assert [r.getMessage() for r in mine] == ["client disconnected before its request was read: POST "
                                              "/v1/chat/completions"]
    assert all(r.exc_info is None for r in mine)


def test_origins_are_compared_as_browsers_send_them():
    from paravt.webguard import origin_of

    assert origin_of("http://Localhost:5173/") == "http://localhost:5173"
    assert origin_of("HTTPS://App.Example:443") == "https://app.example"
    assert origin_of("http://[::1]:3000") == "http://[::1]:3000"
    for bad in ("localhost:5173", "http://localhost:5173/app", "ftp://x", "http://", "http://a:99999"):
        with pytest.raises(ValueError, match="not an origin"):
            origin_of(bad)
    ok = {"host": "127.0.0.1:8000", "content-type": "application/json", "origin": "http://localhost:5173"}
    assert refusal("POST", "/v1/chat/completions", ok, True, (), (origin_of("http://LOCALHOST:5173"),)) is None


def test_without_a_key_beyond_loopback_only_ip_addresses_and_given_names_are_answered():
    """Bound to 0.0.0.0 without --api-key: a DNS-rebinding page reaches the server under a name of its
    own, which the page's Origin then matches; such a Host is refused, an IP address or a name the
    server was given is answered."""
    from paravt.serve.command import hosts_without_key

    assert hosts_without_key("127.0.0.1", None) is None and hosts_without_key("0.0.0.0", "key") is None
    named = hosts_without_key("0.0.0.0", None, ("GPU-Box.lan.",))
    assert "gpu-box.lan" in named and socket.gethostname().lower() in named
    assert "trainer.internal" in hosts_without_key("trainer.internal", None)
    with Server(create_app(FakeBackend(), "fake-model", named_hosts=named)) as s, \
            httpx.Client(base_url=s.url, timeout=30) as c:
        rebind = "rebind.attacker.example"
        r = c.post("/v1/chat/completions", content=CHAT, headers={
            "content-type": "application/json", "host": f"{rebind}:{s.port}", "origin": f"http://{rebind}:{s.port}"})
        assert r.status_code == 421 and "--api-key" in r.json()["error"]["message"]
        for host in (f"10.1.2.3:{s.port}", f"[fe80::1]:{s.port}", f"gpu-box.lan:{s.port}", f"localhost:{s.port}"):
            assert c.get("/health", headers={"host": host}).status_code == 200, host


def test_a_clients_mistake_is_reported_as_the_clients():
    with Server(create_app(FakeBackend(), "fake-model")) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/v1/chat/completions", content=CHAT)  # curl -d: form-encoded
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
        r = c.post("/v1/chat/completions", content="{", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


PAGE = """<!doctype html><script>
async function ask(url) {
  try {
    const r = await fetch(url + "/v1/chat/completions", {method: "POST", headers: {"Content-Type": "application/json",
      "Authorization": "Bearer k"}, body: JSON.stringify({messages: [{role: "user", content: "hi"}], max_tokens: 4})});
    return r.status + " " + (await r.json()).choices[0].message.content;
  } catch (e) { return "blocked: " + e; }
}
</script>"""


def test_a_browser_front_end_on_an_allowed_origin_can_call_the_server(browser):
    """Debian's chromium, a page on another origin (another port) POSTing JSON with a bearer key: the
    preflight is answered for --allow-origin's origin (given in another case than the browser sends),
    and refused for any other page."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    page_app = Starlette(routes=[Route("/", lambda request: HTMLResponse(PAGE))])
    with Server(page_app) as page:
        allowed = f"http://LOCALHOST:{page.port}/"
        with Server(create_app(FakeBackend(), "fake-model", api_key="k", loopback_only=True,
                               allowed_origins=(allowed,))) as api:
            ctx = browser.new_context()
            try:
                tab = ctx.new_page()
                tab.goto(f"http://localhost:{page.port}/")
                got = tab.evaluate("url => ask(url)", api.url)
                assert got.startswith("200 "), got
                tab.goto(f"http://127.0.0.1:{page.port}/")  # the same page on an origin not let in
                assert tab.evaluate("url => ask(url)", api.url).startswith("blocked"), "a foreign origin got through"
            finally:
                ctx.close()
