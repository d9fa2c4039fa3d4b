"""Trainers: cold-start SFT (`sft`) and PARA-GRPO (`grpo`), with typed YAML configs."""

from __future__ import annotations


def run_training(kind: str, config: str | None, overrides: list[str] | None = None) -> dict:
    """Load the config of `kind` ("sft" | "grpo") and train; returns the last step's metrics."""
    if kind == "sft":
        from paravt.train.sft import SFTConfig, train_sft

        return train_sft(SFTConfig.load(config, overrides))
    if kind == "grpo":
        from paravt.train.grpo import GRPOConfig, train_grpo

        return train_grpo(GRPOConfig.load(config, overrides))
    raise ValueError(f"unknown training kind {kind!r}; expected sft or grpo")
