"""The decode-tier CUDA templates (tc_dense, tc_sp24, tc_words, tc_bitmap, tc_lanemask, tc_scatter): their shared source compiles for
sm_90 with every kernel instantiated, the candidates pass the static checks, the launch geometry
respects the shared-memory budget for every shape and N class, prepare() works without a GPU, and
(GPU) every template matches an fp64 reference through the harness's verification."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.harness.static_checks import check_source
from sparseditto.kernel_templates import tc_launch
from sparseditto.kernel_templates.registry import TEMPLATE_ROOT, get_template
from sparseditto.matrix import SparseMatrix

TEMPLATES = ("tc_dense", "tc_sp24", "tc_words", "tc_bitmap", "tc_lanemask", "tc_scatter")
CU_FILE = TEMPLATE_ROOT / "cuda" / "tc_stream.cu"
gpu = pytest.mark.gpu


def _pruned(m: int, k: int, style: str, seed: int = 0) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    if style == "2:4":
        kk = k // 4 * 4
        g = np.abs(w[:, :kk]).reshape(m, -1, 4)
        drop = np.argsort(-g, axis=2)[:, :, 2:]
        mask = np.ones_like(g, dtype=bool)
        np.put_along_axis(mask, drop, False, axis=2)
        w[:, :kk] *= mask.reshape(m, kk)
        w[:, kk:] = 0
    else:
        w *= rng.random((m, k)) < float(style)
    return SparseMatrix.from_scipy(sp.csr_array(w), dtype="float16")


@pytest.mark.parametrize("name", TEMPLATES)
def test_candidate_embeds_the_shared_cu_and_passes_static_checks(name):
    cand = get_template(name).instantiate({})
    assert cand.backend == "cuda"
    assert CU_FILE.read_text().strip("\n") in cand.source
    result = check_source(cand.source)
    assert result.ok, result.violations


def test_launch_tracing_knows_the_kernels_as_the_candidates_own():
    """The GPU verifier accepts only the candidate's own kernels: the names behind __cluster_dims__ /
    __launch_bounds__ attributes must be found, and a profiled template instance must match."""
    from sparseditto.harness.tracing import KernelTracer, own_kernel_names

    own = own_kernel_names(get_template("tc_sp24").instantiate({}).source)
    assert {"tc_dense", "tc_sp24", "tc_bitmap", "tc_lanemask", "tc_scatter"} <= own and not any(n.startswith("__") for n in own)
    tracer = KernelTracer(own)
    assert tracer.is_own("void tc_sp24<0, 2, 1, 8, 8, 4, 0, 0>(unsigned short const*, unsigned int const*, "
                         "unsigned short const*, unsigned short*, int, int, int, int, long long, long long, int, int, int)")
    assert not tracer.is_own("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_tc_stream_compiles_for_sm90_without_spills(tmp_path):
    src = tmp_path / "tc_stream.cu"
    src.write_text(CU_FILE.read_text())
    out = tmp_path / "tc.cubin"
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-DSPARSEDITTO_INSTANTIATE_ALL", "-cubin",
                           "-Xptxas", "-v", str(src), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", proc.stderr)
    assert {e for e in entries if "tc_dense" in e} and {e for e in entries if "tc_sp24" in e}
    assert len([e for e in entries if "tc_bitmap" in e]) == 3
    assert len([e for e in entries if "tc_wordsI" in e]) == 6    # two with the L2 prefetch (PF)
    assert len([e for e in entries if "tc_words_bulk" in e]) == 4
    assert len([e for e in entries if "tc_words_grp" in e]) == 17   # 2 / 4 chunks per stage; B in 4 / 2 parts; R = 2; push;
    assert len([e for e in entries if re.search(r"tc_words_grp.*Li2EEvPKh", e)]) == 4   # two warps per tile (TW = 2)
    assert len([e for e in entries if "tc_words_sk" in e]) == 2
    assert len([e for e in entries if "tc_lanemask" in e]) == 4
    assert len([e for e in entries if "tc_scatterI" in e]) == 4
    assert len([e for e in entries if "tc_scatter_sk" in e]) == 3
    assert len([e for e in entries if "tc_scatter_rg" in e]) == 3
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert spills and max(spills) == 0, "register spills in the decode kernels"


@pytest.mark.parametrize("kind,params", [
    ("dense", {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2}),
    ("dense", {"WARPS": 8, "R": 2, "SPLIT": "auto", "PIPE": 2}),
    ("sp24", {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2}),
    ("words", {"WARPS": 4, "SPLIT": "auto", "PIPE": 3, "SLOT_BYTES": 1616}),
    ("bitmap", {"WARPS": 4, "SPLIT": "auto", "RING_KB": 8}),
    ("bitmap", {"WARPS": 8, "SPLIT": "auto", "RING_KB": 16}),
    ("lanemask", {"WARPS": 8, "SPLIT": "auto", "PIPE": 4, "SLOT_BYTES": 1312}),
    ("lanemask", {"WARPS": 16, "SPLIT": "auto", "PIPE": 3, "SLOT_BYTES": 2192}),
    ("scatter", {"WARPS": 8, "SPLIT": "auto", "PIPE": 3, "SLOT_BYTES": 1552}),
    ("scatter", {"WARPS": 16, "SPLIT": "auto", "PIPE": 3, "SLOT_BYTES": 2208}),
])
@pytest.mark.parametrize("m,k", [(11008, 4096), (4096, 11008), (14336, 4096), (37, 130), (16, 64)])
def test_geometry_fits_shared_memory_and_covers_the_matrix(kind, params, m, k):
    tiles, nchunks = -(-m // 16), -(-k // 64)
    for n in (1, 3, 8, 16, 17, 33, 64, 129, 2048):
        g = tc_launch.plan_geometry(kind, tiles, nchunks, n, params, 132)
        assert g["smem"] <= tc_launch.SMEM_LIMIT
        gx, split, gz = g["grid"]
        rows = 1 if kind in ("bitmap", "lanemask", "scatter", "words") else params["R"]
        assert gx * params["WARPS"] * rows >= tiles
        assert split * g["chunks_per_cta"] >= nchunks and split in tc_launch.SPLIT_CHOICES
        assert gz * 8 * g["nt"] >= n
        assert g["smem"] == tc_launch.smem_bytes(kind, g["nt"], params["WARPS"], rows, split,
                                                 g["chunks_per_cta"], params.get("RING_KB", 0),
                                                 params.get("PIPE", 0), params.get("SLOT_BYTES", 0))
        name = tc_launch.kernel_name(kind, 0, g)
        assert name.startswith(f"tc_{kind}<0, {g['nt']},")
        if kind == "words":
            assert name.endswith(f", {params.get('UNIT', 1)}, {params.get('PF', 0)}>")


def test_blob_ring_auto_split_keeps_enough_warps_streaming():
    """tc_scatter at 11008x4096, N = 16, WARPS=8 with the compiled kernel's 40 registers: the
    one-wave rule alone picks split 1 (86 CTAs, one per SM by shared memory: 5.2 warps per SM,
    measured 2x slower on the H200); the blob-ring guard keeps only splits with >= 16 warps per
    SM streaming. Kernels outside the blob ring keep the plain rule."""
    tiles, nchunks = 11008 // 16, 4096 // 64
    params = {"WARPS": 8, "SPLIT": "auto", "PIPE": 3, "SLOT_BYTES": 1792}
    regs = {tc_launch.regs_key(2, "sync"): 40}
    g = tc_launch.plan_geometry("scatter", tiles, nchunks, 16, params, 132, regs)
    resident = tc_launch.resident_ctas(8, g["smem"], 40)
    ctas = g["grid"][0] * g["grid"][1] * g["grid"][2]
    assert g["split"] >= 4
    assert min(ctas, resident * 132) * 8 / 132 >= tc_launch.STREAM_MIN_WARPS
    # without the guard the same inputs choose split 1: the case the guard exists for
    feasible = []
    for s in tc_launch.SPLIT_CHOICES:
        cpc = -(-nchunks // s)
        smem = tc_launch.smem_bytes("scatter", 2, 8, 1, s, cpc, 0, 3, 1792)
        if smem <= tc_launch.SMEM_LIMIT:
            feasible.append((s, cpc, smem, 0))
    assert tc_launch._auto_split(feasible, g["grid"][0], 1, 132, 8, 40)[0] == 1
    assert tc_launch._auto_split(feasible, g["grid"][0], 1, 132, 8, 40, min_warps=16)[0] == g["split"]


def test_b_ring_holds_chunks_not_the_k_slice():
    """BRING > 0: shared memory holds that many 64-row chunks of B (never more than the slice has),
    so a wide-N CTA's footprint no longer grows with K / split, and "auto" rings only wide N."""
    tiles, nchunks = 11008 // 16, 4096 // 64
    whole = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {"WARPS": 8, "R": 1, "SPLIT": 4, "PIPE": 2}, 132)
    ring = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {"WARPS": 8, "R": 1, "SPLIT": 4, "PIPE": 2,
                                                                "BRING": 4}, 132)
    assert whole["smem"] == 16 * 64 * 128 and whole["bring"] == 0
    assert ring["smem"] == max(4 * 64 * 128, 8 * 16 * 64 * 4) and ring["bring"] == 4
    assert tc_launch.kernel_name("sp24", 0, ring).endswith(", 2, 4, 0>")
    short = tc_launch.plan_geometry("dense", 4, 3, 64, {"WARPS": 8, "R": 1, "SPLIT": 1, "PIPE": 2, "BRING": 4}, 132)
    assert short["smem"] == 3 * 64 * 128                      # a 3-chunk slice needs 3 slots, not 4
    auto = {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto"}
    for m, k in ((11008, 4096), (4096, 11008), (4096, 4096)):
        for n in (1, 8, 16, 17, 32, 64, 65, 200):
            g = tc_launch.plan_geometry("sp24", -(-m // 16), -(-k // 64), n, auto, 132)
            whole = g["chunks_per_cta"] * 64 * 16 * g["nt"]
            assert g["bring"] == (4 if whole > 64 * 1024 else 0), (m, k, n, g)
    # K = 11008 at N = 32 is where the ring measured faster (an 88 KiB slice otherwise)
    assert tc_launch.plan_geometry("sp24", 4096 // 16, 11008 // 64, 32, auto, 132)["bring"] == 4
    assert tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 16, auto, 132)["bring"] == 0
    assert tc_launch.b_ring_for("bitmap", 8, 4) == 0             # the bitmap kernels stage their own way
    with pytest.raises(ValueError):
        tc_launch.b_ring_for("sp24", 8, "deep")
    with pytest.raises(ValueError, match="BRING"):
        tc_launch.b_ring_for("dense", 4, 1)


# tc_sp24wg (the wgmma kernel fed by cp.async); TMA_PARAMS: the template's defaults, which take
# tc_sp24tma wherever it applies
WG_PARAMS = {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto", "MINB": 0, "MMA": "auto",
             "WPIPE": 3, "WLOAD": "cp"}
TMA_PARAMS = {**WG_PARAMS, "WLOAD": "auto", "WSTAGES": "auto"}
H200_CC = (9, 0)


def test_mma_auto_takes_the_wgmma_kernel_only_on_sm90_and_wide_n():
    """MMA "auto": tc_sp24wg (sm_90a) from AUTO_WGMMA_FROM_N columns on a compute-capability 9.0 GPU,
    mma.sync below that, on other GPUs and on the CPU; "sync" never, "wgmma" always (planning on the
    CPU can show it); tc_dense has no wgmma kernel."""
    wide, narrow = tc_launch.AUTO_WGMMA_FROM_N, tc_launch.AUTO_WGMMA_FROM_N - 1
    assert tc_launch.mma_for("sp24", WG_PARAMS, wide, H200_CC) == "wgmma"
    assert tc_launch.mma_for("sp24", WG_PARAMS, narrow, H200_CC) == "sync"
    assert tc_launch.mma_for("sp24", WG_PARAMS, 128, (8, 0)) == "sync"
    assert tc_launch.mma_for("sp24", WG_PARAMS, 128, (10, 0)) == "sync"
    assert tc_launch.mma_for("sp24", WG_PARAMS, 128, None) == "sync"
    assert tc_launch.mma_for("sp24", {**WG_PARAMS, "MMA": "sync"}, 128, H200_CC) == "sync"
    assert tc_launch.mma_for("sp24", {**WG_PARAMS, "MMA": "wgmma"}, 1, None) == "wgmma"
    assert tc_launch.mma_for("dense", {**WG_PARAMS, "MMA": "wgmma"}, 64, H200_CC) == "sync"
    assert tc_launch.mma_for("sp24", {**WG_PARAMS, "R": 4}, 64, H200_CC) == "sync"   # R = 4: mma.sync only
    with pytest.raises(ValueError, match="MMA"):
        tc_launch.mma_for("sp24", {**WG_PARAMS, "MMA": "hgmma"}, 64, H200_CC)
    g = tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 64, WG_PARAMS, 132, None, H200_CC)
    assert tc_launch.kernel_name("sp24", 0, g).startswith("tc_sp24wg<0, 8, 1, 8, ")
    assert tc_launch.kernel_arch(tc_launch.kernel_name("sp24", 0, g)) == tc_launch.WGMMA_ARCH
    assert tc_launch.kernel_arch("tc_sp24<0, 8, 1, 8, 4, 2, 4, 0>") is None
    with pytest.raises(ValueError, match="multiple of 4"):
        tc_launch.plan_geometry("sp24", 100, 10, 64, {**WG_PARAMS, "WARPS": 6}, 132, None, H200_CC)


@pytest.mark.parametrize("m,k", [(11008, 4096), (4096, 11008), (4096, 4096), (300, 1000), (16, 64)])
def test_wgmma_geometry_counts_its_shared_memory_and_ring(m, k):
    """The wgmma kernel's CTA holds whole warpgroups of 64 rows; its shared memory is B (all BR ring
    slots, or the whole slice) on a 1024-byte boundary plus WPIPE A slots per warp, and its ring
    keeps WPIPE + 1 slots at least (it refills WPIPE - 1 chunks ahead). N up to 128 is one block of
    16 n8 tiles, so A is read once for 128 columns; wider N loops over 128-column blocks."""
    tiles, nchunks = -(-m // 16), -(-k // 64)
    for pipe in (2, 3, 4, 6):
        params = {**WG_PARAMS, "WPIPE": pipe}
        for n in (32, 33, 64, 65, 128, 129, 300):
            g = tc_launch.plan_geometry("sp24", tiles, nchunks, n, params, 132, None, H200_CC)
            assert g["mma"] == "wgmma" and g["rows"] == 1 and g["pipe"] == pipe
            assert g["nt"] == (4 if n <= 32 else 8 if n <= 64 else 16)
            gx, split, gz = g["grid"]
            assert gx * params["WARPS"] >= tiles and split * g["chunks_per_cta"] >= nchunks
            assert gz * 8 * g["nt"] >= n and (gz - 1) * 8 * g["nt"] < n
            assert g["bring"] == 0 or g["bring"] >= pipe + 1
            b = (g["bring"] or g["chunks_per_cta"]) * 64 * 16 * g["nt"]
            body = b + tc_launch.WG_ALIGN_PAD + params["WARPS"] * pipe * tc_launch.WG_A_SLOT
            partials = params["WARPS"] * 16 * g["nt"] * 8 * 4 if split > 1 else 0
            assert g["smem"] == max(body, partials) <= tc_launch.SMEM_LIMIT
            assert g["minb"] == (3 if g["nt"] <= 8 else 2)       # 24 / 16 warps per SM at WARPS = 8
    assert tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {**WG_PARAMS, "BRING": 2}, 132, None,
                                   H200_CC)["bring"] in (0, 4)   # a ring below WPIPE + 1 is raised
    assert tc_launch.wg_minb({**WG_PARAMS, "MINB": 2}, 8, 8) == 2 and tc_launch.wg_minb(WG_PARAMS, 8, 16) == 1
    assert tc_launch.wg_minb(WG_PARAMS, 8, 8, rows=2) == 1              # two tiles: no cap (C7512 below 145)
    two = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {**WG_PARAMS, "R": 2}, 132, None, H200_CC)
    assert two["rows"] == 2 and two["grid"][0] * 8 * 2 >= tiles
    assert two["smem"] >= (two["bring"] or two["chunks_per_cta"]) * 64 * 128 + 8 * 3 * 2 * tc_launch.WG_A_SLOT
    with pytest.raises(ValueError, match="row tiles"):
        tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {**WG_PARAMS, "MMA": "wgmma", "R": 4}, 132, None, H200_CC)


