"""The update's speed switches (docs/gpu.md), each against today's path on the tiny Qwen3-VL on a CPU:
what a CPU can check of each. The GPU kernels themselves (torch's varlen attention, Liger's) do
not run on a CPU: their wiring is checked here with a torch reference of their documented
arithmetic in their place, and `benchmarks/gpu.sh` checks the kernels against the baseline on a GPU."""

import functools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from paravt.chat import Renderer
from paravt.models import load_model
from paravt.train import attention as attn
from paravt.train import kernels
from paravt.train.attention import TORCH_VARLEN, VARLEN_SDPA, packed_attention, varlen_attention
from paravt.train.engine import configure_checkpointing, init_engine
from paravt.train.grpo import GRPOConfig
from paravt.train.sequences import TrainSequence
from rollouttools import group_rollouts, packed_pass

TAU = 0.7


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), device="cpu")


@pytest.fixture(scope="module")
def seqs(tiny):
    """A group of three rollouts (one of two turns) and a sub-agent sequence with its own frame."""
    r = Renderer(tiny[1])
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, (64, 64, 3), np.uint8) for _ in range(2)]
    sub = group_rollouts(r, rng, [rng.integers(0, 256, (96, 64, 3), np.uint8)], [7], group=0)
    return (group_rollouts(r, rng, frames, [9, 4], group=0) + group_rollouts(r, rng, frames, [6], turns=2, group=0)
            + sub)


def _copies(seqs):
    return [TrainSequence(list(s.ids), list(s.mask), list(s.old_logprobs), list(s.advantages), s.images, s.kind,
                          s.group) for s in seqs]


def _pass(model, r, seqs, impl=VARLEN_SDPA, share=True):
    """One packed pass's log π_τ, entropy, loss and gradients (the k3 KL term's too)."""
    model.zero_grad(set_to_none=True)
    _, lp, ent, loss = packed_pass(model, r, seqs, impl, share)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return lp.detach(), ent, loss.detach(), grads


def _assert_close(a, b, tol=1e-5):
    assert torch.allclose(a[0], b[0], atol=tol, rtol=0) and torch.allclose(a[1], b[1], atol=tol, rtol=0)
    assert float(a[2]) == pytest.approx(float(b[2]), rel=tol, abs=1e-7)
    assert a[3].keys() == b[3].keys()
    for n in a[3]:
        scale = a[3][n].abs().max().item() + 1e-8
        assert (a[3][n] - b[3][n]).abs().max().item() <= 10 * tol * scale + 1e-7, n


# ----------------------------------------------------------------------------------------------
# packed_attention: varlen (torch.nn.attention.varlen.varlen_attn)


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                      enable_gqa=False):
    """varlen_attn's documented arithmetic (torch 2.12's signature) in sdpa: each segment's queries
    against its keys, causal aligned to the last key (window (-1, 0)), as flash-attention's is."""
    assert window_size == (-1, 0) and max_q == int((cu_q[1:] - cu_q[:-1]).max()) and cu_q.dtype == torch.int32
    if k.shape[1] != q.shape[1]:
        assert enable_gqa
        k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // k.shape[1], 1)
    outs = []
    for i in range(len(cu_q) - 1):
        qi, ki, vi = (t[c[i]:c[i + 1]].transpose(0, 1) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        n, m = qi.shape[1], ki.shape[1]
        mask = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
        outs.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale).transpose(0, 1))
    return torch.cat(outs)


def _reference_varlen_29(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.9's signature: `is_causal`, no scale, the same number of heads for q and k/v."""
    assert is_causal and k.shape[1] == q.shape[1]
    return _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0))


@pytest.mark.parametrize("kernel", [_reference_varlen, _reference_varlen_29])
def test_torch_varlen_wiring_gives_the_sdpa_paths_logprobs_and_gradients(tiny, seqs, monkeypatch, kernel):
    """One varlen call a layer over the pass (the shared prompt's keys gathered for each
    continuation, grouped-query heads as each torch's varlen takes them): the same log π_τ,
    entropy, loss and gradients as sdpa per sequence."""
    model, processor = tiny
    r = Renderer(processor)
    calls = []

    @functools.wraps(kernel)  # the signature the wiring reads
    def counted(*a, **k):
        calls.append(1)
        return kernel(*a, **k)

    monkeypatch.setattr(attn, "_varlen_kernel", lambda: counted)
    monkeypatch.setattr(attn, "KERNEL_DTYPES", (torch.float32,))  # the reference computes in the model's fp32
    want = _pass(model, r, seqs, VARLEN_SDPA)
    got = _pass(model, r, seqs, TORCH_VARLEN)
    assert len(calls) == model.config.text_config.num_hidden_layers  # one call a layer (the backward is autograd's)
    _assert_close(got, want)


