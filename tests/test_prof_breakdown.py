"""benchmarks/prof_breakdown.py sorts a profile's time into docs/gpu.md's categories and the phases a
benchmark marks: checked on a small profile recorded here on the CPU (where each op's own CPU time
is counted; on a GPU the kernels' device time is) and on the kernel names an H200 profile shows."""

import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def module():
    spec = importlib.util.spec_from_file_location("prof_breakdown", ROOT / "benchmarks/prof_breakdown.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["prof_breakdown"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_kernel_names_of_a_gpu_profile():
    pb = module()
    assert pb.classify("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert pb.classify("flash_fwd_splitkv_kernel") == "attention"
    assert pb.classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "GEMM"
    assert pb.classify("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT") == "GEMM"
    assert pb.classify("void gemv2T_kernel_val<int, int, __nv_bfloat16>") == "GEMM"
    assert pb.classify("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>") == "softmax and sampling"
    assert pb.classify("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>") == \
        "elementwise and norms"
    assert pb.classify("void at::native::reduce_kernel<512, 1, MeanOps>") == "elementwise and norms"
    assert pb.classify("Memcpy DtoD (Device -> Device)") == "copies"
    assert pb.classify("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert pb.classify("ncclDevKernel_AllGather_RING_LL") == "communication"
    assert pb.classify("some_unknown_kernel") == "other"


def test_a_recorded_cpu_profile_is_broken_down_by_category_and_phase():
    pb = module()
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(lin.parameters(), foreach=True)
    x = torch.randn(4, 8, 16, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        with pb.phase("forward"):
            h = lin(x)
            a = torch.nn.functional.scaled_dot_product_attention(h, h, h)
            n = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
            lp = torch.log_softmax(n.flatten(0, 2), dim=-1)
            torch.multinomial(lp.exp(), 1)
        lp.mean().backward()
        with pb.phase("optimizer"):
            opt.step()
        time.sleep(0.02)  # the host doing nothing the profiler sees: an idle gap
        wall = time.perf_counter() - t
    r = pb.breakdown(prof.events(), wall)
    cats = r["categories"]
    assert not r["device"]
    for c in ("GEMM", "attention", "softmax and sampling", "elementwise and norms", "optimizer", pb.IDLE):
        assert cats.get(c, 0) > 0, (c, cats)
    assert cats[pb.IDLE] > 0.1 and abs(sum(cats.values()) - 1) < 1e-6
    assert 0 < r["phases"]["optimizer"] < 1 and 0 < r["phases"]["forward"] < 1
    text = pb.table({"update": r, "decode": {"categories": {"GEMM": 0.5, pb.IDLE: 0.5}, "wall_s": 1.0, "busy_s": 0.5}})
    assert "| GEMM |" in text and "| phase: optimizer |" in text and "| idle / host gaps |" in text
    assert "| wall s (busy s) |" in text and "50.0 %" in text
