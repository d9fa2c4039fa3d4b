import asyncio
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from paravt import protocol as P
from paravt.agent import Episode, EpisodeConfig, MainTurn, ModelCall, SubCall
from paravt.backends.base import Completion, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend, Renderer, sequence_logprobs
from paravt.models import load_model
from paravt.rewards import RewardConfig, anchor_token_rewards, structural_positions
from paravt.train.config import ConfigError
from paravt.train.grpo import (GRPOConfig, gate_k, group_advantages, ppo_loss, prompt_schedule, rollout_metrics,
                               rollout_seed, train_grpo)
from paravt.train.logging import read_log
from trainlogs import steps_in
from paravt.train.batches import collate
from paravt.train.logprobs import token_logprobs
from paravt.train.sequences import ContinuationError, episode_sequences


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), device="cpu")


# ----------------------------------------------------------------------------------------------
# a hand-built two-turn trajectory with one sub-agent call, ids made by the real renderer

FRAME = np.full((64, 64, 3), 128, np.uint8)
GEN0 = "The event is short.</think>\n" + P.format_tool_call(2, 6)
GEN1 = "A red circle appears.</think>\n<answer>B</answer>"
SUB = "A red circle at 3 seconds."
RESPONSE = P.format_tool_response(SUB) + "\n"


def _call(r: Renderer, messages, text: str, prefix: str, lp: float) -> ModelCall:
    rd = r.render(messages, prefix=prefix)
    gen = r.encode(text) + [r.im_end]
    return ModelCall(prefix=prefix, text=text, finish_reason="stop", prompt_tokens=len(rd.ids),
                     visual_tokens=rd.visual_tokens, completion_tokens=len(gen), prompt_ids=rd.ids, token_ids=gen,
                     logprobs=[lp] * len(gen), assistant_ids=rd.prefix_ids + gen, started=0.0, finished=0.1,
                     image_times=[1.0], n_images=1, messages=messages)


def hand_episode(r: Renderer) -> Episode:
    prefix = P.THINK_PREFIX
    msgs = [Message("system", "sys"), Message("user", [TextPart("<1.0 seconds>"), ImagePart(FRAME, 1.0), TextPart("Q?")])]
    t0 = _call(r, list(msgs), GEN0, prefix, -1.0)
    msgs2 = msgs + [Message("assistant", prefix + GEN0, token_ids=t0.assistant_ids), Message("user", RESPONSE)]
    t1 = _call(r, msgs2, GEN1, prefix, -2.0)
    sub_msgs = [Message("user", [TextPart("<3.0 seconds>"), ImagePart(FRAME, 3.0), TextPart("Describe.")])]
    sub = SubCall(turn=0, index=0, call={"name": "crop_video", "arguments": {"start_time": 2, "end_time": 6}}, start=2.0,
                  end=6.0, status="ok", error=None, response=SUB, frame_times=[3.0],
                  generation=_call(r, sub_msgs, SUB, "", -3.0), started=0.0, finished=0.1)
    turns = [MainTurn(0, t0, P.parse(GEN0, prefix=prefix).to_dict(), [sub], RESPONSE, False),
             MainTurn(1, t1, P.parse(GEN1, prefix=prefix).to_dict(), [], None, False)]
    return Episode(video="v.mp4", question="Q?", question_type="mcq", config=EpisodeConfig(), duration=10.0,
                   overview_times=[1.0], turns=turns, answer="B", n_parsed_calls=1, n_executed_calls=1)


