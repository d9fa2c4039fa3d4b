"""Training engines: the one training loop of `train.sft` and `train.grpo`, on one process or many.

    single   one process, the model as it is (a CPU, or one GPU)
    ddp      torch DistributedDataParallel: every process holds the whole model and optimizer
    fsdp     PyTorch FSDP2 (`fully_shard`): each decoder layer and each vision block is its own
             shard unit, then the root; parameters, gradients and optimizer state are split over
             the processes, so an 8B Qwen3-VL with AdamW (~16 bytes per parameter) fits 8 GPUs

Launch several processes with `torchrun` (one node: `torchrun --nproc_per_node 8 -m paravt train
grpo ...`; several: add `--nnodes N --node_rank R --rdzv_endpoint HOST:PORT`); `engine: auto`
picks fsdp when there is more than one process. NCCL on GPUs, gloo on CPUs (the tests run two
CPU processes).

Choices, and why:
- Mixed precision (`mixed_precision: bf16`): FSDP keeps fp32 master weights and AdamW state in
  the shards, casts parameters to bf16 for compute, and reduces gradients in fp32
  (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)). GRPO's updates are small (lr 2e-6,
  advantages summed over thousands of tokens): a bf16 gradient sum loses the low bits that carry
  them, and bf16 master weights could not even represent a 2e-6 relative change. single/ddp use
  torch.autocast(bf16) over fp32 weights, the same arithmetic.
- Activation checkpointing (`activation_checkpointing: true`): transformers' own gradient
  checkpointing of every decoder layer and vision block (non-reentrant, so it composes with FSDP2);
  `checkpoint_every: n` checkpoints every n-th layer only, where memory allows keeping the rest;
  `checkpoint_part: attention` recomputes only the attention of those text layers (its projections,
  norms, rotary and kernel), keeping the MLP's activations (`configure_checkpointing`). The
  recompute is the forward's arithmetic again, so loss and gradients are those of no recompute.
- CPU offload (`cpu_offload: true`): FSDP2's CPUOffloadPolicy keeps the sharded parameters,
  gradients and optimizer state in host memory (the optimizer step runs on the CPU).
- The frozen reference of GRPO's KL term is sharded the same way (its own FSDP2 units, bf16 under
  mixed precision, no gradients, no optimizer): 2 bytes per parameter split over the processes, and
  the update code stays the same for one process or many. Computing reference log-probs inside the
  policy's forward would need both weight sets in one module anyway.
- Checkpoints: the trainer state (model and optimizer) as a torch.distributed.checkpoint (DCP)
  directory, which a run can resume from on the same or another number of processes; and a
  consolidated Hugging Face directory (safetensors, config, processor) that load_model, `paravt
  serve` and vLLM read as is. Checkpoints must be on a file system all processes see.
- In-process rollouts under FSDP: each process rolls out its own prompts, and processes generate
  different numbers of tokens, so a sharded forward (which all-gathers with the other processes at
  every layer) would deadlock. `gathered()` all-gathers the parameters once before the rollouts and
  keeps them whole until the update (the bf16 / fp32 weights of the whole model on each device for
  that time); generation then runs with no collectives. The trainer logs the time this takes.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from paravt.procs import free_port

ENGINES = ("auto", "single", "ddp", "fsdp")


@dataclass
class Engine:
    kind: str  # single | ddp | fsdp
    rank: int
    world: int
    device: torch.device
    mixed_precision: str  # no | bf16
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    checkpoint_every: int = 1  # activation checkpointing on every n-th layer (1: all)
    checkpoint_part: str = "layer"  # layer | attention: what a checkpointed text layer recomputes

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    # ---- collectives (no-ops on one process)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def all_sum(self, value: float) -> float:
        if not self.distributed:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(t)
        return float(t.item())

    def all_max(self, value: int) -> int:
        if not self.distributed:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._comm_device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def gather(self, items: list) -> list:
        """Every process's `items`, concatenated in rank order (on every process)."""
        if not self.distributed:
            return list(items)
        out: list = [None] * self.world
        torch.distributed.all_gather_object(out, list(items))
        return [x for part in out for x in part]

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every process."""
        if not self.distributed:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    # ---- the model

    def prepare(self, model: torch.nn.Module, frozen: bool = False) -> torch.nn.Module:
        """The model this engine trains (or, `frozen`, evaluates): wrapped or sharded in place."""
        if frozen:
            model.requires_grad_(False).eval()
        elif self.activation_checkpointing:
            configure_checkpointing(model, True, self.checkpoint_every, self.checkpoint_part)
        if self.kind == "fsdp":
            return _shard(model, self)
        if self.kind == "ddp" and not frozen:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # The vision tower gets no gradient on a batch without frames: let DDP allow it.
            return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)
        return model

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The Hugging Face model object (DDP wraps it; FSDP2 shards it in place)."""
        return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model

    def autocast(self):
        if self.mixed_precision == "bf16" and self.kind != "fsdp":  # FSDP casts through its policy
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    @contextmanager
    def accumulate(self, model: torch.nn.Module, last: bool) -> Iterator[None]:
        """Gradient accumulation over micro-batches: gradients are reduced across processes only
        on the last one."""
        if self.kind == "ddp" and not last:
            with model.no_sync():
                yield
        elif self.kind == "fsdp":
            model.set_requires_gradient_sync(last)
            yield
        else:
            yield

    def clip_grad_norm(self, params: list, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
            norm = norm.full_tensor()
        return float(norm)

    @contextmanager
    def gathered(self, model: torch.nn.Module) -> Iterator[float]:
        """Whole parameters on every process for in-process generation (see the module doc);
        yields the seconds the all-gather took."""
        if self.kind != "fsdp":
            yield 0.0
            return
        units = [m for m in model.modules() if hasattr(m, "unshard") and hasattr(m, "reshard")]
        t0 = time.perf_counter()
        for m in units:
            m.set_reshard_after_forward(False, recurse=False)
        for m in units:
            m.unshard()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        try:
            yield time.perf_counter() - t0
        finally:
            for m in units:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    # ---- checkpoints

    def full_state_dict(self, model: torch.nn.Module, keep_tied: bool = False) -> dict | None:
        """The whole model's parameters on rank 0's CPU (None elsewhere): for the consolidated
        Hugging Face directory. Collective: every process must call it. A tied weight (lm_head =
        embed_tokens) is one parameter and is written once, as from_pretrained expects, unless
        `keep_tied` (vLLM's in-place reload restores the OLD tensor of a layer it got no weights
        for, so weights sent to a running vLLM must name lm_head.weight too)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.kind == "single":
            sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        else:
            sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.main:
            return None
        tied = getattr(self.unwrap(model), "all_tied_weights_keys", None) or {}
        if keep_tied:  # a copy of its own: safetensors refuses two names for one storage
            return {k: v.clone() if k in tied else v for k, v in sd.items()}
        return {k: v for k, v in sd.items() if k not in tied}

    def save_sharded(self, model: torch.nn.Module, optimizer, path: Path) -> None:
        """Model and optimizer state as a DCP directory (each process writes its shards)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optimizer)
        with _quiet_single_process():
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(path))

    def load_sharded(self, model: torch.nn.Module, optimizer, path: Path) -> None:
        """Restore model and optimizer from a DCP directory written by any number of processes,
        reading it as data only (train.safe_dcp: torch's reader would unpickle it)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from . import safe_dcp

        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optimizer": osd}
        with _quiet_single_process():
            safe_dcp.load(state, path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def close(self) -> None:
        """Leave the process group together: a process that tears its gloo group down while another
        is still finishing (rank 0 saving) was seen to abort at exit ("terminate called without an
        active exception", SIGABRT), failing a finished run under torchrun."""
        if self.distributed and self._owns_group:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    _owns_group: bool = False


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: that is the intent."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def init_engine(kind: str = "auto", device: str = "auto", mixed_precision: str = "no", *,
                activation_checkpointing: bool = False, cpu_offload: bool = False, checkpoint_every: int = 1,
                checkpoint_part: str = "layer") -> Engine:
    """The engine of this process: joins the process group `torchrun` describes (WORLD_SIZE,
    RANK, LOCAL_RANK, MASTER_ADDR/PORT), or makes a one-process group when fsdp/ddp is asked for
    without torchrun (e.g. FSDP's CPU offload on one GPU)."""
    import torch.distributed as dist

    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if kind == "auto":
        kind = "fsdp" if world > 1 else "single"
    if kind == "single" and world > 1:
        raise ValueError(f"engine single runs one process, but {world} were launched: use ddp or fsdp")
    if cpu_offload and kind != "fsdp":
        raise ValueError("cpu_offload needs engine fsdp")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but no GPU is visible")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    engine = Engine(kind, rank, world, dev, mixed_precision, activation_checkpointing, cpu_offload, checkpoint_every,
                    checkpoint_part)
    if kind != "single" and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if world > 1:
            dist.init_process_group(backend, device_id=dev if use_cuda else None)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        engine._owns_group = True
    return engine


