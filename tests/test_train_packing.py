"""Packed micro-batches (train.batches.pack) against the padded path, one sequence at a time
(`collate`): the same per-token log π_τ and entropy, the same loss and gradients, on the tiny
Qwen3-VL in fp32 — with frames of different sizes in different sequences, sub-agent sequences and
a sequence without frames in one forward pass."""

import numpy as np
import pytest
import torch

from paravt.backends.base import ImagePart, Message, TextPart
from paravt.backends.hf import Renderer
from paravt.models import load_model
from paravt.train.grpo import GRPOConfig, ppo_loss, update_policy
from paravt.train.engine import init_engine
from paravt.train.attention import VARLEN_SDPA, varlen_attention
from paravt.train.batches import collate, pack, pack_groups, per_sequence, plan_micro_batches, sequence_rows
from paravt.train.logprobs import token_logprobs
from paravt.train.sequences import TrainSequence
from rollouttools import group_rollouts, packed_pass

TAU = 0.7
# the trainer's packed attention on a CPU (per-sequence sdpa), and transformers' own packed path
# (sdpa with the block-diagonal mask it builds from the positions)
IMPLS = [VARLEN_SDPA, "sdpa"]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), device="cpu")


def _seq(r: Renderer, rng, frames: list[tuple[int, int]], n_gen: int, kind: str, turns: int = 1) -> TrainSequence:
    """A rendered prompt with frames of the given sizes, then `turns` generated spans (a tool
    response, masked, between them), random ids from the ordinary vocabulary."""
    parts = []
    for i, (h, w) in enumerate(frames):
        parts += [TextPart(f"<{i}.0 seconds>"), ImagePart(rng.integers(0, 256, (h, w, 3), np.uint8), float(i))]
    parts.append(TextPart("What happens?"))
    rd = r.render([Message("system", "sys"), Message("user", parts)])
    ids, mask = list(rd.ids), [0] * len(rd.ids)
    for t in range(turns):
        gen = [int(x) for x in rng.integers(200, len(r.tok) - 200, n_gen)]
        ids += gen
        mask += [1] * len(gen)
        if t < turns - 1:
            resp = r.encode("<tool_response>a red circle</tool_response>")
            ids += resp
            mask += [0] * len(resp)
    old = [float(-rng.uniform(0.5, 3.0)) if m else 0.0 for m in mask]
    adv = [float(rng.normal()) if m else 0.0 for m in mask]
    return TrainSequence(ids, mask, old, adv, rd.images, kind)


@pytest.fixture(scope="module")
def seqs(tiny):
    r = Renderer(tiny[1])
    rng = np.random.default_rng(0)
    return [_seq(r, rng, [(64, 64), (64, 64)], 9, "main", turns=2),
            _seq(r, rng, [(96, 64)], 7, "sub"),
            _seq(r, rng, [(128, 96), (64, 128), (64, 64)], 5, "sub"),
            _seq(r, rng, [], 6, "main", turns=3)]