def test_masks_on_hand_built_trajectory(tiny):
    r = Renderer(tiny[1])
    ep = hand_episode(r)
    seqs, drifted = episode_sequences(ep, 0.5, r, include_subagents=True, anchoring="off")
    assert not drifted and [s.kind for s in seqs] == ["main", "sub"]
    main, sub = seqs
    t0, t1 = ep.turns[0].generation, ep.turns[1].generation
    assert main.ids == t1.prompt_ids + t1.token_ids  # one token-exact sequence for the whole episode
    trained = [i for i, m in enumerate(main.mask) if m]
    span0 = list(range(len(t0.prompt_ids), len(t0.prompt_ids) + len(t0.token_ids)))
    span1 = list(range(len(t1.prompt_ids), len(main.ids)))
    assert trained == span0 + span1
    assert r.tok.decode([main.ids[i] for i in span0]) == GEN0 + "<|im_end|>"
    # masked: the tool response, the forced prefixes, the frame, the prompt
    untrained = r.tok.decode([t for t, m in zip(main.ids, main.mask) if not m])
    assert SUB in untrained and untrained.count(P.THINK_PREFIX) == 2 and "sys" in untrained
    assert main.old_logprobs[span0[0]] == -1.0 and main.old_logprobs[span1[-1]] == -2.0
    assert all(main.old_logprobs[i] == 0.0 and main.advantages[i] == 0.0 for i in range(len(main.ids)) if not main.mask[i])
    assert all(main.advantages[i] == 0.5 for i in trained)
    assert len(main.images) == 1
    g = ep.turns[0].calls[0].generation
    assert sub.ids == g.prompt_ids + g.token_ids and sub.mask == [0] * len(g.prompt_ids) + [1] * len(g.token_ids)
    assert set(sub.advantages[len(g.prompt_ids):]) == {0.5} and set(sub.old_logprobs[len(g.prompt_ids):]) == {-3.0}
    # the switch drops sub-agent sequences
    only_main, _ = episode_sequences(ep, 0.5, r, include_subagents=False)
    assert [s.kind for s in only_main] == ["main"]


def test_drift_is_detected(tiny):
    r = Renderer(tiny[1])
    ep = hand_episode(r)
    t1 = ep.turns[1].generation
    t1.prompt_ids = t1.prompt_ids[:5] + [t1.prompt_ids[5] + 1] + t1.prompt_ids[6:]  # re-templated context
    with pytest.raises(ContinuationError, match="turn 1 context diverges from turn 0 at token 5"):
        episode_sequences(ep, 1.0, r, strict=True)
    seqs, drifted = episode_sequences(ep, 1.0, r, include_subagents=False)
    assert drifted and len(seqs) == 2  # fallback: each turn as it was fed
    for seq, turn in zip(seqs, ep.turns):
        g = turn.generation
        assert seq.ids == g.prompt_ids + g.token_ids and seq.n_trained == len(g.token_ids)


def test_token_anchoring_puts_the_bonus_at_structural_positions(tiny):
    r = Renderer(tiny[1])
    ep = hand_episode(r)
    cfg = RewardConfig()
    base, _ = episode_sequences(ep, 0.25, r, include_subagents=True, anchoring="off")
    anch, _ = episode_sequences(ep, 0.25, r, include_subagents=True, anchoring="token", reward_cfg=cfg)
    diff = {i: a - b for i, (a, b) in enumerate(zip(anch[0].advantages, base[0].advantages)) if abs(a - b) > 1e-12}
    expected = {}
    structural = set()
    for turn in ep.turns:
        g = turn.generation
        off = len(g.prompt_ids)
        for j, v in anchor_token_rewards(g.token_ids, r.tok, cfg, prefix=g.prefix).items():
            expected[off + j] = cfg.lambda_anchor * v
        structural |= {off + j for j in structural_positions(g.token_ids, r.tok)}
    assert diff == pytest.approx(expected) and len(diff) == 3  # </think> of turn 0; </think> and </answer> of turn 1 ...
    assert set(diff) <= structural  # ... and nowhere else
    think_close = r.tok.convert_tokens_to_ids(P.THINK_CLOSE)
    assert all(anch[0].ids[i] in (think_close, r.tok.convert_tokens_to_ids(P.ANSWER_CLOSE)) for i in diff)
    assert anch[1].advantages == base[1].advantages  # sub-agents carry the plain episode advantage


