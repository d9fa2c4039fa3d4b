"""Cold-start SFT on trajectory rows (SynthVT oracle rows, or ParaVT-Parquet SFT rows).

A row is a conversation ({"video", "messages": [{"role", "content": [{"type": "text", "text"} |
{"type": "frame", "time": t}]}]}, "kind": "main" | "sub"). Frames are decoded from the row's
video at the given times, so training sees the pixels inference sees; a `<video>` placeholder in
a text (ParaVT-Parquet style) becomes K timestamped overview frames, as the episode builds them.
Rows are rendered by the hf backend's own Renderer (the one rollouts and inference use), so the
ids trained on are the ids the model is later prompted with. Loss is on assistant tokens only; a
forced `<think>\\n` at the start of an assistant turn is prompt at inference, so it is masked.

Written by hand rather than with TRL's SFTTrainer: rows carry frame times that must be decoded
and interleaved as Qwen3-VL image tokens by our renderer, which the generic trainer does not do.
The update runs on a training engine (train.engine): one process, or several under torchrun
with DDP or FSDP2 sharding; the default is one CPU process.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paravt import protocol as P
from paravt.train.config import ConfigError, check_finite, check_switches, check_trainer, load_config, to_dict
from paravt.train.sequences import TrainSequence

VIDEO_PLACEHOLDER = "<video>"


@dataclass
class SFTConfig:
    model: str = "tiny"  # "tiny" (fresh tiny Qwen3-VL), or a checkpoint dir / cached hub id
    tiny_size: str = "tiny"  # tiny | small (when model == "tiny")
    data: str = "data/synth_train/sft.parquet"  # SFT rows (`paravt synth` writes sft.parquet; ParaVT SFT rows too)
    video_root: str | None = None  # default: the data file's directory
    out: str = "runs/sft"  # run folder: checkpoint, log.jsonl, TensorBoard (a rerun resumes from it)
    steps: int = 500  # optimizer steps (the lr schedule spans them)
    stop_at: int = 0  # end this run at this step (checkpoint saved; the lr schedule still spans `steps`); 0: at steps
    batch_size: int = 8  # rows per optimizer step (over all processes)
    micro_batch_size: int = 1  # rows per forward pass (packing off: the padded path)
    packing: bool = True  # several rows in one unpadded forward pass, up to token_budget tokens
    token_budget: int = 8192  # packing: most tokens per forward pass (a longer row gets one of its own)
    logprob_chunk: int = 1024  # packing: positions whose vocabulary-wide fp32 logits exist at once
    lr: float = 2e-5  # peak learning rate
    lr_schedule: str = "cosine"  # cosine | constant
    warmup_steps: int = 20  # linear lr warm-up over this many steps
    weight_decay: float = 0.01  # AdamW's weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's β1, β2
    grad_clip: float = 1.0  # gradient-norm clip
    max_frames: int = 64  # rows with more frames are skipped; also K for a <video> placeholder
    include_subagents: bool = True  # train on the rows' sub-agent turns too (false: main-agent rows only)
    dtype: str = "fp32"  # parameter dtype: fp32 | bf16
    mixed_precision: str = "no"  # no | bf16 (bf16 compute over fp32 weights; see train.engine)
    device: str = "auto"  # auto (cuda if available) | cpu | cuda
    engine: str = "auto"  # auto | single | ddp | fsdp (auto: fsdp under torchrun with >1 process)
    activation_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more time
    checkpoint_every: int = 1  # activation checkpointing on every n-th layer only (1: all; more: faster, more memory)
    checkpoint_part: str = "layer"  # what a checkpointed text layer recomputes: layer (all of it) | attention (only)
    packed_attention: str = "auto"  # packed passes' attention: auto | sdpa (per sequence) | varlen (torch's kernel)
    liger: list[str] = field(default_factory=list)  # Liger kernels: rms_norm, swiglu, rope, logprob (or [all])
    cpu_offload: bool = False  # fsdp only: parameters, gradients and optimizer state in host memory
    freeze_vision: bool = False  # the vision tower gets no gradient
    threads: int = 0  # torch CPU threads for this run (0: torch default; 1 is fastest on a busy shared CPU)
    seed: int = 0  # the run's seed: model init, row order
    log_every: int = 1  # steps between log.jsonl / TensorBoard rows
    save_every: int = 100  # steps between checkpoints (OUT/checkpoint)
    keep_checkpoints: int = 0  # also keep the last N saves as OUT/step_<n> snapshots
    max_nonfinite_steps: int = 3  # steps in a row whose update was skipped (non-finite loss/grad) before stopping

    def __post_init__(self) -> None:
        check_finite(self)
        check_trainer(self)
        check_switches(self)
        if self.keep_checkpoints < 0 or self.max_nonfinite_steps < 1:
            raise ValueError("keep_checkpoints must be >= 0 and max_nonfinite_steps >= 1")
        for name in ("steps", "batch_size", "micro_batch_size", "max_frames", "log_every", "save_every",
                     "token_budget", "logprob_chunk", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.stop_at <= self.steps:
            raise ValueError(f"stop_at must be in [0, steps={self.steps}], got {self.stop_at}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or not self.grad_clip > 0:
            raise ValueError("need warmup_steps >= 0, weight_decay >= 0, grad_clip > 0")
        _check_choice("lr_schedule", self.lr_schedule, ("cosine", "constant"))
        _check_choice("dtype", self.dtype, ("fp32", "bf16"))
        _check_choice("mixed_precision", self.mixed_precision, ("no", "bf16"))
        _check_choice("device", self.device, ("auto", "cpu", "cuda"))
        _check_choice("engine", self.engine, ("auto", "single", "ddp", "fsdp"))

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "SFTConfig":
        return load_config(cls, path, overrides)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


# ----------------------------------------------------------------------------------------------
# rows -> messages -> ids


def row_video(row: dict) -> str:
    """The row's video path as written in the row (relative to the video root)."""
    if row.get("video"):
        return str(row["video"])
    videos = row.get("videos")
    if videos:
        v = videos[0]
        return str(v["video"] if isinstance(v, dict) else v)
    raise ConfigError(f"row {row.get('id', '?')}: no video (need a 'video' or 'videos' field)")


