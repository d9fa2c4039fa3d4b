"""The distributed runs of tests/test_train_distributed.py, several in one torchrun launch (a process
group and the imports of torch and transformers, paid once), or GRPO updates in its own process:

    python tests/dist_worker.py JOBS.json

JOBS.json is a list, run in order, each job one of
- {"update": SEQS.pkl, "model": MODEL_DIR, "engine": ENGINE, "out": {LAYOUT: OUT.pt, ...}}: GRPO
  updates on given sequences, each from MODEL_DIR's weights, then a greedy generation with the
  gathered weights; rank 0 writes what the test compares. layout: `one` packs one sequence per
  pass, `packed` the trainer's default token budget (several sequences a pass), `padded` the
  padded path (packing off, one sequence a pass).
- {"train": "sft" | "grpo", "overrides": ["KEY=VALUE", ...]}: a training run through the CLI's entry
  point (paravt.train.run_training), as `torchrun -m paravt train KIND -o ...` makes it.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import torch


def update(seqs_path: str, model_dir: str, kind: str, layouts: list[str]) -> dict[str, dict]:
    """One GRPO update per layout, each from MODEL_DIR's weights: {layout: what the tests compare}
    on rank 0, {} on the others."""
    from paravt.backends.base import GenerateRequest
    from paravt.backends.hf import HFBackend, Renderer
    from paravt.train.checkpoint import load_policy, make_optimizer
    from paravt.train.engine import init_engine
    from paravt.train.grpo import GRPOConfig, _update

    data = pickle.load(open(seqs_path, "rb"))
    # two PPO epochs: the second sees the updated policy, so the KL to the reference is not 0; the KL
    # in the loss (k3) exercises the sharded reference inside the backward pass. token_budget 1: one
    # sequence per packed pass on one process as on two, the same fp32 sums (packing several changes
    # them by ulps, which Adam at lr 1e-3 lifts past the test's tolerance on the weights)
    options = {"one": {"token_budget": 1}, "packed": {}, "padded": {"packing": False}}
    engine = init_engine(kind, "cpu")
    out = {}
    for layout in layouts:
        cfg = GRPOConfig(lr=1e-3, kl_coef=0.01, kl_mode="loss", micro_batch_size=1, ppo_epochs=2, engine=kind,
                         device="cpu", **options[layout])
        model, processor = load_policy(model_dir, device="cpu")
        model.train()
        model = engine.prepare(model)
        base = engine.unwrap(model)
        ref, _ = load_policy(model_dir, device="cpu")
        ref = engine.prepare(ref, frozen=True)
        renderer = Renderer(processor)
        params, opt, _ = make_optimizer(base, cfg)
        mine = data["seqs"][engine.rank::engine.world]
        metrics = _update(cfg, engine, model, base, ref, renderer, opt, params, mine, 0)
        base.eval()
        with engine.gathered(model):
            gen = HFBackend(base, processor).generate_sync([GenerateRequest(data["request"], max_new_tokens=12)])[0]
        state = engine.full_state_dict(model)
        if engine.main:
            out[layout] = {"metrics": metrics, "state": state, "tokens": gen.token_ids, "logprobs": gen.logprobs}
    engine.close()
    return out


def main() -> None:
    import torch.distributed as dist

    from paravt.train import run_training

    torch.set_num_threads(1)
    jobs = json.load(open(sys.argv[1]))
    # one process group for every job (each job's engine joins it and leaves it standing)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    for job in jobs:
        if "update" in job:
            for layout, result in update(job["update"], job["model"], job["engine"], list(job["out"])).items():
                torch.save(result, job["out"][layout])
        else:
            run_training(job["train"], None, job["overrides"])
    if dist.is_initialized():
        dist.barrier()  # leave together (see Engine.close)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
