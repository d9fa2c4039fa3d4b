"""Cold-start SFT on trajectory rows (SynthVT oracle rows, or ParaVT SFT rows in the same shape).

A row is a conversation whose user turns hold `{"type": "frame", "time": t}` parts; the frames
are decoded from the row's video at those times, so training sees the pixels inference sees.
Loss is on assistant tokens only. A forced `<think>\n` prefix at the start of an assistant turn
is tokenized the way the episode feeds it (separately, as prompt) and is masked out.

Written by hand rather than with TRL's SFTTrainer: rows carry frame times that must be decoded
from video and interleaved as Qwen3-VL image tokens with our own renderer (the same one the
backend uses), which is the part the generic trainer does not do.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from paravt import protocol as P
from paravt.backends.hf import Renderer, model_inputs

IGNORE = -100


@dataclass
class SFTConfig:
    model: str = "tiny"  # "tiny" (fresh tiny Qwen3-VL), or a checkpoint dir / cached hub id
    data: str = "data/synth_train/sft.parquet"
    video_root: str | None = None  # default: the data file's directory
    out: str = "runs/sft"
    steps: int = 500
    batch_size: int = 1  # rows per optimizer step (gradient accumulation over rows)
    lr: float = 2e-5
    warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_frames: int = 64
    include_subagents: bool = True
    seed: int = 0
    log_every: int = 10
    save_every: int = 100
    tiny_size: str = "tiny"

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "SFTConfig":
        import yaml

        data = yaml.safe_load(Path(path).read_text()) if path else {}
        data = data or {}
        for item in overrides or []:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like key=value")
            k, v = item.split("=", 1)
            data[k] = yaml.safe_load(v)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown SFT config keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        return cls(**data)


@dataclass
class Example:
    ids: list[int]
    labels: list[int]
    images: list = field(default_factory=list)


def encode_row(row: dict, renderer: Renderer, video_root: Path, max_frames: int = 64) -> Example:
    """Token ids, labels (assistant tokens only) and decoded frames of one conversation row."""
    from paravt.video import VideoReader

    times = [p["time"] for m in row["messages"] for p in m["content"] if isinstance(p, dict) and p.get("type") == "frame"]
    if len(times) > max_frames * 4:
        raise ValueError(f"row {row.get('id')}: {len(times)} frames is over the limit")
    frames = VideoReader(video_root / row["video"]).frames_at(times) if times else []
    by_time = iter(frames)
    ids: list[int] = []
    labels: list[int] = []
    images = []

    def add(tokens: list[int], train: bool) -> None:
        ids.extend(tokens)
        labels.extend(tokens if train else [IGNORE] * len(tokens))

    for m in row["messages"]:
        add(renderer._header(m["role"]), False)
        content = m["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if m["role"] == "assistant":
            text = "".join(p.get("text", "") for p in content)
            if text.startswith(P.THINK_PREFIX):  # forced at inference: prompt, not target
                add(renderer.encode(P.THINK_PREFIX), False)
                text = text[len(P.THINK_PREFIX):]
            add(renderer.encode(text) + [renderer.im_end], True)
            add(renderer.newline, False)
            continue
        for p in content:
            if p.get("type") == "frame":
                f = next(by_time)
                n = renderer.image_tokens(f.image)
                add([renderer.vision_start] + [renderer.image_pad] * n + [renderer.vision_end], False)
                images.append(f.image)
            else:
                add(renderer.encode(p.get("text", "")), False)
        add([renderer.im_end] + renderer.newline, False)
    return Example(ids=ids, labels=labels, images=images)


def example_loss(model, renderer: Renderer, ex: Example) -> torch.Tensor:
    inputs = model_inputs(model, renderer, [ex.ids], [ex.images])
    labels = torch.tensor([ex.labels], device=model.device)
    out = model(**inputs, labels=labels, use_cache=False)
    return out.loss


def _load_model(cfg: SFTConfig):
    if cfg.model == "tiny":
        from paravt.models.tiny import build_tiny

        return build_tiny(seed=cfg.seed, size=cfg.tiny_size)
    from paravt.models import load_model

    return load_model(cfg.model)


def train_sft(cfg: SFTConfig, console=None) -> dict:
    """Run (or resume) SFT; returns the last logged metrics. Checkpoints and logs go to cfg.out."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from torch.utils.tensorboard import SummaryWriter
    from transformers import get_cosine_schedule_with_warmup

    from paravt.models import load_model
    from paravt.models.tiny import save_pretrained
    from paravt.synth.dataset import load_sft_rows

    console = console or Console()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    state_path = ckpt / "trainer_state.pt"
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if state_path.exists():
        model, processor = load_model(str(ckpt))
        console.print(f"[dim]resuming from {ckpt}[/dim]")
    else:
        model, processor = _load_model(cfg)
    model.train()
    renderer = Renderer(processor)
    data_path = Path(cfg.data)
    root = Path(cfg.video_root) if cfg.video_root else data_path.parent
    rows = load_sft_rows(data_path)
    if not cfg.include_subagents:
        rows = [r for r in rows if r.get("kind") != "sub"]
    if not rows:
        raise ValueError(f"{data_path} holds no rows")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps)
    step = 0
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step = state["step"]
        random.setstate(state["python_rng"])
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    writer = SummaryWriter(str(out / "tb"))
    log = open(out / "log.jsonl", "a")
    order: list[int] = []
    last: dict = {}
    t_start = time.perf_counter()
    with Progress(TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
                  TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("sft", total=cfg.steps, completed=step, loss="")
        while step < cfg.steps:
            opt.zero_grad(set_to_none=True)
            total, n_tok = 0.0, 0
            for _ in range(cfg.batch_size):
                if not order:
                    order = list(range(len(rows)))
                    random.shuffle(order)
                ex = encode_row(rows[order.pop()], renderer, root, cfg.max_frames)
                loss = example_loss(model, renderer, ex) / cfg.batch_size
                loss.backward()
                total += float(loss.detach())
                n_tok += sum(1 for x in ex.labels if x != IGNORE)
            if not math.isfinite(total):
                raise FloatingPointError(f"loss is {total} at step {step}")
            gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            opt.step()
            sched.step()
            step += 1
            last = {"step": step, "loss": total, "grad_norm": gnorm, "lr": sched.get_last_lr()[0],
                    "target_tokens": n_tok, "elapsed_s": time.perf_counter() - t_start}
            if step % cfg.log_every == 0 or step == cfg.steps:
                log.write(json.dumps(last) + "\n")
                log.flush()
                for k in ("loss", "grad_norm", "lr"):
                    writer.add_scalar(f"sft/{k}", last[k], step)
            progress.update(task, completed=step, loss=f"loss {total:.3f}")
            if step % cfg.save_every == 0 or step == cfg.steps:
                save_pretrained(model, processor, ckpt)
                torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step,
                            "python_rng": random.getstate()}, state_path)
    log.close()
    writer.close()
    return last
