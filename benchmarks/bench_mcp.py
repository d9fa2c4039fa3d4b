"""Start-up of a stdio session of `paravt mcp`, as lmms-eval pays it on every tool call: its client
starts `python SERVER_PATH` (a script from `paravt mcp --write-script`), initializes, calls one tool
and closes, a new process each time. Timed from the client's start to the tool's result, for
crop_video (no model: the cost to keep low) and watch_window (loads the shipped tiny model in
process), and the server's import time of its modules (`python -X importtime`).

    .venv/bin/python benchmarks/bench_mcp.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def one_call(script: Path, tool: str, args: dict) -> float:
    t0 = time.perf_counter()
    async with stdio_client(StdioServerParameters(command=sys.executable, args=[str(script)])) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    return time.perf_counter() - t0


def import_times() -> dict[str, float]:
    """Cumulative import seconds of what a crop_video call imports, in a fresh interpreter, in the order
    it imports them (a module already imported by an earlier one costs nothing later)."""
    mods = ("paravt.integrations.mcp.server", "paravt.app.media", "paravt.agent", "av", "PIL.Image")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import " + ", ".join(mods)],
                       capture_output=True, text=True, check=True)
    wanted = ("mcp", "numpy", "paravt.video", *mods, "paravt.app")
    out = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
        if m and m.group(3) in wanted and m.group(3) not in out:
            out[m.group(3)] = int(m.group(1)) / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from paravt.synth.render import make_spec, write_video

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "media"
        video = write_video(make_spec(6, min_len=60, max_len=80), root / "v.mp4")
        script = Path(tmp) / "server.py"
        subprocess.run([sys.executable, "-m", "paravt", "mcp", "--media-root", str(root), "--write-script",
                        str(script)], check=True, capture_output=True)
        window = {"video_path": str(video), "start_time": 10, "end_time": 26}
        res = {}
        for tool, args in (("crop_video", window), ("watch_window", {**window, "question": "What happens?"})):
            times = [asyncio.run(one_call(script, tool, args)) for _ in range(a.repeats)]
            res[tool] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
            print(f"{tool:13s} stdio session to result: median {res[tool]['median_s']:.2f} s "
                  f"(min {res[tool]['min_s']:.2f}, max {res[tool]['max_s']:.2f}; {a.repeats} sessions)")
        res["imports_s"] = import_times()
        print("imports (cumulative s): " + ", ".join(f"{k} {v:.2f}" for k, v in res["imports_s"].items()))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
