"""A tiny Qwen3-VL built fully offline: real architecture, small sizes.

The tokenizer is a byte-level BPE trained in code on a small built-in corpus (the project's
own prompts plus SynthVT-style vocabulary), carrying every Qwen special token and our tags as
single tokens. As in Qwen3's tokenizer, the tags (`<think>`, `<tool_call>`, ...) are ordinary
added tokens, not special ones: servers drop special tokens from returned text by default
(vLLM's skip_special_tokens), and the episode's structure must survive that. The chat template
is Qwen3-VL-Instruct's own (tools, tool responses, images), so the hf renderer, `paravt serve`
and vLLM all see the same tokens. Saved with `save_pretrained`, the directory loads back through
the same `paravt.models.load_model` path that loads `Qwen/Qwen3-VL-8B-Instruct`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from paravt import protocol as P

QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
OUR_TAGS = list(P.ALL_TAGS)

# The chat template of the Qwen3-VL-Instruct checkpoints (their chat_template.json), kept verbatim
# as data: a tiny model served by vLLM is prompted through its tokenizer's template, and it must
# produce the very tokens the hf renderer does (tests/test_chat_template.py).
CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_vl_chat_template.jinja").read_text()

SIZES = {
    # hidden, layers, heads, kv heads, intermediate, vision hidden, vision depth
    "tiny": dict(hidden=128, layers=4, heads=4, kv=2, inter=384, v_hidden=64, v_depth=2, vocab=3000),
    "small": dict(hidden=256, layers=6, heads=8, kv=4, inter=768, v_hidden=128, v_depth=4, vocab=4000),
}


def _corpus() -> list[str]:
    """Text the BPE merges are learned from: our prompts and the words SynthVT uses."""
    texts = [
        P.system_prompt("parallel"), P.system_prompt("sequential"), P.system_prompt("none"),
        P.user_prompt_text("Which shape appeared in red?\nA. circle\nB. square\nC. star\nD. cross", 312.5, "mcq"),
        P.user_prompt_text("When does the blue triangle appear?", 120.0, "tvg"),
        P.user_prompt_text("What appeared in green?", 90.0, "oe"),
        P.subagent_prompt(12.0, 30.0, "What colour was the star?"),
        P.final_answer_instruction("mcq"), P.final_answer_instruction("tvg"),
        P.format_tool_call(12.5, 30.0), P.format_tool_response("At 14.0 seconds a red circle appears."),
    ]
    from paravt.synth.render import BACKGROUNDS, COLOURS, SHAPES

    colours = sorted(set(COLOURS) | set(BACKGROUNDS) | set("pink grey gray dark light".split()))
    shapes = sorted(set(SHAPES) | set("ring bar heart".split()))
    words = (
        "the a an at in on of to and or is was were appears appeared appear shows visible seconds second frame "
        "frames video background scene first last before after between upper lower left right top bottom middle "
        "center corner answer option question which what when how many colour color shape event nothing no yes "
        "I look closer window windows crop check overview miss missed short so need see saw there it its".split()
    )
    for c in colours:
        for s in shapes:
            texts.append(f"At 41.0 seconds a {c} {s} appears in the upper left. Background: dark {c}.")
    texts.append(" ".join(words) * 3)
    # Answers follow a tag with no space ("<answer>cyan"): without these the BPE has " cyan" as one
    # token but splits "cyan" into pieces, and the model has to spell what its think named as one token.
    for w in [*colours, *shapes, *"ABCD"]:
        texts.append(f"{P.ANSWER_OPEN}{w}{P.ANSWER_CLOSE}\n{w}\n{w.capitalize()}")
    texts.append(" ".join(str(i) for i in range(0, 1000)) + " " + " ".join(f"{i}.{j}" for i in range(0, 100) for j in range(10)))
    return texts * 3


@functools.lru_cache(maxsize=4)
def _trained_bpe(vocab_size: int) -> str:
    """The trained tokenizer as JSON (training is deterministic; cached because tests build often)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=QWEN_SPECIAL + OUR_TAGS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return _tags_not_special(tok.to_str())


def _tags_not_special(tokenizer_json: str) -> str:
    """Our tags as ordinary added tokens (same ids, still one token each), as Qwen3 has `<think>`
    and `<tool_call>`: decoding with skip_special_tokens keeps them."""
    import json

    data = json.loads(tokenizer_json)
    for t in data["added_tokens"]:
        if t["content"] in OUR_TAGS:
            t["special"] = False
    return json.dumps(data, ensure_ascii=False)


