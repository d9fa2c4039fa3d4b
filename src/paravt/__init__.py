"""paravt: parallel agentic long-video understanding (ParaVT), inference, evaluation and PARA-GRPO training."""

from pathlib import Path

__version__ = "0.1.0"

# The trained tiny checkpoint that ships with the package (1.4 M parameters, SynthVT only: cold-start
# SFT, then PARA-GRPO): what `ask`, `eval`, `demo` and `serve` use when no model is named and
# $PARAVT_MODEL is unset.
DEFAULT_MODEL = Path(__file__).parent / "assets" / "tiny-paravt"
# Its cold-start SFT stage, the start of PARA-GRPO (scripts/rl_proof.py; tests that train from it).
SFT_MODEL = Path(__file__).parent / "assets" / "tiny-paravt-sft"


def load_default(device: str | None = None):
    """(model, processor) of the default model: $PARAVT_MODEL if set, else the shipped checkpoint.
    Offline, unlike a hub id, so examples and notebooks run as written."""
    from paravt.ask import default_model
    from paravt.models import load_model

    name = default_model()
    if name is None:
        raise FileNotFoundError(f"no default model: $PARAVT_MODEL is unset and {DEFAULT_MODEL} is missing")
    return load_model(name, device=device)