def _parts(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")
    return content


def row_frame_count(row: dict, max_frames: int) -> int:
    n = 0
    for m in row["messages"]:
        for p in _parts(m["content"]):
            if p.get("type") == "frame":
                n += 1
            elif p.get("type") == "text":
                n += p.get("text", "").count(VIDEO_PLACEHOLDER) * max_frames
    return n


def row_messages(row: dict, reader, max_frames: int = 64) -> list:
    """The row as backend Messages with decoded frames (each frame keeps its timestamp text
    exactly as the row wrote it; a `<video>` placeholder becomes timestamped overview frames)."""
    from paravt.agent import frame_parts
    from paravt.messages import ImagePart, Message, TextPart

    times = [float(p["time"]) for m in row["messages"] for p in _parts(m["content"]) if p.get("type") == "frame"]
    frames = iter(reader.frames_at(times) if times else [])
    out = []
    for m in row["messages"]:
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"row {row.get('id', '?')}: unknown role {role!r}")
        parts: list = []
        for p in _parts(m["content"]):
            kind = p.get("type")
            if kind == "frame":
                f = next(frames)
                parts.append(ImagePart(f.image, timestamp=f.timestamp))
            elif kind == "text":
                pieces = p.get("text", "").split(VIDEO_PLACEHOLDER)
                for i, piece in enumerate(pieces):
                    if i:
                        parts += frame_parts(reader.overview(max_frames))
                    if piece:
                        parts.append(TextPart(piece))
            else:
                raise ValueError(f"row {row.get('id', '?')}: unknown content part type {kind!r}")
        out.append(Message(role, parts))
    return out