def test_wgmma_auto_split_prefers_long_k_slices_at_wide_blocks():
    """With register counts known, the wgmma kernel at NT >= 8 takes the one-wave split with the most
    CTAs whose K slices keep WG_LONG_SLICE_CHUNKS chunks: the geometries below are the ones measured
    fastest on the H200 (session 27: 4096x4096 split 4, not 8; the large shapes unchanged); NT = 4
    keeps the closest-to-two-per-SM rule."""
    regs = {(4, "wgmma"): 62, (8, "wgmma"): 80, (16, "wgmma"): 120}
    want = {(4096, 4096, 64): (32, 4, 1), (11008, 4096, 64): (86, 4, 1), (4096, 11008, 64): (32, 8, 1),
            (4096, 4096, 128): (32, 4, 1), (11008, 4096, 128): (86, 2, 1), (4096, 11008, 128): (32, 8, 1),
            (4096, 4096, 32): (32, 8, 1), (11008, 4096, 32): (86, 2, 1)}
    for (m, k, n), grid in want.items():
        g = tc_launch.plan_geometry("sp24", m // 16, k // 64, n, WG_PARAMS, 132, regs, H200_CC)
        assert g["grid"] == grid, (m, k, n, g["grid"])
        if g["nt"] >= 8:
            assert g["chunks_per_cta"] >= tc_launch.WG_LONG_SLICE_CHUNKS


@pytest.mark.parametrize("sms", [132, 114])
def test_prepare_compiles_every_wgmma_kernel_any_n_can_launch(sms):
    """MMA "auto" switches kernels at AUTO_WGMMA_FROM_N inside one n8-tile count: the reachable set
    must hold both kernels of that count, and every wgmma block width."""
    tiles, nchunks = 11008 // 16, 4096 // 64
    reachable = {tc_launch.kernel_name("sp24", 0, g)
                 for g in tc_launch.reachable_geometries("sp24", tiles, nchunks, WG_PARAMS, sms, None, H200_CC)}
    for n in range(1, 700):
        g = tc_launch.plan_geometry("sp24", tiles, nchunks, n, WG_PARAMS, sms, None, H200_CC)
        assert tc_launch.kernel_name("sp24", 0, g) in reachable, (n, g["grid"])
    assert any(r.startswith("tc_sp24wg<") for r in reachable) and any(r.startswith("tc_sp24<") for r in reachable)


def test_wload_takes_the_copy_engine_kernel_where_it_applies():
    """WLOAD "auto" (the default) feeds the wgmma kernel through the copy engine (tc_sp24tma) at one
    row tile per warp, 32/64/128-column blocks and a B the tensor map can describe; anything else
    runs tc_sp24wg ("cp"), per call, since B's alignment belongs to the call."""
    assert tc_launch.load_for(TMA_PARAMS, "wgmma", 8, 1, True) == "tma"
    for nt in (4, 16):
        assert tc_launch.load_for(TMA_PARAMS, "wgmma", nt, 1, True) == "tma"
    assert tc_launch.load_for(TMA_PARAMS, "wgmma", 2, 1, True) == "cp"       # 32-byte rows: no TMA path
    assert tc_launch.load_for(TMA_PARAMS, "wgmma", 8, 2, True) == "cp"       # R = 2
    assert tc_launch.load_for(TMA_PARAMS, "wgmma", 8, 1, False) == "cp"      # B not describable
    assert tc_launch.load_for(TMA_PARAMS, "sync", 8, 1, True) == "cp"
    assert tc_launch.load_for({**TMA_PARAMS, "WLOAD": "cp"}, "wgmma", 8, 1, True) == "cp"
    assert tc_launch.load_for({**TMA_PARAMS, "WLOAD": "tma"}, "wgmma", 8, 1, False) == "cp"
    with pytest.raises(ValueError, match="WLOAD"):
        tc_launch.load_for({**TMA_PARAMS, "WLOAD": "bulk"}, "wgmma", 8, 1, True)
    g = tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 64, TMA_PARAMS, 132, None, H200_CC)
    name = tc_launch.kernel_name("sp24", 0, g)
    assert g["load"] == "tma" and name.startswith(f"tc_sp24tma<0, 8, {tc_launch.TMA_WARPS}, ")
    assert g["block"] == ((tc_launch.TMA_WARPS + 1) * 32, 1, 1) and g["grid"][0] == 11008 // 16 // tc_launch.TMA_WARPS
    assert tc_launch.tma_warps({"TWARPS": 8}) == 8 and tc_launch.tma_warps({}) == tc_launch.TMA_WARPS
    with pytest.raises(ValueError, match="TWARPS"):
        tc_launch.tma_warps({"TWARPS": 6})
    assert tc_launch.kernel_arch(name) == tc_launch.WGMMA_ARCH
    unaligned = tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 64, TMA_PARAMS, 132, None, H200_CC, False)
    assert unaligned["load"] == "cp" and tc_launch.kernel_name("sp24", 0, unaligned).startswith("tc_sp24wg<")
    narrow = tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 16, TMA_PARAMS, 132, None, H200_CC)
    assert narrow["load"] == "cp" and narrow["mma"] == "sync"


