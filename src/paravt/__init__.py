"""paravt: parallel agentic long-video understanding (ParaVT), inference, evaluation and PARA-GRPO training."""

__version__ = "0.1.0"
