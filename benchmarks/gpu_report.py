"""docs/gpu.md from a `benchmarks/gpu.sh` run's folder: the machine, each benchmark's figures, where
the time goes (the profiles' breakdown), and the issue's targets, measured and met or not, last (a
missing or failed step is named with the end of its log; a step cut short shows what it reached)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prof_breakdown import table as breakdown_table  # noqa: E402

DEFAULT_PATH = "static-graphs"  # the hf backend's decode on a GPU: the targets are read from it


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


def shapes_table(d: dict) -> str:
    """Decode at the episode shapes: per shape and batch the roofline (the bytes a step must read:
    the weights once and each row's valid KV) and, per decode path, the decode-only rate, its share
    of the roofline, a step's time and the KV the path read; the prefill's rate beside."""
    paths = list(d.get("shapes", {}))
    keys = []
    for m in paths:
        for shape, per in d["shapes"][m].items():
            keys += [(shape, b) for b in per if (shape, b) not in keys]
    if not keys:
        return "No episode shape was measured.\n"

    def first(shape: str, b: str) -> dict:
        return next((d["shapes"][m][shape][b] for m in paths if d["shapes"][m].get(shape, {}).get(b)), {})

    def cell(m: str, shape: str, b: str) -> str:
        r = d["shapes"][m].get(shape, {}).get(b)
        if not r or r.get("decode_tok_s") is None:
            return "—"
        read = f", KV read {r['kv_read_gb_step']:.3g} GB" if r.get("kv_read_gb_step") is not None else ""
        return f"**{r['decode_tok_s']:.0f}** ({100 * r['share_of_limit']:.0f} %), {r['step_ms']:.1f} ms{read}"

    rows = ["| shape, batch (prompt tokens) | roofline tok/s (GB a step: weights + valid KV) | "
            + " | ".join(f"{m}: decode tok/s (% of roofline), step, KV read a step" for m in paths)
            + " | prefill s (tok/s) |", "|---|---|" + "---|" * len(paths) + "---|"]
    for shape, b in keys:
        r = first(shape, b)
        pre = f"{r['prefill_s']:.2f} ({r['prefill_tok_s']:.0f})" if r.get("prefill_tok_s") else "—"
        rows.append(f"| {shape}, {b} ({r.get('prompt_tokens', '?')}) | {r.get('limit_tok_s', 0):.0f} "
                    f"({r.get('weights_gb', 0):.3g} + {r.get('kv_valid_gb_step', 0):.3g}) | "
                    + " | ".join(cell(m, shape, b) for m in paths) + f" | {pre} |")
    text = "\n".join(rows) + "\n\n"
    text += (f"Roofline: measured copy bandwidth {d.get('bandwidth_gbs', 0):.0f} GB/s over the bytes a step must read "
             f"(text weights but the embedding table, {d.get('step_weight_gb', 0):.3g} GB, and "
             f"{d.get('kv_mb_per_token', 0):.3f} MB of KV a context token), {d.get('tokens', '?')} new tokens a row; "
             "decode-only and prefill times from the backend's own clock (HFBackend.timing).\n")
    for m in paths:
        for shape, per in d["shapes"][m].items():
            for b, r in per.items():
                if r.get("capture_failed"):
                    text += f"\n{m}, {shape} {b}: capturing failed, its steps ran eagerly: `{r['capture_failed']}`\n"
    return text


def breakdown_section(dec: dict | None, upd: dict | None) -> str:
    """Where the time goes: the profiled decode calls (their prefill included) and the packed update,
    by category and phase, each a share of its call's wall time (prof_breakdown)."""
    rows = {f"decode {k}": v["breakdown"] for k, v in ((dec or {}).get("profile") or {}).items()
            if isinstance(v, dict) and v.get("breakdown")}
    u = _update_row(upd)
    if (upd or {}).get("profile"):
        rows["update (packed)"] = upd["profile"]
    elif u and u.get("profile"):
        rows["update (packed)"] = u["profile"]
    if not rows:
        return "No profile was written.\n"
    kind = "device (kernel) time" if any(r.get("device") for r in rows.values()) else "CPU time of each op (no device)"
    return breakdown_table(rows) + (f"\nShares of each call's wall time, by {kind}; idle / host gaps: the wall time no "
                                    "kernel ran. Phases overlap the categories (a phase's kernels are in them).\n")


def episodes_table(e: dict) -> str:
    """A batch of episodes, every model call real: episodes per minute, parallel and sequential."""
    out = ["| mode | episodes | wall s | episodes / min | prefill s | decode s | decode tokens | prefills |",
           "|---|---|---|---|---|---|---|---|"]
    for mode, r in e.get("modes", {}).items():
        out.append(f"| {mode} | {r['episodes']} | {r['wall_s']:.2f} | **{r['episodes_per_min']:.1f}** | "
                   f"{r.get('prefill_s', 0):.2f} | {r.get('decode_s', 0):.2f} | {r.get('decode_tokens', 0)} | "
                   f"{len(r.get('prefills', []))} |")
    text = "\n".join(out) + "\n\n"
    text += (f"K = {e.get('frames')}, {e.get('crops')} crops an episode, {e.get('sub_tokens')} tokens a sub-agent, "
             f"decode {e.get('decode')}, frames {e.get('frames_from')}")
    if e.get("sequential_over_parallel"):
        text += f"; sequential / parallel {e['sequential_over_parallel']:.2f}×"
    return text + ".\n"


def targets_table(dec: dict | None, upd: dict | None, epi: list | None) -> str:
    """The issue's targets: what was measured and whether it met each (— where not measured)."""
    def default(group: dict) -> dict:  # the GPU's default path, else (a CPU dry run) the first measured
        return group.get(DEFAULT_PATH) or next(iter(group.values()), {})

    shapes = default((dec or {}).get("shapes") or {})
    short = default({m: r for m, r in ((dec or {}).get("decode") or {}).items() if m != "eager"})
    rows = []

    def add(target: str, measured: str | None, met: bool | None) -> None:
        rows.append(f"| {target} | {measured or 'not measured'} | {'—' if met is None else ('yes' if met else 'no')} |")

    for label, r, need in (("decode batch 1, main shape: ≥ 150 tok/s decode-only, ≥ 60 % of the roofline",
                            shapes.get("main", {}).get("1"), 150),
                           ("decode batch 32, main shape: ≥ 2,500 tok/s decode-only", shapes.get("main", {}).get("32"), 2500),
                           ("decode batch 32, short prompts: ≥ 2,500 tok/s decode-only", short.get("32"), 2500)):
        rate = (r or {}).get("decode_tok_s")
        if rate is None:
            add(label, None, None)
            continue
        share = r.get("share_of_limit")
        roof = f" ({100 * share:.0f} % of {r['limit_tok_s']:.0f})" if share is not None else ""
        ok = rate >= need and (need != 150 or (share or 0) >= 0.6)
        add(label, f"{rate:.0f} tok/s{roof}", ok)
    u = _update_row(upd)
    mfu = (u or {}).get("mfu")
    what = (f"{u['switch']}, equal to {u.get('equal_to', 'baseline')}" if "switch" in (u or {})
            else f"{(u or {}).get('flops_per_token_n', 10)}N FLOPs a token")
    add("PARA-GRPO update (packed): ≥ 40 % MFU", None if mfu is None else f"{100 * mfu:.1f} % ({what})",
        None if mfu is None else mfu >= 0.4)
    ratio = None
    if epi and len(epi) >= 5:
        ratio = epi[4]["parallel"]["wall_s"] / epi[0]["parallel"]["wall_s"]
    add("parallel episode, 5 crops / 1 crop: ≤ 1.1×", None if ratio is None else f"{ratio:.2f}×",
        None if ratio is None else ratio <= 1.1)
    return "| target | measured | met |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def _update_row(upd: dict | None) -> dict | None:
    """The update figure the targets read: of a switch run (bench_switches), its fastest row that
    is equal to its baseline (the baseline if none is faster); else the packed row."""
    if not upd:
        return None
    if "switches" in upd:
        ok = [r for r in upd["switches"] if r.get("equal") and r.get("mfu") is not None]
        return max(ok, key=lambda r: r["mfu"], default=None)
    return upd.get("packed") if "packing" not in upd else upd


def switch_table(upd: dict) -> str:
    """One row per update switch (bench_switches): its speed, memory and whether it is exact."""
    tol = upd.get("tolerance", {})
    rows = ["| switch | config keys | tokens/s | MFU | peak memory (GB) | equal to the baseline | "
            "Δ log π mean / max | loss, gradient-norm ratios |", "|---|---|---|---|---|---|---|---|"]
    for r in upd.get("switches", []):
        keys = ", ".join(f"{k}: " + (f"[{', '.join(v)}]" if isinstance(v, list) else str(v).lower())
                         for k, v in r.get("config", {}).items()) or "(today's defaults)"
        if "not_run" in r or "error" in r:
            why = f"not run: {r['not_run']}" if "not_run" in r else f"failed: `{r['error']}`"
            rows.append(f"| {r['switch']} | {keys} | {why} | — | — | — | — | — |")
            continue
        mfu = "—" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %"
        if "equal" not in r:
            eq = "—"
        else:
            eq = ("yes" if r["equal"] else "**no**") + ("" if r.get("equal_to") in (None, "baseline", r["switch"])
                                                        else f" (to {r['equal_to']})")
        d = f"{r['dlogp_mean']:.2g} / {r['dlogp_max']:.2g}" if r.get("dlogp_mean") is not None else "—"
        ratios = ", ".join("—" if r.get(k) is None else f"{r[k]:.4f}" for k in ("loss_ratio", "grad_norm_ratio"))
        note = f" ({r['partly_not_run']} not run)" if r.get("partly_not_run") else ""
        rows.append(f"| {r['switch']}{note} | {keys} | {r['tokens_per_s']:.0f} | {mfu} | {r['peak_gb']:.3g} | {eq} | "
                    f"{d} | {ratios if r.get('loss_ratio') is not None else '—'} |")
    return ("\n".join(rows) + f"\n\nEach row a step's passes after its rollouts (the reference's forward, then the "
            f"update) on {upd.get('sequences', '?')} sequences ({upd.get('tokens', '?')} tokens, "
            f"{upd.get('computed_tokens', '?')} computed, {upd.get('trained_tokens', '?')} trained; "
            f"{upd.get('forward_passes', '?')} passes of at most {upd.get('token_budget', '?')} tokens), the same "
            f"weights in every row. Equal: the trained tokens' log π_τ within {tol.get('mean_dlogp', '?')} nats on "
            f"average and {tol.get('max_dlogp', '?')} at most, the loss and the gradient norm within "
            f"{100 * tol.get('grad_rel', 0):.0f} % (rows with a frozen vision tower against `freeze_vision`, and "
            "`freeze_vision` against the baseline on log π_τ only: its gradient leaves the tower out). MFU by the "
            "work done in the text model (bench_switches.py's docstring), on the device's dense bf16 peak.\n")


UPDATE_KEYS = ("forward_passes", "tokens", "trained_tokens", "update_s", "tokens_per_s", "mfu", "peak_gpu_gb",
               "peak_rss_gb", "loss", "error")


def update_table(upd: dict) -> str:
    """Packed and padded side by side, the figures that compare them (the rest is in update.json);
    a switch run's rows (bench_switches) as `switch_table`."""
    if "switches" in upd:
        return switch_table(upd)
    if "packing" in upd:  # one mode's row (gpu.sh runs the packed update alone on a GPU)
        upd = {"packed" if upd["packing"] else "padded": upd}
    modes = [m for m in ("packed", "padded") if upd.get(m)]
    rows = ["| | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    rows += [f"| {k} | " + " | ".join(_fmt(upd[m].get(k)) for m in modes) + " |" for k in UPDATE_KEYS
             if any(upd[m].get(k) is not None for m in modes)]
    first = upd.get("packed") or upd.get("padded") or {}
    return ("\n".join(rows) + f"\n\n{first.get('sequences', '?')} sequences ({first.get('main_tokens', '?')} tokens "
            f"each main one), {first.get('params_b', 0):.2f} B parameters, master weights {first.get('master_dtype')}, "
            f"activation checkpointing {first.get('activation_checkpointing')}, KL {first.get('kl_mode', 'reward')} "
            f"(FLOPs counted {first.get('flops_per_token_n', 10)}N a token).\n")


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
    dec, upd, epi, eps = load(out, "decode"), load(out, "update"), load(out, "episode"), load(out, "episodes")
    parts = ["Written by `benchmarks/gpu.sh` (`benchmarks/gpu_report.py`); every figure in this section is "
             "from that run.\n\n", machine(out, dec),
             "\n### Decode at episode shapes (hf backend)\n", shapes_table(dec) if dec else failed(out, "decode"),
             "\n### Where the time goes (torch.profiler)\n", breakdown_section(dec, upd),
             "\n### Decode at the first round's short prompts\n",
             decode_table(dec) if dec and dec.get("decode") else "Not measured.\n",
             "\n### Update, one row per switch (`bench_switches.py`)\n", update_table(upd) if upd else failed(out, "update"),
             "\n### Episodes per minute (`bench_episodes.py`)\n", episodes_table(eps) if eps else failed(out, "episodes"),
             "\n### Parallel episode, 1 to 5 crops (`bench_episode.py`)\n",
             episode_table(epi) if epi else failed(out, "episode"),
             "\n### Targets\n", targets_table(dec, upd, epi)]
    write_section(Path(args.doc), "".join(parts))
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
