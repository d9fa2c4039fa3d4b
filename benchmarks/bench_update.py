"""One PARA-GRPO update of Qwen3-VL-8B's architecture (random weights) at the paper's sequence
lengths: peak GPU memory, update tokens/s and model FLOPs utilisation. Run it on the GPU(s) it is
about; `--arch tiny` runs the same code on a CPU in seconds.

    python benchmarks/bench_update.py --arch 8b                          # one GPU: FSDP, act. ckpt
    python benchmarks/bench_update.py --arch 8b --cpu-offload --dtype bf16
    torchrun --nproc_per_node 8 benchmarks/bench_update.py --arch 8b      # 8 GPUs: the sequences split
    python benchmarks/bench_update.py --arch tiny --device cpu             # the code path, on a CPU
    python benchmarks/bench_update.py --arch tiny --device cpu --packing both   # packed vs padded
    python benchmarks/bench_update.py --arch tiny --device cpu --packing both --vocab 151936  # Qwen's vocab
    python benchmarks/bench_update.py --arch tiny --device cpu --group-prompts --token-budget 65536 \
        --prompt-sharing off                                              # vs on: a prompt computed once

The step's sequences are those of `--prompts` x `--rollouts` episodes: each a main trajectory
(system + tools, K overview frames of 224x224 with timestamps, three generated turns of
`--turn-tokens`, two rounds of five summaries) and `--subs` sub-agent sequences (16 frames, a
`--sub-tokens` summary), token ids random, frames random pixels. They go through the trainer's own
`train.grpo.update.update_policy` (PPO-clip, k3 KL to a frozen sharded reference, token-mean over
processes), packed into forward passes of at most `--token-budget` tokens (`--packing on`, the
trainer's default), or padded, `--micro-batch-size` sequences a pass (`--packing off`, the path
before packing; 1: no padding, one sequence a pass). `--packing both` runs each in a process of its
own and prints both rows and their ratio. `--group-prompts`: the rollouts of one prompt share its
frames and text, as a GRPO group's do; packed under `_varlen_sdpa` (no flash-attn), a pass then
computes a prompt its sequences share once (`--prompt-sharing off`: every time, the path before).
`tokens` are the sequences' tokens, `computed_tokens` those less what a shared prompt spared.

Peak memory: on a GPU torch's peak allocated bytes; on a CPU the peak resident set size during the
update above the one before it (sampled every 5 ms). `update_cpu_s`: the process's CPU time, the
figure to compare on a CPU shared with other work (wall time there measures the neighbours too).

FLOPs counted per computed token: 6 x parameters (forward and backward of the policy) + 2 x
parameters (the reference's forward, which runs in the update with `--kl-mode loss`, the default
here; with `reward` it runs before the update and is not counted) + 2 x parameters (the recompute of
activation checkpointing, when on); attention's quadratic term is left out (small at these lengths).
(The first GPU round ran with the trainer's default kl_mode, reward, and still counted the
reference: its MFU figures are 10/8 of the work the timed update did.) MFU divides by the
device's dense bf16 peak (--peak-tflops, default 989 for an H100 SXM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


def sequences(renderer, args, rng):
    """Synthetic TrainSequences with the ids layout of real episodes (images where the renderer puts them)."""
    from paravt.backends.base import ImagePart, Message, TextPart
    from paravt.train.sequences import TrainSequence

    vocab = [i for i in range(200, len(renderer.tok))]

    def text(n: int) -> list[int]:
        return [int(x) for x in rng.choice(vocab, size=n)]

    def frames(n: int, side: int):
        parts = []
        for i in range(n):
            parts += [TextPart(f"<{i * 2.5:.1f} seconds>"), ImagePart(rng.integers(0, 256, (side, side, 3), np.uint8))]
        return parts

    out = []
    for i in range(args.prompts * args.rollouts):
        if not args.group_prompts or i % args.rollouts == 0:  # else this prompt's rollouts share its prompt
            r = renderer.render([Message("system", "x"), Message("user", frames(args.frames, args.side))])
            prompt = r.ids + text(args.system_tokens)
        ids, mask = list(prompt), [0] * len(prompt)
        for turn in range(3):  # generated turns, each followed (but the last) by a round of summaries
            gen = text(args.turn_tokens)
            ids += gen
            mask += [1] * len(gen)
            if turn < 2:
                resp = text(5 * args.summary_tokens)
                ids += resp
                mask += [0] * len(resp)
        lp = [-1.0] * len(ids)
        adv = [float(rng.normal()) if m else 0.0 for m in mask]
        out.append(TrainSequence(ids, mask, lp, adv, r.images, "main"))
        for _ in range(args.subs):
            s = renderer.render([Message("user", frames(16, args.side))])
            gen = text(args.sub_tokens)
            ids = s.ids + gen
            out.append(TrainSequence(ids, [0] * len(s.ids) + [1] * len(gen), [-1.0] * len(ids),
                                     [0.0] * len(s.ids) + [float(rng.normal())] * len(gen), s.images, "sub"))
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_rss():
    """Yields a dict whose "gb" is, on exit, the peak resident set size above the one at entry."""
    out, stop, base = {"gb": 0.0}, threading.Event(), _rss()
    peak = [base]

    def sample():
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out["gb"] = (max(peak[0], _rss()) - base) / 2**30


def compare(argv: list[str]) -> None:
    """Each mode in a process of its own (a clean peak memory), then the table."""
    rows = {}
    json_path = None
    if "--json" in argv:  # both rows go there together, written here (each run would overwrite the other)
        j = argv.index("--json")
        json_path, argv = argv[j + 1], argv[:j] + argv[j + 2:]
    for mode in ("on", "off"):  # packed first: the figure the trainer runs with; a failing mode leaves the other
        args = [a for a in argv]
        i = args.index("--packing")
        args[i + 1] = mode
        if mode == "off" and "--profile" in args:  # the profile is of the trainer's path only (time is short)
            j = args.index("--profile")
            args = args[:j] + args[j + 2:]
        res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
        if res.returncode or "{" not in res.stdout:
            print(f"packing {mode} failed (exit {res.returncode}):\n{res.stderr[-3000:]}", file=sys.stderr, flush=True)
            rows[mode] = {"error": res.stderr.strip().splitlines()[-1][-500:] if res.stderr.strip() else
                          f"exit {res.returncode}"}
        else:
            rows[mode] = json.loads(res.stdout[res.stdout.index("{"):])
        if json_path:
            with open(json_path, "w") as f:
                json.dump({"padded": rows.get("off"), "packed": rows.get("on")}, f, indent=1)
    if any("error" in r for r in rows.values()):
        print(json.dumps({"padded": rows["off"], "packed": rows["on"]}))
        sys.exit(1)
    keys = ("forward_passes", "tokens", "computed_tokens", "update_s", "tokens_per_s", "update_cpu_s",
            "tokens_per_cpu_s", "peak_gpu_gb", "peak_rss_gb", "mfu", "loss")
    print(f"{'':>16} {'padded':>14} {'packed':>14}")
    for k in keys:
        a, b = rows["off"].get(k), rows["on"].get(k)
        if a is None and b is None:
            continue
        print(f"{k:>16} {a:>14.6g} {b:>14.6g}")
    print(f"packed/padded tokens/s: {rows['on']['tokens_per_s'] / rows['off']['tokens_per_s']:.2f}x wall, "
          f"{rows['on']['tokens_per_cpu_s'] / rows['off']['tokens_per_cpu_s']:.2f}x CPU time")
    both = {"padded": rows["off"], "packed": rows["on"]}
    print(json.dumps(both))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(both, f, indent=1)


def mark_phases(model, ref, opt) -> list:
    """Profiler ranges (prof_breakdown's phases) around the parts of an update the issue asks about:
    the policy's vision tower, the reference's forward, the policy's decoder layers run again in the
    backward (activation checkpointing's recompute) and the optimizer step. Hooks, so the trainer's
    code is unchanged; returns the handles to remove."""
    from prof_breakdown import PHASE_PREFIX

    open_ranges: dict[int, list] = {}

    def enter(name: str, key: int) -> None:
        rf = torch.profiler.record_function(PHASE_PREFIX + name)
        rf.__enter__()
        open_ranges.setdefault(key, []).append(rf)

    def leave(key: int) -> None:
        if open_ranges.get(key):
            open_ranges[key].pop().__exit__(None, None, None)

    def around(module, name) -> list:
        return [module.register_forward_pre_hook(lambda m, a: enter(name(), id(m))),
                module.register_forward_hook(lambda m, a, o: leave(id(m)))]

    handles = []
    inner = model.module if hasattr(model, "module") else model
    visual = getattr(getattr(inner, "model", inner), "visual", None)
    if visual is not None:
        handles += around(visual, lambda: "vision tower (policy)")
    handles += around(ref, lambda: "reference forward")
    in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)
    # transformers checkpoints a layer's `forward`, not its `__call__` (so hooks stay outside the
    # checkpoint): the recompute is seen at the layer's children (attention, MLP, norms)
    for layer in [m for m in inner.modules() if type(m).__name__.endswith("DecoderLayer")]:
        for m in layer.children():
            handles += [m.register_forward_pre_hook(lambda m, a: enter("recompute", id(m)) if in_backward() != -1
                                                    else None),
                        m.register_forward_hook(lambda m, a, o: leave(id(m)) if in_backward() != -1 else None)]
    handles.append(opt.register_step_pre_hook(lambda o, a, k: enter("optimizer step", id(o))))
    handles.append(opt.register_step_post_hook(lambda o, a, k: leave(id(o))))
    return handles


def profile_update(folder: Path, cuda: bool, engine, model, ref, opt, run, name: str) -> dict | None:
    """One update under torch.profiler: a table of ops and kernels in `folder`, and its breakdown by
    category and phase (`prof_breakdown`, docs/gpu.md's table) returned."""
    from prof_breakdown import breakdown, profiler

    handles = mark_phases(model, ref, opt)
    try:
        with profiler(cuda) as prof:
            t = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
    finally:
        for h in handles:
            h.remove()
    if not engine.main:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    (folder / f"{name}.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=30))
    return breakdown(prof.events(), wall)


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The model and the step's sequences (this benchmark's, and bench_switches')."""
    ap.add_argument("--arch", choices=["8b", "tiny"], default="8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="master weights (compute is bf16 on GPUs)")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--system-tokens", type=int, default=700)
    ap.add_argument("--turn-tokens", type=int, default=512)
    ap.add_argument("--summary-tokens", type=int, default=200)
    ap.add_argument("--subs", type=int, default=5)
    ap.add_argument("--sub-tokens", type=int, default=256)
    ap.add_argument("--group-prompts", action="store_true",
                    help="the rollouts of one prompt share its frames and text, as GRPO's do (default: each its own)")
    ap.add_argument("--token-budget", type=int, default=8192, help="packing on: most tokens per forward pass")
    ap.add_argument("--logprob-chunk", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="tiny arch: resize the vocabulary to this (151936: Qwen's), to see the output head's memory")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=Path, default=None,
                    help="after the timed update, profile a second one: a table of ops and kernels in this folder")


def build_models(args, engine, cuda: bool, cpu_offload: bool = False):
    """(policy prepared for training, frozen reference, processor, the policy's parameter count):
    Qwen3-VL-8B's architecture with random weights, or the tiny one, the reference in bf16 on a GPU."""
    from paravt.models.tiny import build_8b_random, build_tiny

    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    build_on = "cpu" if (cpu_offload or not cuda) else str(engine.device)

    def build():
        if args.arch == "8b":
            return build_8b_random(device=build_on, dtype=dtype)
        m, p = build_tiny(seed=0)
        if args.vocab:
            torch.manual_seed(0)
            m.resize_token_embeddings(args.vocab, mean_resizing=False)
        return m.to(device=build_on, dtype=dtype), p

    model, processor = build()
    n_params = sum(p.numel() for p in model.parameters())
    model.train()
    model = engine.prepare(model)
    ref, _ = build()
    ref = engine.prepare(ref.to(torch.bfloat16 if cuda else dtype), frozen=True)
    return model, ref, processor, n_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--cpu-offload", action="store_true")
    ap.add_argument("--no-activation-checkpointing", action="store_true")
    ap.add_argument("--prompt-sharing", choices=["on", "off"], default="on",
                    help="packing on: hold a prompt that sequences of one pass share once (the trainer's path)")
    ap.add_argument("--packing", choices=["on", "off", "both"], default="on")
    ap.add_argument("--micro-batch-size", type=int, default=1, help="packing off: sequences per (padded) pass")
    ap.add_argument("--checkpoint-every", type=int, default=1)
    ap.add_argument("--kl-mode", choices=["loss", "reward"], default="loss",
                    help="loss: the reference's forward runs in the update (k3 in the loss), as the FLOPs count has it; "
                         "reward: it runs before (token_advantages), outside the timed update, and is not counted")
    args = ap.parse_args()
    if args.packing == "both":
        return compare(sys.argv[1:])
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prompt_sharing == "off":
        from paravt.train import prompt_sharing

        prompt_sharing.MIN_SHARED = 1 << 62  # no common beginning is long enough

    from paravt.backends.hf import Renderer
    from paravt.train.checkpoint import make_optimizer
    from paravt.train.engine import init_engine, param_bytes
    from paravt.train.grpo import GRPOConfig, _update

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    cfg = GRPOConfig(device="cuda" if cuda else "cpu", engine="fsdp", mixed_precision="bf16" if cuda else "no",
                     dtype=args.dtype, activation_checkpointing=not args.no_activation_checkpointing,
                     cpu_offload=args.cpu_offload, micro_batch_size=args.micro_batch_size, lr=2e-6, kl_coef=0.01,
                     packing=args.packing == "on", token_budget=args.token_budget, logprob_chunk=args.logprob_chunk,
                     checkpoint_every=args.checkpoint_every, kl_mode=args.kl_mode)
    engine = init_engine(cfg.engine, cfg.device, cfg.mixed_precision,
                         activation_checkpointing=cfg.activation_checkpointing, cpu_offload=cfg.cpu_offload,
                         checkpoint_every=cfg.checkpoint_every)
    model, ref, processor, n_params = build_models(args, engine, cuda, args.cpu_offload)
    base_vocab = model.get_output_embeddings().weight.shape[0]
    renderer = Renderer(processor)
    params, opt, _ = make_optimizer(model, cfg)
    seqs = sequences(renderer, args, np.random.default_rng(engine.rank))
    mine = seqs[engine.rank::engine.world]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t, cpu = time.perf_counter(), time.process_time()
    with peak_rss() as rss:
        metrics = _update(cfg, engine, model, model, ref, renderer, opt, params, mine, 0)
        if cuda:
            torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    from paravt.train.batches import plan_micro_batches, shares_prompts
    from paravt.train.prompt_sharing import plan

    share = shares_prompts(model, cfg.packing, cfg.mixed_precision == "bf16")  # as the update planned its passes
    groups = plan_micro_batches(mine, cfg.packing, cfg.micro_batch_size, cfg.token_budget, renderer if share else None)
    passes = len(groups)
    tokens = engine.all_sum(sum(len(s.ids) for s in mine))
    shared = 0  # tokens a shared prompt spared (train.prompt_sharing)
    if share:
        shared = engine.all_sum(sum(sh.shared for g in groups if len(g) > 1 for sh in plan(g, renderer)))
    # 6N policy forward + backward, 2N the reference's forward where the update runs it, 2N the recompute
    per_token = (6 + (2 if cfg.kl_mode == "loss" else 0) + (2 if cfg.activation_checkpointing else 0)) * n_params
    mfu = (tokens - shared) * per_token / wall / (args.peak_tflops * 1e12 * engine.world)
    row = {"arch": args.arch, "vocab": base_vocab, "packing": cfg.packing,
           "token_budget": cfg.token_budget if cfg.packing else None,
           "micro_batch_size": None if cfg.packing else cfg.micro_batch_size, "forward_passes": passes,
           "threads": torch.get_num_threads(), "params_b": n_params / 1e9, "processes": engine.world,
           "device": str(engine.device), "master_dtype": args.dtype, "cpu_offload": args.cpu_offload,
           "activation_checkpointing": cfg.activation_checkpointing, "kl_mode": cfg.kl_mode,
           "flops_per_token_n": per_token // n_params, "sequences": len(seqs),
           "main_tokens": len(seqs[0].ids), "tokens": int(tokens), "computed_tokens": int(tokens - shared),
           "trained_tokens": metrics["trained_tokens"],
           "update_s": wall, "tokens_per_s": tokens / wall, "update_cpu_s": cpu, "tokens_per_cpu_s": tokens / cpu,
           "mfu": mfu if cuda else None, "param_bytes_per_process_gb": param_bytes(model) / 2**30,
           "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
           "peak_rss_gb": None if cuda else rss["gb"], "loss": metrics["loss"]}
    if engine.main and args.json:  # written now too: a run stopped during the profile keeps the row
        Path(args.json).write_text(json.dumps(row, indent=1))
    if args.profile:  # a second update, under the profiler (its figures are not the row's)
        row["profile"] = profile_update(args.profile, cuda, engine, model, ref, opt,
                                        lambda: _update(cfg, engine, model, model, ref, renderer, opt, params, mine, 1),
                                        f"update_{'packed' if cfg.packing else 'padded'}")
    if engine.main:
        print(json.dumps(row, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(row, f, indent=1)
    engine.close()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