def _padded_rows(model, r, seqs, **kw):
    """The current path: one sequence per forward pass, per-sequence rows."""
    lps, ents = [], []
    for s in seqs:
        b = collate(model, r, [s])
        lp, ent = token_logprobs(model, b, **kw)
        lps += per_sequence([s], lp)
        ents += per_sequence([s], ent) if ent is not None else [None]
    return lps, ents


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_logprobs_equal_one_sequence_at_a_time(tiny, seqs, impl):
    model, processor = tiny
    r = Renderer(processor)
    with torch.no_grad():
        want, want_ent = _padded_rows(model, r, seqs, with_entropy=True, temperature=TAU, banned=r.banned_ids)
    with torch.no_grad(), varlen_attention(model, impl=impl):
        for chunk in (1024, 4):  # several chunks of positions: the same numbers
            b = pack(model, r, seqs, chunk=chunk)
            assert b.inputs["input_ids"].shape == (1, sum(len(s.ids) for s in seqs))  # one row, no padding
            assert "attention_mask" not in b.inputs and b.inputs["position_ids"].shape[0] == 4
            lp, ent = token_logprobs(model, b, with_entropy=True, temperature=TAU, banned=r.banned_ids)
            assert lp.shape == (sum(s.n_trained for s in seqs),)
            got, got_ent = sequence_rows(seqs, b, lp), sequence_rows(seqs, b, ent)
            for s, w, g, we, ge in zip(seqs, want, got, want_ent, got_ent):
                on = [p for p, m in enumerate(s.mask) if m]
                assert np.allclose([g[p] for p in on], [w[p] for p in on], atol=1e-5, rtol=0)
                assert np.allclose([ge[p] for p in on], [we[p] for p in on], atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_never_crosses_sequences(tiny, seqs, impl):
    """A sequence's logprobs do not depend on what it is packed with (nor on its place)."""
    model, processor = tiny
    r = Renderer(processor)
    with torch.no_grad(), varlen_attention(model, impl=impl):
        alone = sequence_rows([seqs[1]], b := pack(model, r, [seqs[1]]), token_logprobs(model, b)[0])[0]
        order = [seqs[3], seqs[1], seqs[0]]
        b = pack(model, r, order)
        mixed = sequence_rows(order, b, token_logprobs(model, b)[0])[1]
    assert np.allclose(alone, mixed, atol=1e-5, rtol=0)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_loss_and_gradients_equal_one_sequence_at_a_time(tiny, seqs, impl):
    model, processor = tiny
    r = Renderer(processor)
    n_tok = sum(s.n_trained for s in seqs)

    def run(batches):
        model.zero_grad(set_to_none=True)
        total = 0.0
        for b in batches:
            lp, _ = token_logprobs(model, b, temperature=TAU, banned=r.banned_ids)
            ref = lp.detach() - 0.05  # a reference nearby: the k3 KL term's gradient too
            loss, _ = ppo_loss(lp, b.old_logprobs, b.advantages, b.mask, n_tok, 0.2, ref, 0.1)
            loss.backward()
            total += float(loss.detach())
        return total, _grads(model)

    padded_loss, padded = run([collate(model, r, [s]) for s in seqs])
    with varlen_attention(model, impl=impl):  # the backward too
        packed_loss, packed = run([pack(model, r, g, chunk=5) for g in pack_groups(seqs, 10_000)])
    assert model.config.text_config._attn_implementation == "sdpa"  # restored
    model.zero_grad(set_to_none=True)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-6)
    assert padded.keys() == packed.keys() and any("visual" in n for n in packed)  # the vision tower trains too
    for n in padded:
        scale = padded[n].abs().max().item() + 1e-8
        assert (packed[n] - padded[n]).abs().max().item() <= 1e-4 * scale + 1e-7, n


def test_pack_groups_fill_the_budget_and_keep_every_sequence(seqs):
    lens = [len(s.ids) for s in seqs]
    groups = pack_groups(seqs, max(lens) + 50)
    assert sorted(id(s) for g in groups for s in g) == sorted(id(s) for s in seqs)
    assert all(sum(len(s.ids) for s in g) <= max(lens) + 50 for g in groups)
    assert len(pack_groups(seqs, 1)) == len(seqs)  # longer than the budget: one pass each
    assert len(pack_groups(seqs, sum(lens))) == 1
    assert [len(g) for g in plan_micro_batches(seqs, False, 3, 1)] == [3, 1]  # packing off: the padded path's