def test_varlen_falls_back_to_sdpa_per_sequence_where_it_cannot_run(tiny):
    """On a CPU (and in fp32) torch's varlen kernel does not run: the choice falls back, says why
    once, and the pass is today's."""
    model, _ = tiny
    assert "CUDA" in attn.varlen_unavailable(model)
    attn._said.clear()
    with pytest.warns(UserWarning, match="varlen falls back to sdpa per sequence.*CUDA"):
        assert packed_attention(model, choice="varlen") == VARLEN_SDPA
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert packed_attention(model, choice="varlen") == VARLEN_SDPA  # said once
        with varlen_attention(model, choice="varlen") as impl:
            assert impl == VARLEN_SDPA
    assert packed_attention(model, choice="sdpa") == VARLEN_SDPA == packed_attention(model)
    with pytest.raises(ValueError, match="packed_attention must be one of"):
        packed_attention(model, choice="flash")


# ----------------------------------------------------------------------------------------------
# liger: Liger's kernels (RMSNorm, SwiGLU, rotary, fused linear log-probability)


def _reference_ops(counts: dict) -> kernels.Ops:
    """The arithmetic of Liger's functional kernels, in torch, counting their calls."""
    def rms_norm(x, w, eps):
        counts["rms_norm"] += 1
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def swiglu(a, b):
        counts["swiglu"] += 1
        return F.silu(a) * b

    def rope(q, k, cos, sin):
        counts["rope"] += 1
        half = lambda x: torch.cat([-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]], -1)  # noqa: E731
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + half(q) * s, k * c + half(k) * s

    def linear_ce(x, w, y, b):  # per-token cross-entropy, a few rows at a time (never all logits at once)
        counts["logprob"] += 1
        out = []
        for a in range(0, x.shape[0], 3):
            z = (x[a:a + 3] @ w.t() + (b if b is not None else 0)).float()
            out.append(torch.logsumexp(z, -1) - z.gather(-1, y[a:a + 3, None]).squeeze(-1))
        return torch.cat(out)

    return kernels.Ops(rms_norm, swiglu, rope, linear_ce)


def test_liger_wiring_gives_the_models_logprobs_and_gradients_and_comes_off_after(tiny, seqs):
    """Every part on (the reference arithmetic in Liger's place): each routes the text model's
    work through its kernel, the pass's log π_τ (τ and the never-sampled ids folded into the fused
    call), entropy, loss and gradients are the model's own, and after the block nothing is left."""
    model, processor = tiny
    r = Renderer(processor)
    from transformers.models.qwen3_vl import modeling_qwen3_vl as mq

    rotary = mq.apply_rotary_pos_emb
    want = _pass(model, r, seqs)
    counts = dict.fromkeys(kernels.PARTS, 0)
    with kernels.liger_kernels(model, model, parts=["all"], ops=_reference_ops(counts)) as on:
        assert on == list(kernels.PARTS)
        got = _pass(model, r, seqs)
    layers = model.config.text_config.num_hidden_layers
    assert counts == {"rms_norm": 4 * layers + 1, "swiglu": layers, "rope": layers, "logprob": 1}
    _assert_close(got, want)
    assert mq.apply_rotary_pos_emb is rotary and not hasattr(model, kernels.FUSED_LOGPROB)
    assert all("forward" not in vars(m) for m in model.modules())
    counts = dict.fromkeys(kernels.PARTS, 0)
    with kernels.liger_kernels(model, parts=["logprob"], ops=_reference_ops(counts)):
        _assert_close(_pass(model, r, seqs), want)
    assert counts == {"rms_norm": 0, "swiglu": 0, "rope": 0, "logprob": 1}


def test_liger_without_cuda_or_the_wheel_runs_the_models_own_code(tiny, seqs):
    model, processor = tiny
    kernels._said.clear()
    with pytest.warns(UserWarning, match="liger: the model's own code runs instead: .*CUDA"):
        with kernels.liger_kernels(model, parts=["rms_norm", "logprob"]) as on:
            assert on == [] and not hasattr(model, kernels.FUSED_LOGPROB)
    with pytest.raises(ValueError, match="liger takes parts among"):
        kernels.check_parts(["rmsnorm"])


# ----------------------------------------------------------------------------------------------
# selective activation checkpointing: every other layer, or the attention only


