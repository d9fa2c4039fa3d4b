"""The PARA-GRPO run's settings (YAML + `-o key=value` overrides, see train.config), checked when
built so that a bad value fails before any model is loaded. The recipe's constants are the
defaults; docs/rl.md says where paravt departs from the release and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from paravt.agent import EpisodeConfig
from paravt.rewards import RewardConfig
from paravt.train.config import check_finite, check_switches, check_trainer, load_config
from paravt.train.rollout import RolloutConfig
from paravt.video import MAX_FRAMES

K_CHOICES = (4, 8, 16, 32, 64)  # nFrames gating: K ~ Uniform over these per prompt group
# the step metrics (grpo.rollouts.rollout_metrics) `keep_best` may maximise: named here so a typo or a
# YAML `yes` fails when the config loads, not after the first step
KEEP_BEST_METRICS = ("reward", "accuracy", "format", "f_tau", "anchor", "tool", "kappa", "executed_calls",
                     "tool_use_rate", "answered_rate")


def _default_episode() -> EpisodeConfig:
    """The recipe's episode: parallel dispatch, 3 main generations, 2048 new tokens, think prefix."""
    return EpisodeConfig(mode="parallel", max_turns=3, max_new_tokens=2048, think_prefix=True)


@dataclass
class GRPOConfig:
    """One PARA-GRPO run: data, model, the estimator's constants, rollouts, engine, logging."""

    model: str = "tiny"  # policy start and frozen reference: checkpoint dir (e.g. the SFT run's), hub id, "tiny"
    tiny_size: str = "tiny"  # tiny | small: the fresh model's size when model is "tiny"
    data: str = "data/synth_train/rl.parquet"  # ParaVT-Parquet RL rows
    video_root: str | None = None  # default: the data file's directory
    out: str = "runs/grpo"  # run folder: checkpoint, log.jsonl, TensorBoard, rollouts.jsonl (a rerun resumes from it)
    steps: int = 100  # optimizer steps: each one P prompts × n rollouts, then the update
    prompts_per_step: int = 7  # prompts a step (P)
    rollouts_per_prompt: int = 8  # rollouts a prompt (n, the group size)
    temperature: float = 0.7  # τ (replaces episode.temperature)
    top_p: float = 1.0  # rollouts' top-p (1, the recipe's: paravt's logprobs do not fold top-p in)
    episode: EpisodeConfig = field(default_factory=_default_episode)  # episode.frames is replaced by K
    gating: bool = True  # nFrames gating; false -> K = fixed_k
    k_choices: list[int] = field(default_factory=lambda: list(K_CHOICES))  # gating: each prompt's K is drawn from these (reproducibly from seed, prompt, epoch)
    fixed_k: int = 64  # K of every prompt when gating is off
    anchoring: str = "token"  # token | sequence | off
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # in-process, or on inference servers
    include_subagents: bool = False  # sub-agent generations as extra sequences (release: off; docs/rl.md)
    adv_eps: float = 1e-5  # added to the std in the group and batch normalisations
    adv_norm: str = "token"  # token: over the batch's trained tokens (recipe) | episode: over its episodes | group
    clip_eps: float = 0.2  # PPO clip ε
    behave_weight_cap: float = 5.0  # asynchronous rollouts: tokens with π_prox/π_behave above this get no gradient
    kl_coef: float = 0.01  # 0 -> no reference model
    kl_mode: str = "reward"  # reward: k1 in the per-token reward, clamped (recipe) | loss: k3 in the loss
    kl_clamp: float = 10.0  # |log π_old − log π_ref| per token in the KL reward
    lr: float = 2e-6  # learning rate (the recipe's 8B value; grpo_tiny.yaml: 1e-5)
    lr_schedule: str = "constant"  # constant | cosine
    warmup_steps: int = 0  # linear lr warm-up over this many steps
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's β1, β2
    weight_decay: float = 0.01  # AdamW's weight decay
    grad_clip: float = 1.0  # gradient-norm clip
    ppo_epochs: int = 1  # passes over a step's sequences
    minibatches: int = 1  # optimizer steps per pass
    micro_batch_size: int = 4  # sequences per forward pass (packing off: the padded path)
    packing: bool = True  # several sequences in one unpadded forward pass, up to token_budget tokens
    token_budget: int = 8192  # packing: most tokens per forward pass (a longer sequence gets one of its own)
    logprob_chunk: int = 1024  # packing: positions whose vocabulary-wide fp32 logits exist at once
    strict_continuation: bool = False  # raise on re-templating drift instead of per-turn sequences
    rollout_batch: int = 64  # hf backend: most requests per generate batch
    dtype: str = "fp32"  # parameter dtype: fp32 | bf16
    mixed_precision: str = "no"  # no | bf16 (bf16 compute, fp32 weights and gradient reduction: train.engine)
    device: str = "auto"  # auto | cpu | cuda
    engine: str = "auto"  # auto | single | ddp | fsdp (auto: fsdp under torchrun with >1 process)
    activation_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more time
    checkpoint_every: int = 1  # activation checkpointing on every n-th layer only (1: all; more: faster, more memory)
    checkpoint_part: str = "layer"  # what a checkpointed text layer recomputes: layer (all of it) | attention (only)
    packed_attention: str = "auto"  # packed passes' attention: auto | sdpa (per sequence) | varlen (torch's kernel)
    liger: list[str] = field(default_factory=list)  # Liger kernels: rms_norm, swiglu, rope, logprob (or [all])
    vision_cache: bool = False  # a frozen vision tower's features computed once a step, for every pass (needs freeze_vision)
    cpu_offload: bool = False  # fsdp only: parameters, gradients and optimizer state in host memory
    freeze_vision: bool = False  # the vision tower gets no gradient
    threads: int = 0  # torch CPU threads for this run (0: torch default; 1 is fastest on a busy shared CPU)
    seed: int = 0  # the run's seed: model init, prompt order, K draws, rollout sampling
    log_every: int = 1  # steps between log.jsonl / TensorBoard rows
    save_every: int = 25  # steps between checkpoints (OUT/checkpoint)
    keep_checkpoints: int = 0  # also keep the last N saves as OUT/step_<n> (model only)
    keep_best: str = ""  # a step metric (e.g. reward): OUT/best holds the save where it was highest
    max_nonfinite_steps: int = 3  # steps in a row whose update was skipped (non-finite loss/grad) before stopping
    warn_entropy_ratio: float = 2.0  # warn when the entropy passes this multiple of the run's first steps'
    warn_kl: float = 0.3  # warn when the KL to the reference (nats/token) passes this
    log_rollouts: bool = True  # OUT/rollouts.jsonl: one record per episode

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "ppo_epochs", "minibatches", "micro_batch_size", "rollout_batch",
                     "log_every", "save_every", "fixed_k", "token_budget", "logprob_chunk", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rollouts_per_prompt < 2:
            raise ValueError("rollouts_per_prompt must be >= 2 (advantages are relative within a group)")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 for group sampling")
        if not self.k_choices or any(not 1 <= k <= MAX_FRAMES for k in self.k_choices):
            raise ValueError(f"k_choices must be frame counts in 1..{MAX_FRAMES}, got {self.k_choices}")
        if self.fixed_k > MAX_FRAMES:
            raise ValueError(f"fixed_k must be <= {MAX_FRAMES}, got {self.fixed_k}")
        check_finite(self)
        check_trainer(self)
        check_switches(self)
        if self.keep_best and self.keep_best not in KEEP_BEST_METRICS:
            raise ValueError(f"keep_best must name a step metric to maximise ({', '.join(KEEP_BEST_METRICS)}), "
                             f"got {self.keep_best!r}")
        if not self.behave_weight_cap > 1:
            raise ValueError(f"behave_weight_cap must be > 1, got {self.behave_weight_cap}")
        if not (self.lr > 0 and self.grad_clip > 0 and self.clip_eps > 0 and self.adv_eps > 0 and self.kl_clamp > 0):
            raise ValueError("lr, grad_clip, clip_eps, adv_eps and kl_clamp must be > 0")
        if self.kl_coef < 0 or self.weight_decay < 0 or self.warmup_steps < 0 or self.keep_checkpoints < 0:
            raise ValueError("kl_coef, weight_decay, warmup_steps and keep_checkpoints must be >= 0")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        for name, value, choices in (("anchoring", self.anchoring, ("token", "sequence", "off")),
                                     ("adv_norm", self.adv_norm, ("token", "episode", "group")),
                                     ("kl_mode", self.kl_mode, ("reward", "loss")),
                                     ("lr_schedule", self.lr_schedule, ("constant", "cosine")),
                                     ("dtype", self.dtype, ("fp32", "bf16")),
                                     ("mixed_precision", self.mixed_precision, ("no", "bf16")),
                                     ("device", self.device, ("auto", "cpu", "cuda")),
                                     ("engine", self.engine, ("auto", "single", "ddp", "fsdp"))):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "GRPOConfig":
        return load_config(cls, path, overrides)