def build_tokenizer(vocab_size: int = 3000):
    """A PreTrainedTokenizerFast over a byte-level BPE with Qwen special tokens and our tags, each a
    single token, and the Qwen chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe(vocab_size)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in QWEN_SPECIAL if t not in ("<|im_end|>", "<|endoftext|>")],
        model_max_length=32768,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_processor(tokenizer, max_pixels: int | None = None, min_pixels: int | None = None):
    """Tokenizer + Qwen2-VL image processor (patch 16, merge 2, temporal patch 2: Qwen3-VL's) with the
    pixel budget of paravt.video, so frames the episode sampled are never resized again."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from paravt.models import VLProcessor
    from paravt.video import MAX_PIXELS, MIN_PIXELS

    max_pixels = MAX_PIXELS if max_pixels is None else max_pixels
    min_pixels = MIN_PIXELS if min_pixels is None else min_pixels

    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, patch_size=16, merge_size=2, temporal_patch_size=2
    )
    return VLProcessor(tokenizer=tokenizer, image_processor=image_processor)


def tiny_config(tokenizer, size: str = "tiny"):
    from transformers import Qwen3VLConfig

    s = SIZES[size]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL}
    head_dim = s["hidden"] // s["heads"]
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=s["hidden"],
            intermediate_size=s["inter"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv"],
            head_dim=head_dim,
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [head_dim // 8, head_dim // 8 * 3 // 2, head_dim // 8 * 3 // 2][:3], "mrope_interleaved": True},
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=s["v_depth"],
            hidden_size=s["v_hidden"],
            intermediate_size=s["v_hidden"] * 2,
            num_heads=max(1, s["v_hidden"] // 32),
            in_channels=3,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=s["hidden"],
            num_position_embeddings=256,
            deepstack_visual_indexes=[0] if s["v_depth"] > 1 else [],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def build_tiny(seed: int = 0, size: str = "tiny"):
    """(model, processor): a randomly initialised tiny Qwen3-VL and its processor, offline."""
    from transformers import Qwen3VLForConditionalGeneration

    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose from {list(SIZES)}")
    tokenizer = build_tokenizer(SIZES[size]["vocab"])
    processor = build_processor(tokenizer)
    config = tiny_config(tokenizer, size)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.eval()
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return model, processor


# Qwen3-VL-8B-Instruct's published architecture (its config.json): the model of the paper, built
# with random weights for memory and speed figures where the checkpoint is not at hand.
QWEN3_VL_8B = dict(
    text=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
              rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                               "mrope_interleaved": True}),
    vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
                spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096, num_position_embeddings=2304,
                deepstack_visual_indexes=[8, 16, 24]),
)


def build_8b_random(device: str = "cpu", dtype=torch.bfloat16, seed: int = 0):
    """(model, processor): Qwen3-VL-8B's architecture with random weights, made directly on `device`
    (8.77 B parameters: 17.5 GB in bf16), and the tiny tokenizer and processor (whose special-token
    ids the config uses; token ids only index the real-size vocabulary)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL}
    config = Qwen3VLConfig(
        text_config=dict(QWEN3_VL_8B["text"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         bos_token_id=None),
        vision_config=dict(QWEN3_VL_8B["vision"]), image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():  # small random weights (unit norms), so activations stay finite in bf16
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if "inv_freq" in name:  # rotary tables are computed at init: recompute them on the device
                dim = b.numel() * 2
                base = QWEN3_VL_8B["text"]["rope_parameters"]["rope_theta"] if "language" in name else 10000.0
                b.copy_(1.0 / (base ** (torch.arange(0, dim, 2, device=b.device, dtype=torch.float32) / dim)))
    model.to(dtype)
    model.eval()
    return model, processor


def save_pretrained(model, processor, path: str | Path, state_dict: dict | None = None) -> Path:
    """Write a checkpoint directory laid out like Qwen's (config, safetensors, tokenizer, chat
    template, image and video preprocessor configs) that `load_model` reads offline. `state_dict`:
    the weights to write instead of the model's own (a sharded model's gathered parameters)."""
    from transformers.utils import logging as hf_logging

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # a bar per save floods the logs of a training run
    model.save_pretrained(path, safe_serialization=True, state_dict=state_dict)
    processor.save_pretrained(path)
    return path
