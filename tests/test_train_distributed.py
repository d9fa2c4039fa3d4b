"""Training on two processes (torchrun, FSDP2 over gloo, CPU) against one: the same losses and
parameters; sharded checkpoints resumed on one and on two processes continue identically; the
consolidated checkpoint loads with load_model and answers as the trained model did."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from paravt.procs import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5  # fp32 sums in another order (two shards, then a reduce) differ by a few ulps


def _run(args: list[str], nproc: int, cwd: Path) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node NPROC ARGS` (the one-process references run in the test's process)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def split(mini_split):
    return mini_split


def sft_overrides(split: Path, out: Path, engine: str, **over) -> list[str]:
    # token_budget 1: one row per (packed) pass on one process as on two, the same arithmetic (packing two
    # rows into one pass changes fp32 sums by ulps, which Adam at lr 1e-3 lifts past TOL in 4 steps)
    opts = {**dict(model="tiny", data=split / "sft.parquet", out=out, steps=4, batch_size=2, micro_batch_size=1,
                   token_budget=1, lr=1e-3, warmup_steps=0, engine=engine, device="cpu", save_every=2, threads=1),
            **over}
    return [f"{k}={v}" for k, v in opts.items()]


def sft(split: Path, out: Path, nproc: int, engine: str, **over) -> list[dict]:
    overrides = sft_overrides(split, out, engine, **over)
    if nproc > 1:
        _run(["-m", "paravt", "train", "sft"] + [x for o in overrides for x in ("-o", o)], nproc, out.parent)
    else:  # the same entry point as the CLI's, in this process: a fresh one's imports cost the suite ~6 s a run
        from paravt.train import run_training

        run_training("sft", None, overrides)
    return log_of(out)


def log_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoint" / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < TOL, worst


def test_sft_on_two_processes_equals_one_and_resumes_on_either(split, two_process_runs, tmp_path):
    """Four steps on one process against two FSDP processes stopped at step 2 (a sharded checkpoint),
    then resumed (a copy each) on two (`torchrun -m paravt train sft`, fresh processes) and on one:
    every step's loss and the final weights are one process's straight run. (Two straight through on
    two processes is the resumed-on-two run minus the resume; launching it as well cost the suite a
    fifth of this test for no claim of its own.)"""
    one = sft(split, tmp_path / "one", 1, "single")
    stopped_dir = two_process_runs["sft_fsdp"]
    assert (stopped_dir / "checkpoint" / "dcp" / "__1_0.distcp").is_file()  # sharded: one file per process
    # whole replicas (ddp): the same arithmetic
    for run in (log_of(stopped_dir), log_of(two_process_runs["sft_ddp"])):
        assert [r["step"] for r in run] == [1, 2]
        assert [r["loss"] for r in run] == pytest.approx([r["loss"] for r in one[:2]], abs=TOL)
    for nproc, engine in ((2, "fsdp"), (1, "single")):
        run = tmp_path / f"resume{nproc}"
        shutil.copytree(stopped_dir, run)
        log = sft(split, run, nproc, engine)
        assert [r["step"] for r in log] == [1, 2, 3, 4]
        for a, b in zip(one, log):
            assert a["loss"] == pytest.approx(b["loss"], abs=TOL) and a["target_tokens"] == b["target_tokens"]
        assert_same_weights(weights(run), weights(tmp_path / "one"))


@pytest.fixture(scope="module")
def rollouts(tiny_dir, tmp_path_factory):
    """Sequences of real in-process episodes of the tiny model (sampled, seeded), with advantages."""
    from paravt.agent import EpisodeConfig, run_episode
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.train.sequences import episode_sequences
    from tests.videotools import make_test_video

    d = tmp_path_factory.mktemp("rollouts")
    video = make_test_video(d / "v.mp4", seconds=8, fps=4)
    model, processor = load_model(str(tiny_dir), device="cpu")
    backend = HFBackend(model, processor)
    cfg = EpisodeConfig(frames=4, max_new_tokens=24, max_turns=1, temperature=1.0)

    async def run():
        return await asyncio.gather(*[run_episode(backend, video, "What happens?", EpisodeConfig(
            **{**cfg.__dict__, "seed": s}), question_type="oe") for s in range(4)])

    eps = asyncio.run(run())
    seqs = []
    for ep, adv in zip(eps, (1.0, -1.0, 0.5, -0.5)):
        seqs += [q for q in episode_sequences(ep, adv, backend.renderer, anchoring="token")[0] if q.n_trained]
    path = d / "seqs.pkl"
    pickle.dump({"seqs": seqs, "request": eps[0].turns[0].generation.messages}, open(path, "wb"))
    return path


@pytest.fixture(scope="module")
def two_process_runs(split, tiny_dir, rollouts, tmp_path_factory) -> dict:
    """The two-process runs the tests compare, in one torchrun launch (tests/dist_worker.py: a
    process group and the imports of torch and transformers, paid once, not once a run): the GRPO
    update in each layout the tests compare, on two FSDP processes; SFT stopped at step 2 on two FSDP
    processes and on two DDP ones; GRPO with in-process rollouts. Each run starts from its own
    weights into a folder or file of its own. (The resume on two processes is a launch of its own:
    fresh processes, as a rerun's.)"""
    d = tmp_path_factory.mktemp("two")
    layouts = ("one", "packed")
    from paravt.ask import DEFAULT_MODEL

    grpo = dict(model=DEFAULT_MODEL, data=split / "rl.parquet", out=d / "grpo", steps=1, prompts_per_step=2,
                rollouts_per_prompt=2, **{"episode.max_new_tokens": 16}, engine="fsdp", device="cpu", threads=1)
    jobs = [{"update": str(rollouts), "model": str(tiny_dir), "engine": "fsdp",
             "out": {layout: str(d / f"{layout}.pt") for layout in layouts}},
            {"train": "sft", "overrides": sft_overrides(split, d / "sft_fsdp", "fsdp", stop_at=2)},
            {"train": "sft", "overrides": sft_overrides(split, d / "sft_ddp", "ddp", stop_at=2)},
            {"train": "grpo", "overrides": [f"{k}={v}" for k, v in grpo.items()]}]
    (d / "jobs.json").write_text(json.dumps(jobs))
    _run([str(ROOT / "tests" / "dist_worker.py"), str(d / "jobs.json")], 2, d)
    return {**{layout: torch.load(d / f"{layout}.pt") for layout in layouts},
            "sft_fsdp": d / "sft_fsdp", "sft_ddp": d / "sft_ddp", "grpo": d / "grpo"}


def single_update(tiny_dir: Path, rollouts: Path, layout: str) -> dict:
    """The update on one process (engine single), this one: the reference the FSDP runs must equal."""
    from tests.dist_worker import update

    return update(str(rollouts), str(tiny_dir), "single", [layout])[layout]


def test_grpo_update_on_two_processes_equals_one_and_its_checkpoint_answers_the_same(tiny_dir, rollouts,
                                                                                       two_process_runs, tmp_path):
    """One PARA-GRPO update (PPO-clip + KL to a sharded frozen reference, token-level anchoring in
    the advantages) of the same sequences split over two FSDP processes: the same loss and weights.
    The greedy answer of the updated model, generated in the workers with the gathered weights,
    is the one the consolidated weights give after load_model."""
    one, two = single_update(tiny_dir, rollouts, "one"), two_process_runs["one"]
    for k in ("loss", "pg_loss", "kl", "trained_tokens"):
        assert one["metrics"][k] == pytest.approx(two["metrics"][k], abs=TOL), k
    assert one["metrics"]["kl"] > 0 and one["metrics"]["trained_tokens"] > 0
    assert_same_weights(one["state"], two["state"])
    assert one["tokens"] == two["tokens"]

    # the consolidated weights, saved and loaded back the way a checkpoint is
    from paravt.backends.base import GenerateRequest
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.models.tiny import save_pretrained

    model, processor = load_model(str(tiny_dir), device="cpu")
    save_pretrained(model, processor, tmp_path / "ckpt", state_dict=two["state"])
    loaded, lp = load_model(str(tmp_path / "ckpt"), device="cpu")
    req = pickle.load(open(rollouts, "rb"))["request"]
    got = HFBackend(loaded, lp).generate_sync([GenerateRequest(req, max_new_tokens=12)])[0]
    assert got.token_ids == two["tokens"]
    assert got.logprobs == pytest.approx(two["logprobs"], abs=1e-4)


def test_packed_grpo_update_on_two_processes_equals_the_padded_one_on_one(tiny_dir, rollouts, two_process_runs):
    """The update as it runs on GPUs: FSDP2, several sequences packed into each forward pass
    (per-sequence attention, log π_τ in chunks at trained positions, the reference's too), against
    the padded path on one process: the same loss, KL and weights (within what two Adam steps at
    lr 1e-3 make of fp32 sums in another order: changing the padded path's micro_batch_size alone
    moves the weights by ~3e-6)."""
    padded, packed = single_update(tiny_dir, rollouts, "padded"), two_process_runs["packed"]
    for k in ("loss", "pg_loss", "kl", "trained_tokens", "entropy"):
        assert padded["metrics"][k] == pytest.approx(packed["metrics"][k], abs=TOL), k
    worst = max(float((padded["state"][k].float() - packed["state"][k].float()).abs().max()) for k in padded["state"])
    assert worst < 5e-5, worst  # measured: 1.8e-5


def test_grpo_with_in_process_rollouts_on_two_processes(two_process_runs):
    """`train grpo` on two torchrun processes end to end (the CLI's entry point, in the module's launch;
    `torchrun -m paravt train grpo` itself runs in test_async_grpo_on_two_trainer_processes): each
    process rolls out its prompts over the gathered weights, and the rollout logprobs are those the
    sharded update recomputes."""
    out = two_process_runs["grpo"]
    [log] = log_of(out)
    assert log["episodes"] == 4 and log["logprob_drift"] < 1e-4
    assert len(list((out / "checkpoint" / "dcp").glob("*.distcp"))) == 2
