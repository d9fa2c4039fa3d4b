"""docs/gpu.md from a `benchmarks/gpu.sh` run's folder: the machine, then each benchmark's figures
beside the issue's targets (a missing or failed step is named with the end of its log)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

TARGETS = {  # what docs/gpu.md compares against (one H100 or H200)
    "decode batch 1": "≥ 60 % of the measured bandwidth limit (H200: ≥ 150 tok/s)",
    "decode batch 32": "≥ 2,500 tok/s",
    "update MFU": "≥ 40 %",
    "parallel episode, 5 crops / 1 crop": "≤ 1.1×",
}


def load(out: Path, name: str) -> dict | list | None:
    p = out / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def failed(out: Path, name: str) -> str:
    rc = (out / f"{name}.rc").read_text().strip() if (out / f"{name}.rc").exists() else "not run"
    tail = (out / f"{name}.log").read_text(errors="replace").strip().splitlines()[-8:] if (out / f"{name}.log").exists() else []
    return f"**{name} failed** (exit {rc}):\n\n```\n" + "\n".join(tail) + "\n```\n"


def machine(dec: dict | None) -> str:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    d = dec or {}
    return (f"- device: {smi or d.get('device_name', '?')}\n- torch {d.get('torch', '?')}, transformers "
            f"{d.get('transformers', '?')}\n")


def decode_table(d: dict) -> str:
    modes = list(d["decode"])
    batches = list(next(iter(d["decode"].values()), {}))
    rows = ["| batch | " + " | ".join(f"{m} tok/s" for m in modes) + " |", "|---|" + "---|" * len(modes)]
    rows += [f"| {b} | " + " | ".join(f"{d['decode'][m][b]['tok_s']:.1f}" for m in modes) + " |" for b in batches]
    shares = ", ".join(f"{m} {100 * d[f'batch1_share_of_limit/{m}']:.1f} %" for m in modes
                       if f"batch1_share_of_limit/{m}" in d)
    return ("\n".join(rows) + f"\n\nMeasured copy bandwidth {d['bandwidth_gbs']:.0f} GB/s; text weights "
            f"{d['text_weight_gb']:.2f} GB: batch-1 limit {d['limit_batch1_tok_s']:.0f} tok/s; batch 1 reaches "
            f"{shares} of it. Prefill of {d['prefill_frames']} frames: {d['prefill_s']:.2f} s. transformers "
            f"`generate`, batch 1: {d['generate_batch1_tok_s']:.1f} tok/s.\n")


def plain_table(obj) -> str:
    if isinstance(obj, dict) and all(isinstance(v, dict) for v in obj.values()):
        keys = sorted({k for v in obj.values() for k in v})
        head = "| | " + " | ".join(obj) + " |\n|---|" + "---|" * len(obj) + "\n"
        return head + "".join(f"| {k} | " + " | ".join(_fmt(v.get(k)) for v in obj.values()) + " |\n" for k in keys)
    if isinstance(obj, list):
        return "```\n" + json.dumps(obj, indent=1)[:4000] + "\n```\n"
    return "".join(f"- {k}: {_fmt(v)}\n" for k, v in (obj or {}).items())


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


BEGIN, END = "<!-- gpu.sh: begin -->", "<!-- gpu.sh: end -->"


def write_section(doc: Path, text: str) -> None:
    """The run's figures between the markers of `doc` (the rest of the page stays), or a new page."""
    page = doc.read_text() if doc.exists() else ""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        page = head + BEGIN + "\n" + text + END + rest.split(END, 1)[1]
    else:
        page = "# paravt on a GPU\n\n## The latest run\n" + BEGIN + "\n" + text + END + "\n"
    doc.write_text(page)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--doc", default="docs/gpu.md")
    args = ap.parse_args()
    out = Path(args.out)
    dec, upd, epi = load(out, "decode"), load(out, "update"), load(out, "episode")
    parts = ["Written by `benchmarks/gpu.sh` (`benchmarks/gpu_report.py`); every figure in this section is "
             "from that run.\n\n", machine(dec), "\n### Targets\n",
             "".join(f"- {k}: {v}\n" for k, v in TARGETS.items()),
             "\n### Decode (hf backend)\n", decode_table(dec) if dec else failed(out, "decode"),
             "\n### Update (`bench_update.py`, packed vs padded)\n", plain_table(upd) if upd else failed(out, "update"),
             "\n### Parallel episode (`bench_episode.py`)\n", plain_table(epi) if epi else failed(out, "episode")]
    write_section(Path(args.doc), "".join(parts))
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
