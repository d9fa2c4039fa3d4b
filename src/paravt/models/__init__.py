"""Loading Qwen3-VL checkpoints (tiny ones built here, or real ones such as Qwen/Qwen3-VL-8B-Instruct).

`VLProcessor` holds what the backend needs from a checkpoint: the tokenizer (with its chat
template) and the image processor. We load those two directly rather than through
`AutoProcessor` because transformers' Qwen3-VL processor insists on a video processor whose
class lookup needs torchvision, which does not install beside the CPU torch build we target;
the episode samples frames itself and sends them as images, so the video processor is unused.
"""

from __future__ import annotations

import json
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
        """Tokenizer (with chat template) and image processor, plus the processor/video-processor
        entries a Qwen3-VL checkpoint carries, so tools that have torchvision (vLLM, AutoProcessor)
        can load the directory as a whole Qwen3-VL processor."""
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        ip = self.image_processor
        pre = Path(path) / "preprocessor_config.json"
        cfg = json.loads(pre.read_text())
        cfg["processor_class"] = "Qwen3VLProcessor"
        pre.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        video = {
            "video_processor_type": "Qwen3VLVideoProcessor",
            "processor_class": "Qwen3VLProcessor",
            "patch_size": ip.patch_size,
            "merge_size": ip.merge_size,
            "temporal_patch_size": ip.temporal_patch_size,
            "image_mean": list(ip.image_mean),
            "image_std": list(ip.image_std),
            "size": dict(ip.size),
        }
        (Path(path) / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2, sort_keys=True) + "\n")

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


_DTYPES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")


def load_model(path_or_id: str, device: str | None = None, dtype: str | None = None,
               allow_download: bool = False):
    """(model, processor) from a local directory or a hub id (`Qwen/Qwen3-VL-8B-Instruct`,
    `ParaVT/ParaVT-8B`): one code path for the tiny model and real checkpoints.

    Hub ids are read from the local Hugging Face cache only, unless `allow_download` (this project
    never downloads by itself). device None: cuda when available, else cpu; dtype None: bf16 on
    cuda, fp32 on cpu."""
    import pickle

    if dtype is not None and dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(_DTYPES)}")
    local = Path(path_or_id).expanduser()
    kwargs: dict = {}
    if not local.exists():
        if path_or_id.count("/") != 1 or path_or_id.startswith((".", "/", "~")):
            raise ModelLoadError(f"model path {path_or_id!r} does not exist")
        kwargs["local_files_only"] = not allow_download
    elif not (local / "config.json").exists():
        raise ModelLoadError(f"{local} has no config.json: not a transformers model directory")

    import torch  # after the checks above: a mistyped path is said at once, not after seconds of imports
    from transformers import Qwen3VLForConditionalGeneration
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
    except pickle.UnpicklingError:  # a .bin that is more than tensors: torch's message says to drop weights_only
        raise ModelLoadError(
            f"{path_or_id}: its weights file holds pickled Python objects, not only tensors; paravt never loads "
            "those (unpickling can run code). Save the checkpoint as safetensors where you trust it "
            "(model.save_pretrained(dir, safe_serialization=True))") from None
    except (OSError, ValueError) as e:  # missing files / not in cache / unreadable config
        if not local.exists() and not allow_download:
            raise ModelLoadError(
                f"{path_or_id!r} is not a local directory and was not found locally in the Hugging Face cache. "
                "Hub ids load only from the cache: download once with `hf download "
                f"{path_or_id}` where a network is available, or pass a checkpoint directory."
            ) from None
        raise ModelLoadError(f"cannot load {path_or_id!r}: {e}") from None
    model.to(device)
    model.eval()
    return model, processor