def test_group_advantages_by_hand():
    adv = group_advantages([[1.0, 2.0, 3.0], [5.0, 5.0]], eps=0.0, batch_norm=False)
    assert adv[0] == pytest.approx([-1.0, 0.0, 1.0]) and adv[1] == [0.0, 0.0]  # no signal in an all-equal group
    adv = group_advantages([[1.0, 2.0, 3.0], [5.0, 5.0]], eps=0.0, batch_norm=True)
    s = np.std([-1, 0, 1, 0, 0], ddof=1)
    assert adv[0] == pytest.approx([-1 / s, 0.0, 1 / s]) and adv[1] == [0.0, 0.0]
    # shaping is affine, so group normalization removes it
    r = [[0.3, 1.2, 2.0, 0.0]]
    shaped = [[(x - 0.2) * 10 for x in r[0]]]
    assert group_advantages(shaped, 1e-9, False)[0] == pytest.approx(group_advantages(r, 1e-9, False)[0], abs=1e-6)


def test_ppo_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.5]]))  # ratio 2, 1, 1
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = ppo_loss(logp, old, adv, mask, n_tokens=2, clip_eps=0.2)
    # token 0: min(2*1, 1.2*1) -> -1.2; token 1: ratio 1 -> +1; token 2 masked
    assert float(loss) == pytest.approx((-1.2 + 1.0) / 2) and float(stats["clipped"]) == 1.0
    ref = logp.clone()
    loss_kl, stats = ppo_loss(logp, old, adv, mask, 2, 0.2, ref_logp=ref, kl_coef=0.5)
    assert float(loss_kl) == pytest.approx(float(loss)) and float(stats["kl"]) == pytest.approx(0.0)
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.25]]))
    _, stats = ppo_loss(logp, old, adv, mask, 2, 0.2, ref_logp=ref, kl_coef=0.5)
    k3 = 0.5 - np.log(0.5) - 1  # exp(d) - d - 1 with d = log(0.25 / 0.5)
    assert float(stats["kl"]) == pytest.approx(2 * k3)
    # the gradient raises the logprob of a positive-advantage token
    lp = torch.tensor([[-1.0]], requires_grad=True)
    ppo_loss(lp, torch.tensor([[-1.0]]), torch.tensor([[1.0]]), torch.tensor([[1.0]]), 1)[0].backward()
    assert lp.grad.item() < 0


def test_ppo_loss_ignores_untrained_positions_a_policy_cannot_produce():
    """Padding of a micro-batch of several sequences can hold an image placeholder, whose log π is −inf
    under every policy: with the KL in the loss that gave NaN (−inf − −inf) and the update was skipped."""
    inf = float("-inf")
    logp = torch.tensor([[-1.0, inf]], requires_grad=True)
    old, ref = torch.tensor([[-1.2, inf]]), torch.tensor([[-0.9, inf]])
    adv, mask = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    loss, stats = ppo_loss(logp, old, adv, mask, 1, 0.2, ref_logp=ref, kl_coef=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    d = -0.9 + 1.0
    assert float(stats["kl"]) == pytest.approx(np.exp(d) - d - 1, rel=1e-4)  # float32


def test_recomputed_logprobs_match_the_sequence(tiny):
    """collate + token_logprobs give, per trained token, what the backend's helper computes."""
    model, processor = tiny
    r = Renderer(processor)
    seqs, _ = episode_sequences(hand_episode(r), 1.0, r)
    with torch.no_grad():
        batch = collate(model, r, seqs)
        logp, _ = token_logprobs(model, batch, temperature=0.7, banned=r.banned_ids)
        for i, s in enumerate(seqs):
            if s.kind != "sub":
                continue
            n_p = s.mask.index(1)
            ref = sequence_logprobs(model, r, s.ids[:n_p], s.ids[n_p:], s.images, temperature=0.7)
            got = logp[i][batch.mask[i] > 0]
            assert torch.allclose(got, ref, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# nFrames gating


GATE_SNIPPET = "from paravt.train.grpo import gate_k; print([gate_k(7, f'p{i}', e) for i in range(50) for e in (0, 1)])"


def test_gating_is_reproducible_and_independent_of_python_hash():
    here = [gate_k(7, f"p{i}", e) for i in range(50) for e in (0, 1)]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", GATE_SNIPPET], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == here
    ks = [gate_k(0, f"video_{i:04d}-q{i % 5}", 0) for i in range(2000)]
    counts = {k: ks.count(k) for k in (4, 8, 16, 32, 64)}
    assert set(ks) == {4, 8, 16, 32, 64} and all(300 < c < 500 for c in counts.values())  # ~uniform
    assert [gate_k(0, f"p{i}", 1) for i in range(40)] != [gate_k(0, f"p{i}", 0) for i in range(40)]  # new draw per epoch
    assert [gate_k(1, f"p{i}", 0) for i in range(40)] != [gate_k(0, f"p{i}", 0) for i in range(40)]
    assert gate_k(3, "x", 2, [4, 64]) in (4, 64)


def test_prompt_schedule_and_seeds():
    sched = [prompt_schedule(s, 3, 5, seed=1) for s in range(4)]
    flat = [i for st in sched for i, _ in st]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))  # each epoch a permutation
    assert [e for st in sched for _, e in st][:6] == [0, 0, 0, 0, 0, 1]
    assert prompt_schedule(2, 3, 5, seed=1) == sched[2]
    assert len({rollout_seed(0, 0, "p", r) for r in range(8)}) == 8


