"""The update's switches in one run (docs/gpu.md): a step's passes after its rollouts, as the trainer
runs them (`train.grpo.train_passes`: the reference's forward for the KL reward, then the PPO
update), once per switch on the same weights and sequences, each alone and all together, with a
row per switch: tokens/s, MFU by the work done, peak memory, and whether it is equal to the
baseline (its log π_τ at the trained tokens, its loss and its gradient norm within the bf16
tolerance below).

    python benchmarks/bench_switches.py --arch 8b --device cuda --dtype bf16 --rollouts 2 --group-prompts \
        --subs 0 --token-budget 16384 --json update.json           # one H100/H200
    python benchmarks/bench_switches.py --arch tiny --device cpu --rollouts 2 --frames 4 --subs 1   # the CPU dry run

Switches (config keys, `SWITCHES`): packed_attention varlen (torch's varlen kernel), liger (Liger's
RMSNorm, SwiGLU, rotary and fused linear log-probability), checkpoint_every 2 and checkpoint_part
attention (less recompute), vision_cache (a frozen vision tower's features computed once for every
pass; its row and `all` are compared with `freeze_vision`, the frozen tower without the cache, since
a frozen tower's gradient is another one). A switch whose kernels cannot run here (the GPU-only
ones on a CPU) is "not run", with the reason; `all` then runs what can.

The weights never move between rows: the optimizer's learning rate is 0 (AdamW's step still runs,
and its time counts), so every row sees the baseline's weights. Before its timed step a row runs a
short warm-up step (kernels compiled, the optimizer's state made), and the no-grad pass whose
log π_τ is compared. MFU counts the FLOPs of the work a row does in its text model: each computed
token (a shared prompt once) costs 6L (the policy's decoder layers, forward and backward) + 2L (the
reference's forward) + 2L x the share of those layers recomputed (1 with full activation
checkpointing, 1/2 with every other layer, the attention's share with attention only), L the
decoder layers' parameters; each trained token adds 10H of the output head (H its parameters: the
policy's forward, backward and chunk recompute, the reference's forward), the only positions the
head runs at. The vision tower (7 % of Qwen3-VL-8B's parameters, run per patch) and the embedding
lookup are left out of the count, so the vision cache's gain shows in tokens/s. Peak memory: torch's peak allocated bytes on a
GPU, the resident set's rise on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_update import add_workload_args, build_models, peak_rss, profile_update, sequences  # noqa: E402

SWITCHES = {
    "baseline": {},
    "varlen": {"packed_attention": "varlen"},
    "liger": {"liger": ["all"]},
    "ckpt_every_2": {"checkpoint_every": 2},
    "ckpt_attention": {"checkpoint_part": "attention"},
    "freeze_vision": {"freeze_vision": True},
    "vision_cache": {"freeze_vision": True, "vision_cache": True},
    "all": {"packed_attention": "varlen", "liger": ["all"], "checkpoint_every": 2, "checkpoint_part": "attention",
            "freeze_vision": True, "vision_cache": True},
}
# equal to the baseline, in bf16: the trained tokens' log π_τ within these (nats), the loss and the
# gradient norm within GRAD_REL; a wrong mask or a misplaced kernel moves log π_τ by tenths at least
MEAN_DLOGP, MAX_DLOGP, GRAD_REL = 0.02, 0.25, 0.02


def not_run(name: str, sw: dict, model, bf16: bool) -> list[str]:
    """Why parts of switch `name` cannot run here (empty: all of it can)."""
    from paravt.train.attention import varlen_unavailable
    from paravt.train.kernels import liger_unavailable

    why = []
    if sw.get("packed_attention") == "varlen" and (w := varlen_unavailable(model, bf16)):
        why.append(f"varlen: {w}")
    if sw.get("liger") and (w := liger_unavailable(model)):
        why.append(f"liger: {w}")
    return why


def recompute_share(model) -> float:
    """The share of the decoder layers' parameters whose forward the backward runs again."""
    text = model.model.language_model
    n = sum(p.numel() for p in text.layers.parameters())
    again = 0
    for layer in text.layers:
        if layer.gradient_checkpointing:
            again += sum(p.numel() for p in layer.parameters())
        elif getattr(layer.self_attn, "_paravt_checkpointed", False):
            again += sum(p.numel() for p in layer.self_attn.parameters())
    return again / n


def copies(seqs):
    from paravt.train.sequences import TrainSequence

    return [TrainSequence(list(s.ids), list(s.mask), list(s.old_logprobs), list(s.advantages), s.images, s.kind,
                          s.group, s.episode) for s in seqs]