def configure_checkpointing(model: torch.nn.Module, enabled: bool, every: int = 1, part: str = "layer") -> None:
    """Activation checkpointing of `model` (a Hugging Face model, before DDP wraps it; FSDP2's
    sharding may have happened): off, every `every`-th layer (transformers' own), and with `part`
    "attention" the chosen text layers recompute their attention only (checkpointed around the
    attention module, the layer itself not). Callable again to change it."""
    if part not in ("layer", "attention"):
        raise ValueError(f"checkpoint_part must be layer or attention, got {part!r}")
    for m in model.modules():  # undo an earlier attention-only setting
        if getattr(m, "_paravt_checkpointed", False):
            del m.forward, m._paravt_checkpointed
    if not enabled:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
        return
    # transformers >= 5.2x names it activation_checkpointing_enable(activation_checkpointing_kwargs=...);
    # the older gradient_checkpointing_enable(gradient_checkpointing_kwargs=...) takes the same settings.
    # every_n_layers: only where memory needs it, the others keep their activations
    kw = {"every_n_layers": every} if every > 1 else {}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, **kw)
    else:
        import inspect

        if kw and "every_n_layers" not in inspect.signature(model.gradient_checkpointing_enable).parameters:
            raise ValueError(f"checkpoint_every: {every} needs a transformers whose checkpointing takes "
                             "every_n_layers; this one checkpoints every layer or none")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}, **kw)
    if part == "attention":
        for layer in model.modules():
            if type(layer).__name__.endswith("TextDecoderLayer") and layer.gradient_checkpointing:
                layer.gradient_checkpointing = False
                _checkpoint_forward(layer.self_attn)


def _checkpoint_forward(module: torch.nn.Module) -> None:
    """module's forward recomputed in the backward (non-reentrant checkpoint) while training."""
    from torch.utils.checkpoint import checkpoint

    forward = module.forward

    def run(*args, **kwargs):
        if module.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    module.forward = run
    module._paravt_checkpointed = True


def _shard(model: torch.nn.Module, engine: Engine) -> torch.nn.Module:
    """FSDP2 units: every vision block, every decoder layer, then the root (embeddings, final norm,
    lm_head, the vision merger)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if engine.mixed_precision == "bf16" else MixedPrecisionPolicy())
    offload = CPUOffloadPolicy() if engine.cpu_offload else OffloadPolicy()
    inner = model.model
    for block in list(inner.visual.blocks) + list(inner.language_model.layers):
        fully_shard(block, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    return model


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters this process holds (its shards under FSDP)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total
