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


def machine(out: Path, dec: dict | None) -> str:
    """The GPU, driver and memory as gpu.sh saw them (machine.txt), else as nvidia-smi says now."""
    smi = (out / "machine.txt").read_text().strip() if (out / "machine.txt").exists() else ""
    try:
        smi = smi or subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                     "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    d = dec or {}
    return (f"- device: {smi or d.get('device_name', '?')}\n- torch {d.get('torch', '?')}, transformers "
            f"{d.get('transformers', '?')}\n")


def decode_table(d: dict) -> str:
    """tok/s per batch and decode path, each path's first call (its capture or compile) beside it;
    a path stopped part-way (its time limit, an error) shows what it reached."""
    modes = list(d.get("decode", {}))
    batches = []
    for m in modes:
        batches += [b for b in d["decode"][m] if b.isdigit() and b not in batches]

    def cell(m: str, b: str) -> str:
        r = d["decode"][m].get(b)
        if not r:
            return "—"
        alone = f"{r['decode_tok_s']:.0f} / " if "decode_tok_s" in r else ""
        return f"{alone}{r['tok_s']:.0f} ({r['first_call_s']:.1f} s)"

    split = any("decode_tok_s" in r for m in modes for r in d["decode"][m].values() if isinstance(r, dict))
    what = "tok/s decoding / with the prefill" if split else "tok/s with the prefill"
    rows = ["| batch | " + " | ".join(f"{m}: {what} (first call)" for m in modes) + " |",
            "|---|" + "---|" * len(modes)]
    rows += [f"| {b} | " + " | ".join(cell(m, b) for m in modes) + " |" for b in batches]
    text = "\n".join(rows) + "\n\n"
    if "bandwidth_gbs" in d:
        shares = ", ".join(f"{m} {100 * d[f'batch1_share_of_limit/{m}']:.1f} %" for m in modes
                           if f"batch1_share_of_limit/{m}" in d)
        text += (f"Measured copy bandwidth {d['bandwidth_gbs']:.0f} GB/s; text weights {d['text_weight_gb']:.2f} GB: "
                 f"batch-1 limit {d['limit_batch1_tok_s']:.0f} tok/s; batch 1 reaches {shares} of it. ")
    same = {m: d["decode"][m]["1"].get("greedy_same_as_eager") for m in modes if "1" in d["decode"][m]}
    same = {m: n for m, n in same.items() if n is not None}
    if same:
        text += ("Greedy tokens at batch 1 equal to eager's: " + ", ".join(f"{m} the first {n} of {d.get('tokens', '?')}"
                                                                         for m, n in same.items()) + ". ")
        for m in same:
            r = d["decode"][m]["1"]
            if r.get("max_logprob_diff_while_equal") is not None:
                text += f"{m}: the chosen tokens' log π differ by at most {r['max_logprob_diff_while_equal']:.3g} while equal"
                part = r.get("logprobs_where_they_part")
                text += (f"; where they part, eager's choice has log π {part[0]:.3f} and {m}'s {part[1]:.3f} (each "
                         "in its own path's distribution). " if part else ". ")
    if "prefill_s" in d:
        text += f"Prefill of {d['prefill_frames']} frames: {d['prefill_s']:.2f} s. "
    if "generate_batch1_tok_s" in d:
        text += f"transformers `generate`, batch 1: {d['generate_batch1_tok_s']:.1f} tok/s."
    text += "\n"
    for m in modes:
        if "capture_failed" in d["decode"][m]:
            text += f"\n{m}: capturing failed, its steps ran eagerly: `{d['decode'][m]['capture_failed']}`\n"
    for name, err in d.get("errors", {}).items():
        text += f"\n{name} failed: `{err}`\n"
    return text


UPDATE_KEYS = ("forward_passes", "tokens", "trained_tokens", "update_s", "tokens_per_s", "mfu", "peak_gpu_gb",
               "peak_rss_gb", "loss", "error")


def update_table(upd: dict) -> str:
    """Packed and padded side by side, the figures that compare them (the rest is in update.json)."""
    modes = [m for m in ("packed", "padded") if upd.get(m)]
    rows = ["| | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    rows += [f"| {k} | " + " | ".join(_fmt(upd[m].get(k)) for m in modes) + " |" for k in UPDATE_KEYS
             if any(upd[m].get(k) is not None for m in modes)]
    first = upd.get("packed") or upd.get("padded") or {}
    return ("\n".join(rows) + f"\n\n{first.get('sequences', '?')} sequences ({first.get('main_tokens', '?')} tokens "
            f"each main one), {first.get('params_b', 0):.2f} B parameters, master weights {first.get('master_dtype')}, "
            f"activation checkpointing {first.get('activation_checkpointing')}.\n")


def episode_table(rows: list) -> str:
    """Wall time of a scripted episode with N crops: in one parallel turn, and one crop a turn."""
    one = rows[0]["parallel"]["wall_s"]
    out = ["| N crops | parallel s (× one crop) | sequential s | sequential / parallel | sub-agent batches (parallel) |",
           "|---|---|---|---|---|"]
    out += [f"| {r['n']} | {r['parallel']['wall_s']:.2f} ({r['parallel']['wall_s'] / one:.2f}×) | "
            f"{r['sequential']['wall_s']:.2f} | {r['sequential']['wall_s'] / r['parallel']['wall_s']:.2f} | "
            f"{r['parallel']['sub_batches']} |" for r in rows]
    return "\n".join(out) + "\n"


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
             "from that run.\n\n", machine(out, dec), "\n### Targets\n",
             "".join(f"- {k}: {v}\n" for k, v in TARGETS.items()),
             "\n### Decode (hf backend)\n", decode_table(dec) if dec else failed(out, "decode"),
             "\n### Update (`bench_update.py`, packed vs padded)\n", update_table(upd) if upd else failed(out, "update"),
             "\n### Parallel episode (`bench_episode.py`)\n", episode_table(epi) if epi else failed(out, "episode")]
    write_section(Path(args.doc), "".join(parts))
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
