"""`paravt mcp` driven by the official `mcp` client (2.x), over stdio and over streamable HTTP, in both
protocol eras (2026-07-28's `server/discover`, and the `initialize` handshake mcp 1.x clients such as
lmms-eval's open with), as an agent or lmms-eval would: every tool listed and called on a SynthVT video
with the shipped tiny model, what each returns checked against paravt's own episode code, and what
must be refused refused (a path outside the media root, a link out, `..`, a URL, a window outside the
video, a file that is no video; a foreign Origin or Host on HTTP). Faults (deadlines, a client that
leaves, hostile HTTP bodies): tests/test_mcp_faults.py."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

from servetools import Server, paravt_server

if TYPE_CHECKING:
    from mcp import StdioServerParameters

# the SDK is imported by the tests that use it: a worker that runs no MCP test never loads it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mcp") is None,
                                reason="the mcp package is not installed (pip install -e '.[test]')")

QUESTION = "What colour was the circle? Answer with one word."
TOOLS = {"crop_video", "watch_window", "ask_video"}


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    """A media root with the demo's SynthVT-mini video (at K = 4 the shipped model crops it), a file that
    is no video and a link out of the root, and a video outside the root."""
    from paravt.demo import DEMO_SEED
    from paravt.synth.dataset import MINI_TASK
    from paravt.synth.render import make_spec, write_video

    base = tmp_path_factory.mktemp("mcp")
    root, outside = base / "media", base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    spec = make_spec(DEMO_SEED, min_len=MINI_TASK["min_len"], max_len=MINI_TASK["max_len"],
                     n_events=MINI_TASK["n_events"], event_len=(MINI_TASK["event_min"], MINI_TASK["event_max"]))
    assert f"What colour was the {spec.events[0].shape}? Answer with one word." == QUESTION
    video = write_video(spec, root / "sub" / "v.mp4")
    shutil.copy(video, outside / "secret.mp4")
    (root / "broken.mp4").write_bytes(b"this is not a video" * 100)
    (root / "link.mp4").symlink_to(outside / "secret.mp4")
    return {"root": root, "video": video, "outside": outside / "secret.mp4", "base": base}


@pytest.fixture(scope="module")
def script(media) -> Path:
    """A server script bound to the media root, K = 4 and the shipped model (`--write-script`)."""
    out = media["base"] / "server" / "paravt_mcp.py"
    r = subprocess.run([sys.executable, "-m", "paravt", "mcp", "--media-root", str(media["root"]), "--frames", "4",
                        "--write-script", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return out


def run(coro):
    return asyncio.run(coro)


ERA = {"auto": "2026-07-28", "legacy": "2025-11-25"}  # the official client's modes, and the era each opens


async def session(target, work, mode: str = "auto"):
    """The official client on `target` (stdio parameters, or an HTTP URL), connected in the era `mode`
    opens: "auto" probes server/discover (2026-07-28), "legacy" runs the initialize handshake."""
    from mcp import Client

    async with Client(target, mode=mode) as client:
        assert client.protocol_version == ERA[mode]
        return await work(client)


def script_params(script: Path, command: str = sys.executable) -> StdioServerParameters:
    """How lmms-eval starts it: `python SCRIPT`, no arguments, the SDK's minimal environment."""
    from mcp import StdioServerParameters

    return StdioServerParameters(command=command, args=[str(script)])