def test_rollout_metrics():
    rec = lambda g, r, reward, k, calls, fmt: {"step": 1, "group": g, "rollout": r, "k": k, "reward": reward,  # noqa: E731
                                               "accuracy": float(reward > 1), "format": fmt, "anchor": 0.0, "tool": 0.0,
                                               "degenerate": False, "answer": "A", "n_parsed_calls": calls,
                                               "n_executed_calls": calls, "turns": 1 + (calls > 0), "problem_turns": 0}
    m = rollout_metrics([rec(0, 0, 2.0, 4, 2, 1.0), rec(0, 1, 1.0, 4, 0, 0.5), rec(1, 0, 1.0, 64, 0, 0.0),
                         rec(1, 1, 1.0, 64, 0, 0.0)], [4, 8, 16, 32, 64])
    assert m["kappa"] == 0.5 and m["f_tau"] == 0.375 and m["accuracy"] == 0.25 and m["zero_signal_groups"] == 0.5
    assert m["k_frac/4"] == 0.5 and m["k_frac/64"] == 0.5 and m["k_frac/8"] == 0.0 and m["tool_use_rate"] == 0.25
    assert m["stopped_on_bad_call_rate"] == 0.0  # records written before the field count as not stopped
    stopped = dict(rec(0, 0, 0.0, 4, 2, 0.0), stopped_on_bad_call=True)
    assert rollout_metrics([stopped, rec(0, 1, 1.0, 4, 0, 0.5)], [4])["stopped_on_bad_call_rate"] == 0.5


def test_config_overrides_and_errors(tmp_path):
    cfg = GRPOConfig.load(None, ["episode.max_turns=2", "reward.w_fmt=0.5", "gating=false", "anchoring=off",
                                 "episode.on_bad_call=end"])
    assert cfg.episode.on_bad_call == "end"
    assert cfg.episode.max_turns == 2 and cfg.reward.w_fmt == 0.5 and not cfg.gating and cfg.anchoring == "off"
    assert cfg.lr == 2e-6 and cfg.clip_eps == 0.2 and cfg.kl_coef == 0.01 and cfg.rollouts_per_prompt == 8
    with pytest.raises(ConfigError, match="anchoring must be one of"):
        GRPOConfig.load(None, ["anchoring=tokens"])
    with pytest.raises(ConfigError, match="unknown config key.*episode.turns"):
        GRPOConfig.load(None, ["episode.turns=2"])
    with pytest.raises(ConfigError, match="episode: mode must be one of"):
        GRPOConfig.load(None, ["episode.mode=fast"])
    with pytest.raises(ConfigError, match="rollouts_per_prompt"):
        GRPOConfig.load(None, ["rollouts_per_prompt=1"])
    with pytest.raises(ConfigError, match="reward.judge: a function cannot be set"):
        GRPOConfig.load(None, ["reward.judge=x"])
    from pathlib import Path

    import paravt

    for p in sorted((Path(paravt.__file__).parent / "configs").glob("grpo_*.yaml")):
        GRPOConfig.load(p)


