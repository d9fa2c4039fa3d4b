"""Trainers: cold-start SFT (`sft`) and PARA-GRPO (`grpo`), with typed YAML configs."""

from __future__ import annotations

from paravt.procs import Stop


class RunStopped(Stop):
    """A run stopped by Ctrl-C or SIGTERM; `note` says what rerunning its command does (resume from its
    checkpoint, or start over where none was written yet)."""

    def __init__(self, why: str, note: str):
        super().__init__(why)
        self.note = note


def run_training(kind: str, config: str | None, overrides: list[str] | None = None) -> dict:
    """Load the config of `kind` ("sft" | "grpo") and train; returns the last step's metrics. A stop
    (KeyboardInterrupt, procs.Stop) comes out as RunStopped."""
    # the config first: a bad one fails before the trainer's modules (torch, transformers) load
    if kind == "sft":
        from paravt.train.sft import SFTConfig

        cfg = SFTConfig.load(config, overrides)
        from paravt.train.sft import train_sft as train
    elif kind == "grpo":
        from paravt.train.grpo import GRPOConfig

        cfg = GRPOConfig.load(config, overrides)
        from paravt.train.grpo import train_grpo as train
    else:
        raise ValueError(f"unknown training kind {kind!r}; expected sft or grpo")
    try:
        return train(cfg)
    except (KeyboardInterrupt, Stop) as e:
        from paravt.train.checkpoint import rerun_note

        raise RunStopped(e.args[0] if isinstance(e, Stop) and e.args else "SIGINT", rerun_note(cfg.out)) from None