def test_selective_checkpointing_gives_full_checkpointings_loss_and_gradients_exactly(tiny_dir, seqs):
    """Recomputing less (every other layer; only each layer's attention) runs the forward's own
    arithmetic again: the loss and every gradient are those of full checkpointing, bit for bit."""
    model, processor = load_model(str(tiny_dir), device="cpu")
    model.train()
    r = Renderer(processor)
    layers = model.model.language_model.layers
    out = {}
    for every, part in ((1, "layer"), (2, "layer"), (1, "attention"), (2, "attention")):
        configure_checkpointing(model, True, every, part)
        recomputed = [type(m).__name__ for m in model.modules() if getattr(m, "_paravt_checkpointed", False)]
        assert [m.gradient_checkpointing for m in layers] == ([False] * 4 if part == "attention" else
                                                              [True, False] * 2 if every == 2 else [True] * 4)
        assert len(recomputed) == (0 if part == "layer" else 4 // every)
        out[every, part] = _pass(model, r, seqs, share=True)
    configure_checkpointing(model, False)
    assert not any(m.gradient_checkpointing for m in layers) and not any(
        getattr(m, "_paravt_checkpointed", False) for m in model.modules())
    full = out[1, "layer"]
    for key, got in out.items():
        assert torch.equal(got[0], full[0]) and float(got[2]) == float(full[2]), key
        assert all(torch.equal(got[3][n], full[3][n]) for n in full[3]), key


def test_checkpoint_part_comes_from_the_config(tiny_dir):
    from paravt.models.tiny import build_tiny

    model, _ = build_tiny(seed=0)
    cfg = GRPOConfig(device="cpu", engine="single", activation_checkpointing=True, checkpoint_part="attention")
    engine = init_engine("single", "cpu", activation_checkpointing=True, checkpoint_part=cfg.checkpoint_part)
    engine.prepare(model)
    assert sum(getattr(m, "_paravt_checkpointed", False) for m in model.modules()) == 4
    with pytest.raises(ValueError, match="checkpoint_part must be layer or attention"):
        GRPOConfig(checkpoint_part="mlp")


# ----------------------------------------------------------------------------------------------
# vision_cache, and no forward the estimator does not use


def _stage(tiny_dir, seqs, *, vision_cache: bool, kl_mode: str = "reward", ppo_epochs: int = 1):
    """The step's passes as the trainer runs them (grpo.update.train_passes: advantages, then the
    update) from fresh weights, the vision tower frozen; returns the metrics, the reference's log
    π_τ, the gradients of the first optimizer step, each model's vision-tower and forward calls per
    stage (the policy is in train mode in the update only), and the step's vision features."""
    from paravt.train import vision_cache as vc
    from paravt.train.checkpoint import make_optimizer
    from paravt.train.grpo import train_passes

    model, processor = load_model(str(tiny_dir), device="cpu")
    ref, _ = load_model(str(tiny_dir), device="cpu")
    model.model.visual.requires_grad_(False)
    cfg = GRPOConfig(device="cpu", engine="single", token_budget=120, lr=1e-3, kl_coef=0.05, kl_mode=kl_mode,
                     temperature=TAU, freeze_vision=True, vision_cache=vision_cache, ppo_epochs=ppo_epochs)
    engine = init_engine("single", "cpu")
    engine.prepare(ref, frozen=True)
    model.eval()  # as the rollouts leave it
    r = Renderer(processor)
    params, opt, _ = make_optimizer(model, cfg, True)
    calls: dict = {}

    def count(name):
        def hook(*_):
            key = f"{'update' if model.training else 'advantages'}/{name}"
            calls[key] = calls.get(key, 0) + 1
        return hook

    for name, m in (("policy", model), ("ref", ref)):
        m.register_forward_hook(count(name))
        m.model.visual.register_forward_hook(count(f"{name} vision"))
    grads = []
    opt.register_step_pre_hook(lambda *_: grads.append(
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}) if not grads else None)
    made = []
    real = vc.VisionFeatures.__init__

    def keep(self, *args):
        real(self, *args)
        made.append(self)

    vc.VisionFeatures.__init__ = keep
    try:
        mine = _copies(seqs)
        _, metrics = train_passes(cfg, engine, model, model, ref, r, opt, params, mine, 0)
    finally:
        vc.VisionFeatures.__init__ = real
    return metrics, [s.ref_logprobs for s in mine], grads[0], calls, made[0] if made else None


