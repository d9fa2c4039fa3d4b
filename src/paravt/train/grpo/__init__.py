"""PARA-GRPO (arXiv 2605.20342; docs/rl.md): group rollouts through the episode loop, nFrames gating,
hierarchical token-exact sequences, the recipe's estimator, PPO-clip (decoupled with asynchronous
rollouts), on one process or many (`torchrun --nproc_per_node N -m paravt train grpo ...`).

The modules, each importing only those above it:
- `config`     GRPOConfig: every setting of a run, checked when built.
- `estimator`  the estimator exactly as docs/rl.md states it, step by step: reward shaping, group
               normalisation, the KL reward-to-go, token normalisation, PPO-clip and the decoupled
               loss. Pure functions of lists and tensors.
- `schedule`   the prompt order, nFrames gating (K per group), rollout seeds, the jobs of a step:
               pure functions of the run's seed (sha256, never Python's salted hash()).
- `rollouts`   playing jobs through `run_episode`, episode records, rollout metrics.
- `servers`    rollout servers and the asynchronous producer: start, weight sync, staleness.
- `update`     the model passes of a step: reference / proximal logprobs, per-token advantages,
               the PPO optimizer steps.
- `loop`       `train_grpo`: setup, then each step as named stages (rollouts → score → sequences →
               advantages → update → sync → log / save), the run state, save and resume.

Everything users, tests, benchmarks and docs import from `paravt.train.grpo` is re-exported here (each
module loaded when one of its names is first asked for).
"""

import importlib

# name -> the module it lives in. Loaded when first asked for: the settings (config, schedule) need no
# torch, so a config error, `--show-config` or a torchrun rank failing on its config answers without
# the ~1.5 s of torch's import.
_WHERE = {
    "TrainingDiverged": "paravt.train.checkpoint",
    **dict.fromkeys(("K_CHOICES", "GRPOConfig"), "paravt.train.grpo.config"),
    **dict.fromkeys(("add_kl_reward", "group_advantages", "kl_reward_to_go", "normalize", "normalize_tokens",
                     "ppo_loss", "shape_rewards"), "paravt.train.grpo.estimator"),
    **dict.fromkeys(("_RunState", "load_state_of", "train_grpo"), "paravt.train.grpo.loop"),  # _RunState: tests
    **dict.fromkeys(("episode_record", "play_jobs", "rollout_metrics", "run_rollouts"), "paravt.train.grpo.rollouts"),
    **dict.fromkeys(("Job", "gate_k", "load_samples", "plan_group", "plan_jobs", "prompt_schedule", "rollout_seed"),
                    "paravt.train.grpo.schedule"),
    "staleness_stats": "paravt.train.grpo.servers",
    **dict.fromkeys(("reference_logprobs", "token_advantages", "train_passes", "update_policy"),
                    "paravt.train.grpo.update"),
}
# the earlier module's private names that tests and benchmarks import
_ALIASES = {"_load_samples": "load_samples", "_plan_group": "plan_group", "_plan_jobs": "plan_jobs",
            "_update": "update_policy"}

__all__ = [
    "K_CHOICES", "GRPOConfig", "Job", "TrainingDiverged", "add_kl_reward", "episode_record", "gate_k",
    "group_advantages", "kl_reward_to_go", "load_samples", "load_state_of", "normalize", "normalize_tokens",
    "plan_group", "plan_jobs", "play_jobs", "ppo_loss", "prompt_schedule", "reference_logprobs", "rollout_metrics",
    "rollout_seed", "run_rollouts", "shape_rewards", "staleness_stats", "token_advantages", "train_grpo", "train_passes",
    "update_policy",
]


def __getattr__(name: str):
    real = _ALIASES.get(name, name)
    if real not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[real]), real)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE, *_ALIASES})
