"""Where a profiled call's time goes: torch.profiler events grouped into the categories docs/gpu.md
tabulates (GEMMs, attention, elementwise and norms, softmax and sampling, copies, optimizer,
communication, other) and the share of the wall time the device sat idle (host gaps), plus the
phases a benchmark marked with `phase()` ranges (the update's vision tower, reference forward,
recompute, optimizer step).

Why by name: a replayed CUDA graph's kernels reach the profiler correlated to one cudaGraphLaunch,
not to the aten ops that recorded them, so the kernel's own name is all a decode step's profile
has. On a GPU the kernels are counted (their device time); on a CPU, where there are none, each
aten op's own (self) CPU time is, so the same code runs in `gpu.sh cpu` and in the tests.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# first match wins: attention kernels are cutlass kernels too, and a fused softmax inside attention
# carries "attention" in its name
CATEGORIES = (
    ("attention", ("attention", "fmha", "flash", "sdpa", "scaled_dot_product")),
    ("GEMM", ("gemm", "gemv", "matmul", "xmma", "cutlass", "nvjet", "cublas", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm", "aten::linear", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "optimizer")),
    ("communication", ("nccl", "all_gather", "reduce_scatter", "all_reduce", "allgather", "gloo")),
    ("softmax and sampling", ("softmax", "multinomial", "argmax", "argmin", "sort", "topk", "cumsum", "scan",
                              "isfinite", "exponential", "uniform")),
    ("copies", ("memcpy", "memset", "aten::copy_", "aten::to", "aten::_to_copy", "aten::clone",
                "aten::contiguous", "aten::index_copy")),
    ("elementwise and norms", ("elementwise", "vectorized", "unrolled", "reduce", "norm", "rsqrt", "pow",
                               "mean", "aten::", "index", "cat", "fill", "silu", "gelu", "mul", "add", "rotary",
                               "triton")),
)
IDLE = "idle / host gaps"
PHASE_PREFIX = "paravt::"


def classify(name: str) -> str:
    """The category of a kernel or op name (lower-cased substring match, in CATEGORIES' order)."""
    low = name.lower()
    for category, keys in CATEGORIES:
        if any(k in low for k in keys):
            return category
    return "other"


@contextmanager
def phase(name: str):
    """A range the breakdown reports by itself: `with phase("reference"): ...`."""
    with torch.profiler.record_function(PHASE_PREFIX + name):
        yield


def profiler(cuda: bool):
    """torch.profiler over every thread (the hf backend decodes in a worker thread of its own; on a
    GPU its kernels are seen anyway, on a CPU its ops only so), where this torch can."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        from torch._C._profiler import _ExperimentalConfig

        return profile(activities=acts, experimental_config=_ExperimentalConfig(profile_all_threads=True))
    except (ImportError, TypeError, RuntimeError):
        return profile(activities=acts)


def _device_events(events) -> list:
    return [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]


def breakdown(events, wall_s: float) -> dict:
    """{"device": bool, "busy_s", "wall_s", "categories": {name: share of the wall time}, "phases":
    {name: share}} from a profile's events (`prof.events()`). Shares are of the wall time, the idle
    share included, so they sum to 1 (more where streams overlap). Phases are `phase()` ranges: the
    device time of the kernels their ops launched (the CPU time of their ops on a CPU), several
    ranges of one name summed."""
    kernels = _device_events(events)
    device = bool(kernels)
    times: dict[str, float] = {}
    if device:
        for k in kernels:
            times[classify(k.name)] = times.get(classify(k.name), 0.0) + k.device_time_total / 1e6
    else:
        for e in events:
            if e.name.startswith(PHASE_PREFIX) or e.name.startswith("ProfilerStep"):
                continue
            times[classify(e.name)] = times.get(classify(e.name), 0.0) + e.self_cpu_time_total / 1e6
    busy = sum(times.values())
    wall = max(wall_s, 1e-9)
    shares = {k: v / wall for k, v in sorted(times.items(), key=lambda kv: -kv[1])}
    shares[IDLE] = max(wall - busy, 0.0) / wall
    phases: dict[str, float] = {}
    for e in events:
        if e.name.startswith(PHASE_PREFIX) and e.device_type == torch.autograd.DeviceType.CPU:
            spent = e.device_time_total if device else e.cpu_time_total
            name = e.name[len(PHASE_PREFIX):]
            phases[name] = phases.get(name, 0.0) + spent / 1e6 / wall
    return {"device": device, "busy_s": busy, "wall_s": wall_s, "categories": shares, "phases": phases}


def table(rows: dict[str, dict]) -> str:
    """A markdown table: one column per profiled call (`rows`: name -> breakdown), a row per
    category then per phase, each a % of its call's wall time."""
    names = list(rows)
    cats = []
    for r in rows.values():
        cats += [c for c in r.get("categories", {}) if c not in cats and c != IDLE]
    cats.append(IDLE)
    phases = []
    for r in rows.values():
        phases += [p for p in r.get("phases", {}) if p not in phases]

    def cell(r: dict, group: str, key: str) -> str:
        v = r.get(group, {}).get(key)
        return "—" if v is None else f"{100 * v:.1f} %"

    out = ["| share of the wall time | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    out += [f"| {c} | " + " | ".join(cell(rows[n], "categories", c) for n in names) + " |" for c in cats]
    out += [f"| phase: {p} | " + " | ".join(cell(rows[n], "phases", p) for n in names) + " |" for p in phases]
    out.append("| wall s (busy s) | " + " | ".join(f"{rows[n].get('wall_s', 0):.2f} ({rows[n].get('busy_s', 0):.2f})"
                                              for n in names) + " |")
    return "\n".join(out) + "\n"
