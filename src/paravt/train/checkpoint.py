"""Checkpoints shared by SFT and GRPO: OUT/checkpoint holds the model (safetensors, loadable by
`paravt.models.load_model`, so a checkpoint is directly usable by ask/eval/serve) and
`trainer_state.pt` (optimizer, scheduler, step, config). Written to a temporary directory and
swapped in, so a crash while saving leaves the previous checkpoint intact."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.pt"


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoint"


def has_checkpoint(out: str | Path) -> bool:
    return (checkpoint_dir(out) / STATE_FILE).is_file()


def save_checkpoint(out: str | Path, model, processor, state: dict[str, Any], keep_as: str | None = None) -> Path:
    """Write model + processor + trainer state to OUT/checkpoint (atomically); with `keep_as`,
    also keep a copy at OUT/<keep_as> (e.g. step-numbered snapshots)."""
    import torch

    from paravt.models.tiny import save_pretrained

    final = checkpoint_dir(out)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, processor, tmp)
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    if keep_as:
        snap = Path(out) / keep_as
        shutil.rmtree(snap, ignore_errors=True)
        shutil.copytree(final, snap, ignore=shutil.ignore_patterns(STATE_FILE))
    return final


def load_state(out: str | Path) -> dict[str, Any]:
    import torch

    path = checkpoint_dir(out) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no trainer state at {path}")
    return torch.load(path, weights_only=False, map_location="cpu")


def load_policy(model: str, *, seed: int = 0, tiny_size: str = "tiny", device: str = "cpu", dtype: str = "fp32"):
    """(model, processor) for training: "tiny" builds a fresh tiny Qwen3-VL (seeded), anything
    else is a checkpoint directory or a cached hub id (paravt.models.load_model)."""
    import torch

    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
    if model == "tiny":
        from paravt.models.tiny import build_tiny

        m, processor = build_tiny(seed=seed, size=tiny_size)
        m.to(device=device, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
        return m, processor
    from paravt.models import load_model

    return load_model(model, device=device, dtype=dtype)


def make_optimizer(model, cfg, freeze_vision: bool = False):
    """(trainable params, AdamW, lr schedule) from a trainer config's lr, betas, weight_decay,
    lr_schedule (cosine | constant), warmup_steps and steps; the vision tower is left out when frozen."""
    import torch
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    if freeze_vision:
        model.model.visual.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    sched = (get_cosine_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps) if cfg.lr_schedule == "cosine"
             else get_constant_schedule_with_warmup(opt, cfg.warmup_steps))
    return params, opt, sched


def restore_optimizer(out: str | Path, opt, sched) -> int:
    """Load the optimizer and schedule state of OUT/checkpoint; returns the step it was saved at."""
    state = load_state(out)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return int(state["step"])


@contextmanager
def torch_threads(n: int):
    """Run with `n` torch CPU threads (0: unchanged), restoring the previous count after."""
    import torch

    if n < 0:
        raise ValueError(f"threads must be >= 0, got {n}")
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