def decode_png(data: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


def error_text(result) -> str:
    assert result.is_error, result
    return result.content[0].text


# ---------- stdio: every tool, checked against paravt's own code ----------

async def _all_tools(session):
    tools = {t.name: t for t in (await session.list_tools()).tools}
    crop = await session.call_tool("crop_video", {"video_path": "sub/v.mp4", "start_time": 3, "end_time": 9.5})
    watch = await session.call_tool("watch_window", {"video_path": "sub/v.mp4", "start_time": 0, "end_time": 20,
                                                     "question": QUESTION})
    ask = await session.call_tool("ask_video", {"video_path": "sub/v.mp4", "question": QUESTION, "frames": 4})
    return tools, crop, watch, ask


def test_stdio_lists_and_calls_every_tool(media, script):
    from paravt.agent import EpisodeConfig, run_episode_sync
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt import DEFAULT_MODEL
    from paravt.video import VideoReader

    def reference():  # the episode paravt runs in-process, while the server works (another process)
        return run_episode_sync(HFBackend(*load_model(str(DEFAULT_MODEL))), str(media["video"]), QUESTION,
                                EpisodeConfig(frames=4), question_type="oe")

    with ThreadPoolExecutor(1) as pool:
        episode = pool.submit(reference)
        tools, crop, watch, ask = run(session(script_params(script), _all_tools))
        ep = episode.result()
    assert set(tools) == TOOLS
    schema = tools["crop_video"].input_schema  # LongVT's example server's names
    assert {"video_path", "start_time", "end_time"} <= set(schema["required"])
    assert schema["properties"]["start_time"]["type"] == "number"

    # crop_video: the frames a sub-agent sees (1 fps, <= 16, 224x224 budget), each after its time
    assert not crop.is_error
    cfg = EpisodeConfig()
    with VideoReader(media["video"]) as reader:
        frames = reader.crop(3, 9.5, fps=cfg.sub_fps, max_frames=cfg.sub_max_frames)
    images = [c for c in crop.content if c.type == "image"]
    texts = [c.text for c in crop.content if c.type == "text"]
    assert len(images) == len(frames) == 6 and all(c.mime_type == "image/png" for c in images)
    for img, f in zip(images, frames):
        assert np.array_equal(decode_png(img.data), f.image)  # PNG: the very pixels
    assert texts[1:] == [f"<{f.timestamp:.1f} seconds>" for f in frames]
    assert crop.structured_content["frame_times"] == [f.timestamp for f in frames]
    assert crop.structured_content["start"] == 3 and crop.structured_content["end"] == 9.5

    # watch_window: a sub-agent's summary of the window (16 frames of 20 s), on the shipped model
    assert not watch.is_error and watch.structured_content["summary"]
    assert len(watch.structured_content["frame_times"]) == 16
    assert watch.content[0].text.endswith(watch.structured_content["summary"])

    # ask_video: the episode paravt runs in-process, the same answer, calls and summaries
    assert not ask.is_error
    got = ask.structured_content
    assert ep.n_executed_calls >= 2 and got["n_executed_calls"] == ep.n_executed_calls  # it cropped
    assert got["answer"] == ep.answer and got["frames"] == 4 and got["mode"] == "parallel"
    want = [[(c.start, c.end, c.response if c.status == "ok" else None) for c in t.calls] for t in ep.turns]
    assert [[(c["start"], c["end"], c["summary"]) for c in t["calls"]] for t in got["turns"]] == want
    assert ask.content[0].text.startswith(f"Answer: {ep.answer}")


async def _refusals(session, media):
    calls = {
        "absolute outside": ("crop_video", {"video_path": str(media["outside"]), "start_time": 0, "end_time": 5}),
        "dotdot": ("crop_video", {"video_path": "../outside/secret.mp4", "start_time": 0, "end_time": 5}),
        "dotdot inside": ("crop_video", {"video_path": str(media["root"] / ".." / "outside" / "secret.mp4"),
                                         "start_time": 0, "end_time": 5}),
        "link out": ("crop_video", {"video_path": "link.mp4", "start_time": 0, "end_time": 5}),
        "url": ("crop_video", {"video_path": "http://127.0.0.1:9/v.mp4", "start_time": 0, "end_time": 5}),
        "file url": ("watch_window", {"video_path": "file:///etc/passwd", "start_time": 0, "end_time": 5}),
        "ftp": ("crop_video", {"video_path": "ftp://127.0.0.1/v.mp4", "start_time": 0, "end_time": 5}),
        "missing": ("crop_video", {"video_path": "sub/nope.mp4", "start_time": 0, "end_time": 5}),
        "not a video": ("crop_video", {"video_path": "broken.mp4", "start_time": 0, "end_time": 5}),
        "after the end": ("crop_video", {"video_path": "sub/v.mp4", "start_time": 500, "end_time": 600}),
        "backwards": ("crop_video", {"video_path": "sub/v.mp4", "start_time": 9, "end_time": 3}),
        "negative": ("watch_window", {"video_path": "sub/v.mp4", "start_time": -4, "end_time": 3}),
        "no end": ("crop_video", {"video_path": "sub/v.mp4", "start_time": 3}),
        "not a time": ("crop_video", {"video_path": "sub/v.mp4", "start_time": "soon", "end_time": 5}),
        "ask outside": ("ask_video", {"video_path": str(media["outside"]), "question": QUESTION}),
        "ask K": ("ask_video", {"video_path": "sub/v.mp4", "question": QUESTION, "frames": 100000}),
    }
    out = {name: await session.call_tool(tool, args) for name, (tool, args) in calls.items()}
    # the server is still there after them all
    out["after"] = await session.call_tool("crop_video", {"video_path": str(media["video"]), "start_time": 60,
                                                          "end_time": 1000})
    return out


def test_refusals_are_tool_errors_and_the_server_goes_on(media, script):
    out = run(session(script_params(script), lambda s: _refusals(s, media), mode="legacy"))
    outside = "is outside the media root"
    for name in ("absolute outside", "dotdot", "dotdot inside", "link out", "ask outside", "file url"):
        assert outside in error_text(out[name]), name
    assert "reads no URLs" in error_text(out["url"]) and "--allow-urls" in error_text(out["url"])
    assert "only files under the media root" in error_text(out["ftp"])
    assert "not a video file under the media root" in error_text(out["missing"])
    assert "cannot read the video" in error_text(out["not a video"])
    assert "start_time 500 is outside the video, which lasts" in error_text(out["after the end"])
    assert "must be smaller than end_time" in error_text(out["backwards"])
    assert "negative" in error_text(out["negative"])
    assert error_text(out["no end"]).endswith("crop_video: end_time: Field required")
    assert "start_time: Input should be a valid number" in error_text(out["not a time"])
    assert "frames must be a whole number from 1 to 256" in error_text(out["ask K"])
    for name, r in out.items():  # one line naming the tool, as FastMCP reports a tool's exception
        if name != "after":
            assert error_text(r).startswith("Error executing tool ") and "\n" not in error_text(r), name
    after = out["after"]  # an end past the video is clamped, as in the episode
    assert not after.is_error and after.structured_content["end"] == after.structured_content["duration"]


# ---------- lmms-eval's way: `python SCRIPT`, a new process per call, minimal environment ----------

def test_written_script_runs_under_another_python_a_process_per_call(media, script):
    """The SDK passes only PATH, HOME, ...: the script finds paravt's interpreter itself (here it is
    started by the base interpreter, which has no paravt), and each call is a fresh process whose
    crop imports no model code."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not base.exists() or sys.prefix == sys.base_prefix:
        pytest.skip("no base interpreter outside the virtual environment")
    text = script.read_text()
    assert repr(str(media["root"])) in text and sys.executable in text
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        res = run(session(script_params(script, str(base)), lambda s: s.call_tool(
            "crop_video", {"video_path": str(media["video"]), "start_time": 10, "end_time": 14})))
        seconds.append(time.perf_counter() - t0)
        assert not res.is_error and len([c for c in res.content if c.type == "image"]) == 4
    print(f"stdio session to first crop_video result: {min(seconds):.2f} s")


def test_crop_video_imports_no_model_code(media):
    code = f"""
import asyncio, sys
from mcp import Client
from paravt.integrations.mcp.server import build_server
from paravt.integrations.mcp.settings import McpSettings

async def main():
    server = build_server(McpSettings(media_root={str(media['root'])!r}))
    async with Client(server) as s:
        r = await s.call_tool("crop_video", {{"video_path": "sub/v.mp4", "start_time": 1, "end_time": 3}})
        assert not r.is_error, r
    print(sorted(m for m in ("torch", "transformers", "paravt.backends.hf", "paravt.models") if m in sys.modules))

asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_write_script_and_client_config(media, tmp_path):
    from paravt.integrations.mcp.settings import McpSettings, client_config, write_script

    s = McpSettings(media_root=str(media["root"]), model="http://127.0.0.1:8000", api_key="k3y", frames=8)
    path = write_script(tmp_path / "s.py", s)
    assert path.stat().st_mode & 0o077 == 0  # a key inside: the owner's only
    ns: dict = {}
    exec(compile(path.read_text().split("if sys.prefix")[0], str(path), "exec"), ns)
    assert McpSettings.from_dict(ns["SETTINGS"]) == s
    cfg = client_config(s)["mcpServers"]["paravt"]
    assert cfg["command"] == sys.executable
    assert cfg["args"][:3] == ["-m", "paravt", "mcp"] and "--media-root" in cfg["args"] and "k3y" not in cfg["args"]
    assert cfg["env"] == {"PARAVT_API_KEY": "k3y"}
    r = subprocess.run([sys.executable, "-m", "paravt", "mcp", "--media-root", str(media["root"]), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["mcpServers"]["paravt"]["args"][-1] == str(media["root"])
    with pytest.raises(ValueError, match="unknown MCP setting"):
        McpSettings.from_dict({"media": "x"})
    r = subprocess.run([sys.executable, "-m", "paravt", "mcp", "--media-root", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a directory" in r.stderr


# ---------- streamable HTTP on loopback, behind paravt.webguard ----------

@pytest.fixture(scope="module")
def model_url():
    """The shipped model behind paravt serve's app, in this process: the HTTP server's model is its
    URL (`--model URL`, as in front of vLLM or a `paravt serve` of one's own)."""
    from paravt import DEFAULT_MODEL
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.serve import create_app

    with Server(create_app(HFBackend(*load_model(str(DEFAULT_MODEL), device="cpu")), "tiny-paravt")) as s:
        yield s.url


@pytest.fixture(scope="module")
def http_mcp(media, model_url):
    """`paravt mcp --http` on the shipped model's URL; yields (its /mcp URL, its process)."""
    with paravt_server("mcp", "--http", "--media-root", str(media["root"]), "--frames", "4", "--model", model_url,
                       ready="/mcp", any_answer=True, timeout_s=60) as (url, proc):
        yield url + "/mcp", proc


@pytest.fixture(scope="module")
def http_server(http_mcp) -> str:
    return http_mcp[0]


def test_http_lists_and_calls_every_tool(http_mcp, media):
    """Every tool over streamable HTTP, watch_window and ask_video on a model URL: the server's
    process loads no model code for them (no torch in its memory map)."""
    url, proc = http_mcp
    tools, crop, watch, ask = run(session(url, _all_tools))
    assert set(tools) == TOOLS
    assert not crop.is_error and len([c for c in crop.content if c.type == "image"]) == 6
    assert not watch.is_error and watch.structured_content["summary"]
    assert not ask.is_error and ask.structured_content["frames"] == 4
    assert ask.structured_content["n_executed_calls"] >= 2  # the shipped model cropped, as over stdio
    assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_serves_both_protocol_eras(http_server, media, mode):
    async def work(s):
        crop = await s.call_tool("crop_video", {"video_path": "sub/v.mp4", "start_time": 3, "end_time": 9.5})
        refused = await s.call_tool("crop_video", {"video_path": str(media["outside"]), "start_time": 0, "end_time": 5})
        return crop, refused

    from paravt.video import VideoReader

    crop, refused = run(session(http_server, work, mode))
    with VideoReader(media["video"]) as reader:
        want = [f.timestamp for f in reader.crop(3, 9.5)]
    assert not crop.is_error and crop.structured_content["frame_times"] == want
    assert len([c for c in crop.content if c.type == "image"]) == len(want) == 6
    assert "is outside the media root" in error_text(refused)


def test_http_refuses_what_a_web_page_could_send(http_server):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(http_server, json=body, headers={**accept, "Origin": "http://evil.example"})
    assert r.status_code == 403 and "cross-origin" in r.json()["error"]
    r = httpx.post(http_server, json=body, headers={**accept, "Host": "evil.example"})
    assert r.status_code == 421
    r = httpx.post(http_server, content=json.dumps(body), headers={**accept, "Content-Type": "text/plain"})
    assert r.status_code == 415


def test_http_binds_loopback_only(media):
    """A bind beyond loopback, or an --allow-origin that is no origin, is refused before the SDK is
    imported (`-X importtime` lists every module the command imported)."""
    for flags, said in ((["--host", "0.0.0.0"], "loopback address only"),
                        (["--allow-origin", "localhost:5173"], "not an origin: 'localhost:5173'")):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "paravt", "mcp", "--http", *flags, "--media-root",
                            str(media["root"])], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and said in r.stderr, r.stderr[-2000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
        assert "paravt.cli" in imported and not {"mcp", "paravt.integrations.mcp.server"} & imported


def test_a_server_bound_to_one_video_reads_it_whatever_a_call_names(media):
    """`--video FILE`: every call reads that file, with or without a video_path (a model trained on
    paravt's schema writes none; lmms-eval passes the model's arguments as they are), and a path the
    model writes opens nothing else (paravt's rule: the model never chooses the file). The tools keep
    LongVT's schema."""
    out = media["base"] / "bound" / "paravt_mcp.py"
    r = subprocess.run([sys.executable, "-m", "paravt", "mcp", "--video", str(media["video"]), "--write-script",
                        str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

    async def work(client):
        schema = {t.name: t for t in (await client.list_tools()).tools}["crop_video"].input_schema
        bare = await client.call_tool("crop_video", {"start_time": 3, "end_time": 6})
        other = await client.call_tool("crop_video", {"video_path": str(media["outside"]), "start_time": 3,
                                                       "end_time": 6})
        return schema, bare, other

    schema, bare, other = run(session(script_params(out), work))
    assert "video_path" in schema["required"]
    for result in (bare, other):
        assert not result.is_error, result
        assert result.structured_content["frame_times"] == [3.5, 4.5, 5.5]
        assert result.content[0].text.startswith("Frames of 3.0-6.0 s of v.mp4")
    r = subprocess.run([sys.executable, "-m", "paravt", "mcp", "--video", str(media["base"] / "nope.mp4"),
                        "--print-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a file" in r.stderr


# ---------- an mcp 1.x client (lmms-eval 0.7.3's kind), opt-in ----------

V1_PYTHON = os.environ.get("PARAVT_MCP_V1_PYTHON")  # a Python whose mcp is 1.x, e.g. .venv-lmms/bin/python
V1_CLIENT = """
import asyncio, json, sys
from datetime import timedelta
from importlib.metadata import version
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

script, video, url = sys.argv[1:]

async def use(read, write):  # as lmms-eval's MCPClient: initialize, list the tools, call one
    async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=300)) as s:
        init = await s.initialize()
        tools = (await s.list_tools()).tools
        crop = await s.call_tool("crop_video", {"video_path": video, "start_time": 3, "end_time": 9.5})
        bad = await s.call_tool("crop_video", {"video_path": "../outside/secret.mp4", "start_time": 0, "end_time": 5})
        return {"protocol": init.protocolVersion, "server": init.serverInfo.name, "tools": sorted(t.name for t in tools),
                "required": sorted(next(t for t in tools if t.name == "crop_video").inputSchema["required"]),
                "images": sum(c.type == "image" for c in crop.content), "crop_error": crop.isError,
                "times": crop.structuredContent["frame_times"], "bad": bad.content[0].text, "bad_error": bad.isError}

async def main():
    out = {"mcp": version("mcp")}
    async with stdio_client(StdioServerParameters(command=sys.executable, args=[script])) as (r, w):
        out["stdio"] = await use(r, w)
    async with streamablehttp_client(url) as (r, w, _):
        out["http"] = await use(r, w)
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.skipif(not V1_PYTHON, reason="opt-in: PARAVT_MCP_V1_PYTHON=a Python with mcp 1.x (.venv-lmms/bin/python, "
                                          "or a venv with `pip install 'mcp<2'`) runs an mcp 1.x client")
def test_an_mcp_1x_client_over_stdio_and_http(media, script, http_server):
    """lmms-eval 0.7.3's client code (mcp 1.x: ClientSession, the initialize handshake) against this
    server on mcp 2.x: over stdio it starts the written script with its own Python (which has no
    paravt; the script runs itself again under paravt's), and over streamable HTTP."""
    from paravt.video import VideoReader

    r = subprocess.run([V1_PYTHON, "-c", V1_CLIENT, str(script), str(media["video"]), http_server],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mcp"].startswith("1."), out["mcp"]
    with VideoReader(media["video"]) as reader:
        want = [f.timestamp for f in reader.crop(3, 9.5)]
    for transport in ("stdio", "http"):
        got = out[transport]
        assert got["server"] == "paravt" and set(got["tools"]) == TOOLS, got
        assert got["required"] == ["end_time", "start_time", "video_path"]
        assert not got["crop_error"] and got["images"] == 6 and got["times"] == want
        assert got["bad_error"] and "is outside the media root" in got["bad"]
    print(f"mcp {out['mcp']} client: protocol {out['stdio']['protocol']} (stdio), {out['http']['protocol']} (http)")