@pytest.mark.parametrize("m,k", [(11008, 4096), (4096, 11008), (4096, 4096), (300, 1024), (16, 64)])
def test_tma_geometry_counts_stages_barriers_and_the_producer_warp(m, k):
    """tc_sp24tma's CTA is WARPS consumer warps plus one producer warp; its shared memory is the
    stages' mbarriers (B full, B empty, each warp's A full), a 1024-byte alignment pad and WSTAGES stages of (B chunk + every warp's A
    slot, rounded to 1024), the split-K partials laid over the stages; no register cap by default."""
    tiles, nchunks = -(-m // 16), -(-k // 64)
    for stages in (2, 3, 4, 6, 8):
        for warps in (4, 8, 16):
            params = {**TMA_PARAMS, "WSTAGES": stages, "TWARPS": warps}
            for n in (32, 33, 64, 65, 128, 129, 300):
                try:
                    g = tc_launch.plan_geometry("sp24", tiles, nchunks, n, params, 132, None, H200_CC)
                except ValueError:
                    assert stages * tc_launch.tma_stage_bytes(16, warps) > tc_launch.SMEM_LIMIT
                    continue
                assert g["load"] == "tma" and g["pipe"] == stages and g["block"] == ((warps + 1) * 32, 1, 1)
                want = 4 if n <= 32 else 8 if n <= 64 else 16       # fewer n8 tiles only where stages do not fit
                assert g["nt"] == want or (g["nt"] < want and 1024 + stages * tc_launch.tma_stage_bytes(
                    want, warps) > tc_launch.SMEM_LIMIT)
                assert g["minb"] == 0
                stage = -(-(64 * 16 * g["nt"] + warps * tc_launch.WG_A_SLOT) // 1024) * 1024
                partials = warps * 16 * g["nt"] * 8 * 4 if g["split"] > 1 else 0
                bars = 8 * stages * (2 + warps)
                assert g["smem"] == bars + 1024 + max(stages * stage, partials) <= tc_launch.SMEM_LIMIT
                name = tc_launch.kernel_name("sp24", 1, g)
                assert name == f"tc_sp24tma<1, {g['nt']}, {warps}, {g['split']}, {stages}, 0, 0, 1>"
    # ASTAGES: each warp's A in a ring of its own, after the B chunks (B stages no longer hold A slots)
    g = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, {**TMA_PARAMS, "ASTAGES": 8}, 132, None, H200_CC)
    assert g["a_stages"] == 8 and tc_launch.kernel_name("sp24", 0, g).endswith(f", {g['pipe']}, 0, 8, 1>")
    bars = 8 * (2 * g["pipe"] + tc_launch.TMA_WARPS * 8)
    region = g["pipe"] * 64 * 128 + tc_launch.TMA_WARPS * 8 * tc_launch.WG_A_SLOT
    partials = tc_launch.TMA_WARPS * 16 * 64 * 4 if g["split"] > 1 else 0
    assert g["smem"] == bars + 1024 + max(region, partials)



@pytest.mark.parametrize("m,k", [(11008, 4096), (4096, 11008), (300, 1024), (16, 64), (208, 4096)])
def test_tma_multicast_rounds_the_grid_to_cluster_rows_and_keeps_clusters_portable(m, k):
    """MCAST row blocks share a B chunk, so the grid's x is a whole number of cluster rows (a block past
    the last row tile only streams B) and MCAST x SPLIT CTAs, one cluster, stay within the portable 8;
    the shared memory does not change (the empty barrier only counts more arrivals)."""
    tiles, nchunks = -(-m // 16), -(-k // 64)
    blocks = -(-tiles // tc_launch.TMA_WARPS)
    for mcast in (1, 2, 4):
        for split in ("auto", 1, 2, 3, 4, 6, 8):
            params = {**TMA_PARAMS, "MCAST": mcast, "SPLIT": split}
            for n in (32, 64, 128):
                if split != "auto" and mcast * split > tc_launch.CLUSTER_MAX:
                    with pytest.raises(ValueError, match="MCAST"):
                        tc_launch.plan_geometry("sp24", tiles, nchunks, n, params, 132, None, H200_CC)
                    continue
                g = tc_launch.plan_geometry("sp24", tiles, nchunks, n, params, 132, None, H200_CC)
                plain = tc_launch.plan_geometry("sp24", tiles, nchunks, n, {**params, "MCAST": 1,
                                                "SPLIT": g["split"]}, 132, None, H200_CC)
                assert g["mcast"] == mcast and g["grid"][0] == -(-blocks // mcast) * mcast
                assert g["grid"][0] % mcast == 0 and g["grid"][0] - blocks < mcast
                assert g["split"] * mcast <= tc_launch.CLUSTER_MAX and g["smem"] == plain["smem"]
                assert tc_launch.kernel_name("sp24", 0, g).endswith(f", {g['a_stages']}, {mcast}>")
    with pytest.raises(ValueError, match="MCAST"):
        tc_launch.tma_multicast({"MCAST": 3})
    assert tc_launch.tma_multicast({}) == 1 and tc_launch.tma_multicast({"MCAST": "2"}) == 2


def test_tma_auto_split_keeps_about_two_ctas_per_sm():
    """tc_sp24tma's auto split counts its producer warp and takes the one-wave grid closest to two
    CTAs per SM, without the cp kernel's long-slice preference: the geometries below are those
    measured fastest on the H200 (session 28, N = 64: 11008x4096 split 2 (344 CTAs) 21.5 us against
    36.0 at split 4; 4096x11008 split 4 26.7 us against 32.0 at split 8; 4096x4096 split 4)."""
    regs = {(8, "tma"): 78, (16, "tma"): 110, (4, "tma"): 62}
    want = {(11008, 4096, 64): (172, 2, 1), (4096, 11008, 64): (64, 4, 1), (4096, 4096, 64): (64, 4, 1)}
    for (m, k, n), grid in want.items():
        g = tc_launch.plan_geometry("sp24", m // 16, k // 64, n, TMA_PARAMS, 132, regs, H200_CC)
        assert g["load"] == "tma" and g["grid"] == grid and g["pipe"] == tc_launch.TMA_STAGES, (m, k, n, g)
        resident = tc_launch.resident_ctas(tc_launch.TMA_WARPS + 1, g["smem"], regs[(g["nt"], "tma")])
        assert grid[0] * grid[1] <= resident * 132
    # 128-column blocks: 3 stages, so three CTAs fit an SM (4 stages: two; 28.8 vs 34.9 us on 11008x4096)
    wide = tc_launch.plan_geometry("sp24", 11008 // 16, 4096 // 64, 128, TMA_PARAMS, 132, regs, H200_CC)
    assert wide["nt"] == 16 and wide["pipe"] == tc_launch.TMA_STAGES_WIDE == 3
    assert tc_launch.resident_ctas(tc_launch.TMA_WARPS + 1, wide["smem"], 110) == 3
    assert tc_launch.tma_stages({"WSTAGES": 6}, 16) == 6


@pytest.mark.parametrize("k,ok", [(4096, True), (11008, True), (4160, True), (300, False), (72, False)])
def test_prepare_compiles_the_tma_kernels_only_where_k_allows_them(k, ok):
    """The tensor map reads whole 16-row periods of B: K not a multiple of 16 keeps tc_sp24wg."""
    tiles, nchunks = 4096 // 16, -(-k // 64)
    names = {tc_launch.kernel_name("sp24", 0, g)
             for g in tc_launch.reachable_geometries("sp24", tiles, nchunks, TMA_PARAMS, 132, None, H200_CC,
                                                     k % 16 == 0)}
    assert any(x.startswith("tc_sp24tma<") for x in names) == ok
    assert any(x.startswith("tc_sp24<") for x in names)


def _phys_row_sp(k: int) -> int:
    """tc_stream.cu's phys_row_sp (the 2:4 kernels' K permutation inside a 64-row chunk)."""
    tt, s, h, p = k >> 4, (k >> 3) & 1, (k >> 2) & 1, k & 3
    return 32 * s + 8 * (2 * h + (tt >> 1)) + 4 * (tt & 1) + p


def test_b_tensor_map_boxes_land_the_permuted_chunk_rows():
    """Box q of a chunk (at row coordinate 4q of B's 3-D view) must copy, in shared-memory order, the
    logical rows phys_row_sp puts at physical rows 16q .. 16q + 15: then four boxes fill the chunk
    exactly as tc_sp24wg's cp.async staging does, and the swizzle is the descriptor's."""
    from sparseditto.kernel_templates import tensor_map

    for k0 in (0, 64, 4032):
        lay = tensor_map.b_map_layout(64, 4096, 72, 64)
        seen = []
        for q in range(4):
            rows = tensor_map.logical_rows(lay, k0, q)
            assert [_phys_row_sp(r - k0) for r in rows] == list(range(16 * q, 16 * q + 16))
            seen += rows
        assert sorted(seen) == list(range(k0, k0 + 64))
    lay = tensor_map.b_map_layout(100, 11008, 104, 64)
    assert lay == {"dims": (100, 16, 688), "strides": (208, 3328), "box": (64, 4, 4), "swizzle": 3}
    assert tensor_map.b_map_layout(32, 4096, 32, 32)["swizzle"] == 2         # 64-byte rows at NT = 4
    with pytest.raises(ValueError, match="multiple of 16"):
        tensor_map.b_map_layout(64, 4100, 64, 64)
    with pytest.raises(ValueError, match="columns wide"):
        tensor_map.b_map_layout(64, 4096, 64, 16)
    assert tensor_map.tma_ready(4096, 64, 0x7f0000000000)
    assert not tensor_map.tma_ready(4096, 60, 0x7f0000000000)          # rows not 16-byte aligned
    assert not tensor_map.tma_ready(4096, 64, 0x7f0000000008)
    assert not tensor_map.tma_ready(4100, 64, 0x7f0000000000)
    assert not tensor_map.tma_ready(4096, 64, 0x7f0000000000, col_stride=2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_wgmma_kernel_assembles_for_sm90a_without_serialising(tmp_path):
    """ptxas serializes a wgmma pipeline (warnings C7515 / C7518) when non-wgmma instructions write
    its accumulators mid-pipeline or a wgmma sits in divergent control flow; both happened while
    writing tc_sp24wg, and a register cap too tight for two row tiles (C7512). Every block width must
    assemble for sm_90a clean, without spills, under the cap MINB sets (3 CTAs of 8 warps at NT <= 8:
    85 registers; 2 at NT = 16: 128)."""
    tail = "const u16*, const u32*, const u16*, u16*, int, int, int, int, long long, long long, int, int, int"
    kernels = [(0, 1, 1, 8, 2, 3, 4, 3), (1, 2, 1, 8, 4, 3, 0, 3), (0, 4, 1, 8, 8, 3, 4, 3), (0, 8, 1, 8, 4, 3, 4, 3),
               (1, 8, 1, 16, 1, 6, 0, 1), (0, 16, 1, 8, 2, 3, 4, 2), (1, 16, 1, 4, 8, 2, 3, 4), (0, 4, 2, 8, 4, 3, 4, 2), (1, 8, 2, 8, 4, 3, 4, 1)]
    for (bf16, nt, r, warps, split, pipe, bring, minb), regs in _assemble_sm90a(tmp_path, "tc_sp24wg", tail, kernels):
        assert regs <= 65536 // (warps * 32 * minb), (nt, warps, minb, regs)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_tma_kernel_assembles_for_sm90a_without_serialising(tmp_path):
    """tc_sp24tma's consumer warpgroups issue their wgmma inside the consumer branch of a warp-role
    split: ptxas must keep the pipeline (no C751x), and no instantiation may spill (a cap of three
    9-warp CTAs per SM at NT = 8, 72 registers, did: that is why MINB defaults to 0 here)."""
    tail = ("const __grid_constant__ TensorMap, const u16*, const u32*, const u16*, u16*, int, int, int, int, "
            "long long, long long, int, int, int")
    kernels = [(0, 4, 8, 4, 4, 0, 0, 1), (1, 8, 8, 2, 4, 0, 0, 1), (0, 8, 4, 8, 2, 0, 0, 1), (0, 8, 16, 1, 6, 0, 0, 1),
               (1, 16, 8, 4, 4, 0, 0, 1), (0, 16, 4, 2, 3, 0, 0, 1), (0, 8, 8, 4, 8, 2, 0, 1), (0, 8, 4, 2, 4, 0, 8, 1),
               (1, 16, 4, 1, 3, 0, 6, 1), (0, 8, 4, 2, 4, 0, 0, 2), (1, 8, 4, 3, 4, 0, 0, 2), (0, 16, 4, 1, 3, 0, 0, 4),
               (0, 4, 4, 2, 4, 0, 6, 4), (0, 8, 4, 6, 4, 0, 0, 1)]
    for (bf16, nt, warps, split, stages, minb, a_stages, mx), regs in _assemble_sm90a(tmp_path, "tc_sp24tma", tail, kernels):
        assert not minb or regs <= 65536 // ((warps + 1) * 32 * minb), (nt, warps, minb, regs)


def _assemble_sm90a(tmp_path, kernel: str, tail: str, instances: list) -> list:
    """Assemble `kernel`'s instances for sm_90a with nvcc; fail on a ptxas wgmma serialisation warning
    (C751x) or any spill; [(template arguments, registers)] per instance."""
    src = tmp_path / f"{kernel}.cu"
    src.write_text(CU_FILE.read_text() + "".join(
        f"template __global__ void {kernel}<{', '.join(map(str, k))}>({tail});\n" for k in instances))
    proc = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v",
                           str(src), "-o", str(tmp_path / f"{kernel}.cubin")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not re.search(r"C751[0-9]", proc.stderr), proc.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", proc.stderr, re.S)
    assert len(entries) == len(instances)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert spills and max(spills) == 0
    out = []
    for name, regs in entries:
        args = tuple(int(x) for x in re.findall(r"Li(\d+)E", name))
        assert args in instances, name
        out.append((args, int(regs)))
    return out


@pytest.mark.parametrize("kind,params", [
    ("dense", {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2}),
    ("dense", {"WARPS": 8, "R": 2, "SPLIT": "auto", "PIPE": 2}),
    ("sp24", {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2}),
    ("sp24", {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto"}),
    ("words", {"WARPS": 8, "SPLIT": "auto", "PIPE": 4, "SLOT_BYTES": 2112, "UNIT": 2}),
    ("bitmap", {"WARPS": 4, "SPLIT": "auto", "RING_KB": 8}),
    ("lanemask", {"WARPS": 8, "SPLIT": "auto", "PIPE": 4, "SLOT_BYTES": 1312}),
])
@pytest.mark.parametrize("m,k,sms", [(4096, 4096, 132), (11008, 4096, 132), (300, 1000, 132), (16, 64, 8),
                                     (4096, 11008, 114)])
def test_prepare_compiles_every_kernel_any_n_can_launch(kind, params, m, k, sms):
    """Found on the H200: N = 129 on 4096x4096 moved the auto split to one N = 64 had not, and the
    launch compiled it into packed['kernels'], which the verifier rightly calls kept state."""
    tiles, nchunks = -(-m // 16), -(-k // 64)
    reachable = {tc_launch.kernel_name(kind, 0, g)
                 for g in tc_launch.reachable_geometries(kind, tiles, nchunks, params, sms)}
    for n in range(1, 1200):
        g = tc_launch.plan_geometry(kind, tiles, nchunks, n, params, sms)
        assert tc_launch.kernel_name(kind, 0, g) in reachable, (n, g["grid"])


def _blob_sizes(fmt) -> np.ndarray:
    """Each blob's byte count read from its own header (byte 168), independently of the offsets."""
    tiles, chunks1 = fmt.offsets.shape
    starts = fmt.offsets[:, :-1].astype(np.int64) * 16
    raw = np.frombuffer(fmt.blobs.tobytes(), dtype=np.uint8)
    size_at = starts[..., None] + 168 + np.arange(4)
    return raw[size_at].astype(np.int64) @ (256 ** np.arange(4))


@pytest.mark.parametrize("density", ["1.0", "0.9", "0.5", "0.1"])
def test_bitmap_ring_holds_the_largest_bulk_copy(density, tmp_path):
    """Found on the H200: a 90%-dense 4096x4096 matrix made 4-blob units larger than the default 8 KiB
    ring and the launch failed; prepare now raises RING_KB to the largest unit."""
    from sparseditto.harness.source_loader import load_module
    from sparseditto.tc_formats import TCBitmap

    A = _pruned(48, 1000, density)
    fmt = TCBitmap.from_matrix(A, "float16")
    sizes = _blob_sizes(fmt)
    windows = [sizes[:, c:c + tc_launch.UNIT_CHUNKS].sum(axis=1).max() for c in range(sizes.shape[1])]
    floor = tc_launch.bulk_ring_floor_kb(fmt.offsets)
    assert floor * 1024 >= max(windows) > (floor - 1) * 1024
    mod = load_module(get_template("tc_bitmap").instantiate({}).source, cache_dir=tmp_path)
    packed = mod.prepare(A, torch.float16, torch.device("cpu"))
    assert packed["ring_floor_kb"] == floor
    ring_kb = tc_launch.launch_params(packed["params"], {"ring_floor_kb": floor})["RING_KB"]
    assert ring_kb == max(8, floor) and ring_kb * 1024 >= max(windows)
    if density == "1.0":
        assert floor == 9   # 4 full blobs: 4 * (176 + 2 * 1024) bytes
    with pytest.raises(ValueError, match="tiles, chunks"):
        tc_launch.bulk_ring_floor_kb(np.zeros(5, dtype=np.uint32))


def test_resident_ctas_follows_the_occupancy_arithmetic():
    # ncu on the H200 (session 25): tc_sp24 with 87 registers at 256 threads -> 2 CTAs (register
    # limit), 76 registers -> 3; shared memory 24,576 bytes -> 8 by smem, 12,288 -> 17 (ncu reports
    # 7 there: it also counts the 1 KiB reserve per CTA against 228 KiB, 227 usable per CTA)
    assert tc_launch.resident_ctas(8, 24576, 87) == 2
    assert tc_launch.resident_ctas(8, 12288, 76) == 3
    assert tc_launch.resident_ctas(8, 24576, 32) == 8            # the thread limit: 2048 / 256
    assert tc_launch.resident_ctas(4, 100 * 1024, 40) == 2       # shared memory: 228 KiB / 101 KiB
    assert tc_launch.resident_ctas(8, 230 * 1024, 40) == 0


def test_auto_split_with_registers_keeps_the_grid_in_one_wave():
    """Measured on the H200 (11008x4096 2:4, N = 16): PIPE=4's 87 registers leave 2 CTAs per SM,
    and the register-blind rule's split of 4 (344 CTAs, 1.3 waves) ran 26.1 us where split 2 in one
    wave took 24.2 us; with PIPE=2's fewer registers split 4 fits one wave (17.8 us)."""
    params = {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 4}
    blind = tc_launch.plan_geometry("sp24", 688, 64, 16, params, 132)
    assert blind["split"] == 4
    tight = tc_launch.plan_geometry("sp24", 688, 64, 16, params, 132, {2: 87})
    assert tight["split"] == 2 and 86 * 2 <= tc_launch.resident_ctas(8, tight["smem"], 87) * 132
    roomy = tc_launch.plan_geometry("sp24", 688, 64, 16, {**params, "PIPE": 2}, 132, {2: 56})
    assert roomy["split"] == 4 and 86 * 4 <= tc_launch.resident_ctas(8, roomy["smem"], 56) * 132
    # registers of another n8-tile count do not apply
    assert tc_launch.plan_geometry("sp24", 688, 64, 16, params, 132, {1: 87})["split"] == blind["split"]


def test_register_kernels_put_split_partials_over_the_b_slice():
    # tc_dense / tc_sp24 reuse the staged B slice for the split-K partials; tc_bitmap keeps both
    b, parts = 16 * 64 * 128, 8 * 16 * 64 * 4
    assert tc_launch.smem_bytes("sp24", 8, 8, 1, 4, 16) == max(b, parts)
    assert tc_launch.smem_bytes("dense", 8, 8, 1, 1, 16) == b
    assert tc_launch.smem_bytes("bitmap", 8, 8, 1, 4, 16, ring_kb=8) > b + parts


def test_prepare_compiles_every_kernel_the_register_aware_plan_launches():
    tiles, nchunks = 688, 64
    params = {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2}
    regs = {1: 56, 2: 62, 4: 90, 8: 128}
    reachable = {tc_launch.kernel_name("sp24", 0, g)
                 for g in tc_launch.reachable_geometries("sp24", tiles, nchunks, params, 132, regs)}
    for n in range(1, 2100, 7):
        g = tc_launch.plan_geometry("sp24", tiles, nchunks, n, params, 132, regs)
        assert tc_launch.kernel_name("sp24", 0, g) in reachable, (n, g["grid"])


@pytest.mark.parametrize("groups,nchunks,ctas", [(172, 64, 792), (64, 64, 1056), (5, 16, 80), (64, 172, 792),
                                                 (3, 7, 2), (1, 1, 1), (86, 64, 396), (11, 3, 32)])
def test_stream_schedule_owners_match_the_ranges(groups, nchunks, ctas):
    """blob_stream_sk trusts the schedule: CTA i's items are [s_i, s_i+1), its first group s_i // nchunks,
    and each group's first and last owner are the CTAs whose ranges hold its first and last item; the
    groups a range touches fit the workspace's kmax slots."""
    total = groups * nchunks
    sched = tc_launch.stream_schedule(groups, nchunks, min(ctas, total)).astype(np.int64)
    p = min(ctas, total)
    starts, first_group, owners = sched[:p + 1], sched[p + 1:2 * p + 1], sched[2 * p + 1:].reshape(groups, 2)
    assert starts[0] == 0 and starts[-1] == total and np.all(np.diff(starts) >= 1)
    assert np.diff(starts).max() - np.diff(starts).min() <= 1                # even cut
    owner = np.repeat(np.arange(p), np.diff(starts))                          # item -> CTA, brute force
    assert np.array_equal(first_group, starts[:-1] // nchunks)
    assert np.array_equal(owners[:, 0], owner[np.arange(groups) * nchunks])
    assert np.array_equal(owners[:, 1], owner[np.arange(groups) * nchunks + nchunks - 1])
    kmax = tc_launch.stream_kmax(int(np.diff(starts).max()), nchunks)
    touched = (starts[1:] - 1) // nchunks - starts[:-1] // nchunks + 1
    assert touched.max() <= kmax


def test_stream_geometry_is_one_wave_that_fits():
    """SCHED="stream": one wave of CTAs (as many per SM as registers and shared memory allow), each
    range's B slice inside the CTA's shared memory, a wide N in n blocks; other kinds refuse it."""
    for tiles, nchunks, slot in ((688, 64, 1200), (256, 64, 1792), (19, 16, 528), (256, 172, 1200)):
        for n in (1, 8, 16, 17, 64, 129, 2048):
            for warps in (4, 8):
                params = {"WARPS": warps, "PIPE": 3, "SLOT_BYTES": slot, "SCHED": "stream"}
                regs = {tc_launch.regs_key(tc_launch.n_tiles_for(n), "sync", "cp"): 63}
                g = tc_launch.plan_geometry("scatter", tiles, nchunks, n, params, 132, regs)
                ctas, one, gz = g["grid"]
                groups = -(-tiles // warps)
                assert one == 1 and g["split"] == 1 and ctas <= groups * nchunks
                assert g["chunks_per_cta"] == -(-groups * nchunks // ctas)
                assert g["smem"] <= tc_launch.SMEM_LIMIT
                assert tc_launch.resident_ctas(warps, g["smem"], 63) * 132 >= ctas
                assert gz * 8 * g["nt"] >= n
                assert tc_launch.kernel_name("scatter", 1, g) == f"tc_scatter_sk<1, {g['nt']}, {warps}, 3>"
                words = tc_launch.plan_geometry("words", tiles, nchunks, n, {**params, "UNIT": 2}, 132, regs)
                # no decoder scratch: at least as many CTAs fit as tc_scatter's
                assert words["grid"][0] >= ctas and words["smem"] <= tc_launch.SMEM_LIMIT
                assert tc_launch.kernel_name("words", 0, words) == f"tc_words_sk<0, {words['nt']}, {warps}, 3, 2>"
    with pytest.raises(ValueError, match="SCHED='stream' is implemented for scatter, words"):
        tc_launch.plan_geometry("lanemask", 688, 64, 8, {"WARPS": 4, "PIPE": 3, "SLOT_BYTES": 1200, "SCHED": "stream"}, 132)
    with pytest.raises(ValueError, match="SCHED must be one of"):
        tc_launch.plan_geometry("scatter", 688, 64, 8, {"WARPS": 4, "PIPE": 3, "SCHED": "persistent"}, 132)


def test_scatter_register_load_geometry_has_no_ring():
    """LOAD="reg" (tc_scatter_rg): the cluster split as LOAD="ring" plans it, minus the ring's bytes per
    warp (PIPE x the slot), so at least as many CTAs fit; other kinds ignore LOAD, stream-K refuses it."""
    for tiles, nchunks, slot in ((688, 64, 1200), (256, 64, 1792), (19, 16, 528)):
        for n in (1, 8, 16, 64, 129):
            ring = {"WARPS": 4, "SPLIT": 8, "PIPE": 3, "SLOT_BYTES": slot}
            g_ring = tc_launch.plan_geometry("scatter", tiles, nchunks, n, ring, 132)
            g_reg = tc_launch.plan_geometry("scatter", tiles, nchunks, n, {**ring, "LOAD": "reg"}, 132)
            assert g_reg["load"] == "reg" and g_reg["pipe"] == 0 and g_reg["grid"] == g_ring["grid"]
            assert g_ring["smem"] - g_reg["smem"] == 4 * 3 * slot
            assert tc_launch.kernel_name("scatter", 0, g_reg) == f"tc_scatter_rg<0, {g_reg['nt']}, 4, 8>"
    lm = tc_launch.plan_geometry("lanemask", 688, 64, 8, {"WARPS": 4, "SPLIT": 8, "PIPE": 3, "SLOT_BYTES": 1200,
                                                          "LOAD": "reg"}, 132)
    assert lm["load"] == "cp" and tc_launch.kernel_name("lanemask", 0, lm).startswith("tc_lanemask<")
    with pytest.raises(ValueError, match="LOAD='reg' runs with SCHED='cluster' only"):
        tc_launch.plan_geometry("scatter", 688, 64, 8, {"WARPS": 4, "PIPE": 3, "LOAD": "reg", "SCHED": "stream"}, 132)
    with pytest.raises(ValueError, match="LOAD must be one of"):
        tc_launch.plan_geometry("scatter", 688, 64, 8, {"WARPS": 4, "PIPE": 3, "LOAD": "tma"}, 132)


@pytest.mark.parametrize("style,shape", [("0.5", (300, 1000)), ("1.0", (100, 260)), ("0.0", (40, 130)),
                                         ("0.05", (64, 4100)), ("0.3", (1100, 4160))])
def test_scatter_register_loader_reads_the_format_as_packed(style, shape):
    """What tc_scatter_rg assumes about the TCScatter bytes, replayed in numpy: a blob's group count
    from its size in the offsets alone ((16 units - 16) // 24, before its header arrives) equals the
    header's padded step counts / 8; lane L's groups L, L + 32, L + 64, L + 96 cover them all (at most
    128); the values and positions it loads at 16 + 16 g and 16 + 16 groups + 8 g, scattered into
    the step regions the compare chain names, give back the matrix (the ring decoder's to_dense)."""
    from sparseditto.tc_formats import SCATTER_HEADER, TCScatter

    A = _pruned(*shape, style)
    fmt = TCScatter.from_matrix(A, "float16")
    offs = fmt.offsets.astype(np.int64)
    tiles, chunks = offs.shape[0], offs.shape[1] - 1
    out = np.zeros((tiles * 16, chunks * 64), dtype=np.float32)
    p = np.arange(256)                                                   # halves of a 512-byte step region
    lane_of, reg, half = p >> 3, (p >> 1) & 3, p & 1
    g8, t4 = lane_of >> 2, lane_of & 3
    for tile in range(tiles):
        for c in range(chunks):
            lo, units = int(offs[tile, c]), int(offs[tile, c + 1] - offs[tile, c])
            groups = (16 * units - 16) // 24
            base = lo * 16
            counts = fmt.blobs[base:base + 8].view(np.uint16).astype(np.int64)
            assert groups * 8 == counts.sum() and groups <= 128
            e1, e2, e3 = np.cumsum(counts)[:3]
            regions = np.zeros((4, 256), dtype=np.uint16)
            for lane in range(32):
                for k in range(4):
                    g = lane + 32 * k
                    if g >= groups:
                        continue
                    vals = fmt.blobs[base + SCATTER_HEADER + 16 * g:base + SCATTER_HEADER + 16 * g + 16].view(np.uint16)
                    pos = fmt.blobs[base + SCATTER_HEADER + 16 * groups + 8 * g:base + SCATTER_HEADER + 16 * groups + 8 * g + 8]
                    step = int(8 * g >= e1) + int(8 * g >= e2) + int(8 * g >= e3)
                    regions[step, pos] = vals
            for s_ in range(4):
                rows = tile * 16 + 8 * (reg & 1) + g8
                cols = c * 64 + 16 * t4 + 4 * s_ + 2 * (reg >> 1) + half
                out[rows, cols] = regions[s_].view(np.float16).astype(np.float32)
    m, k = shape
    np.testing.assert_array_equal(out[:m, :k], fmt.to_dense())


def test_explicit_split_that_cannot_fit_is_a_clear_error():
    with pytest.raises(ValueError, match="no split of K"):
        tc_launch.plan_geometry("bitmap", 688, 172, 64, {"WARPS": 8, "SPLIT": 1, "RING_KB": 16}, 132)


@pytest.mark.parametrize("name,style", [("tc_dense", "0.3"), ("tc_bitmap", "0.3"), ("tc_sp24", "2:4"),
                                        ("tc_lanemask", "0.3"), ("tc_scatter", "0.3"), ("tc_words", "0.3")])
def test_prepare_on_cpu_packs_without_compiling(name, style, tmp_path):
    from sparseditto.harness.source_loader import load_module

    mod = load_module(get_template(name).instantiate({}).source, cache_dir=tmp_path)
    A = _pruned(37, 130, style)
    packed = mod.prepare(A, torch.float16, torch.device("cpu"))
    assert packed["kernels"] == {} and packed["shape"] == (37, 130)
    assert packed["tiles"] == 3 and packed["nchunks"] == 3
    for key in packed["arrays"]:
        assert isinstance(packed[key], torch.Tensor) and packed[key].is_contiguous()
    with pytest.raises(ValueError, match="CUDA device"):
        mod.spmm(packed, torch.zeros(130, 4, dtype=torch.float16), torch.zeros(37, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        mod.prepare(A, torch.float32, torch.device("cpu"))


def test_words_launch_reads_the_unit_the_matrix_was_packed_with(tmp_path):
    """UNIT is a property of the packed bytes: a sweep that launches a tc_words pack with other params
    (benchmarks/llm_layers.py sets packed['params'] per variant) must still name the packed unit's kernel.
    Found on the H200: UNIT 2 launched on a UNIT 1 pack read past its blobs (illegal memory access)."""
    from sparseditto.harness.source_loader import load_module

    mod = load_module(get_template("tc_words").instantiate({"UNIT": 2}).source, cache_dir=tmp_path)
    packed = mod.prepare(_pruned(37, 130, "0.3"), torch.float16, torch.device("cpu"))
    assert packed["unit"] == 2
    for params in ({"UNIT": 1}, {}):
        lp = tc_launch.launch_params({**packed["params"], **params}, packed)
        geom = tc_launch.plan_geometry("words", packed["tiles"], packed["nchunks"], 8, lp, 132)
        assert tc_launch.kernel_name("words", 0, geom).endswith(", 2, 0>")


def test_sp24_prepare_refuses_unstructured(tmp_path):
    from sparseditto.harness.source_loader import load_module

    mod = load_module(get_template("tc_sp24").instantiate({}).source, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="Not 2:4 structured"):
        mod.prepare(_pruned(32, 64, "0.9"), "float16", "cpu")


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,style,shape", [
    ("tc_dense", "0.5", (300, 1000)), ("tc_bitmap", "0.5", (300, 1000)), ("tc_bitmap", "0.9", (4096, 4096)),
    ("tc_sp24", "2:4", (300, 1000)), ("tc_sp24", "2:4", (4096, 4096)), ("tc_dense", "0.3", (37, 130)),
    ("tc_lanemask", "0.5", (300, 1000)), ("tc_lanemask", "1.0", (100, 260)), ("tc_lanemask", "2:4", (4096, 4096)),
    ("tc_scatter", "0.5", (300, 1000)), ("tc_scatter", "1.0", (100, 260)), ("tc_scatter", "0.1", (4096, 4096)),
    ("tc_scatter", "0.0", (40, 130)),
    ("tc_words", "0.5", (300, 1000)), ("tc_words", "1.0", (100, 260)), ("tc_words", "0.1", (4096, 4096)),
    ("tc_words", "0.0", (40, 130)), ("tc_words", "2:4", (1100, 4160)),
])
def test_gpu_verifies_against_fp64(name, style, shape, dtype):
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    A = _pruned(*shape, style)
    result = run_and_verify(get_template(name).instantiate({}), A, n_values=(1, 3, 16, 17, 64, 129),
                            dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


def _param_id(value) -> str:
    """Test ids a `-k` can select on the GPU: the template, its params as KEYvalue, the style, the shape MxK."""
    if isinstance(value, dict):
        return "_".join(f"{k}{v}" for k, v in value.items()) or "defaults"
    if isinstance(value, tuple):
        return "x".join(str(x) for x in value)
    return str(value)


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,params,style,shape", [
    ("tc_scatter", {"SCHED": "stream"}, "0.5", (300, 1000)), ("tc_scatter", {"SCHED": "stream"}, "1.0", (100, 260)),
    ("tc_scatter", {"SCHED": "stream"}, "0.1", (4096, 4096)), ("tc_scatter", {"SCHED": "stream"}, "0.0", (40, 130)),
    ("tc_scatter", {"SCHED": "stream", "WARPS": 8, "PIPE": 2}, "0.3", (1100, 4160)),
    ("tc_scatter", {"SCHED": "stream", "WARPS": 16, "PIPE": 4}, "0.05", (333, 7000)),
    ("tc_scatter", {"SCHED": "stream"}, "0.3", (80000, 128)),
    ("tc_scatter", {"LOAD": "reg"}, "0.5", (300, 1000)), ("tc_scatter", {"LOAD": "reg"}, "1.0", (100, 260)),
    ("tc_scatter", {"LOAD": "reg"}, "0.1", (4096, 4096)), ("tc_scatter", {"LOAD": "reg"}, "0.0", (40, 130)),
    ("tc_scatter", {"LOAD": "reg", "WARPS": 8, "SPLIT": 2}, "0.3", (1100, 4160)),
    ("tc_words", {"UNIT": 2}, "0.5", (300, 1000)), ("tc_words", {"UNIT": 2}, "1.0", (100, 260)),
    ("tc_words", {"UNIT": 2}, "0.1", (4096, 4096)), ("tc_words", {"UNIT": 2, "WARPS": 8, "PIPE": 2}, "0.3", (1100, 4160)),
    ("tc_words", {"WARPS": 16, "PIPE": 4}, "0.05", (333, 7000)),
    ("tc_words", {"SCHED": "stream"}, "0.5", (300, 1000)), ("tc_words", {"SCHED": "stream", "UNIT": 2}, "0.1", (4096, 4096)),
    ("tc_words", {"SCHED": "stream", "WARPS": 8}, "0.3", (80000, 128)), ("tc_words", {"SCHED": "stream"}, "0.0", (40, 130)),
    ("tc_words", {"LOAD": "bulk"}, "0.5", (300, 1000)), ("tc_words", {"LOAD": "bulk", "UNIT": 2}, "0.1", (4096, 4096)),
    ("tc_words", {"LOAD": "bulk", "WARPS": 2, "RING_KB": 8}, "1.0", (100, 260)),
    ("tc_words", {"LOAD": "bulk", "WARPS": 8, "SPLIT": 1}, "0.3", (1100, 4160)), ("tc_words", {"LOAD": "bulk"}, "0.0", (40, 130)),
    ("tc_words", {"PF": 4}, "0.5", (300, 1000)), ("tc_words", {"PF": 8, "UNIT": 2, "SPLIT": 1}, "0.1", (1100, 4160)),
    ("tc_words", {"LOAD": "group"}, "0.5", (300, 1000)), ("tc_words", {"LOAD": "group", "PIPE": 3}, "1.0", (100, 260)),
    ("tc_words", {"LOAD": "group", "UNIT": 2, "WARPS": 8, "PIPE": 4}, "0.1", (4096, 4096)),
    ("tc_words", {"LOAD": "group", "WARPS": 8, "SPLIT": 1, "PIPE": 3}, "2:4", (1100, 4160)),
    ("tc_words", {"LOAD": "group"}, "0.0", (40, 130)),
    ("tc_words", {"LOAD": "group", "STAGE_CHUNKS": 2}, "0.5", (300, 1000)),
    ("tc_words", {"LOAD": "group", "STAGE_CHUNKS": 4, "WARPS": 8, "PIPE": 3}, "0.3", (1100, 4160)),
    ("tc_words", {"LOAD": "group", "B_PARTS": 4}, "0.5", (1100, 4160)),
    ("tc_words", {"LOAD": "group", "B_PARTS": 2, "SPLIT": 1, "PIPE": 3}, "0.3", (300, 1000)),
    ("tc_words", {"LOAD": "group", "B_PARTS": 4, "SPLIT": 8, "WARPS": 4}, "0.5", (260, 200)),
    ("tc_words", {"LOAD": "group", "R": 2}, "0.5", (300, 1000)),     # 19 tiles: the second group's last warp half past M
    ("tc_words", {"LOAD": "group", "R": 2, "WARPS": 4, "SPLIT": 1, "PIPE": 3}, "0.3", (1100, 4160)),
    ("tc_words", {"LOAD": "group", "R": 2, "UNIT": 2, "WARPS": 2, "PIPE": 4}, "0.1", (4096, 4096)),
    ("tc_words", {"LOAD": "group", "R": 2}, "0.0", (40, 130)),
    ("tc_words", {"LOAD": "group", "EPILOGUE": "push"}, "0.5", (300, 1000)),
    ("tc_words", {"LOAD": "group", "EPILOGUE": "push", "SPLIT": 8, "WARPS": 2}, "0.3", (1100, 4160)),   # 4-row shares
    ("tc_words", {"LOAD": "group", "EPILOGUE": "push", "R": 2, "SPLIT": 8, "WARPS": 4}, "0.5", (1100, 4160)),
    ("tc_words", {"LOAD": "group", "EPILOGUE": "push", "SPLIT": 2}, "0.0", (40, 130)),
    ("tc_words", {"LOAD": "group", "TILE_WARPS": 2}, "0.5", (300, 1000)),   # 19 tiles, two a CTA: the last half past M
    ("tc_words", {"LOAD": "group", "TILE_WARPS": 2, "WARPS": 8, "SPLIT": 1, "PIPE": 3}, "0.3", (1100, 4160)),  # 65 chunks
    ("tc_words", {"LOAD": "group", "TILE_WARPS": 2, "EPILOGUE": "push", "SPLIT": 8, "WARPS": 4}, "0.5", (1100, 4160)),
    ("tc_words", {"LOAD": "group", "TILE_WARPS": 2, "UNIT": 2, "WARPS": 16}, "0.1", (4096, 4096)),
    ("tc_words", {"LOAD": "group", "TILE_WARPS": 2}, "0.0", (40, 130)),
    ("tc_words", {}, "0.3", (8200, 700)),   # the defaults on a wide matrix at 30%: CTA stream, R 2, pushed up to N = 16
    ("tc_words", {}, "0.5", (2100, 1000)),   # the defaults on a narrow one with short K: CTA stream, 4 warps, R 1
], ids=lambda v: _param_id(v))
def test_gpu_template_params_verify_against_fp64(name, params, style, shape, dtype):
    """Kernels that only non-default parameters reach. tc_scatter's stream-K schedule: groups split between
    many CTAs (a 40x130 matrix has 3 chunks and gets a CTA per item), rows past the last tile, K not a
    multiple of the chunk, wide N in n blocks (N = 129: three), the counters left at zero for the next
    call (the verifier calls again); 80000x128 (2 chunks, 1250 groups of 4 tiles on 1056 CTAs of the
    H200) gives ranges longer than K, so a CTA stages all of B and touches three groups. tc_scatter's
    register-load kernel (LOAD="reg"). tc_words' two-register units (UNIT 2), a 16-warp CTA, its
    stream-K kernel (tc_words_sk) and its bulk ring (tc_words_bulk: a dense 100x260 with RING_KB 8 raised
    to the pack's largest copy, a whole-K slice per warp at SPLIT 1, an empty matrix), its L2 prefetch
    ahead of the ring (PF, past the slice's end included), and its CTA stream (tc_words_grp: 19 tiles in
    groups of 4, the last padded; a dense 100x260; 2:4 at SPLIT 1; an empty matrix; 2 and 4 chunks per stage,
    K slices that are not a multiple of them), its pushed split-K reduction (EPILOGUE="push": a warp's rows sent to
    four owners at 2 warps x split 8, two tiles per warp, an empty matrix), two warps per tile (TILE_WARPS 2: a
    CTA's last tile past M, an odd chunk count that leaves the second warps idle in the last stage, pushed and
    pulled epilogues, 16 warps, an empty matrix)."""
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    A = _pruned(*shape, style)
    result = run_and_verify(get_template(name).instantiate(params), A, n_values=(1, 3, 16, 17, 64, 129),
                            dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("params", [{"MMA": "wgmma", "WLOAD": "cp"},
                                    {"MMA": "wgmma", "WLOAD": "cp", "WARPS": 4, "WPIPE": 2, "SPLIT": 8},
                                    {"MMA": "wgmma", "WLOAD": "cp", "WARPS": 16, "WPIPE": 6, "BRING": 4},
                                    {"MMA": "wgmma"}, {"MMA": "wgmma", "TWARPS": 8, "WSTAGES": 2, "SPLIT": 8},
                                    {"MMA": "wgmma", "TWARPS": 16, "WSTAGES": 6, "SPLIT": 1},
                                    {"MMA": "wgmma", "ASTAGES": 8, "WSTAGES": 3},
                                    {"MMA": "wgmma", "MCAST": 2, "SPLIT": 3},
                                    {"MMA": "wgmma", "MCAST": 4, "TWARPS": 8, "SPLIT": 2}])
def test_gpu_wgmma_kernel_verifies_against_fp64(params, dtype):
    """tc_sp24's sm_90a kernels through the sandboxed verifier at every block width (N = 1 .. 129: n8
    tiles 1 .. 16, two 128-column blocks; N = 2048: sixteen), rows past the last warpgroup and a K that is not a
    multiple of the chunk. Skips on GPUs other than compute capability 9.0."""
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    A = _pruned(200, 4160, "2:4")
    result = run_and_verify(get_template("tc_sp24").instantiate(params), A, n_values=(1, 9, 33, 64, 65, 128, 129, 2048),
                            dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


def test_lanemask_slot_holds_the_largest_blob_and_the_last_quads_overread(tmp_path):
    """Each ring slot takes a whole blob (16-byte pieces) plus the 4 bytes the last quad of the last
    lane may read past its values (decode_quad_c reads two halves at the quad's start and two at its
    second pair, selected away when past the end)."""
    from sparseditto.harness.source_loader import load_module
    from sparseditto.tc_formats import LANEMASK_OVERREAD, TCLaneMask

    for density in ("1.0", "0.5", "0.05"):
        A = _pruned(40, 300, density)
        fmt = TCLaneMask.from_matrix(A, "float16")
        largest = int(np.diff(fmt.offsets.astype(np.int64), axis=1).max()) * 16
        assert fmt.slot_bytes() % 16 == 0 and fmt.slot_bytes() >= largest + LANEMASK_OVERREAD
        mod = load_module(get_template("tc_lanemask").instantiate({}).source, cache_dir=tmp_path)
        packed = mod.prepare(A, torch.float16, torch.device("cpu"))
        assert packed["slot_bytes"] == fmt.slot_bytes()
        params = tc_launch.launch_params(packed["params"], {"slot_bytes": packed["slot_bytes"]})
        g = tc_launch.plan_geometry("lanemask", packed["tiles"], packed["nchunks"], 16, params, 132)
        assert g["slot_bytes"] == fmt.slot_bytes()
        assert g["smem"] >= g["warps"] * g["pipe"] * fmt.slot_bytes()


def test_wide_n_estimates_follow_the_measured_stream_floor():
    """The planner's view of tc_sp24 / tc_dense at wide N: the byte roofline at N <= 16 (where they
    measured 1.47-2.28x / ~1.0x cuBLAS on the H200) and a measured per-tile floor from N = 32 up. On
    an sm_90 target tc_sp24 runs the wgmma kernel there (session 28, fed by the copy engine: 21.6 us on
    11008x4096 at N = 64, A read once per 128 columns); elsewhere, or with MMA="sync", the mma.sync kernel's floor (0.67x
    cuBLAS at N = 64, session 25), which re-reads A per 64 columns and ranks behind dense."""
    from sparseditto.kernel_templates.cost import TC_WG_TILE_STEP_S, tc_stream_floor_s
    from sparseditto.targets import get_target

    nm = {"shape": (11008, 4096), "nnz": 11008 * 2048, "row_stats": {"mean": 2048.0, "max": 2048, "cv": 0.0},
          "empty_rows": 0, "empty_cols": 0, "nm_conformance": {"2:4": {"row": 1.0}}, "blocks": [],
          "best_block_shape": None}
    h200, a100 = get_target("H200"), get_target("A100")
    sp24, dense = get_template("tc_sp24"), get_template("dense")
    at = {n: sp24.cost(nm, n, "float16", h200) for n in (16, 64, 65, 128, 129)}
    assert at[16].bound == "memory"
    assert at[64].bound == "decode" and "wgmma" in at[64].notes
    floor = tc_stream_floor_s(11008, 4096, 64, h200, TC_WG_TILE_STEP_S)
    assert floor <= at[64].seconds < floor + 5e-6                              # plus the launch overhead
    assert 20e-6 < at[64].seconds < 26e-6                                      # measured 21.6 us
    assert at[128].a_bytes == at[65].a_bytes == at[64].a_bytes and at[129].a_bytes == pytest.approx(2 * at[64].a_bytes)
    sync = {n: sp24.cost(nm, n, "float16", h200, {"MMA": "sync"}) for n in (64, 65)}
    old = {n: sp24.cost(nm, n, "float16", a100) for n in (64, 65)}
    for est, tgt in ((sync, h200), (old, a100)):
        assert est[64].bound == "decode" and est[64].seconds > dense.cost(nm, 64, "float16", tgt).seconds
        assert est[64].seconds >= tc_stream_floor_s(11008, 4096, 64, tgt) > 30e-6
        assert est[65].a_bytes == pytest.approx(2 * est[64].a_bytes)
    assert get_template("tc_dense").cost(nm, 16, "float16", h200).bound == "memory"


def test_a_refused_tensor_map_falls_back_to_the_cp_kernel(monkeypatch):
    """The driver has the last word on a tensor map (or there is no libcuda): a refusal must not fail
    the launch; the plan runs tc_sp24wg for that B layout and says why. An accepted map is encoded
    once at planning and kept per B buffer."""
    from sparseditto.kernel_templates import tensor_map

    params = {**TMA_PARAMS}
    tiles, nchunks = 4096 // 16, 4096 // 64
    tma = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, params, 132, None, H200_CC)
    cp = tc_launch.plan_geometry("sp24", tiles, nchunks, 64, params, 132, None, H200_CC, False)
    names = [tc_launch.kernel_name("sp24", 0, g) for g in (tma, cp)]
    assert names[0].startswith("tc_sp24tma<") and names[1].startswith("tc_sp24wg<")

    class Kernel:
        max_dynamic_shared_size_bytes = 0

    packed = {"kind": "sp24", "params": params, "shape": (4096, 4096), "tiles": tiles, "nchunks": nchunks,
              "sm_count": 132, "cc": H200_CC, "bf16": 0, "kernels": {x: Kernel() for x in names},
              "arrays": ("values", "meta"), "values": torch.zeros(8), "meta": torch.zeros(8)}
    b = torch.zeros((4096, 64), dtype=torch.float16)
    out = torch.zeros((4096, 64), dtype=torch.float16)

    def refuse(*args):
        raise RuntimeError("cuTensorMapEncodeTiled refused B's map (CUresult 1)")

    monkeypatch.setattr(tensor_map, "encode", refuse)
    plan = tc_launch._plan(packed, 64, b, out)
    assert plan["geom"]["load"] == "cp" and plan["b_map"] is None and "refused" in plan["tma_fallback"]
    monkeypatch.setattr(tensor_map, "encode", lambda ptr, *layout: ("map", ptr, layout))
    plan = tc_launch._plan(packed, 64, b, out)
    assert plan["geom"]["load"] == "tma" and plan["tma_fallback"] is None
    assert plan["b_map"] == (64, 4096, 64, 64) and plan["maps"] == {b.data_ptr(): ("map", b.data_ptr(), plan["b_map"])}
    assert tc_launch._b_map(plan, b.data_ptr()) is plan["maps"][b.data_ptr()]


def test_tensor_map_encode_hands_the_driver_the_layout_and_returns_its_128_bytes(monkeypatch):
    """encode() is the one piece of tc_sp24tma's host path that only a GPU machine runs for real: the
    driver call gets B's 3-D layout (dims, byte strides, box, 16-bit elements, the swizzle, zero fill)
    and a 64-byte aligned destination, and its 128 bytes come back as one by-value kernel argument; a
    driver error is a RuntimeError naming the layout."""
    import ctypes

    from sparseditto.kernel_templates import tensor_map

    seen = {}

    def fake(dst, dtype, rank, addr, dims, strides, box, elem, interleave, swizzle, l2, oob):
        seen.update(dst=dst.value, dtype=dtype, rank=rank, addr=addr.value, dims=list(dims[:3]),
                    strides=list(strides[:2]), box=list(box[:3]), elem=list(elem[:3]), swizzle=swizzle, oob=oob)
        ctypes.memmove(dst.value, bytes(range(128)), 128)
        return 0

    monkeypatch.setattr(tensor_map, "_encoder", lambda: fake)
    arg = tensor_map.encode(0x7F0000001000, 100, 11008, 104, 64)
    assert seen["dst"] % 64 == 0 and seen["rank"] == 3 and seen["addr"] == 0x7F0000001000
    assert seen["dims"] == [100, 16, 688] and seen["strides"] == [208, 3328] and seen["box"] == [64, 4, 4]
    assert seen["elem"] == [1, 1, 1] and seen["dtype"] == tensor_map.DATA_TYPE_UINT16
    assert seen["swizzle"] == 3 and seen["oob"] == tensor_map.OOB_FILL_ZEROS
    assert arg.shape == (1,) and arg.dtype.itemsize == 128 and arg.tobytes() == bytes(range(128))
    monkeypatch.setattr(tensor_map, "_encoder", lambda: (lambda *a: 1))
    with pytest.raises(RuntimeError, match="CUresult 1.*K = 4096"):
        tensor_map.encode(0x7F0000001000, 64, 4096, 64, 64)


def test_words_ring_kb_holds_three_mean_bulk_copies():
    """tc_words LOAD="bulk": "auto" RING_KB is three mean copies of four blobs (cost.words_bytes per block),
    at least 4 KiB: 50% unstructured keeps 3/4 of the 4-byte words, ~1.64 KiB per blob, so 20 KiB."""
    from sparseditto.kernel_templates.cost import words_bytes, words_ring_kb

    m, k = 11008, 4096
    for density, unit in ((0.5, 1), (0.3, 1), (0.1, 2), (0.0, 1)):
        nnz = int(density * m * k)
        blob = words_bytes(m, k, nnz, unit) / (m // 16 * k // 64)
        assert words_ring_kb(m, k, nnz, unit) == max(4, -(-3 * 4 * blob // 1024))
    assert words_ring_kb(m, k, int(0.5 * m * k)) == 20


def test_words_bulk_geometry_and_kernel():
    """LOAD="bulk" (tc_words_bulk over blob_stream_bulk): shared memory as tc_bitmap's ring (barriers,
    positions, RING_KB per warp, offsets) without its table, no PIPE and no slot size argument; the
    ring is raised to the pack's largest copy; the stream-K schedule refuses it; LOAD is checked."""
    for tiles, nchunks in ((688, 64), (256, 64), (19, 16), (256, 172)):
        for n in (1, 8, 16, 64, 129):
            params = {"WARPS": 4, "SPLIT": "auto", "UNIT": 1, "LOAD": "bulk", "RING_KB": 12, "SLOT_BYTES": 1200}
            g = tc_launch.plan_geometry("words", tiles, nchunks, n, params, 132)
            cpc = g["chunks_per_cta"]
            b = cpc * 64 * tc_launch.b_row_bytes(g["nt"])
            part = 4 * 16 * g["nt"] * 8 * 4 if g["split"] > 1 else 0
            assert g["load"] == "bulk" and g["pipe"] == 0
            assert g["smem"] == b + part + 4 * 4 * 12 + 4 * 12 * 1024 + 4 * (cpc + 1) * 4 <= tc_launch.SMEM_LIMIT
            assert tc_launch.kernel_name("words", 1, g) == f"tc_words_bulk<1, {g['nt']}, 4, {g['split']}, 12, 1>"
    lp = tc_launch.launch_params({"LOAD": "bulk", "RING_KB": 8, "WARPS": 4}, {"ring_floor_kb": 10, "unit": 2})
    assert lp["RING_KB"] == 10 and lp["UNIT"] == 2
    with pytest.raises(ValueError, match="runs with SCHED='cluster' only"):
        tc_launch.plan_geometry("words", 688, 64, 8, {"WARPS": 4, "LOAD": "bulk", "SCHED": "stream", "PIPE": 2}, 132)
    with pytest.raises(ValueError, match="LOAD must be one of"):
        tc_launch.plan_geometry("words", 688, 64, 8, {"WARPS": 4, "LOAD": "reg", "PIPE": 2}, 132)


def test_words_l2_prefetch_names_the_kernel_and_applies_to_the_cp_ring_only():
    """PF (blobs pulled into L2 ahead of the cp.async ring) is tc_words' last template argument; it changes
    no shared memory, the bulk ring and other kinds ignore it, a negative distance is refused."""
    base = {"WARPS": 8, "SPLIT": 4, "PIPE": 2, "UNIT": 1, "SLOT_BYTES": 2224}
    plain = tc_launch.plan_geometry("words", 688, 64, 16, base, 132)
    ahead = tc_launch.plan_geometry("words", 688, 64, 16, {**base, "PF": 4}, 132)
    assert tc_launch.kernel_name("words", 0, plain) == "tc_words<0, 2, 8, 4, 2, 1, 0>"
    assert tc_launch.kernel_name("words", 0, ahead) == "tc_words<0, 2, 8, 4, 2, 1, 4>"
    assert ahead["smem"] == plain["smem"] and ahead["grid"] == plain["grid"]
    bulk = tc_launch.plan_geometry("words", 688, 64, 16, {**base, "PF": 4, "LOAD": "bulk", "RING_KB": 12}, 132)
    assert bulk["prefetch"] == 0 and tc_launch.kernel_name("words", 0, bulk).startswith("tc_words_bulk<")
    assert tc_launch.plan_geometry("scatter", 688, 64, 16, {**base, "PF": 4}, 132)["prefetch"] == 0
    with pytest.raises(ValueError, match="PF .* must be >= 0"):
        tc_launch.plan_geometry("words", 688, 64, 16, {**base, "PF": -1}, 132)


def test_words_group_stream_geometry_and_kernel():
    """LOAD="group" (tc_words_grp): one CTA per group of WARPS tiles plus a producer warp; shared memory is
    B's slice, 2 x PIPE barriers, the group's offsets of the slice, PIPE stages of the pack's largest run
    (the partials over them); the pack's GROUP sets WARPS and LOAD; a pack grouped otherwise, or one
    stage, is refused."""
    for tiles, nchunks, stage in ((688, 64, 13296), (256, 64, 6688), (19, 16, 13296), (256, 172, 6688)):
        for n in (1, 8, 16, 64, 129):
            for warps, pipe in ((8, 3), (4, 2), (4, 4)):
                lp = tc_launch.launch_params({"WARPS": 16, "SPLIT": "auto", "PIPE": pipe, "LOAD": "ring"},
                                             {"slot_bytes": stage, "unit": 1, "group": warps})
                assert lp["WARPS"] == warps and lp["LOAD"] == "group" and lp["GROUP"] == warps
                g = tc_launch.plan_geometry("words", tiles, nchunks, n, lp, 132)
                cpc, nt = g["chunks_per_cta"], g["nt"]
                part = warps * 16 * nt * 8 * 4 if g["split"] > 1 else 0
                offs = -(-(cpc * warps + 1) * 4 // 16) * 16
                assert g["smem"] == cpc * 64 * tc_launch.b_row_bytes(nt) + 16 * pipe + offs + max(pipe * stage, part)
                assert g["smem"] <= tc_launch.SMEM_LIMIT and g["block"] == ((warps + 1) * 32, 1, 1)
                assert g["grid"][0] == -(-tiles // warps) and g["load"] == "group"
                assert tc_launch.kernel_name("words", 0, g) == f"tc_words_grp<0, {nt}, {warps}, {g['split']}, {pipe}, 1, 1, 1, 1, 0>"
    with pytest.raises(ValueError, match="grouped by WARPS x R / TILE_WARPS row tiles: this pack has GROUP=1"):
        tc_launch.plan_geometry("words", 688, 64, 8, {"WARPS": 8, "PIPE": 3, "LOAD": "group", "GROUP": 1}, 132)
    with pytest.raises(ValueError, match="PIPE >= 2"):
        tc_launch.plan_geometry("words", 688, 64, 8, {"WARPS": 8, "PIPE": 1, "LOAD": "group", "GROUP": 8}, 132)
    # STAGE_CHUNKS: a pack property (its SLOT_BYTES holds that many chunks), the kernel's last argument
    lp = tc_launch.launch_params({"WARPS": 8, "PIPE": 2, "LOAD": "group", "STAGE_CHUNKS": 1},
                                 {"slot_bytes": 26000, "unit": 1, "group": 8, "stage_chunks": 2})
    g = tc_launch.plan_geometry("words", 688, 64, 16, lp, 132)
    assert lp["STAGE_CHUNKS"] == 2 and tc_launch.kernel_name("words", 0, g).endswith(", 1, 2, 1, 1, 0>")
    with pytest.raises(ValueError, match="STAGE_CHUNKS must be one of"):
        tc_launch.plan_geometry("words", 688, 64, 8, {**lp, "STAGE_CHUNKS": 3}, 132)
    # B_PARTS: a launch choice (the kernel's last template argument), one chunk per stage only
    one = {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 8, "STAGE_CHUNKS": 1}
    g = tc_launch.plan_geometry("words", 688, 64, 16, {**one, "B_PARTS": 4}, 132)
    assert g["b_parts"] == 4 and tc_launch.kernel_name("words", 0, g).endswith(", 1, 1, 4, 1, 0>")
    assert tc_launch.plan_geometry("words", 688, 64, 16, one, 132)["b_parts"] == 1
    with pytest.raises(ValueError, match="B_PARTS must be one of"):
        tc_launch.plan_geometry("words", 688, 64, 8, {**one, "B_PARTS": 3}, 132)
    with pytest.raises(ValueError, match="needs STAGE_CHUNKS=1, got 2"):
        tc_launch.plan_geometry("words", 688, 64, 8, {**one, "B_PARTS": 2, "STAGE_CHUNKS": 2}, 132)


def test_words_group_push_epilogue_geometry():
    """EPILOGUE="push" (PushReduce): the partials no longer lie over the stages; a receive region follows
    them, a 16-byte barrier and SPLIT slots of the largest row share (MC = WARPS x R x 16 rows split as
    split_reduce splits them, 3 splits of 128 rows: 43 rows a slot); the kernel's last template argument
    is 1. Without a split there is nothing to push (same kernel and shared memory as "pull"), and the
    ring kernels refuse it."""
    for rows, split, nt in ((1, 4, 2), (1, 3, 1), (2, 8, 2), (1, 8, 8), (2, 2, 4)):
        params = {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 8 * rows, "R": rows, "SPLIT": split}
        pull = tc_launch.plan_geometry("words", 688, 64, 8 * nt, {**params, "SLOT_BYTES": 13296}, 132)
        push = tc_launch.plan_geometry("words", 688, 64, 8 * nt, {**params, "SLOT_BYTES": 13296, "EPILOGUE": "push"}, 132)
        assert (pull["nt"], pull["split"], push["nt"], push["split"]) == (nt, split, nt, split)
        head = pull["smem"] - max(2 * 13296, 8 * rows * 16 * nt * 8 * 4)
        share = -(-8 * rows * 16 // split)
        assert push["smem"] == head + 2 * 13296 + 16 + split * share * nt * 32
        assert tc_launch.kernel_name("words", 0, push).endswith(f", {rows}, 1>")
        assert tc_launch.kernel_name("words", 0, pull).endswith(f", {rows}, 0>")
    assert (-(-128 // 3), 128 * 1 // 3, 128 * 2 // 3) == (43, 42, 85)   # the slot holds the largest share
    one = {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 8, "SPLIT": 1, "SLOT_BYTES": 13296}
    alone = tc_launch.plan_geometry("words", 688, 64, 16, {**one, "EPILOGUE": "push"}, 132)
    assert alone == tc_launch.plan_geometry("words", 688, 64, 16, one, 132) and alone["push"] == 0
    # "auto" (the default) pushes up to two n8 tiles (N <= 16, where it was measured) and pulls wider
    auto = {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 8, "SPLIT": 4, "SLOT_BYTES": 13296, "EPILOGUE": "auto"}
    assert [tc_launch.plan_geometry("words", 688, 64, n, auto, 132)["push"] for n in (1, 8, 16, 17, 32, 64)] == [1, 1, 1, 0, 0, 0]
    assert tc_launch.plan_geometry("words", 688, 64, 8, {"WARPS": 8, "PIPE": 2, "LOAD": "ring", "SPLIT": 4, "EPILOGUE": "auto",
                                                            "SLOT_BYTES": 1664}, 132)["push"] == 0
    with pytest.raises(ValueError, match="EPILOGUE must be one of"):
        tc_launch.plan_geometry("words", 688, 64, 16, {**one, "EPILOGUE": "atomic"}, 132)
    with pytest.raises(ValueError, match="EPILOGUE='push' runs with LOAD='group' only, got LOAD='ring'"):
        tc_launch.plan_geometry("words", 688, 64, 16, {"WARPS": 8, "PIPE": 2, "LOAD": "ring", "EPILOGUE": "push"}, 132)


def test_words_group_two_warps_per_tile_geometry():
    """TILE_WARPS = 2 (tc_words_grp's TW): the pack's group is WARPS / 2 tiles with stages of two chunks, so
    launch_params reads WARPS = GROUP x TILE_WARPS back; one CTA per WARPS / 2 tiles; the offsets, the split-K
    partials and the pushed receive region are sized for WARPS / 2 tiles, and the stages hold at least the
    second warps' partial tiles; the kernel names TW = 2 as a last template argument (1 is its default, so
    every other name is unchanged); R 2, B_PARTS, a pack made without it, odd warps and the ring are refused."""
    pack = {"slot_bytes": 1500, "unit": 1, "group": 4, "stage_chunks": 2, "group_rows": 1, "tile_warps": 2}
    lp = tc_launch.launch_params({"WARPS": 4, "SPLIT": "auto", "PIPE": 2, "LOAD": "ring", "STAGE_CHUNKS": 1}, pack)
    assert (lp["WARPS"], lp["R"], lp["GROUP"], lp["TILE_WARPS"], lp["STAGE_CHUNKS"], lp["LOAD"]) == (8, 1, 4, 2, 2, "group")
    for tiles, nchunks, n in ((256, 64, 16), (19, 16, 1), (256, 172, 64), (688, 64, 8)):
        for epilogue in ("pull", "push"):
            g = tc_launch.plan_geometry("words", tiles, nchunks, n, {**lp, "EPILOGUE": epilogue}, 132)
            cpc, nt, split = g["chunks_per_cta"], g["nt"], g["split"]
            pair = 4 * 16 * nt * 8 * 4                      # the second warps' tiles, fp32
            head = cpc * 64 * tc_launch.b_row_bytes(nt) + 16 * 2 + -(-(cpc * 4 + 1) * 4 // 16) * 16
            stages = max(2 * 1500, pair)
            if epilogue == "push" and split > 1:
                want = head + stages + 16 + split * -(-64 // split) * nt * 32
            else:
                want = head + max(stages, pair if split > 1 else 0)
            assert g["smem"] == want, (tiles, nchunks, n, epilogue)
            assert g["grid"][0] == -(-tiles // 4) and g["block"] == (9 * 32, 1, 1) and g["tile_warps"] == 2
            assert tc_launch.kernel_name("words", 0, g) == (f"tc_words_grp<0, {nt}, 8, {split}, 2, 1, 2, 1, 1, "
                                                            f"{int(epilogue == 'push' and split > 1)}, 2>")
    one = tc_launch.plan_geometry("words", 256, 64, 16, {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 8}, 132)
    assert one["tile_warps"] == 1 and tc_launch.kernel_name("words", 0, one).endswith(", 1, 1, 1, 1, 0>")
    with pytest.raises(ValueError, match="TILE_WARPS=2 takes one row tile per warp and B staged whole: it needs R=1"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "R": 2, "GROUP": 8}, 132)
    with pytest.raises(ValueError, match="it needs R=1 and B_PARTS=1, got R=1, B_PARTS=2"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "B_PARTS": 2}, 132)
    with pytest.raises(ValueError, match="stages hold one chunk per warp of a tile .STAGE_CHUNKS=2., got STAGE_CHUNKS=1"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "STAGE_CHUNKS": 1}, 132)
    with pytest.raises(ValueError, match="WARPS must be a multiple of 2 and at least 4, got 2"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "WARPS": 2, "GROUP": 1}, 132)
    with pytest.raises(ValueError, match="this pack has GROUP=8, the launch WARPS=8, R=1, TILE_WARPS=2"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "GROUP": 8}, 132)
    with pytest.raises(ValueError, match="TILE_WARPS=2 runs with LOAD='group' only, got LOAD='ring'"):
        tc_launch.plan_geometry("words", 256, 64, 16, {"WARPS": 8, "PIPE": 2, "LOAD": "ring", "TILE_WARPS": 2}, 132)
    with pytest.raises(ValueError, match=r"TILE_WARPS \(consumer warps per row tile\) must be one of \(1, 2\), got 4"):
        tc_launch.plan_geometry("words", 256, 64, 16, {**lp, "TILE_WARPS": 4}, 132)


def test_words_auto_two_tiles_per_warp_from_the_density():
    """"auto" R: two row tiles per warp only where the CTA stream runs (512+ row tiles, one-register units)
    with one chunk per stage and the density is at most 35% (H200 session 37: 4-8% faster at 70% on
    11008x4096, up to 20% slower at 50%); an explicit R is kept."""
    from sparseditto.kernel_templates.cost import words_auto_params

    base = {"WARPS": "auto", "UNIT": "auto", "LOAD": "auto", "SCHED": "cluster", "RING_KB": "auto", "R": "auto"}
    k = 4096
    for m, density, want in ((11008, 0.3, (2, "group")), (11008, 0.35, (2, "group")), (11008, 0.5, (1, "group")),
                             (11008, 0.1, (1, "ring")), (4096, 0.3, (1, "group")), (8192, 0.3, (2, "group"))):
        out = words_auto_params(base, m, k, int(density * m * k))
        assert (out["R"], out["LOAD"]) == want, (m, density, out)
    assert words_auto_params({**base, "R": 1}, 11008, k, int(0.3 * 11008 * k))["R"] == 1
    assert words_auto_params({**base, "STAGE_CHUNKS": 2}, 11008, k, int(0.3 * 11008 * k))["R"] == 1   # one chunk per stage only
    assert words_auto_params({**base, "TILE_WARPS": 2}, 11008, k, int(0.3 * 11008 * k))["R"] == 1   # one warp per tile only
    assert words_auto_params({**base, "R": 2}, 4096, k, int(0.5 * 4096 * k))["LOAD"] == "group"


def test_words_auto_cta_stream_on_narrow_short_k_matrices():
    """"auto" LOAD takes the CTA stream with 4 warps and one tile each on narrower matrices (128 to 511 row
    tiles) whose K is at most 64 chunks (H200 session 38, 4096x4096: 1-7% faster than the ring at 50-90%, N =
    8 / 16), two-register units included; longer K (4096x11008, 4-5% slower there), fewer row tiles and the
    stream-K schedule keep the ring; the wide rule is unchanged."""
    from sparseditto.kernel_templates.cost import words_auto_params

    base = {"WARPS": "auto", "UNIT": "auto", "LOAD": "auto", "SCHED": "cluster", "RING_KB": "auto", "R": "auto"}
    for m, k, density, want in ((4096, 4096, 0.5, ("group", 4, 1, 1)), (4096, 4096, 0.1, ("group", 4, 1, 2)),
                                (2048, 4096, 0.3, ("group", 4, 1, 1)), (4096, 4160, 0.3, ("ring", 4, 1, 1)),
                                (4096, 11008, 0.3, ("ring", 4, 1, 1)), (2032, 4096, 0.3, ("ring", 4, 1, 1)),
                                (11008, 4096, 0.3, ("group", 8, 2, 1))):
        out = words_auto_params(base, m, k, int(density * m * k))
        assert (out["LOAD"], out["WARPS"], out["R"], out["UNIT"]) == want, (m, k, density, out)
    assert words_auto_params({**base, "SCHED": "stream"}, 4096, 4096, 2 ** 23)["LOAD"] == "ring"


def test_words_group_two_tiles_per_warp_geometry():
    """R = 2 (tc_words_grp, two row tiles per consumer warp): the pack's group is WARPS x 2 tiles, so
    launch_params reads WARPS = GROUP / R back; one CTA per 2 x WARPS tiles; the offsets and the split-K
    partials are sized for 2 x WARPS tiles; the kernel's last template argument is R; a pack grouped for
    another R, R = 3 and R = 2 with several chunks per stage are refused."""
    for tiles, nchunks, n in ((688, 64, 16), (19, 16, 1), (256, 172, 64)):
        lp = tc_launch.launch_params({"WARPS": 4, "SPLIT": "auto", "PIPE": 2, "LOAD": "ring"},
                                     {"slot_bytes": 26000, "unit": 1, "group": 16, "group_rows": 2})
        assert (lp["WARPS"], lp["R"], lp["GROUP"], lp["LOAD"]) == (8, 2, 16, "group")
        g = tc_launch.plan_geometry("words", tiles, nchunks, n, lp, 132)
        cpc, nt = g["chunks_per_cta"], g["nt"]
        part = 16 * 16 * nt * 8 * 4 if g["split"] > 1 else 0
        offs = -(-(cpc * 16 + 1) * 4 // 16) * 16
        assert g["smem"] == cpc * 64 * tc_launch.b_row_bytes(nt) + 16 * 2 + offs + max(2 * 26000, part)
        assert g["grid"][0] == -(-tiles // 16) and g["block"] == (9 * 32, 1, 1) and g["rows"] == 2
        assert tc_launch.kernel_name("words", 1, g) == f"tc_words_grp<1, {nt}, 8, {g['split']}, 2, 1, 1, 1, 2, 0>"
    one = {"WARPS": 8, "PIPE": 2, "LOAD": "group", "GROUP": 16, "R": 2}
    with pytest.raises(ValueError, match="this pack has GROUP=8, the launch WARPS=8, R=2"):
        tc_launch.plan_geometry("words", 688, 64, 16, {**one, "GROUP": 8}, 132)
    with pytest.raises(ValueError, match=r"R \(row tiles per warp of LOAD='group'\) must be one of"):
        tc_launch.plan_geometry("words", 688, 64, 16, {**one, "R": 3, "GROUP": 24}, 132)
    with pytest.raises(ValueError, match="R=2 decodes one chunk per stage: it needs STAGE_CHUNKS=1, got 2"):
        tc_launch.plan_geometry("words", 688, 64, 16, {**one, "STAGE_CHUNKS": 2}, 132)
    with pytest.raises(ValueError, match="R=2 \\(row tiles per warp\\) runs with LOAD='group' only, got LOAD='ring'"):
        tc_launch.plan_geometry("words", 688, 64, 16, {"WARPS": 8, "PIPE": 2, "LOAD": "ring", "R": 2}, 132)
    from sparseditto.kernel_templates.cost import words_auto_params
    assert words_auto_params({"R": 2, "LOAD": "auto", "WARPS": "auto", "UNIT": "auto"}, 4096, 4096, 2 ** 23)["LOAD"] == "group"


def test_words_auto_params_follow_the_measured_rules():
    """tc_words' "auto": two-register units at <= 15% density (90% sparsity, where the H200 measured them
    faster), one register above; 8 warps from 512 row tiles (11008 rows), 4 below (4096); explicit values
    are kept; the planner's grid tries the other choice of each."""
    from sparseditto.kernel_templates.cost import words_auto_params
    from sparseditto.kernel_templates.cuda.planning import tc_words as planning

    assert words_auto_params({}, 11008, 4096, int(0.1 * 11008 * 4096)) == {"UNIT": 2, "WARPS": 8, "LOAD": "ring",
                                                                             "RING_KB": 9}
    assert words_auto_params({}, 11008, 4096, int(0.5 * 11008 * 4096))["LOAD"] == "group"
    assert words_auto_params({}, 4096, 4096, int(0.3 * 4096 * 4096)) == {"UNIT": 1, "WARPS": 4, "LOAD": "group",
                                                                         "RING_KB": 14}   # the narrow stream (K <= 64 chunks)
    # the CTA stream from 512 row tiles with one-register units, except under the stream-K schedule
    assert words_auto_params({"SCHED": "stream"}, 11008, 4096, 10)["LOAD"] == "ring"
    fixed = {"UNIT": 1, "WARPS": 16, "PIPE": 3, "RING_KB": 8, "LOAD": "ring"}
    assert words_auto_params(fixed, 11008, 4096, 10) == fixed

    class Stats:
        m, k, nnz = 4096, 4096, int(0.1 * 4096 * 4096)
    assert planning.grid(Stats, 8, None, None) == [{}, {"WARPS": 8}, {"UNIT": 1}, {"PIPE": 3}, {"LOAD": "ring"}]

    class LongK(Stats):
        k, nnz = 11008, int(0.1 * 4096 * 11008)
    assert planning.grid(LongK, 8, None, None)[-1] == {"LOAD": "group"}

    class Wide(Stats):
        m, nnz = 11008, int(0.5 * 11008 * 4096)
    assert planning.grid(Wide, 8, None, None)[-1] == {"LOAD": "ring"}


@pytest.mark.parametrize("shape,sparsity,expect", [
    ((64, 256), 0.9, {"unit": 2, "warps": 4, "group": 1}),     # 10% density: two-register units, the ring
    ((8208, 128), 0.5, {"unit": 1, "warps": 8, "group": 8}),   # 513 row tiles: the CTA stream, a padded group
])
def test_exported_tc_words_packs_like_tcwords_in_an_isolated_interpreter(tmp_path, shape, sparsity, expect):
    """`sparseditto export` of a tc_words kernel (its auto params reach tc_launch through cost.py): the
    module imports only torch, numpy and CuPy, and in `python -I` without SparseDitto its prepare()
    resolves the auto params (the CTA stream's group order from 512 row tiles included) and packs the
    very blobs TCWords builds here."""
    import json
    import sys

    from sparseditto import generate
    from sparseditto.batch.export import module_text
    from sparseditto.batch.standalone import third_party_imports
    from sparseditto.pattern_features import structure_signature
    from sparseditto.tc_formats import TCWords

    W = generate.unstructured(*shape, sparsity, seed=1)
    fields = {"source": get_template("tc_words").instantiate({}).source, "template": "tc_words", "layer": "w",
              "params": {}, "matrix_shape": list(shape), "dtype": "float16", "verified_ns": [1, 8], "verification": {},
              "signature": structure_signature(W), "density": 1 - sparsity, "structure": {"kind": "unstructured"}}
    text = module_text(fields)
    assert third_party_imports(text) == {"torch", "numpy", "cupy"}
    (tmp_path / "kernel.py").write_text(text)
    np.save(tmp_path / "w.npy", W.to_dense().astype(np.float16).astype(np.float32))
    child = ("import json, runpy, sys, numpy as np, torch\n"
             "m = runpy.run_path('kernel.py')\n"
             "p = m['prepare'](m['as_sparse_matrix'](np.load('w.npy')), torch.float16, torch.device('cpu'))\n"
             "np.save('blobs.npy', p['blobs'].numpy())\n"
             "print(json.dumps({'unit': p['unit'], 'warps': p['params']['WARPS'], 'group': p['group'],"
             " 'ours': sorted(k for k in sys.modules if k.startswith('sparseditto'))}))\n")
    done = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {**expect, "ours": []}
    ours = TCWords.from_matrix(W, "float16", expect["unit"], expect["group"]).blobs
    assert np.array_equal(np.load(tmp_path / "blobs.npy").view(np.uint8), ours)