def encode_messages(messages: list, renderer) -> TrainSequence:
    """Ids, assistant-only mask and frames of a conversation, rendered segment by segment with the
    backend's Renderer. An assistant turn is inserted as ids (prefix + target + <|im_end|>), the
    way the episode inserts a generated turn into the next context."""
    from paravt.messages import Message

    ids: list[int] = []
    mask: list[int] = []
    images: list = []
    for m in messages:
        if m.role == "assistant":
            text = m.text()
            prefix = P.THINK_PREFIX if text.startswith(P.THINK_PREFIX) else ""
            prefix_ids = renderer.encode(prefix)
            target = renderer.encode(text[len(prefix):]) + [renderer.im_end]
            r = renderer.render([Message("assistant", text, token_ids=prefix_ids + target)], add_generation_prompt=False)
            head = len(r.ids) - len(target) - len(renderer.newline)
            if r.ids[head:head + len(target)] != target:  # the renderer must insert assistant ids verbatim
                raise RuntimeError("renderer did not insert assistant ids verbatim")
            ids += r.ids
            mask += [0] * head + [1] * len(target) + [0] * len(renderer.newline)
        else:
            r = renderer.render([m], add_generation_prompt=False)
            ids += r.ids
            mask += [0] * len(r.ids)
            images += r.images
    zeros = [0.0] * len(ids)
    return TrainSequence(ids=ids, mask=mask, old_logprobs=zeros, advantages=list(zeros), images=images, kind="sft")


class _Readers:
    """A few open VideoReaders (a main row and its sub rows share one video)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._open: OrderedDict[str, Any] = OrderedDict()

    def get(self, path: Path):
        from paravt.video import VideoReader

        key = str(path)
        if key in self._open:
            self._open.move_to_end(key)
            return self._open[key]
        reader = VideoReader(path)
        self._open[key] = reader
        if len(self._open) > self.size:
            self._open.popitem(last=False)[1].close()
        return reader

    def close(self) -> None:
        for r in self._open.values():
            r.close()
        self._open.clear()


def encode_row(row: dict, renderer, video_root: str | Path, max_frames: int = 64, readers: _Readers | None = None) -> TrainSequence:
    """One SFT row -> a TrainSequence (mask on assistant tokens)."""
    path = Path(video_root) / row_video(row)
    own = readers is None
    readers = readers or _Readers()
    try:
        return encode_messages(row_messages(row, readers.get(path), max_frames), renderer)
    finally:
        if own:
            readers.close()


def load_rows(cfg: SFTConfig) -> list[dict]:
    from paravt.synth.dataset import load_sft_rows

    path = Path(cfg.data)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data {path} does not exist (make it with `paravt synth --split train`)")
    try:
        rows = load_sft_rows(path)
    except (KeyError, ValueError, TypeError) as e:  # a missing column, a row that is not JSON
        raise ConfigError(f"{path}: not an SFT file paravt can read ({type(e).__name__}: {e})") from None
    for i, r in enumerate(rows):
        if not isinstance(r.get("messages"), list) or not r["messages"]:
            raise ConfigError(f"{path} row {i}: no messages (a list of chat messages is needed)")
    if not cfg.include_subagents:
        rows = [r for r in rows if r.get("kind") != "sub"]
    return rows


def sample_index(step: int, j: int, batch_size: int, n: int, seed: int) -> int:
    """Row of the j-th example of `step`: epochs walk through a fresh seeded permutation each,
    a pure function of (seed, step), so resuming needs no RNG state."""
    import numpy as np

    g = step * batch_size + j
    epoch, pos = divmod(g, n)
    return int(np.random.default_rng([seed, epoch]).permutation(n)[pos])


# ----------------------------------------------------------------------------------------------
# training


def make_engine(cfg):
    """The run's training engine from a trainer config (SFTConfig or GRPOConfig)."""
    from paravt.train.engine import init_engine

    return init_engine(cfg.engine, cfg.device, cfg.mixed_precision,
                       activation_checkpointing=cfg.activation_checkpointing, cpu_offload=cfg.cpu_offload,
                       checkpoint_every=cfg.checkpoint_every, checkpoint_part=cfg.checkpoint_part)