def test_update_policy_packed_equals_padded(tiny_dir, seqs):
    """The trainer's update, packing on and off, from the same weights: the same loss, gradient
    norm and statistics."""
    from paravt.train.checkpoint import make_optimizer

    out = {}
    for packing in (False, True):
        model, processor = load_model(str(tiny_dir), device="cpu")
        model.train()
        r = Renderer(processor)
        cfg = GRPOConfig(device="cpu", engine="single", micro_batch_size=1, packing=packing, token_budget=4096,
                         lr=1e-3, kl_coef=0.0, temperature=TAU)
        engine = init_engine("single", "cpu")
        params, opt, _ = make_optimizer(model, cfg)
        copies = [TrainSequence(list(s.ids), list(s.mask), list(s.old_logprobs), list(s.advantages), s.images, s.kind)
                  for s in seqs]
        out[packing] = update_policy(cfg, engine, model, model, None, r, opt, params, copies, 0)
    for k in ("loss", "pg_loss", "clip_frac", "ratio_mean", "entropy", "grad_norm", "logprob_drift"):
        assert out[True][k] == pytest.approx(out[False][k], rel=1e-4, abs=1e-6), k
    assert out[True]["trained_tokens"] == out[False]["trained_tokens"]


def test_packed_passes_use_a_varlen_attention_and_restore_the_model_after(tiny):
    model, _ = tiny
    with varlen_attention(model) as impl:  # no flash-attn on a CPU: sdpa per packed sequence
        assert impl == VARLEN_SDPA and model.config.text_config._attn_implementation == VARLEN_SDPA
        assert model.config.vision_config._attn_implementation == "sdpa"  # the vision tower already goes per image
    assert model.config.text_config._attn_implementation == "sdpa"


def test_checkpoint_every_checkpoints_every_nth_layer_only():
    from paravt.models.tiny import build_tiny

    def checkpointed(n: int) -> list[bool]:
        model, _ = build_tiny(seed=0)
        model = init_engine("single", "cpu", activation_checkpointing=True, checkpoint_every=n).prepare(model)
        return [m.gradient_checkpointing for m in model.model.language_model.layers]

    assert checkpointed(1) == [True] * 4
    assert checkpointed(2) == [True, False, True, False]


# ----------------------------------------------------------------------------------------------
# shared prompts (train.prompt_sharing): sequences that begin alike hold their beginning once


@pytest.fixture(scope="module")
def sharing(tiny):
    """Three rollouts of one prompt (one of two turns), two of a prompt with other frames of the
    same sizes (the same ids up to the answer: only the frames tell them apart), a sub-agent
    sequence with frames of its own, and a prompt with the first prompt's frames and one more."""
    r = Renderer(tiny[1])
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (64, 64, 3), np.uint8) for _ in range(2)]
    other = [rng.integers(0, 256, (64, 64, 3), np.uint8) for _ in range(2)]
    a = group_rollouts(r, rng, frames, [9, 4]) + group_rollouts(r, rng, frames, [6], turns=2)
    b = group_rollouts(r, rng, other, [5, 7])
    more = group_rollouts(r, rng, frames + [rng.integers(0, 256, (64, 96, 3), np.uint8)], [6])
    return [a[0], b[0], a[1], _seq(r, rng, [(96, 64)], 7, "sub"), a[2], b[1], more[0]]


def test_shared_prompts_are_laid_out_once_and_never_across_other_frames(tiny, sharing):
    from paravt.train import prompt_sharing as ps

    r = Renderer(tiny[1])
    shares = ps.plan(sharing, r)
    roots = [i for i, s in enumerate(shares) if s.root < 0]
    assert roots == [0, 1, 3]  # the first of each prompt, and the sub-agent's
    assert [s.root for s in shares] == [-1, -1, 0, -1, 0, 1, 0]
    prompt = sharing[0].mask.index(1)
    assert shares[2].shared == shares[4].shared == prompt  # the whole prompt, frames and all
    assert shares[5].shared == prompt  # b's second rollout shares b's prompt, not a's
    # the two prompts' ids agree up to the answer; their frames do not: shared only up to the first frame
    pads = [p for p, t in enumerate(sharing[0].ids) if t == r.image_pad]
    assert sharing[0].ids[:prompt] == sharing[1].ids[:prompt]
    assert ps.shared_length(sharing[0], ps.image_runs(sharing[0], r), sharing[1],
                            ps.image_runs(sharing[1], r)) == pads[0]
    # the last prompt holds the first's two frames, then one of its own: shared up to where they part
    runs = ps.image_runs(sharing[6], r)
    assert runs[1][1] < shares[6].shared < runs[2][0] and shares[6].images == ps.shared_images(runs, shares[6].shared) == 2
    b = pack(tiny[0], r, sharing, share_prompts=True)
    assert b.inputs["input_ids"].shape[1] == sum(len(s.ids) for s in sharing) - 3 * prompt - shares[6].shared
    assert b.inputs["image_grid_thw"].shape[0] == 2 + 2 + 1 + 1  # each prompt's frames once, the others' own


