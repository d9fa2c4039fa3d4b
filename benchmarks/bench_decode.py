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


def request(n_frames: int, side: int, max_new: int, seed: int = 0, temperature: float = 0.0, pad: int = 0
            ) -> GenerateRequest:
    """A main-agent request: system prompt, n timestamped frames, question (after `pad` filler words:
    earlier turns' text, to reach an episode's context length), think prefix."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_frames):
        parts += [TextPart(P.timestamp_text(i * 5.0)), ImagePart(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))]
    if pad > 0:
        parts.append(TextPart(" a" * pad))
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


def profile(backend: HFBackend, reqs: list[GenerateRequest], name: str, out: Path) -> dict:
    """One call under torch.profiler, its prefill included (`reqs`, already run once: graphs captured):
    the ops and kernels by their own time (a table in `out`), the breakdown by category
    (`prof_breakdown`), and how busy the device was over the call's wall time."""
    import asyncio

    from prof_breakdown import breakdown, profiler

    cuda = str(backend.model.device).startswith("cuda")
    asyncio.run(backend.aclose())  # the worker thread starts again under the profiler (its graphs are kept)
    with profiler(cuda) as prof:
        t = time.perf_counter()
        backend.generate_sync(reqs)
        sync(str(backend.model.device))
        wall = time.perf_counter() - t
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"decode_{name}.txt").write_text(events.table(sort_by=key, row_limit=25))
    parts = breakdown(prof.events(), wall)
    busy = parts["busy_s"] if parts["device"] else None
    return {"wall_s": wall, "device_busy_share": busy / wall if busy is not None else None, "breakdown": parts}


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure_mode(rows: dict, model, processor, mode: str, batches: list[int], args, save) -> None:
    """One decode path at the short prompts of the first GPU round: per batch size, the first call (a
    capture or a compile happens there) and then the timed one; `rows` is written after each, so a run
    stopped by its time limit keeps what it has."""
    backend = HFBackend(model, processor, max_batch=max(batches), decode=mode)
    backend.renderer.stop_ids = set()  # full length: every row decodes `tokens`
    rows["decode"][backend.decode] = per_batch = {}
    for b in batches:
        t = time.perf_counter()  # the same call twice: the first captures every span the second crosses
        backend.generate_sync([request(args.frames, 64, args.tokens, seed=s) for s in range(b)])
        first = time.perf_counter() - t
        for k in backend.timing:
            backend.timing[k] = 0
        rate, wall, toks = decode_rate(backend, b, args.tokens, args.frames)
        tm = backend.timing  # the worker's clock: the prefill and the decode steps apart
        per_batch[str(b)] = {"tok_s": rate, "wall_s": wall, "first_call_s": first, "prefill_s": tm["prefill_s"],
                             "decode_tok_s": tm["decode_tokens"] / max(tm["decode_s"], 1e-9),
                             "step_ms": 1000 * tm["decode_s"] / max(tm["decode_steps"], 1)}
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


def shape_requests(backend: HFBackend, shape: dict, batch: int, tokens: int) -> list[GenerateRequest]:
    """`batch` requests of an episode's shape: `frames` frames of `side`^2, padded with text to `context`
    prompt tokens where it is larger (a main agent's later turn carries its earlier turns)."""
    pad = 0
    if shape["context"]:
        r = request(shape["frames"], shape["side"], tokens)
        pad = max(shape["context"] - len(backend.renderer.render(r.messages, prefix=r.prefix).ids), 0)
    return [request(shape["frames"], shape["side"], tokens, seed=s, pad=pad) for s in range(batch)]


def kv_bytes_per_token(model) -> int:
    """Bytes of K and V one token keeps in the cache, all layers (the decode's other read)."""
    cfg = model.config.get_text_config()
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    size = next(model.model.language_model.parameters()).element_size()
    return cfg.num_hidden_layers * 2 * heads * head_dim * size