CONFIG_ERROR_SNIPPET = """
import sys
from paravt.train import run_training
from paravt.train.config import ConfigError
for kind in ("grpo", "sft"):
    try:
        run_training(kind, None, ["stepz=3"])
    except ConfigError as e:
        assert "stepz" in str(e), e
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_a_config_error_comes_before_torch_loads():
    """A typo in -o (under torchrun, once a rank) is refused without importing torch or transformers
    (~1.5 CPU-s a process), in a fresh process."""
    out = subprocess.run([sys.executable, "-c", CONFIG_ERROR_SNIPPET], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"], out.stdout


def test_cli_reports_config_errors():
    from typer.testing import CliRunner

    from paravt.cli import app

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    res = CliRunner().invoke(app, ["train", "grpo", "-o", "stepz=3"])
    assert res.exit_code == 2 and "stepz" in res.output
    res = CliRunner().invoke(app, ["train", "sft", "--override", "data=/nonexistent/sft.parquet"])
    assert res.exit_code == 2 and "does not exist" in res.output
    # a run from Python leaves the caller's signal handlers as it found them (Ctrl-C raises
    # KeyboardInterrupt again, not the trainer's Stop)
    assert {s: signal.getsignal(s) for s in before} == before


# ----------------------------------------------------------------------------------------------
# end to end: 2 PARA-GRPO steps on a fresh tiny model and SynthVT videos, then a resumed third


class ToolCallingHF(HFBackend):
    """The hf backend, except that for odd-seeded rollouts the main agent's first turn is
    teacher-forced to a crop_video call (with its exact logprobs under the current weights), so
    a randomly initialised model produces tool-using episodes and sub-agent generations."""

    async def generate(self, requests):
        return list(await asyncio.gather(*[self._one(r) for r in requests]))

    async def _one(self, req):
        if req.role == "main" and len(req.messages) == 2 and req.seed is not None and req.seed % 2:
            rd = self.renderer.render(req.messages, prefix=req.prefix)
            text = "I need a closer look.</think>\n" + P.format_tool_call(1, 5)
            ids = self.renderer.encode(text) + [self.renderer.im_end]
            # off the event loop, so the free rollouts' requests are not held back behind this forward pass
            lp = await asyncio.to_thread(self._forced_logprobs, rd, ids, req.temperature)
            return Completion(text=text, prompt_tokens=len(rd.ids), visual_tokens=rd.visual_tokens,
                              completion_tokens=len(ids), prompt_ids=rd.ids, token_ids=ids, logprobs=lp,
                              assistant_ids=rd.prefix_ids + ids)
        return (await super().generate([req]))[0]

    def _forced_logprobs(self, rd, ids, temperature):
        with torch.no_grad():
            return sequence_logprobs(self.model, self.renderer, rd.ids, ids, rd.images, temperature=temperature).tolist()


@pytest.fixture(scope="module")
def rl_split(tmp_path_factory):
    from paravt.synth.dataset import SynthConfig, build_split

    out = tmp_path_factory.mktemp("rl") / "train"
    build_split(out, SynthConfig(n=3, seed=2, split="train", min_len=20, max_len=24, event_max=4, per_video=3,
                                 oracle_k=(4,)))
    return out


def _mixed_seed(samples, cfg_kw) -> int:
    """A run seed whose first step has, in every group, both forced and free rollouts."""
    for seed in range(100):
        ok = True
        for idx, _ in prompt_schedule(0, cfg_kw["prompts_per_step"], len(samples), seed):
            par = {rollout_seed(seed, 0, samples[idx].id, r) % 2 for r in range(cfg_kw["rollouts_per_prompt"])}
            ok &= par == {0, 1}
        if ok:
            return seed
    raise AssertionError("no mixed seed")


@pytest.mark.slow
def test_two_para_grpo_steps_then_resume(tiny_dir, rl_split, tmp_path):
    from paravt.data import load_rl_rows

    samples = load_rl_rows(rl_split / "rl.parquet")
    kw = dict(prompts_per_step=2, rollouts_per_prompt=2)
    seed = _mixed_seed(samples, kw)
    out = tmp_path / "run"
    overrides = [f"model={tiny_dir}", f"data={rl_split / 'rl.parquet'}", f"out={out}", "steps=2", f"seed={seed}",
                 "prompts_per_step=2", "rollouts_per_prompt=2", "k_choices=[2, 4]", "episode.max_turns=2",
                 "episode.max_new_tokens=12", "episode.sub_max_new_tokens=6", "episode.sub_max_frames=4",
                 "lr=1e-3", "device=cpu", "threads=1", "save_every=1", "adv_norm=group", "include_subagents=true",
                 "keep_checkpoints=1", "keep_best=reward"]
    cfg = GRPOConfig.load(None, overrides)
    backends = []
    # a worker that waits 100 ms for company, so a loaded machine (CI runs three test files at once on two
    # cores) cannot space the group's first requests out past the batching window
    make = lambda *a, **k: backends.append(ToolCallingHF(*a, batch_wait_ms=100, **k)) or backends[-1]  # noqa: E731
    last = train_grpo(cfg, make_backend=make)
    assert max(backends[0].batch_sizes) >= 2  # the group's rollouts reached the model together
    assert last["step"] == 2 and np.isfinite(last["loss"]) and last["grad_norm"] > 0
    assert last["logprob_drift"] < 1e-3  # the trained ids/logprobs are the generated ones
    before, _ = load_model(str(tiny_dir), device="cpu")
    after, _ = load_model(str(out / "checkpoint"), device="cpu")
    b = before.state_dict()
    assert sum(not torch.equal(t, b[n]) for n, t in after.state_dict().items()) > 10

    log = read_log(out)
    assert [r["step"] for r in log] == [1, 2]
    for key in ("reward", "accuracy", "format", "f_tau", "anchor", "tool", "kappa", "k_frac/2", "k_frac/4",
                "parse_problem_rate", "rollout_tokens_per_s", "step_time_s", "kl", "clip_frac", "entropy"):
        assert key in log[0], key
    assert sum(r["seqs_sub"] for r in log) > 0 and log[0]["kappa"] > 0
    assert list((out / "tb").glob("events.*"))
    assert sorted(p.name for p in out.glob("step_*")) == ["step_000002"]  # keep_checkpoints=1: the newest only
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["reward"] == max(r["reward"] for r in log) and best["step"] == max(log, key=lambda r: r["reward"])["step"]

    rec = [json.loads(l) for l in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rec) == 2 * 2 * 2 and all(r["stopped_on_bad_call"] is False for r in rec)
    groups: dict = {}
    for r in rec:
        groups.setdefault((r["step"], r["group"]), []).append(r)
    assert any(max(x["reward"] for x in g) > min(x["reward"] for x in g) for g in groups.values())
    for g in groups.values():
        g.sort(key=lambda x: x["rollout"])
        want = group_advantages([[min(20.0, (x["reward"] - 0.2) * 10) for x in g]], cfg.adv_eps, batch_norm=False)[0]
        assert [x["advantage"] for x in g] == pytest.approx(want, abs=1e-6)  # group-normalized
        assert len({x["k"] for x in g}) == 1 and g[0]["k"] == gate_k(seed, g[0]["prompt_id"], g[0]["epoch"], [2, 4])

    cfg.steps = 3
    assert train_grpo(cfg, make_backend=ToolCallingHF)["step"] == 3  # resumed at 2
    assert [r["step"] for r in read_log(out)] == [1, 2, 3]
    assert {json.loads(l)["step"] for l in (out / "rollouts.jsonl").read_text().splitlines()} == {1, 2, 3}


def test_ctrl_c_says_what_a_rerun_does_and_no_log_is_lost(tiny_dir, rl_split, tmp_path, ctrl_c):
    """`paravt train grpo` stopped by Ctrl-C before its first checkpoint says there is none and a rerun
    starts over; the rerun keeps the earlier log.jsonl and rollouts.jsonl whole beside its own. Stopped
    after a checkpoint, it names that checkpoint's step (what a resume keeps: test_train_sft)."""
    from typer.testing import CliRunner

    from paravt.cli import app

    out = tmp_path / "run"
    base = ["train", "grpo", "-o", f"model={tiny_dir}", "-o", f"data={rl_split / 'rl.parquet'}", "-o", f"out={out}",
            "-o", "prompts_per_step=1", "-o", "rollouts_per_prompt=2", "-o", "k_choices=[2]", "-o", "episode.max_turns=1",
            "-o", "episode.max_new_tokens=4", "-o", "device=cpu", "-o", "threads=1", "-o", "save_every=10"]
    ctrl_c["step"] = 1
    r = CliRunner().invoke(app, [*base, "-o", "steps=2"])
    said = " ".join(r.output.split())
    assert r.exit_code == 130 and "no checkpoint was written yet" in said and "starts over at step 1" in said, said
    assert "checkpoint is kept" not in said and steps_in(out / "log.jsonl") == [1]
    first_rollouts = (out / "rollouts.jsonl").read_text()

    ctrl_c["step"] = None
    r = CliRunner().invoke(app, [*base, "-o", "steps=2"])
    assert r.exit_code == 0, r.output
    assert steps_in(out / "log.jsonl") == [1, 2] and steps_in(out / "log.1.jsonl") == [1]  # the first run's, kept
    assert (out / "rollouts.1.jsonl").read_text() == first_rollouts
    assert "kept in log.1.jsonl" in " ".join(r.output.split())

    ctrl_c["step"] = 3  # after step 3 is logged, before it is saved
    r = CliRunner().invoke(app, [*base, "-o", "steps=3"])
    said = " ".join(r.output.split())
    assert r.exit_code == 130 and "its checkpoint of step 2 is kept" in said and "resume from step 2" in said, said


