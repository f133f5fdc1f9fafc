"""Delta-coded SpMV / skinny SpMM in CUDA C++ through CuPy: the per-nonzero decode kernel (N <= 8)
for unstructured 50-98% sparsity.

Why this template exists: at N = 1..4 a pruned weight's product is one pass over A, so its time is
A's bytes over HBM bandwidth, provided the decode keeps up. The bitmap kernels decode per element
(instruction-bound on the H200, docs/kernels.md); int32 CSR (csr_vector) decodes per nonzero but
reads 6 bytes per fp16 nonzero. Delta slices (sparseditto/delta_format.py) read 2.5 bytes per
nonzero with 4-bit deltas (3 with 8-bit, chosen per matrix by prepare when gaps are wide) and
decode each with a bit-field extract and an add; B (K x NV, its own 16-bit values by default,
B_HALF) is staged once per persistent CTA in shared memory. delta_spmv.cu says more.

prepare() packs the slices (lanes per row and delta width "auto": the fewest bytes), compiles every
kernel an N can launch, keeps the handles in the packed dict, and makes each kernel's stream split
(its one-wave grid's sub-warps each stream a contiguous range of rows: `stream_split`, or with
ROW_SPLIT ranges cut inside rows: `group_split`); spmm() is one launch on torch's current
stream, its plan cached per (N, layout of B and C) under packed["scratch"]. N wider than the
shared-memory cap of NV (K * NV * 2 bytes with B_HALF, 4 without, <= SMEM_CAP) runs as several
column blocks, each re-reading A: the planner keeps this template to small N.
"""
META = {
    "name": "delta_spmv",
    "backend": "cuda",
    "format": "delta_slices",
    "description": "CUDA C++ decode SpMV/SpMM (N <= 8): 4/8-bit column deltas in per-lane row slices, B in shared memory",
    "params": {
        "NV": ["auto", 1, 2, 4, 8],
        # "auto": the most lanes per row within 6% of the least padding, raised until the rows
        # spread over 90% of the SMs (delta_format.lanes_to_fill); H200 (session 21): 16 beat the
        # 32 "auto" picks on 4 of 5 weights of 4096 rows at N = 1, so the planner tries it second
        "LANES": ["auto", 4, 8, 16, 32],
        "DELTA_BITS": ["auto", 4, 8],
        "SKEW": ["auto", 0, 4, 5, 6, 7, 8],
        "WARPS": [4, 8, 16, 32],
        # groups in flight per lane; 6 is the deepest ring without spills under MIN_WARPS 24 (ptxas:
        # 80 registers; 8 spills there and ran 20-40% slower on the H200); 6 measured within +-4% of
        # 4 on every Llama-shape case at N = 1, 2, 4 (H200, session 20)
        "PIPE": [2, 4, 6, 8],
        "CTAS_PER_SM": ["auto", 1, 2, 4, 8],
        # warps per SM the registers must allow (__launch_bounds__' minimum CTAs = MIN_WARPS / WARPS;
        # 0: no cap). H200, 11008x4096 at N = 1: uncapped the kernel takes ~100 registers, 16 warps
        # per SM, and waits on its loads; 24 (80 registers, no spills) ran 1.1x faster at 50-70%;
        # 32 (64 registers) spills and ran slower than uncapped.
        "MIN_WARPS": [0, 16, 24, 32],
        # 1: streams cut at group boundaries inside rows (balanced to a group; a cut row's parts are
        # added in stream order by its last contributor); 0: cuts at row ends only. H200 (session
        # 20): against the row-end kernel as fixed that session, at most 2% faster (4096x11008 50%,
        # N = 1: 24.5 vs 25.1 us) and 7-40% slower elsewhere (70-90%, N >= 2); 0 by default.
        "ROW_SPLIT": [0, 1],
        # 1: B's shared copy in its own 16-bit values (half the words per gather at NV >= 2, and NV
        # up to 4 at K = 11008, one pass at N = 4); 0: fp32. H200 (session 20, Llama shapes 50-90%):
        # N = 1 within +-4%, N = 2 1.1-1.3x and N = 4 1.3-2.7x faster than fp32 (N = 4 from 0.54-0.99x
        # cuBLAS at 50% to 1.04-1.40x): the default.
        "B_HALF": [0, 1],
    },
    # SKEW "auto": a skewed B copy only where it cuts the simulated bank conflicts by 15% (2:4-like
    # aligned columns: 1.9-2.5x faster on the H200; random patterns: skew 0, 2-11% faster there)
    "defaults": {"NV": "auto", "LANES": "auto", "DELTA_BITS": "auto", "SKEW": "auto", "WARPS": 8, "PIPE": 4, "CTAS_PER_SM": "auto", "MIN_WARPS": 24,
                 "ROW_SPLIT": 0, "B_HALF": 1},
    "grid": [{}],             # the rest, in an order that depends on the matrix: planning/delta_spmv.py
    "patterns": ["unstructured", "nm", "block", "row_pruned", "column_pruned", "banded", "power_law"],
    "cuda_source": "delta_spmv.cu",
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh delta_spmv.cu@"""

import numpy as np
import torch

from sparseditto.delta_format import DeltaSlices, lanes_floor, physical_extent
from sparseditto.kernel_templates import runtime as rt

_DTYPE_TAGS = {torch.float16: "F16", torch.bfloat16: "BF16"}
_NV_CHOICES = (1, 2, 4, 8)
# B's strip per CTA: K * NV * column bytes (4 fp32, 2 with B_HALF) at most. 99 KB: the smallest opt-in
# dynamic shared memory per block among the target table's GPUs (sm_86 / sm_89; the A100 allows 163 KB, Hopper
# 227 KB), so a strip that fits here launches on all of them (100 KB did not on an Ada or Ampere consumer card)
SMEM_CAP = 99 * 1024
HOPPER_SM = rt.SMResources()      # off the GPU; a launch plans with its device's (rt.sm_resources)
REGS_PER_SM = 65536


def b_bytes() -> int:
    """Bytes per element of B's shared copy: 4 (fp32), or 2 with B_HALF (B's own 16-bit values)."""
    return 2 if int(PARAMS["B_HALF"]) else 4


def nv_cap(K: int) -> int:
    """The widest NV whose strip of B (K x NV) fits SMEM_CAP; 0 when even one column does not."""
    fits = [nv for nv in _NV_CHOICES if K * nv * b_bytes() <= SMEM_CAP]
    return fits[-1] if fits else 0


def nv_for(n: int, K: int) -> int:
    if PARAMS["NV"] != "auto":
        return int(PARAMS["NV"])
    return min(rt.next_pow2(max(1, n)), nv_cap(K))


def kernel_name(dtype, nv: int, lanes: int, bits: int) -> str:
    """delta_spmv (cuts at row ends) or, with ROW_SPLIT, delta_spmv_rs (its own kernel: as a flag of
    one kernel the row-end case ran 1.15-1.4x slower on the H200, delta_spmv.cu says more)."""
    kernel = "delta_spmv_rs" if int(PARAMS["ROW_SPLIT"]) else "delta_spmv"
    return (f"{kernel}<{_DTYPE_TAGS[rt.torch_dtype(dtype)]}, {nv}, {lanes}, {bits}, {int(PARAMS['WARPS'])}, "
            f"{int(PARAMS['PIPE'])}, {min_ctas(nv)}, {'true' if int(PARAMS['B_HALF']) else 'false'}>")


def min_ctas(nv: int) -> int:
    """__launch_bounds__' minimum resident CTAs per SM for PARAMS' MIN_WARPS (1: no register cap).
    NV = 8 keeps its registers (16 accumulators and an 8-wide B row): under the cap ptxas spills."""
    return 1 if nv >= 8 else max(1, int(PARAMS["MIN_WARPS"]) // int(PARAMS["WARPS"]))


def reachable_nvs(kp: int) -> tuple:
    """Every NV plan_launch can pick for a B copy of KP rows under PARAMS."""
    return tuple(nv for nv in _NV_CHOICES if nv <= nv_cap(kp)) if PARAMS["NV"] == "auto" else (int(PARAMS["NV"]),)


def reachable_kernels(dtype, kp: int, lanes: int, bits: int) -> tuple:
    """Every kernel plan_launch can pick for this dtype, B-copy extent (KP) and packing under PARAMS."""
    return tuple(kernel_name(dtype, nv, lanes, bits) for nv in reachable_nvs(kp))


def check_shape(shape) -> None:
    M, K = shape
    eb = b_bytes()
    if K < 1 or nv_cap(K) == 0:
        raise ValueError(f"delta_spmv stages B's rows in shared memory: K = {K} needs {K * eb} bytes per column, "
                         f"more than its {SMEM_CAP} bytes (K <= {SMEM_CAP // eb}); use csr_vector or a tile template.")
    if PARAMS["NV"] != "auto" and K * int(PARAMS["NV"]) * eb > SMEM_CAP:
        raise ValueError(f"delta_spmv NV = {PARAMS['NV']} needs K * NV * {eb} = {K * int(PARAMS['NV']) * eb} bytes of "
                         f"shared memory, more than {SMEM_CAP}; lower NV (the widest that fits is {nv_cap(K)}).")


def prepare(A, dtype, device) -> dict:
    """The delta slices on `device` (values in `dtype`) and, on a GPU, the compiled kernels."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    if dtype not in _DTYPE_TAGS:
        raise ValueError(f"delta_spmv supports float16 and bfloat16 values (16-byte pieces of 8), got {dtype}.")
    check_shape(tuple(A.shape))
    device = torch.device(device)
    floor = min_lanes(A.shape[0], rt.sm_count(device) if device.type == "cuda" else 0)
    fmt = DeltaSlices.from_matrix(A, lanes=PARAMS["LANES"], bits=PARAMS["DELTA_BITS"], skew=PARAMS["SKEW"],
                                  min_lanes=floor)
    if nv_cap(physical_extent(A.shape[1], fmt.skew)) == 0:     # the skew's holes would not fit
        fmt = DeltaSlices.from_matrix(A, lanes=PARAMS["LANES"], bits=PARAMS["DELTA_BITS"], skew=0, min_lanes=floor)
    kp = physical_extent(A.shape[1], fmt.skew)
    deltas = fmt.deltas.view(np.int64) if fmt.bits == 8 else fmt.deltas.view(np.int32)
    tensors = {"values": torch.from_numpy(fmt.values).to(device=device, dtype=dtype),
               "deltas": torch.from_numpy(deltas).to(device),
               "starts": torch.from_numpy(fmt.starts).to(device),
               "group_base": torch.from_numpy(fmt.group_base).to(device)}
    kernels = (rt.compile_cuda(CUDA_SRC, reachable_kernels(dtype, kp, fmt.lanes, fmt.bits), device,
                               "delta_spmv") if device.type == "cuda" else {})
    packed = {**tensors, "arrays": ["values", "deltas", "starts", "group_base"], "shape": tuple(A.shape),
              "nnz": fmt.nnz, "lanes": fmt.lanes, "bits": fmt.bits, "skew": fmt.skew, "kp": kp,
              "fillers": fmt.fillers, "groups": fmt.pieces // fmt.lanes, "a_bytes": fmt.nbytes(2), "kernels": kernels,
              "splits": {}, "scratch": {}, "scratch_row_split": {}}
    # Each kernel's stream split is made here, not at the first spmm: that call may be inside a CUDA
    # graph capture, where a host-to-device copy is not allowed.
    for nv in reachable_nvs(kp) if kernels else ():
        kernel = kernels[kernel_name(dtype, nv, fmt.lanes, fmt.bits)]
        plan = plan_launch(packed, nv, dtype, rt.sm_count(device), int(kernel.num_regs), rt.sm_resources(device))
        if plan["streams"] not in packed["splits"]:
            meta = {name: torch.from_numpy(a).to(device) for name, a in split_arrays(fmt, plan["streams"]).items()}
            if "heads" in meta:     # one column block's parts and counters (N <= NV), made here too
                # scratch* entries: the verifier resets them before each call (the kernel writes them)
                packed["scratch_row_split"][plan["streams"]] = row_split_work(plan["streams"], 1, device)
            packed["splits"][plan["streams"]] = meta
    return packed