def step_weight_bytes(model) -> int:
    """Bytes of the weights a decode step reads: the text decoder and lm_head (the embedding table is
    gathered, a row a token, not read whole)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if "visual" not in n and "embed_tokens" not in n)


def measure_shape(backend: HFBackend, reqs: list[GenerateRequest], tokens: int, bw: float) -> dict:
    """One batch at an episode's shape, called twice (the first captures the graphs of every span
    it crosses), the second timed: the decode-only rate from the worker's clock (`HFBackend.timing`),
    the prefill's, and the roofline: `batch` tokens a step over the bytes the step must read
    (the weights once, each row's valid KV: its prompt and half the new tokens, on average)."""
    batch = len(reqs)
    t = time.perf_counter()
    backend.generate_sync(reqs)
    first = time.perf_counter() - t
    dec = backend._static
    cols = dec.kv_columns if dec else 0
    for k in backend.timing:
        backend.timing[k] = 0
    t = time.perf_counter()
    out = backend.generate_sync(reqs)
    wall = time.perf_counter() - t
    tm = dict(backend.timing)
    model = backend.model
    kv = kv_bytes_per_token(model)
    prompts = [o.prompt_tokens for o in out]
    valid = sum(n + tokens / 2 for n in prompts) * kv
    weights = step_weight_bytes(model)
    limit = batch * bw / (weights + valid)
    decode = tm["decode_tokens"] / tm["decode_s"] if tm["decode_s"] else None
    row = {"batch": batch, "prompt_tokens": max(prompts), "tokens": tokens, "wall_s": wall, "first_call_s": first,
           "prefill_s": tm["prefill_s"], "prefill_tok_s": sum(prompts) / tm["prefill_s"] if tm["prefill_s"] else None,
           "decode_tok_s": decode, "step_ms": 1000 * tm["decode_s"] / max(tm["decode_steps"], 1),
           "weights_gb": weights / 1e9, "kv_valid_gb_step": valid / 1e9, "limit_tok_s": limit,
           "share_of_limit": decode / limit if decode else None}
    if dec is not None and tm["decode_steps"]:
        row["kv_read_gb_step"] = (dec.kv_columns - cols) * kv / tm["decode_steps"] / 1e9  # what the path reads
    if dec is not None and dec.failed:
        row["capture_failed"] = dec.failed
    return row


SHAPES = ("main", "sub")


def measure_shapes(rows: dict, model, processor, mode: str, args, bw: float, save, first: bool) -> None:
    """Every episode shape and batch on one decode path; `rows["shapes"][mode][shape][batch]`, saved
    after each (a run stopped by its time limit keeps what it has). On the `first` path, with
    --profile, a third call of the main shape at each of --profile-batches runs under the profiler
    (its graphs already captured); the other paths take --other-*-batches."""
    per_mode = rows.setdefault("shapes", {}).setdefault(mode, {})
    profiled = [int(b) for b in args.profile_batches.split(",") if b] if first and args.profile else []
    for name in SHAPES:
        shape = {"frames": getattr(args, f"{name}_frames"), "side": getattr(args, f"{name}_side"),
                 "context": getattr(args, f"{name}_context")}
        which = getattr(args, f"{name}_batches") if first else getattr(args, f"other_{name}_batches") or \
            getattr(args, f"{name}_batches")
        batches = [int(b) for b in which.split(",") if b]
        if not batches:
            continue
        backend = HFBackend(model, processor, max_batch=max(batches), decode=mode)
        backend.renderer.stop_ids = set()
        per_mode[name] = {}
        for b in batches:
            reqs = shape_requests(backend, shape, b, args.tokens)
            per_mode[name][str(b)] = r = measure_shape(backend, reqs, args.tokens, bw)
            print(f"shape {name}, {mode}, batch {b} ({r['prompt_tokens']} prompt tokens): decode "
                  f"{r['decode_tok_s'] or 0:.1f} tok/s ({r['step_ms']:.2f} ms a step), "
                  f"{100 * (r['share_of_limit'] or 0):.1f} % of {r['limit_tok_s']:.0f}; prefill {r['prefill_s']:.2f} s; "
                  f"first call {r['first_call_s']:.1f} s", flush=True)
            save()
            if name == "main" and b in profiled:
                try:
                    prof = profile(backend, reqs, f"{mode}_main_b{b}", args.profile)
                    rows.setdefault("profile", {})[f"main b{b}"] = prof
                    print(f"profile {mode}, main shape, batch {b}: {prof['wall_s']:.2f} s, busy "
                          f"{prof['device_busy_share']}", flush=True)
                except Exception as e:  # noqa: BLE001 - the measurements go on without it
                    rows["errors"][f"profile main b{b}"] = f"{type(e).__name__}: {e}"[:1000]
                save()
        free(backend)


def free(backend: HFBackend) -> None:
    """Stop the backend's worker and drop its static cache (tens of GB at 8B) before the next one."""
    import asyncio

    asyncio.run(backend.aclose())
    backend._static = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["tiny", "8b"], default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", default="1,8,32,64", help="the short prompts' batch sizes (the first round's rows)")
    ap.add_argument("--decodes", default="eager,static-graphs,static-compiled",
                    help="hf backend decode paths at the short prompts (static-compiled last: minutes at 8B)")
    ap.add_argument("--eager-batches", default=None, help="batch sizes for the eager path (default: --batches)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--frames", type=int, default=4, help="frames in the short prompts")
    ap.add_argument("--shape-decodes", default="static-graphs,static-graphs-bucket",
                    help="decode paths at the episode shapes (empty: none)")
    ap.add_argument("--main-frames", type=int, default=64, help="a main agent's overview K")
    ap.add_argument("--main-side", type=int, default=224)
    ap.add_argument("--main-context", type=int, default=7986, help="a main agent's prompt tokens (its last turn)")
    ap.add_argument("--main-batches", default="1,8,32")
    ap.add_argument("--sub-frames", type=int, default=10, help="a sub-agent's crop frames")
    ap.add_argument("--sub-side", type=int, default=384)
    ap.add_argument("--sub-context", type=int, default=0, help="pad sub-agent prompts to this (0: as rendered)")
    ap.add_argument("--sub-batches", default="5,40")
    ap.add_argument("--other-main-batches", default=None, help="main batches on the paths after the first (default: all)")
    ap.add_argument("--other-sub-batches", default=None, help="sub batches on the paths after the first (default: all)")
    ap.add_argument("--prefill-frames", type=int, default=64)
    ap.add_argument("--prefill-side", type=int, default=448)
    ap.add_argument("--copy-gib", type=float, default=None, help="size of the bandwidth copy (default 4 GPU, 0.25 CPU)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=Path, default=None,
                    help="also profile a call of the first shape path at the main shape (--profile-batches, "
                         "among --main-batches): tables in this folder, the breakdown by category in the JSON")
    ap.add_argument("--profile-batches", default="1,32")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    gib = args.copy_gib or (4.0 if device.startswith("cuda") else 0.25)
    bw = bandwidth(device, gib)
    model, processor = build(args.arch, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    text_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "visual" not in n)
    batches = [int(b) for b in args.batches.split(",") if b]
    eager_batches = [int(b) for b in (args.eager_batches or args.batches).split(",") if b]
    rows = {"arch": args.arch, "device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else
            "cpu", "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "bandwidth_gbs": bw / 1e9, "weight_gb": weight_bytes / 1e9, "text_weight_gb": text_bytes / 1e9,
            "step_weight_gb": step_weight_bytes(model) / 1e9, "kv_mb_per_token": kv_bytes_per_token(model) / 1e6,
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
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        save()

    # what matters first (a run cut short keeps it): the episode shapes on the default path (with its
    # profiles), the shapes on the other paths, then the first round's short prompts
    shape_modes = [m for m in args.shape_decodes.split(",") if m]
    for i, mode in enumerate(shape_modes):
        attempt(f"shapes {mode}", lambda: measure_shapes(rows, model, processor, mode, args, bw, save, first=i == 0))
    modes = [m for m in args.decodes.split(",") if m] if batches else []
    extra = [m for m in modes if m.startswith("static-compiled")]  # minutes of compiling at 8B: measured last
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

    if args.prefill_frames:
        attempt("prefill", prefill)
    for mode in extra:
        attempt(mode, lambda: measure_mode(rows, model, processor, mode, batches, args, save))
    print(json.dumps({k: v for k, v in rows.items() if k != "greedy_tokens"}, indent=1))


if __name__ == "__main__":
    main()