@pytest.mark.filterwarnings("error:Detected call of:UserWarning")  # a skipped first update still moves the lr on, silently
def test_a_non_finite_update_is_skipped_and_never_saved(tiny_dir, rl_split, tmp_path):
    """Every update's loss is NaN (the policy's logits poisoned in training mode only): the updates are
    skipped and counted, the checkpoint keeps finite weights (the starting ones), and after
    max_nonfinite_steps such steps the run stops with one line naming the step and the quantity."""
    from paravt.train.checkpoint import load_state
    from paravt.train.grpo import TrainingDiverged

    def poisoned(model, processor, **kw):
        model.lm_head.register_forward_hook(lambda mod, args, out: out * float("nan") if mod.training else out)
        return HFBackend(model, processor, **kw)

    out = tmp_path / "run"
    cfg = GRPOConfig.load(None, [f"model={tiny_dir}", f"data={rl_split / 'rl.parquet'}", f"out={out}", "steps=5",
                                 "prompts_per_step=1", "rollouts_per_prompt=2", "k_choices=[2]",
                                 "episode.max_turns=1", "episode.max_new_tokens=4", "device=cpu", "threads=1",
                                 "save_every=1", "max_nonfinite_steps=2", "kl_coef=0"])
    with pytest.raises(TrainingDiverged, match=r"step 2: the update was skipped 2 steps in a row because the loss"):
        train_grpo(cfg, make_backend=poisoned)
    assert load_state(out)["step"] == 1
    assert read_log(out)[0]["skipped_updates"] == 1
    before, _ = load_model(str(tiny_dir), device="cpu")
    after, _ = load_model(str(out / "checkpoint"), device="cpu")
    b = before.state_dict()
    assert all(torch.equal(t, b[n]) for n, t in after.state_dict().items())