@pytest.mark.parametrize("checkpointed", [False, True])
def test_shared_prompts_give_the_same_logprobs_loss_and_gradients(tiny_dir, sharing, checkpointed):
    """Shared or not, the same per-token log π_τ, entropy, loss and gradients (every parameter, the
    vision tower's too), with the layers checkpointed (their attention recomputed in the backward)."""
    model, processor = load_model(str(tiny_dir), device="cpu")
    if checkpointed:  # in training mode, where checkpointed layers recompute in the backward
        model = init_engine("single", "cpu", activation_checkpointing=True).prepare(model).train()
    r = Renderer(processor)

    def run(share: bool):
        model.zero_grad(set_to_none=True)
        b, lp, ent, loss = packed_pass(model, r, sharing, VARLEN_SDPA, share)
        return sequence_rows(sharing, b, lp.detach()), sequence_rows(sharing, b, ent), float(loss.detach()), _grads(model)

    plain, shared = run(False), run(True)
    for k in (0, 1):
        for s, w, g in zip(sharing, plain[k], shared[k]):
            on = [p for p, m in enumerate(s.mask) if m]
            assert np.allclose([g[p] for p in on], [w[p] for p in on], atol=1e-5, rtol=0)
    assert shared[2] == pytest.approx(plain[2], rel=1e-5, abs=1e-6)
    assert plain[3].keys() == shared[3].keys() and any("visual" in n for n in shared[3])
    for n in plain[3]:
        scale = plain[3][n].abs().max().item() + 1e-8
        assert (shared[3][n] - plain[3][n]).abs().max().item() <= 1e-4 * scale + 1e-7, n


def test_a_shared_prompt_counts_once_against_the_token_budget(tiny, sharing):
    """With sharing, a pass's budget holds what it computes: a prompt its sequences share counts
    once, so a group's rollouts fit in one pass that their full lengths would overflow, and no
    pass computes more than the budget."""
    r = Renderer(tiny[1])
    group = [sharing[i] for i in (0, 2, 4)]  # one prompt's three rollouts
    prompt = group[0].mask.index(1)
    budget = sum(len(s.ids) for s in group) - 2 * prompt
    assert len(pack_groups(group, budget)) > 1
    assert [len(g) for g in pack_groups(group, budget, r)] == [3]
    for budget in (max(len(s.ids) for s in sharing), budget, 2 * budget):
        groups = plan_micro_batches(sharing, True, 1, budget, r)
        assert sorted(id(s) for g in groups for s in g) == sorted(id(s) for s in sharing)
        for g in groups:
            assert len(g) == 1 or pack(tiny[0], r, g, share_prompts=True).inputs["input_ids"].shape[1] <= budget


def test_a_sequence_without_trained_tokens_is_still_the_packs_clear_error(tiny, sharing):
    from paravt.train.sequences import SequenceError

    r = Renderer(tiny[1])
    s = sharing[2]
    untrained = TrainSequence(list(s.ids), [0] * len(s.ids), [0.0] * len(s.ids), [0.0] * len(s.ids), s.images)
    groups = plan_micro_batches([sharing[0], untrained], True, 1, 10_000, r)
    with pytest.raises(SequenceError, match="no trained token"):
        pack(tiny[0], r, groups[0], share_prompts=True)