def warm_up(seqs):
    """The shortest sequence cut 32 tokens after its first trained one: a short step that compiles
    the kernels and makes the optimizer's state before the timed one."""
    from paravt.train.sequences import TrainSequence

    s = min(seqs, key=lambda q: len(q.ids))
    n = min(len(s.ids), s.mask.index(1) + 32)
    return TrainSequence(s.ids[:n], s.mask[:n], s.old_logprobs[:n], s.advantages[:n], s.images, s.kind, s.group)


def trained_logprobs(cfg, engine, model, renderer, seqs) -> torch.Tensor:
    """The policy's log π_τ at every trained token under the switch (no grad, eval mode); with the
    vision cache, from a second pass that takes the first one's features."""
    from paravt.train.grpo import reference_logprobs
    from paravt.train.kernels import liger_kernels
    from paravt.train.vision_cache import step_features

    mine = copies(seqs)
    model.eval()
    with liger_kernels(model, parts=cfg.liger), step_features(model, enabled=cfg.vision_cache) as vision:
        for _ in range(2 if vision is not None else 1):
            reference_logprobs(engine, model, model, renderer, mine, cfg, into="prox_logprobs", vision=vision)
    return torch.tensor([v for s in mine for v, m in zip(s.prox_logprobs, s.mask) if m], dtype=torch.float64)


def run_switch(name: str, args, engine, model, ref, renderer, opt, params, seqs, cuda: bool) -> dict:
    """One switch's row (module doc)."""
    from paravt.train.engine import configure_checkpointing
    from paravt.train.grpo import GRPOConfig, train_passes

    sw = SWITCHES[name]
    cfg = GRPOConfig(device="cuda" if cuda else "cpu", engine="fsdp", mixed_precision="bf16" if cuda else "no",
                     activation_checkpointing=True, kl_coef=0.01, kl_mode=args.kl_mode, packing=True,
                     token_budget=args.token_budget, logprob_chunk=args.logprob_chunk, **sw)
    configure_checkpointing(model, True, cfg.checkpoint_every, cfg.checkpoint_part)
    model.model.visual.requires_grad_(not cfg.freeze_vision)
    mine = copies(seqs)
    logp = trained_logprobs(cfg, engine, model, renderer, mine)
    train_passes(cfg, engine, model, model, ref, renderer, opt, params, [warm_up(mine)], 0)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0, cpu0 = time.perf_counter(), time.process_time()
    with peak_rss() as rss:
        _, upd = train_passes(cfg, engine, model, model, ref, renderer, opt, params, mine, 1)
        if cuda:
            torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"switch": name, "config": sw, "cfg": cfg, "wall_s": wall, "cpu_s": cpu, "update_s": upd["update_s"],
            "loss": upd["loss"], "grad_norm": upd["grad_norm"], "logp": logp, "recompute_share": recompute_share(model),
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else rss["gb"]}


def compare(row: dict, ref: dict, grads: bool) -> dict:
    """Row against its reference row: log π_τ differences, loss and gradient-norm ratios, equal."""
    d = (row["logp"] - ref["logp"]).abs()
    out = {"equal_to": ref["switch"], "dlogp_mean": float(d.mean()), "dlogp_max": float(d.max()),
           "loss_ratio": row["loss"] / ref["loss"] if ref["loss"] else None,
           "grad_norm_ratio": row["grad_norm"] / ref["grad_norm"] if ref["grad_norm"] else None}
    ok = out["dlogp_mean"] <= MEAN_DLOGP and out["dlogp_max"] <= MAX_DLOGP
    if grads:
        ok = ok and all(r is not None and abs(r - 1) <= GRAD_REL for r in (out["loss_ratio"], out["grad_norm_ratio"]))
    out["equal"] = bool(ok)
    return out