@pytest.mark.parametrize("override", ["lr=inf", "kl_coef=nan", "clip_eps=-inf", "reward.w_fmt=nan"])
def test_non_finite_settings_are_refused_at_load(override):
    from paravt.train.config import ConfigError

    with pytest.raises(ConfigError, match="finite"):
        GRPOConfig.load(None, [override])


def test_non_finite_settings_in_code_are_refused():
    with pytest.raises(ValueError, match="kl_coef must be finite"):
        GRPOConfig(kl_coef=float("nan"))


def test_train_errors_are_one_line(rl_split, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "paravt", "train", "grpo", "-o", f"data={rl_split / 'rl.parquet'}",
                        "-o", f"model={tmp_path / 'no-such-checkpoint'}", "-o", f"out={tmp_path / 'run'}",
                        "-o", "device=cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "no-such-checkpoint" in lines[0], r.stderr


def test_divergence_warnings():
    """Entropy past twice the run's first steps', KL past warn_kl, skipped updates: each is said."""
    from paravt.train.grpo import _RunState

    cfg = GRPOConfig()
    run = _RunState()
    for ent in (0.25, 0.24, 0.26, 0.25, 0.25, 9.0):  # only the first five make the baseline
        run.track({"entropy": ent}, cfg)
    assert run.entropy_start == [0.25, 0.24, 0.26, 0.25, 0.25]
    assert run.warnings({"entropy": 0.4, "kl": 0.05, "skipped_updates": 0}, cfg) == []
    said = run.warnings({"entropy": 0.6, "kl": 0.8, "skipped_updates": 1, "updates": 1, "grad_norm": float("nan")}, cfg)
    assert len(said) == 3 and "2.4x" in said[0] and "0.800" in said[1] and "1 of 1 updates skipped" in said[2]


@pytest.mark.parametrize("text,why", [
    ("1: x\n", "not a setting's name"),
    ("~: x\n", "not a setting's name"),
    ("keep_best: yes\n", "keep_best must name a step metric"),
    ("keep_best: rewards\n", "keep_best must name a step metric"),
    ("betas: [2, 3]\n", "betas must be two numbers in"),
    ("threads: -1\n", "threads must be >= 0"),
    ("steps: 010\n", "read by YAML as 8"),
    ("save_every: 1:30\n", "read by YAML as 90"),
    ("steps: 3\nlr: 1e-6\nsteps: 5\n", "'steps' is given twice \\(lines 1 and 3\\)"),
    ("episode:\n  max_turns: 2\n  max_turns: 3\n", "'max_turns' is given twice"),
])
def test_a_config_that_would_fail_later_or_mean_something_else_fails_at_load(tmp_path, text, why):
    """Each loaded before (or failed only once the run started, or silently became another value)."""
    from paravt.train.config import ConfigError
    from paravt.train.sft import SFTConfig

    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=why):
        GRPOConfig.load(p)
    if not text.startswith(("keep_best", "episode")):
        with pytest.raises(ConfigError, match=why):
            SFTConfig.load(p)
    assert GRPOConfig.load(None, ["steps=10", "keep_best=reward", "betas=[0.9, 0.95]"]).steps == 10


def test_keep_best_names_metrics_a_step_logs():
    from paravt.train.grpo.config import KEEP_BEST_METRICS
    from paravt.train.grpo.rollouts import rollout_metrics

    rec = {"step": 1, "group": 0, "reward": 1.0, "k": 4, "accuracy": 1.0, "format": 1.0, "anchor": 1.0, "tool": 0.0,
           "degenerate": 0, "n_parsed_calls": 1, "n_executed_calls": 1, "answer": "a", "turns": 2, "problem_turns": 0}
    assert set(KEEP_BEST_METRICS) <= set(rollout_metrics([rec], [4]))
