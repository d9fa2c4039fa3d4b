"""Loading Qwen3-VL checkpoints (tiny ones built here, or real ones such as Qwen/Qwen3-VL-8B-Instruct).

`VLProcessor` holds what the backend needs from a checkpoint: the tokenizer (with its chat
template) and the image processor. We load those two directly rather than through
`AutoProcessor` because transformers' Qwen3-VL processor insists on a video processor whose
class lookup needs torchvision, which does not install beside the CPU torch build we target;
the episode samples frames itself and sends them as images, so the video processor is unused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelLoadError(RuntimeError):
    """A model path or id that cannot be loaded; the message says what to do."""


@dataclass
class VLProcessor:
    tokenizer: Any
    image_processor: Any

    def save_pretrained(self, path: str | os.PathLike) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> "VLProcessor":
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        tokenizer.padding_side = "left"
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, **kwargs)
        return cls(tokenizer=tokenizer, image_processor=image_processor)

    def image_token_count(self, height: int, width: int) -> int:
        """Visual tokens of one frame (after the 2x2 merge)."""
        patch = getattr(self.image_processor, "patch_size", 16)
        merge = getattr(self.image_processor, "merge_size", 2)
        return (height // patch) * (width // patch) // (merge * merge)


def load_model(path_or_id: str, device: str | None = None, dtype: str | None = None):
    """(model, processor) from a local directory or a hub id already in the local cache.

    The same path serves the shipped tiny model and Qwen/Qwen3-VL-8B-Instruct or ParaVT/ParaVT-8B."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    local = Path(path_or_id).expanduser()
    kwargs: dict = {}
    if not local.exists():
        if "/" not in path_or_id or path_or_id.startswith((".", "/", "~")):
            raise ModelLoadError(f"model path {path_or_id!r} does not exist")
        kwargs["local_files_only"] = os.environ.get("HF_HUB_OFFLINE", "0") == "1" or True
    elif not (local / "config.json").exists():
        raise ModelLoadError(f"{local} has no config.json: not a transformers model directory")
    source = str(local) if local.exists() else path_or_id
    torch_dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                   "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32, None: None}[dtype]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch_dtype is None:
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        processor = VLProcessor.from_pretrained(source, **kwargs)
        model = Qwen3VLForConditionalGeneration.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except OSError as e:
        raise ModelLoadError(
            f"cannot load {path_or_id!r}: {e}. Hub ids load only when already in the local cache "
            "(download them once with `huggingface-cli download` where a network is available)."
        ) from None
    model.to(device)
    model.eval()
    return model, processor
