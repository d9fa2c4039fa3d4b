"""Peak memory (RSS) of a `paravt serve` process under requests that carry large images.

Each request carries 16 images of 4096x4096 (half JPEG, half PNG, made in memory: smooth
gradients with shapes, so 16 of them fit the 64 MB body cap as a client would send them) and
asks for 4 greedy tokens. For each concurrency level (default 1, 4 and 16 requests at once) a
fresh server is started on 127.0.0.1, the requests are sent together, and the server's RSS is
sampled every 20 ms; its kernel high-water mark (VmHWM) is the peak, and its RSS 3 s after the
last answer is what stays. A server whose RSS passes --rss-cap-mb is killed (the row says so),
and every run is bounded by --timeout. Linux only (reads /proc).

    .venv/bin/python benchmarks/bench_serve_memory.py [--concurrency 1,4,16] [--model DIR]
        [--pythonpath DIR] [--rss-cap-mb 8000] [--timeout 300] [--json out.json]

--pythonpath puts another copy of the package first on the server's path (to measure an older
version against this one with the same script).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from paravt.procs import free_port

SIDE = 4096
N_IMAGES = 16
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "src" / "paravt" / "assets" / "tiny-paravt"


def big_image(seed: int) -> np.ndarray:
    """A 4096x4096 RGB picture that compresses like a photo of simple scenes (gradients, discs)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    rng = np.random.default_rng(seed)
    img = np.stack([x * 255, y * 255, (1 - x) * 200 + 30 * np.sin(20 * y)], -1)
    for cx, cy, r in rng.uniform(0.1, 0.9, (6, 3)):
        img[(x - cx) ** 2 + (y - cy) ** 2 < (r / 4) ** 2] = rng.uniform(0, 255, 3)
    return img.astype(np.uint8)


def data_url(img: np.ndarray, fmt: str) -> str:
    from PIL import Image

    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
    else:
        Image.fromarray(img).save(buf, format="PNG", compress_level=6)
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode()


def request_body() -> bytes:
    """One /v1/chat/completions body: 8 JPEG + 8 PNG images of 4096x4096 (4 distinct pictures each)."""
    urls = []
    for i in range(N_IMAGES):
        fmt = "jpeg" if i % 2 == 0 else "png"
        urls.append((i % 4, fmt))
    cache = {key: data_url(big_image(key[0]), key[1]) for key in set(urls)}
    parts = [{"type": "image_url", "image_url": {"url": cache[key]}} for key in urls]
    parts.append({"type": "text", "text": "What is shown?"})
    return json.dumps({"messages": [{"role": "user", "content": parts}], "max_tokens": 4,
                       "temperature": 0}).encode()


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def start_server(model: str, pythonpath: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "paravt", "serve", "--model", model, "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"paravt serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise SystemExit("paravt serve did not come up in 180 s")
        time.sleep(0.2)


def run_level(n: int, body: bytes, model: str, pythonpath: str | None, cap_mb: float, timeout: float) -> dict:
    """n requests at once against a fresh server; its peak and settled RSS."""
    proc, url = start_server(model, pythonpath)
    start_rss = rss_mb(proc.pid)
    statuses: list = [None] * n
    killed = threading.Event()

    def send(i: int) -> None:
        try:
            r = httpx.post(url + "/v1/chat/completions", content=body, timeout=timeout,
                           headers={"content-type": "application/json"})
            statuses[i] = r.status_code
        except httpx.HTTPError as e:
            statuses[i] = type(e).__name__

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    peak = start_rss
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_mb(proc.pid))
        if peak > cap_mb or time.perf_counter() - t0 > timeout:
            killed.set()
            proc.kill()
            break
        time.sleep(0.02)
    for t in threads:
        t.join(10)
    wall = time.perf_counter() - t0
    after = float("nan")
    if not killed.is_set():
        time.sleep(3)
        after = rss_mb(proc.pid)
        peak = max(peak, rss_mb(proc.pid, "VmHWM"))
    proc.kill()
    proc.wait(10)
    return {"concurrency": n, "statuses": statuses, "rss_start_mb": round(start_rss), "rss_peak_mb": round(peak),
            "rss_after_mb": None if after != after else round(after), "wall_s": round(wall, 1),
            "killed": killed.is_set(), "cap_mb": cap_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--pythonpath", help="a src/ directory whose paravt the server runs instead of this one")
    ap.add_argument("--rss-cap-mb", type=float, default=8000, help="kill the server past this RSS")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one concurrency level may take")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    t = time.perf_counter()
    body = request_body()
    print(f"request body: {len(body) / 2**20:.1f} MB, {N_IMAGES} images of {SIDE}x{SIDE} "
          f"(made in {time.perf_counter() - t:.0f} s)", flush=True)
    rows = []
    for n in (int(x) for x in args.concurrency.split(",")):
        row = run_level(n, body, args.model, args.pythonpath, args.rss_cap_mb, args.timeout)
        rows.append(row)
        ok = sum(s == 200 for s in row["statuses"])
        note = f" KILLED past {args.rss_cap_mb:.0f} MB" if row["killed"] else ""
        print(f"{n:>3} at once: peak RSS {row['rss_peak_mb']:>6} MB (start {row['rss_start_mb']} MB, "
              f"after {row['rss_after_mb']} MB), {ok}/{n} answered 200 {sorted(set(map(str, row['statuses'])))}, "
              f"{row['wall_s']} s{note}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