def test_vision_cache_gives_the_same_loss_and_gradients_with_the_tower_run_once_a_frame(tiny_dir, seqs):
    """A frozen tower's features, computed in the reference's pass and reused by every later pass
    (the policy's forward, a second PPO epoch): the same reference log π_τ, loss, gradient norm and
    gradients, and the tower runs for the first pass's frames only."""
    plain = _stage(tiny_dir, seqs, vision_cache=False, ppo_epochs=2)
    cached = _stage(tiny_dir, seqs, vision_cache=True, ppo_epochs=2)
    assert plain[3]["advantages/ref vision"] == plain[3]["advantages/ref"] >= 2  # every pass runs the tower
    assert plain[3]["update/policy vision"] == plain[3]["update/policy"]
    assert cached[3]["advantages/ref vision"] == cached[3]["advantages/ref"]  # first sight of every frame
    assert "update/policy vision" not in cached[3]  # ... then never again, two epochs of the update included
    assert cached[3]["update/policy"] == plain[3]["update/policy"]
    distinct = {f.tobytes() for s in seqs for f in s.images}
    assert cached[4].computed >= len(distinct) and cached[4].reused == 2 * cached[4].computed
    for a, b in zip(plain[1], cached[1]):
        assert np.allclose(a, b, atol=1e-6, rtol=0)
    for k in ("loss", "grad_norm", "entropy", "pg_loss"):
        assert cached[0][k] == pytest.approx(plain[0][k], rel=1e-5, abs=1e-7), k
    assert plain[2].keys() == cached[2].keys() and not any("visual" in n for n in plain[2])
    for n in plain[2]:
        assert torch.allclose(cached[2][n], plain[2][n], atol=1e-6, rtol=1e-5), n


@pytest.mark.parametrize("kl_mode", ["reward", "loss"])
def test_the_reference_runs_once_a_step_where_the_estimator_reads_it(tiny, tiny_dir, seqs, kl_mode):
    """kl_mode reward: the reference's forward runs once over the rollouts (the KL reward), never in
    the update; kl_mode loss: only in the update, once a pass beside the policy's. No other forward
    runs: the policy's are the update's passes only."""
    _, _, _, calls, _ = _stage(tiny_dir, seqs, vision_cache=False, kl_mode=kl_mode)
    from paravt.train.batches import plan_micro_batches

    passes = len(plan_micro_batches(seqs, True, 1, 120, Renderer(tiny[1])))
    if kl_mode == "reward":
        assert calls.get("advantages/ref") == passes and "update/ref" not in calls
    else:
        assert "advantages/ref" not in calls and calls.get("update/ref") == passes
    assert "advantages/policy" not in calls and calls["update/policy"] == passes


def test_switch_config_keys_are_checked():
    with pytest.raises(ValueError, match="vision_cache .* needs freeze_vision: true"):
        GRPOConfig(vision_cache=True)
    with pytest.raises(ValueError, match="liger is a list of parts"):
        GRPOConfig(liger="all")
    with pytest.raises(ValueError, match="liger takes parts among"):
        GRPOConfig(liger=["all", "rope"])
    assert GRPOConfig(liger=["all"]).liger == list(kernels.PARTS)
    with pytest.raises(ValueError, match="packed_attention must be one of"):
        GRPOConfig(packed_attention="flash")
    cfg = GRPOConfig()  # today's behaviour unless a config says otherwise
    assert (cfg.packed_attention, cfg.liger, cfg.checkpoint_part, cfg.vision_cache) == ("auto", [], "layer", False)


def test_every_process_runs_the_tower_in_a_pass_where_one_needs_it():
    """Under FSDP the tower's blocks all-gather in every process's pass alike: each pass asks all
    processes (`agree`, once a pass, frames or not), and a process whose frames are all stored still
    runs the tower when another's are not."""
    from paravt.train.vision_cache import VisionFeatures

    asked = []
    im = np.zeros((8, 8, 3), np.uint8)
    feats = VisionFeatures(agree=lambda need: asked.append(need) or True)  # another process needs the tower
    feats.store[feats.key(im)] = (torch.zeros(1, 4), [torch.zeros(1, 4)])
    inputs = {"input_ids": torch.zeros(1, 3), "pixel_values": torch.zeros(4, 6)}
    assert feats.inputs(inputs, [im]) is inputs and feats.reused == 0  # its pixels: the tower runs here too
    assert feats.inputs({"input_ids": torch.zeros(1, 3)}, []) is not None  # a pass without frames asks all the same
    assert asked == [False, False]
    alone = VisionFeatures()
    alone.store[alone.key(im)] = (torch.zeros(1, 4), [torch.zeros(1, 4)])
    out = alone.inputs(inputs, [im.copy()])  # the same frame, another array: found by content
    assert "pixel_values" not in out and out["mm_encoder_outputs"]["image"].pooler_output[0].shape == (1, 4)
