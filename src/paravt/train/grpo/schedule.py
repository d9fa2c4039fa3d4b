"""What a step rolls out, as pure functions of the run's seed: the prompt order (a seeded permutation
per epoch), nFrames gating (K per prompt group), the rollouts' sampling seeds, and the jobs they make.

Everything here is reproducible from (seed, prompt id, epoch, step) on any machine and under any
PYTHONHASHSEED: sha256, never Python's salted hash() (the public release drew K with it), so a resumed
run, another process of a torchrun launch and the asynchronous producer plan the same groups.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paravt.train.config import ConfigError
from paravt.train.grpo.config import K_CHOICES, GRPOConfig

if TYPE_CHECKING:
    from paravt.data import RLSample


def _digest_int(*parts: object) -> int:
    text = "\x00".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def gate_k(seed: int, prompt_id: str, epoch: int, choices: tuple[int, ...] | list[int] = K_CHOICES) -> int:
    """K for a prompt group: uniform over `choices`, reproducible from (seed, prompt id, epoch)
    on any machine and under any PYTHONHASHSEED."""
    return int(choices[_digest_int("ngate", seed, epoch, prompt_id) % len(choices)])


def rollout_seed(seed: int, step: int, prompt_id: str, rollout: int) -> int:
    """Sampling seed of one rollout (distinct per rollout; the same on a resumed run)."""
    return _digest_int("rollout", seed, step, prompt_id, rollout) % (2**31 - 2048)


def prompt_schedule(step: int, per_step: int, n_prompts: int, seed: int) -> list[tuple[int, int]]:
    """(prompt index, epoch) of each prompt of `step`: epochs walk a fresh seeded permutation."""
    import numpy as np

    out = []
    perms: dict[int, Any] = {}
    for j in range(per_step):
        g = step * per_step + j
        epoch, pos = divmod(g, n_prompts)
        if epoch not in perms:
            perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n_prompts)
        out.append((int(perms[epoch][pos]), epoch))
    return out


@dataclass
class Job:
    """One rollout to play: rollout `rollout` of prompt group `group`, on `sample` with K = `k`
    overview frames (the group's, by gating), sampled with `seed`."""

    group: int
    rollout: int
    sample: "RLSample"
    k: int
    epoch: int
    seed: int


def plan_jobs(cfg: GRPOConfig, samples: list["RLSample"], step: int, world: int, rank: int) -> list[Job]:
    """This process's rollouts of `step`: its prompts (a seeded schedule), each with its K
    (nFrames gating) and n rollout seeds."""
    return [job for j in range(cfg.prompts_per_step) if j % world == rank
            for job in plan_group(cfg, samples, step, j, number=j)]


def plan_group(cfg: GRPOConfig, samples: list["RLSample"], step: int, j: int, number: int) -> list[Job]:
    """The n rollouts of prompt j of `step` (the seeded schedule), with its K and seeds, as group
    `number` (its place in the step; asynchronous rollouts number the run's groups)."""
    idx, epoch = prompt_schedule(step, cfg.prompts_per_step, len(samples), cfg.seed)[j]
    s = samples[idx]
    k = gate_k(cfg.seed, s.id, epoch, cfg.k_choices) if cfg.gating else cfg.fixed_k
    return [Job(number, r, s, k, epoch, rollout_seed(cfg.seed, step, s.id, r)) for r in range(cfg.rollouts_per_prompt)]


def load_samples(cfg: GRPOConfig) -> list["RLSample"]:
    """The run's prompts (cfg.data), checked before any model is loaded: known question types, every
    video present."""
    from paravt import protocol as P
    from paravt.data import load_rl_rows

    path = Path(cfg.data)
    if not path.is_file():
        raise FileNotFoundError(f"RL data {path} does not exist (make it with `paravt synth --split train`)")
    samples = load_rl_rows(path, cfg.video_root)
    if not samples:
        raise ConfigError(f"{path} holds no rows")
    bad = sorted({s.question_type for s in samples} - set(P.QUESTION_TYPES))
    if bad:
        raise ConfigError(f"{path}: unknown question types {bad}; expected {P.QUESTION_TYPES}")
    missing = [s.video for s in samples if not Path(s.video).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} videos of {path} are missing, e.g. {missing[0]} "
                                "(set video_root to the directory the paths are relative to)")
    return samples
