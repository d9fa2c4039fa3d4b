"""paravt inside other tools' harnesses.

`lmms_eval_models` is the payload of the `lmms_eval.models` entry point (pyproject.toml): lmms-eval
(>= 0.7) loads every such entry point when it starts, to fill its model registry, so this module
imports nothing heavy (no torch, no transformers, not even lmms-eval until it is called). The model
itself is `paravt.integrations.lmms_eval.ParaVT`, imported only when `--model paravt` is chosen.
"""

from __future__ import annotations

MODEL_ID = "paravt"
MODEL_CLASS = "paravt.integrations.lmms_eval.ParaVT"


def lmms_eval_models():
    """The ModelManifest that makes `python -m lmms_eval --model paravt` resolve to ParaVT."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=MODEL_CLASS)
