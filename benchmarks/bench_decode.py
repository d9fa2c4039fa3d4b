"""Decode speed of the hf backend against the memory-bandwidth limit, at the 8B shape on a GPU or
the tiny model on a CPU (the same script: `benchmarks/gpu.sh` runs it both ways).

    python benchmarks/bench_decode.py --arch 8b --device cuda --json out.json
    python benchmarks/bench_decode.py --arch tiny --device cpu --batches 1,8 --tokens 32

What it measures, in one process:
- the device's memory bandwidth, as a large device-to-device copy moves it (bytes read + written
  per second), and from it the batch-1 decode limit: bandwidth / bytes of the weights (every decode
  step reads each weight once);
- decode tokens/s of `HFBackend` at each batch size (forced to full length: end tokens ignored),
  with the rows' prefill and without it (the time of the same call with one new token taken off;
  each call the faster of two),
  and the ratio of batch 1 to the limit, for each decode path (`--decodes`: eager, the DynamicCache
  path, before; static-graphs and static-compiled, the static-cache CUDA-graph paths, after), each
  one's first call (where it captures or compiles) and whether its greedy tokens equal eager's;
- the prefill of a 64-frame main-agent prompt (vision tower, DeepStack, M-RoPE);
- transformers' `generate` at batch 1 on the same prompt, as a reference for the backend's own loop.
The 8B model is Qwen3-VL-8B's architecture with random weights (`build_8b_random`): speed only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from paravt import protocol as P  # noqa: E402
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart  # noqa: E402
from paravt.backends.hf import HFBackend  # noqa: E402


def request(n_frames: int, side: int, max_new: int, seed: int = 0, temperature: float = 0.0) -> GenerateRequest:
    """A main-agent request: system prompt, n timestamped frames, question, think prefix."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_frames):
        parts += [TextPart(P.timestamp_text(i * 5.0)), ImagePart(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))]
    parts.append(TextPart(P.user_prompt_text("What happens?", max(n_frames, 1) * 5.0, "oe")))
    return GenerateRequest([Message("system", P.system_prompt("parallel")), Message("user", parts)],
                           max_new_tokens=max_new, temperature=temperature, seed=seed, prefix=P.THINK_PREFIX)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bandwidth(device: str, gib: float) -> float:
    """Bytes/s of a device-to-device copy (read + write), the best of 5."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t)
    del src, dst
    return 2 * n * 2 / best


def build(arch: str, device: str):
    if arch == "8b":
        from paravt.models.tiny import build_8b_random

        return build_8b_random(device=device, dtype=torch.bfloat16)
    from paravt.models.tiny import build_tiny

    model, processor = build_tiny(seed=0)
    return model.to(device), processor


def decode_rate(backend: HFBackend, batch: int, tokens: int, frames: int) -> tuple[float, float, tuple[list, list]]:
    """(new tokens/s, seconds, row 0's (tokens, logprobs)) of `batch` concurrent rows decoding `tokens` each."""
    reqs = [request(frames, 64, tokens, seed=s) for s in range(batch)]
    t = time.perf_counter()
    out = backend.generate_sync(reqs)
    wall = time.perf_counter() - t
    return sum(o.completion_tokens for o in out) / wall, wall, (list(out[0].token_ids or []), list(out[0].logprobs or []))


def profile(backend: HFBackend, batch: int, tokens: int, frames: int, out: Path) -> dict:
    """One timed call under torch.profiler: the ops and kernels by their own time (a table in `out`),
    and how busy the device was over the call's wall time (kernel time / wall)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = str(backend.model.device).startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        t = time.perf_counter()
        decode_rate(backend, batch, tokens, frames)
        wall = time.perf_counter() - t
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"decode_{backend.decode}_b{batch}.txt").write_text(events.table(sort_by=key, row_limit=25))
    # the kernels alone (an op's own device time is its kernels' again): their time over the wall time
    busy = sum(e.self_device_time_total for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6 if cuda else None
    return {"wall_s": wall, "device_busy_share": busy / wall if busy is not None else None}


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure_mode(rows: dict, model, processor, mode: str, batches: list[int], args, save) -> None:
    """One decode path: per batch size, the first call (a capture or a compile happens there) and then
    the timed one; `rows` is written after each, so a run stopped by its time limit keeps what it has."""
    backend = HFBackend(model, processor, max_batch=max(batches), decode=mode)
    backend.renderer.stop_ids = set()  # full length: every row decodes `tokens`
    rows["decode"][backend.decode] = per_batch = {}
    for b in batches:
        t = time.perf_counter()
        backend.generate_sync([request(args.frames, 64, 8, seed=s) for s in range(b)])
        first = time.perf_counter() - t
        # each call twice, the faster kept: the decode-only rate is a difference of two times, which one
        # slow call (a neighbour's load, an allocator's first growth) would otherwise throw far off
        rate, wall, toks = max((decode_rate(backend, b, args.tokens, args.frames) for _ in range(2)), key=lambda r: r[0])
        prefill = min(decode_rate(backend, b, 1, args.frames)[1] for _ in range(2))  # the rows' prefill + first token
        steps = max(wall - prefill, 1e-9)
        per_batch[str(b)] = {"tok_s": rate, "wall_s": wall, "first_call_s": first, "prefill_s": prefill,
                             "decode_tok_s": b * (args.tokens - 1) / steps, "step_ms": 1000 * steps / (args.tokens - 1)}
        if b == 1:
            rows["greedy_tokens"][backend.decode] = toks
            ref = rows["greedy_tokens"].get("eager")
            if ref is not None and backend.decode != "eager":
                n = same_prefix(ref[0], toks[0])
                per_batch["1"]["greedy_same_as_eager"] = n
                # the size of the bf16 difference: the chosen tokens' log-probabilities while the paths agree,
                # and, where they part, each path's log-probability of its own choice
                diffs = [abs(a - b) for a, b in zip(ref[1][:n], toks[1][:n])]
                per_batch["1"]["max_logprob_diff_while_equal"] = max(diffs) if diffs else None
                if n < min(len(ref[0]), len(toks[0])):
                    per_batch["1"]["logprobs_where_they_part"] = [ref[1][n], toks[1][n]]
            rows[f"batch1_share_of_limit/{backend.decode}"] = per_batch["1"]["decode_tok_s"] / rows["limit_batch1_tok_s"]
        failed = getattr(backend._static, "failed", None)
        if failed:
            per_batch["capture_failed"] = failed
        print(f"decode {backend.decode}, batch {b}: {rate:.1f} tok/s with the prefill ({wall:.2f} s), "
              f"{per_batch[str(b)]['decode_tok_s']:.1f} tok/s decoding ({per_batch[str(b)]['step_ms']:.2f} ms a step); "
              f"first call {first:.1f} s"
              + (f" [capture failed: {failed}]" if failed else ""), flush=True)
        save()


def generate_rate(model, backend: HFBackend, tokens: int, frames: int) -> float:
    """transformers' generate at batch 1 on the same kind of prompt (greedy, forced length)."""
    from paravt.policy import model_inputs

    r = backend.renderer.render(request(frames, 64, tokens).messages, prefix=P.THINK_PREFIX)
    inputs = model_inputs(model, backend.renderer, [r.ids], [r.images])
    inputs.pop("position_ids")
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        sync(str(model.device))
        t = time.perf_counter()
        model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        sync(str(model.device))
    return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["tiny", "8b"], default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--decodes", default="eager,static-graphs,static-compiled",
                    help="hf backend decode paths to measure (static-compiled last: it compiles for minutes at 8B)")
    ap.add_argument("--eager-batches", default=None, help="batch sizes for the eager path (default: --batches)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--frames", type=int, default=4, help="frames in the decode rows' prompts")
    ap.add_argument("--prefill-frames", type=int, default=64)
    ap.add_argument("--prefill-side", type=int, default=448)
    ap.add_argument("--copy-gib", type=float, default=None, help="size of the bandwidth copy (default 4 GPU, 0.25 CPU)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=Path, default=None,
                    help="also profile one call at batch 1 and 32 of the first static path: tables in this folder")
    args = ap.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    gib = args.copy_gib or (4.0 if device.startswith("cuda") else 0.25)
    bw = bandwidth(device, gib)
    model, processor = build(args.arch, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    text_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "visual" not in n)
    batches = [int(b) for b in args.batches.split(",")]
    eager_batches = [int(b) for b in (args.eager_batches or args.batches).split(",")]
    rows = {"arch": args.arch, "device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else
            "cpu", "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "bandwidth_gbs": bw / 1e9, "weight_gb": weight_bytes / 1e9, "text_weight_gb": text_bytes / 1e9,
            "limit_batch1_tok_s": bw / text_bytes, "tokens": args.tokens, "decode": {}, "greedy_tokens": {},
            "errors": {}}

    def save() -> None:
        if device.startswith("cuda"):
            rows["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)

    def attempt(name: str, fn) -> None:  # one part failing leaves the others' figures
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded in the results, the run goes on
            rows["errors"][name] = f"{type(e).__name__}: {e}"[:1000]
            print(f"{name} failed: {rows['errors'][name]}", flush=True)
        save()

    modes = args.decodes.split(",")
    extra = [m for m in modes if m == "static-compiled"]  # minutes of compiling at 8B: measured last
    for mode in [m for m in modes if m not in extra]:
        attempt(mode, lambda: measure_mode(rows, model, processor, mode, eager_batches if mode == "eager" else
                                           batches, args, save))

    def prefill() -> None:
        backend = HFBackend(model, processor, max_batch=1, decode="eager")
        backend.generate_sync([request(2, 64, 1)])  # warm-up
        t = time.perf_counter()
        backend.generate_sync([request(args.prefill_frames, args.prefill_side, 1)])
        sync(device)
        rows["prefill_s"] = time.perf_counter() - t
        rows["prefill_frames"] = f"{args.prefill_frames} x {args.prefill_side}^2"
        rows["generate_batch1_tok_s"] = generate_rate(model, backend, min(args.tokens, 64), args.frames)

    attempt("prefill", prefill)
    for mode in extra:
        attempt(mode, lambda: measure_mode(rows, model, processor, mode, batches, args, save))
    static = [m for m in modes if m != "eager"]
    if args.profile and static:
        def profiled() -> None:
            backend = HFBackend(model, processor, max_batch=max(batches), decode=static[0])
            backend.renderer.stop_ids = set()
            rows["profile"] = {}
            for b in (1, 32):
                backend.generate_sync([request(args.frames, 64, 8, seed=s) for s in range(b)])  # captures
                rows["profile"][str(b)] = profile(backend, b, 16, args.frames, args.profile)
                print(f"profile {backend.decode}, batch {b}: {rows['profile'][str(b)]}", flush=True)

        attempt("profile", profiled)
    print(json.dumps({k: v for k, v in rows.items() if k != "greedy_tokens"}, indent=1))


if __name__ == "__main__":
    main()