def min_lanes(m: int, sms: int) -> int:
    """The fewest lanes per row "auto" may pick under PARAMS (`delta_format.lanes_floor`): M rows in
    CTAs of WARPS warps spread over the GPU's ``sms`` SMs; 1 without a GPU or with ROW_SPLIT."""
    return lanes_floor(m, int(PARAMS["WARPS"]), sms, int(PARAMS["ROW_SPLIT"]))


def row_split_work(streams: int, column_blocks: int, device) -> tuple:
    """ROW_SPLIT's scratch: a cut row's parts (16 floats per stream and column block) and the
    arrival counters (zero; the kernel leaves them zero)."""
    return (torch.zeros(column_blocks * streams * 16, dtype=torch.float32, device=device),
            torch.zeros(column_blocks * streams, dtype=torch.int32, device=device))


def split_arrays(fmt: DeltaSlices, streams: int) -> dict:
    """The launch metadata of ``streams`` sub-warps under PARAMS["ROW_SPLIT"]: "split" (first row,
    first piece per stream), and with row splits "heads" and "head_cols" (`group_split`)."""
    if not int(PARAMS["ROW_SPLIT"]):
        return {"split": stream_split(fmt.group_base, streams)}
    split, heads = group_split(fmt.group_base, fmt.lanes, streams)
    return {"split": split, "heads": heads, "head_cols": head_columns(fmt, split, heads)}