def measure(name: str, args, head: dict, done: dict, engine, model, ref, renderer, opt, params, seqs,
            cuda: bool) -> dict:
    """Switch `name`'s row: not run (why), failed (the error), or its figures against its reference
    row (the baseline, or freeze_vision for a frozen tower); a run switch's raw results go to `done`."""
    why = not_run(name, SWITCHES[name], model, cuda)
    row = {"switch": name, "config": SWITCHES[name]}
    if why and name != "all":
        return {**row, "not_run": "; ".join(why)}
    try:
        r = run_switch(name, args, engine, model, ref, renderer, opt, params, seqs, cuda)
    except Exception as e:  # noqa: BLE001 - an out-of-memory row, a kernel that fails: the next row still runs
        if cuda:
            torch.cuda.empty_cache()
        return {**row, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    done[name] = r
    flops = (head["computed_tokens"] * (8 + 2 * r["recompute_share"]) * head["layer_params"]
             + head["trained_tokens"] * 10 * head["head_params"])
    row.update({"wall_s": r["wall_s"], "update_s": r["update_s"], "tokens_per_s": head["tokens"] / r["wall_s"],
                "mfu": flops / r["wall_s"] / (args.peak_tflops * 1e12) if cuda else None, "tflop": flops / 1e12,
                "recompute_share": r["recompute_share"], "peak_gb": r["peak_gb"], "loss": r["loss"],
                "grad_norm": r["grad_norm"], "cpu_s": r["cpu_s"],
                "partly_not_run": ", ".join(w.split(":")[0] for w in why) or None})
    frozen = SWITCHES[name].get("freeze_vision", False)
    base = done.get("freeze_vision" if frozen and name != "freeze_vision" else "baseline")
    if name == "baseline":
        row.update({"equal_to": "baseline", "equal": True, "dlogp_mean": 0.0, "dlogp_max": 0.0})
    elif base is not None:
        row.update(compare(r, base, grads=not (frozen and base["switch"] == "baseline")))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--switches", default=",".join(SWITCHES), help="the rows, in order (baseline first)")
    ap.add_argument("--kl-mode", choices=["reward", "loss"], default="reward",
                    help="the trainer's default, reward: the reference's forward once, before the update")
    args = ap.parse_args()
    names = args.switches.split(",")
    if names[0] != "baseline" or any(n not in SWITCHES for n in names):
        raise SystemExit(f"--switches: baseline first, then any of {', '.join(SWITCHES)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    from paravt.backends.hf import Renderer
    from paravt.train.batches import plan_micro_batches
    from paravt.train.checkpoint import make_optimizer
    from paravt.train.engine import init_engine
    from paravt.train.grpo import GRPOConfig, train_passes
    from paravt.train.prompt_sharing import plan

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    engine = init_engine("fsdp", "cuda" if cuda else "cpu", "bf16" if cuda else "no", activation_checkpointing=True)
    model, ref, processor, n_params = build_models(args, engine, cuda)
    renderer = Renderer(processor)
    _, opt, _ = make_optimizer(model, GRPOConfig(lr=2e-6))
    params = [p for p in model.parameters()]
    for g in opt.param_groups:  # the weights stay the baseline's in every row (module doc)
        g["lr"] = 0.0
    seqs = sequences(renderer, args, np.random.default_rng(0))
    groups = plan_micro_batches(seqs, True, 1, args.token_budget, renderer)
    tokens = sum(len(s.ids) for s in seqs)
    computed = tokens - sum(sh.shared for g in groups if len(g) > 1 for sh in plan(g, renderer))
    n_layers = sum(p.numel() for p in model.model.language_model.layers.parameters())
    n_head = model.lm_head.weight.numel()
    trained = sum(s.n_trained for s in seqs)
    head = {"arch": args.arch, "device": str(engine.device), "sequences": len(seqs), "main_tokens": len(seqs[0].ids),
            "tokens": tokens, "computed_tokens": computed, "forward_passes": len(groups), "params_b": n_params / 1e9,
            "layer_params": n_layers, "head_params": n_head, "trained_tokens": trained, "master_dtype": args.dtype, "kl_mode": args.kl_mode,
            "token_budget": args.token_budget, "tolerance": {"mean_dlogp": MEAN_DLOGP, "max_dlogp": MAX_DLOGP,
                                                             "grad_rel": GRAD_REL},
            "switches": []}
    done: dict[str, dict] = {}
    for name in names:
        row = measure(name, args, head, done, engine, model, ref, renderer, opt, params, seqs, cuda)
        head["switches"].append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # as it goes: a run cut short keeps its rows
            Path(args.json).write_text(json.dumps(head, indent=1))
    if args.profile and "baseline" in done:  # where the baseline's time goes: one more step, profiled
        from paravt.train.engine import configure_checkpointing

        cfg = done["baseline"]["cfg"]
        configure_checkpointing(model, True, 1, "layer")
        model.model.visual.requires_grad_(True)
        head["profile"] = profile_update(args.profile, cuda, engine, model, ref, opt, lambda: train_passes(
            cfg, engine, model, model, ref, renderer, opt, params, copies(seqs), 2), "update_packed")
    if args.json:
        Path(args.json).write_text(json.dumps(head, indent=1))
    engine.close()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