def backward_micro_batches(engine, model, base, renderer, groups: list, n_tok: int, loss_fn, packing: bool = False,
                           chunk: int = 1024, attention: str = "auto", vision=None) -> float:
    """Forward and backward of this process's micro-batches, gradients reduced across processes
    once. Every process runs the same number of passes (FSDP's collectives must match): one with
    fewer pads with passes over its first micro-batch at weight 0. `n_tok` is the trained tokens of
    ALL processes, and DDP/FSDP average gradients over processes, so each local loss is scaled by
    the world size: the update is the token mean over the whole batch. loss_fn(batch, real) -> the
    loss summed over the micro-batch's trained tokens (`real` is False on a padding pass, whose
    statistics must not count). `packing`: the groups are packed (train.batches.pack), under the
    attention `attention` picks (train.attention: flash-attention's varlen kernel where installed,
    torch's, or sdpa per sequence), for the backward's recomputes too, with the prompts the
    sequences share held once where it reads them (train.prompt_sharing). `vision`: the step's
    frozen vision features (train.vision_cache). Returns the local loss sum."""
    from contextlib import nullcontext

    from paravt.train.attention import SHARING, varlen_attention
    from paravt.train.batches import make_batch

    n = engine.all_max(len(groups))
    total = 0.0
    with varlen_attention(model, bf16_compute=engine.mixed_precision == "bf16", choice=attention) if packing \
            else nullcontext() as impl:
        for gi in range(n):
            real = gi < len(groups)
            batch = make_batch(base, renderer, groups[gi if real else 0], packing, chunk=chunk,
                               share_prompts=impl in SHARING, vision=vision)
            with engine.accumulate(model, last=gi == n - 1), engine.autocast():
                summed = loss_fn(batch, real)
                loss = summed * (engine.world / max(n_tok, 1)) * (1.0 if real else 0.0)
            loss.backward()
            if real:
                total += float(summed.detach())
    return total


def train_sft(cfg: SFTConfig, console=None) -> dict:
    """Run (or resume) SFT; returns the last step's metrics. Checkpoints and logs go to cfg.out."""
    from paravt.train.checkpoint import torch_threads

    with torch_threads(cfg.threads):
        return _train_sft(cfg, console)


def _usable_rows(cfg: SFTConfig, console) -> list[dict]:
    """The data's rows, less those with more frames than `max_frames` (said); none left is an error."""
    rows = load_rows(cfg)
    too_big = {i for i, r in enumerate(rows) if row_frame_count(r, cfg.max_frames) > cfg.max_frames}
    if too_big:
        console.print(f"[yellow]skipping {len(too_big)} rows with more than {cfg.max_frames} frames[/yellow]")
        rows = [r for i, r in enumerate(rows) if i not in too_big]
    if not rows:
        raise ConfigError(f"{cfg.data} holds no usable rows")
    return rows


def _start_run(cfg: SFTConfig, engine, console):
    """Claim OUT, load the policy (from OUT's checkpoint when resuming) and its optimizer: returns
    (model, its unwrapped module, processor, trained params, optimizer, scheduler, step)."""
    import json

    import torch

    from paravt.train.checkpoint import claim_run_dir, find_checkpoint, load_policy, make_optimizer, restore_optimizer

    out = Path(cfg.out)
    claim_run_dir(out, "sft", engine.main)  # refuses a folder that is not a run before anything is written
    resumed_from = find_checkpoint(out)  # checkpoint, or what a crash mid-save left
    torch.manual_seed(cfg.seed)
    model, processor = load_policy(str(resumed_from) if resumed_from else cfg.model, seed=cfg.seed,
                                   tiny_size=cfg.tiny_size, device=str(engine.device), dtype=cfg.dtype)
    if cfg.freeze_vision:
        model.model.visual.requires_grad_(False)
    model.train()
    model = engine.prepare(model)
    base = engine.unwrap(model)
    params, opt, sched = make_optimizer(base, cfg, cfg.freeze_vision)
    step = 0
    if resumed_from is not None:
        step = restore_optimizer(out, opt, sched, engine=engine, model=model)
        console.print(f"[dim]resuming from {resumed_from} at step {step}[/dim]")
    if engine.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    return model, base, processor, params, opt, sched, step


def _save(cfg: SFTConfig, engine, model, processor, opt, sched, step: int) -> None:
    from paravt.train.checkpoint import prune_snapshots, save_checkpoint

    out = Path(cfg.out)
    save_checkpoint(out, model, processor,
                    {"scheduler": sched.state_dict(), "step": step, "config": to_dict(cfg), "kind": "sft"},
                    keep_as=f"step_{step:06d}" if cfg.keep_checkpoints else None, engine=engine, optimizer=opt)
    if engine.main:
        prune_snapshots(out, cfg.keep_checkpoints)