def stream_split(group_base: np.ndarray, streams: int) -> np.ndarray:
    """[streams + 1, 2] int32: (first row, first piece) of each sub-warp's contiguous range of rows,
    cut at the row boundary nearest to an equal share of the pieces (bytes), so that one resident
    wave of sub-warps ends together; the last entry is (M, all pieces). Rows are never split: a
    row's lanes reduce in registers, deterministic and without a second pass."""
    if streams < 1:
        raise ValueError(f"Expected at least one stream (sub-warp), got {streams}.")
    base = np.asarray(group_base, dtype=np.int64)
    m = base.size - 1
    targets = (base[-1] * np.arange(streams + 1, dtype=np.int64)) // streams
    after = np.clip(np.searchsorted(base, targets, side="left"), 0, m)
    before = np.maximum(after - 1, 0)
    rows = np.where(targets - base[before] < base[after] - targets, before, after)
    rows[0], rows[-1] = 0, m
    rows = np.maximum.accumulate(rows)
    return np.stack([rows, base[rows]], axis=1).astype(np.int32)


def group_split(group_base: np.ndarray, lanes: int, streams: int) -> tuple[np.ndarray, np.ndarray]:
    """Streams cut at group boundaries (multiples of L pieces) at equal shares of the pieces, rows
    cut where a share ends inside them: (split, heads), both [streams + 1, 2] int32.

    split[s] = (R_s, P_s): the stream's first piece P_s and R_s, the row containing it (or, at a row
    boundary, the first row starting there, so empty rows belong to the stream after them; the last
    entry is (M, all pieces)). heads[s] = (a, b) when P_s lies inside row R_s: that row is shared by
    streams a..b (a: where it begins, b: where its last piece is), else (-1, -1). Stream s then works
    on rows R_s .. R_{s+1} - 1, and on R_{s+1} too when heads[s + 1] is set."""
    if streams < 1:
        raise ValueError(f"Expected at least one stream (sub-warp), got {streams}.")
    base = np.asarray(group_base, dtype=np.int64)
    m, total = base.size - 1, int(base[-1])
    cuts = (total // lanes) * np.arange(streams + 1, dtype=np.int64) // streams * lanes
    cuts[-1] = total
    first = np.searchsorted(base, cuts, side="left")          # the first row starting at or after the cut
    boundary = (first <= m) & (base[np.minimum(first, m)] == cuts)
    rows = np.where(boundary, first, first - 1)
    rows[0], rows[-1] = 0, m
    inside = ~boundary
    inside[0] = inside[-1] = False
    heads = np.full((streams + 1, 2), -1, dtype=np.int64)
    shared = rows[inside]
    heads[inside, 0] = np.searchsorted(cuts, base[shared], side="right") - 1
    heads[inside, 1] = np.searchsorted(cuts, base[shared + 1] - 1, side="right") - 1
    return np.stack([rows, cuts], axis=1).astype(np.int32), heads.astype(np.int32)


def head_columns(fmt: DeltaSlices, split: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """[streams * L] int32: for a stream starting inside a row, each lane's running column there
    (its start plus the deltas of the row's groups before the cut), what the kernel would have
    reached walking the row from its start; 0 for the other streams."""
    L = fmt.lanes
    streams = split.shape[0] - 1
    out = np.zeros(streams * L, dtype=np.int64)
    for s in np.flatnonzero(heads[:streams, 0] >= 0):
        row, cut = int(split[s, 0]), int(split[s, 1])
        done = np.arange(int(fmt.group_base[row]), cut)        # the row's pieces before the cut, lane-fastest
        steps = sum(fmt.field(done, i) for i in range(8)).reshape(-1, L)
        out[s * L:(s + 1) * L] = fmt.starts[row * L:(row + 1) * L].astype(np.int64) + steps.sum(axis=0)
    return out.astype(np.int32)


def ctas_per_sm(smem: int, regs: int, sm: rt.SMResources = HOPPER_SM) -> int:
    """Resident CTAs per SM the persistent grid is sized for: PARAMS["CTAS_PER_SM"], or what shared
    memory, registers (allocated per warp in 256-register units) and the thread limit allow (at
    most 8). A grid larger than what stays resident makes later CTAs stage B again and leaves a
    partial last wave."""
    if PARAMS["CTAS_PER_SM"] != "auto":
        return int(PARAMS["CTAS_PER_SM"])
    threads = int(PARAMS["WARPS"]) * 32
    per_warp = -(-max(1, regs) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (per_warp * int(PARAMS["WARPS"]))
    return max(1, min(8, sm.smem // max(1, smem + 1024), sm.threads // threads, by_regs))


def plan_launch(packed: dict, N: int, dtype, sms: int, regs: int = 64, sm: rt.SMResources = HOPPER_SM) -> dict:
    """Kernel name, grid, block and dynamic shared memory for one call (pure Python); ``regs`` is
    the compiled kernel's registers per thread. The grid is one wave of resident CTAs (fewer when
    the matrix has fewer rows, or with ROW_SPLIT row groups, than sub-warps); each of its
    ``streams`` sub-warps of L lanes streams one contiguous range (`stream_split`, `group_split`)."""
    M, kp = packed["shape"][0], packed["kp"]
    nv = nv_for(N, kp)
    lanes, warps = int(packed["lanes"]), int(PARAMS["WARPS"])
    rows_per_cta = warps * (32 // lanes)
    smem = kp * nv * b_bytes()
    # streams to fill: rows (cuts at row ends), or row groups of L pieces when rows are cut
    work = int(packed.get("groups", M)) if int(PARAMS["ROW_SPLIT"]) else M
    grid = (max(1, min(-(-work // rows_per_cta), sms * ctas_per_sm(smem, regs, sm))), -(-N // nv), 1)
    if grid[1] > 65535:
        raise ValueError(f"N = {N} needs {grid[1]} column blocks of NV = {nv}, more than CUDA's grid.y limit of "
                         "65535; delta_spmv is a decode kernel (N <= 8), use a tensor-core template.")
    return {"name": kernel_name(dtype, nv, lanes, int(packed["bits"])), "grid": grid, "block": (warps * 32, 1, 1),
            "smem": smem, "streams": grid[0] * rows_per_cta, "nv": nv}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B (B [K, N] on the GPU, any strides), fp32 accumulation, out in B's dtype."""
    M = packed["shape"][0]
    N, b, target = rt.cuda_operands(packed, B, out, packed["values"].dtype, "delta_spmv")
    if N == 0 or M == 0:
        return
    key = (N, b.dtype, b.device, b.stride(0), target.stride(0))

    def make_plan() -> dict:
        kernel = packed["kernels"][kernel_name(b.dtype, nv_for(N, packed["kp"]), packed["lanes"], packed["bits"])]
        plan = plan_launch(packed, N, b.dtype, rt.sm_count(b.device), int(kernel.num_regs), rt.sm_resources(b.device))
        if plan["smem"] > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = plan["smem"]
        plan["kernel"] = kernel
        meta = packed["splits"].get(plan["streams"])
        if meta is None:
            raise RuntimeError(f"delta_spmv: no stream split for {plan['streams']} streams (prepare plans one per "
                               "reachable kernel on this device; was the matrix prepared for another GPU?)")
        pointers = [packed[name] for name in ("values", "deltas", "starts", "group_base")] + [meta["split"]]
        tail = (np.int32(M), np.int32(packed["shape"][1]), np.int32(packed["kp"]), np.int32(packed["skew"]),
                np.int32(N), np.int64(b.stride(0)), np.int64(target.stride(0)))
        if "heads" in meta:     # delta_spmv_rs: the cuts inside rows, the parts' scratch, the stream count
            # prepare made the one-column-block scratch; wider N allocates here (inside a graph
            # capture that is memory of the graph's pool)
            work = packed["scratch_row_split"][plan["streams"]] if plan["grid"][1] == 1 else \
                row_split_work(plan["streams"], plan["grid"][1], b.device)
            plan["work"] = work
            pointers += [meta["heads"], meta["head_cols"], *work]
            tail += (np.int32(plan["streams"]),)
        plan["head"] = tuple(np.uint64(t.data_ptr()) for t in pointers)
        plan["tail"] = tail
        return plan

    rt.launch_cuda(packed, key, make_plan, b, target, out)
