"""GRPO updates on given sequences, run by tests/test_train_distributed.py in its own process or
under torchrun (FSDP2 over gloo): each update, then a greedy generation with the gathered weights,
and rank 0 writes what the test compares.

    python tests/dist_worker.py SEQS.pkl MODEL_DIR ENGINE OUT.pt:LAYOUT [OUT.pt:LAYOUT ...]

layout: `one` packs one sequence per pass, `packed` the trainer's default token budget (several
sequences a pass), `padded` the padded path (packing off, one sequence a pass). Several updates in
one launch start each from the same weights: a process group and its imports, paid once.
"""

from __future__ import annotations

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
    seqs_path, model_dir, kind, *jobs = sys.argv[1:]
    torch.set_num_threads(1)
    paths = dict(reversed(job.rsplit(":", 1)) for job in jobs)  # layout -> OUT.pt
    for layout, result in update(seqs_path, model_dir, kind, list(paths)).items():
        torch.save(result, paths[layout])


if __name__ == "__main__":
    main()