def _train_sft(cfg: SFTConfig, console=None) -> dict:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from paravt.chat import Renderer
    from paravt.train.checkpoint import diverged, step_schedule
    from paravt.train.logging import RunLogger
    from paravt.train.batches import plan_micro_batches, shares_prompts
    from paravt.train.kernels import liger_kernels
    from paravt.train.logprobs import token_logprobs

    console = console or Console()
    engine = make_engine(cfg)
    world, rank = engine.world, engine.rank
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size {cfg.batch_size} must be a multiple of the {world} processes")
    out = Path(cfg.out)
    rows = _usable_rows(cfg, console)
    root = Path(cfg.video_root) if cfg.video_root else Path(cfg.data).parent
    model, base, processor, params, opt, sched, step = _start_run(cfg, engine, console)
    renderer = Renderer(processor)
    share_with = renderer if shares_prompts(model, cfg.packing, engine.mixed_precision == "bf16",
                                            cfg.packed_attention) else None
    log = RunLogger(out, "sft", resume_step=step, enabled=engine.main, console=console)
    readers = _Readers()
    per_rank = cfg.batch_size // world
    last: dict = {}
    streak = 0
    t_run = time.perf_counter()

    def nll(batch, real: bool) -> torch.Tensor:
        logp, _ = token_logprobs(model, batch)
        return -(logp * batch.mask).sum()

    try:
        with Progress(TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeRemainingColumn(), console=console, disable=not engine.main) as progress:
            end = cfg.stop_at or cfg.steps
            task = progress.add_task("sft", total=end, completed=step, info="")
            while step < end:
                t0 = time.perf_counter()
                idx = [sample_index(step, j, cfg.batch_size, len(rows), cfg.seed) for j in range(cfg.batch_size)]
                mine = idx[rank * per_rank:(rank + 1) * per_rank]
                seqs = [encode_row(rows[i], renderer, root, cfg.max_frames, readers) for i in mine]
                seqs = [s for s in seqs if s.n_trained > 0]
                n_tok = int(engine.all_sum(sum(s.n_trained for s in seqs)))
                if n_tok == 0 or not seqs:
                    raise ConfigError(f"step {step}: the batch's rows have no assistant tokens")
                opt.zero_grad(set_to_none=True)
                groups = plan_micro_batches(seqs, cfg.packing, cfg.micro_batch_size, cfg.token_budget, share_with)
                with liger_kernels(model, parts=cfg.liger):
                    local = backward_micro_batches(engine, model, base, renderer, groups, n_tok, nll, cfg.packing,
                                                   cfg.logprob_chunk, cfg.packed_attention)
                total = engine.all_sum(local) / n_tok  # the batch's mean token NLL
                gnorm = engine.clip_grad_norm(params, cfg.grad_clip)
                if math.isfinite(total) and math.isfinite(gnorm):
                    opt.step()
                    streak = 0
                else:  # skipped, as the recipe's engine does: applying it writes NaN into every weight
                    opt.zero_grad(set_to_none=True)
                    streak += 1
                    console.print(f"[yellow]step {step + 1}: update skipped (loss {total}, grad_norm {gnorm})[/yellow]")
                    if streak >= cfg.max_nonfinite_steps:
                        raise diverged(step + 1, streak, total, gnorm, cfg.lr, out)
                step_schedule(sched)
                step += 1
                dt = time.perf_counter() - t0
                n_seen = engine.all_sum(sum(len(s.ids) for s in seqs))
                last = {"step": step, "loss": total, "grad_norm": gnorm, "lr": sched.get_last_lr()[0],
                        "target_tokens": n_tok, "tokens": n_seen, "tokens_per_s": n_seen / dt, "step_time_s": dt,
                        "elapsed_s": time.perf_counter() - t_run}
                if step % cfg.log_every == 0 or step == end:
                    log.log(step, {k: v for k, v in last.items() if k != "step"})
                progress.update(task, completed=step, info=f"loss {total:.3f}")
                if step % cfg.save_every == 0 or step == end:
                    _save(cfg, engine, model, processor, opt, sched, step)
    finally:
        readers.close()
        log.close()
        engine.close()
    return last
