"""The launch plumbing every kernel template shares, in one trusted module candidates may import.

Why one module: every Triton template needs the same host-side steps around its kernel (name ->
torch dtype, check its PARAMS against META, check the operands of ``spmm``, cache one launch plan
per layout of B and C, launch through Triton's compiled kernel after the first call). Written
once here, a template file holds only what is its own: its kernels, its format, its launch rules.
The static checks allow ``sparseditto.kernel_templates.runtime`` in candidate sources (beside
``sparseditto.formats`` and ``sparseditto.reorder``), so an LLM editing a template instance keeps
the same plumbing. It imports torch and numpy only (no Triton; CuPy only inside `cupy_stream` and
`compile_cuda`), so CUDA C++ templates use it too.

A launch plan is a dict: ``kernel`` (a Triton JIT function), ``grid`` (a 3-tuple), ``args`` (every
kernel argument in signature order, B and C left as None), ``b_at`` / ``out_at`` (where B and C go;
``b_at`` None for a kernel that does not read B), ``options`` (num_warps, num_stages), ``compiled``
(None until the first GPU launch) and anything the template keeps beside it (config, workspaces).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_SMS = 132   # H100/H200 SXM; used when no CUDA device can be asked (interpreter)
INT16_COLUMN_LIMIT = 32768   # int16 column ids hold 0..32767

_NAMED_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def torch_dtype(dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or a name ("float16", "bf16", ...); ValueError otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _NAMED_DTYPES:
        raise ValueError(f"Unsupported value dtype {dtype!r}; expected float16, bfloat16 or float32.")
    return _NAMED_DTYPES[dtype]


# The value types of cuda/dtypes.cuh: the C++ template argument (F32, F16, BF16) per torch dtype.
CUDA_VALUE_TAGS = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def cuda_value_dtype(dtype, who: str) -> torch.dtype:
    """The torch dtype of a CUDA-core template's values (those dtypes.cuh has a type for); a
    ValueError naming the template ``who`` otherwise."""
    dtype = torch_dtype(dtype)
    if dtype not in CUDA_VALUE_TAGS:
        raise ValueError(f"{who} supports float32, float16 and bfloat16 values, got {dtype}.")
    return dtype


def element_size(dtype) -> int:
    """Bytes per element of a torch dtype (or a dtype name)."""
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def vectors_fit(ptr: int, ld: int, vec: int, esize: int) -> bool:
    """Whether rows of a matrix at address ``ptr`` with row stride ``ld`` elements can be read or
    written VEC elements at a time as one aligned vector (VEC * esize bytes) from any multiple of VEC."""
    return ptr % (vec * esize) == 0 and ld % vec == 0


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def index_bits(choice, K: int) -> int:
    """Column-id width of a CSR-family kernel: INDEX_BITS 16 | 32 | "auto" (16 when K <= 32768,
    4 instead of 6 bytes per fp16 nonzero); ValueError when 16 cannot hold K's column ids."""
    bits = (16 if K <= INT16_COLUMN_LIMIT else 32) if choice == "auto" else int(choice)
    if bits == 16 and K > INT16_COLUMN_LIMIT:
        raise ValueError(f"INDEX_BITS=16 needs K <= {INT16_COLUMN_LIMIT}, got K = {K}.")
    return bits


def check_params(meta: dict, params: dict) -> None:
    """ValueError naming the first parameter whose value is not among META's legal values (a
    candidate's PARAMS line may have been edited by hand or by an LLM)."""
    for name, legal in meta["params"].items():
        if params.get(name) not in legal:
            raise ValueError(f"{meta['name']} parameter {name}={params.get(name)!r} is not one of {legal}.")


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device`` (a torch.device); DEFAULT_SMS off the GPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return DEFAULT_SMS


# (dynamic shared memory one block may opt into, shared memory per SM) by compute capability (the CUDA C
# programming guide's table): the Triton templates size their pipelines to the device's opt-in and delta_spmv its
# persistent grid to the SM's, where the H200's figures had been assumed (an A100 allows 163 KB per block, an Ada
# or consumer Ampere card 99 KB: a deeper pipeline fails to launch there)
SMEM_BY_CC = {(8, 0): (163 * 1024, 164 * 1024), (8, 6): (99 * 1024, 100 * 1024), (8, 7): (163 * 1024, 164 * 1024),
              (8, 9): (99 * 1024, 100 * 1024), (9, 0): (227 * 1024, 228 * 1024), (10, 0): (227 * 1024, 228 * 1024),
              (12, 0): (99 * 1024, 100 * 1024)}
HOPPER_CC = (9, 0)                    # what is assumed off the GPU (interpreter): the H100 / H200
SM_RESERVED_SMEM = 1024               # per SM, kept by the system
DEFAULT_SMEM_PER_BLOCK = SMEM_BY_CC[HOPPER_CC][0]
DEFAULT_SMEM_PER_SM = SMEM_BY_CC[HOPPER_CC][1] - SM_RESERVED_SMEM
DEFAULT_THREADS_PER_SM = 2048         # H100/H200 (and A100); an Ada or consumer Ampere SM holds 1536


def smem_for(cc) -> tuple[int, int]:
    """(opt-in shared memory per block, shared memory per SM) of compute capability ``cc``; for one the
    table does not list, the smallest of its major version (48 / 64 KB before Ampere)."""
    cc = tuple(int(x) for x in cc)
    if cc in SMEM_BY_CC:
        return SMEM_BY_CC[cc]
    known = [v for k, v in SMEM_BY_CC.items() if k[0] == cc[0]] or (
        [(48 * 1024, 64 * 1024)] if cc[0] < 8 else list(SMEM_BY_CC.values()))
    return min(known)


def smem_optin_for(cc) -> int:
    """The opt-in shared memory per block of compute capability ``cc`` (`smem_for`)."""
    return smem_for(cc)[0]


def smem_per_block(device) -> int:
    """Shared memory a block may opt into on ``device`` (a torch.device): the driver's figure where
    torch reports it, else `smem_for` its compute capability; DEFAULT_SMEM_PER_BLOCK off the GPU."""
    if device.type != "cuda":
        return DEFAULT_SMEM_PER_BLOCK
    props = torch.cuda.get_device_properties(device)
    reported = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return reported or smem_for((props.major, props.minor))[0]


@dataclass(frozen=True)
class SMResources:
    """What the CTAs resident on one SM share, for sizing a persistent grid to one wave."""

    smem: int = DEFAULT_SMEM_PER_SM
    threads: int = DEFAULT_THREADS_PER_SM


def sm_resources(device) -> SMResources:
    """``device``'s per-SM shared memory (torch's figure where it reports one, else `smem_for` its
    compute capability, less the system's reserve) and thread limit; Hopper's off the GPU."""
    if device.type != "cuda":
        return SMResources()
    props = torch.cuda.get_device_properties(device)
    total = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0) or smem_for((props.major, props.minor))[1]
    threads = int(getattr(props, "max_threads_per_multi_processor", 0) or DEFAULT_THREADS_PER_SM)
    return SMResources(smem=total - SM_RESERVED_SMEM, threads=threads)


SMEM_HEADROOM = 16 * 1024   # what a pipeline's shared-memory budget leaves for barriers, epilogue and Triton's own


def stage_budget(wanted: int, smem_limit: int) -> int:
    """The bytes a template's "auto" pipeline depth may spend on its buffers on a device whose blocks
    may opt into ``smem_limit``: its own ``wanted`` budget, less where the device has less."""
    return max(0, min(int(wanted), int(smem_limit) - SMEM_HEADROOM))


def check_operands(packed: dict, B, out) -> int:
    """N, after checking B is [K, N] and out is [M, N] for the prepared A (ValueError otherwise)."""
    M, K = packed["shape"]
    if B.dim() != 2 or B.shape[0] != K:
        raise ValueError(f"Expected B of shape ({K}, N), got {tuple(B.shape)}.")
    N = B.shape[1]
    if out.dim() != 2 or out.shape[0] != M or out.shape[1] != N:
        raise ValueError(f"Expected out of shape ({M}, {N}), got {tuple(out.shape)}.")
    return N


def cuda_operands(packed: dict, B, out, dtype, who: str):
    """(N, b, target) for a CUDA C++ template's spmm after checking shapes, dtypes and device.

    b and target are B and out where their columns are unit-stride (or N == 1, where only
    column 0 is touched), else contiguous stand-ins: the kernels walk columns with unit stride.
    The caller copies target back into out when they differ. N == 0 gives (0, None, None). A CUDA prepare
    that compiled no kernel (no geometry fits its parameters) passes here: the launch's planner then names
    the parameter that does not fit, which a device complaint would hide."""
    n = check_operands(packed, B, out)
    if B.dtype != dtype or out.dtype != B.dtype:
        raise ValueError(f"Expected B and out in the prepared dtype {dtype}, got B {B.dtype} and out {out.dtype}.")
    scratch = packed.get("scratch")
    prepared_on_cuda = scratch.get("_on_cuda") if isinstance(scratch, dict) else None
    if prepared_on_cuda is None:   # once per prepared matrix (scratch is reset before each verification call)
        prepared_on_cuda = any(getattr(v, "is_cuda", False) for v in packed.values())
        if isinstance(scratch, dict):
            scratch["_on_cuda"] = prepared_on_cuda
    if not B.is_cuda or not prepared_on_cuda:
        where = "prepared on the CPU" if B.is_cuda else f"got B on {B.device}"
        raise ValueError(f"{who} runs on a CUDA device (prepare on 'cuda'): {where}.")
    if n == 0:
        return 0, None, None
    m = packed["shape"][0]
    b = B if B.stride(1) == 1 or n == 1 else B.contiguous()
    target = out if out.stride(1) == 1 or n == 1 else torch.empty((m, n), dtype=out.dtype, device=out.device)
    return n, b, target


def cupy_stream(scratch: dict, device):
    """(CuPy device, CuPy view of torch's current stream) for launching on ``device``, made once per
    stream and kept in the packed dict's scratch (CuPy is imported only here, on first use)."""
    import cupy as cp

    stream = torch.cuda.current_stream(device).cuda_stream
    key = ("stream", device.index, stream)
    ctx = scratch.get(key)
    if ctx is None:
        ctx = scratch[key] = (cp.cuda.Device(device.index), cp.cuda.ExternalStream(stream))
    return ctx


def compile_cuda(source: str, names, device, who: str) -> dict:
    """NVRTC-compile the kernels ``names`` (C++ name expressions such as ``"k<F16, 4>"``) of a CUDA
    template's CUDA_SRC on ``device`` through cupy.RawModule; {name: kernel}. RuntimeError without
    CuPy, or while CUDA_SRC is still the registry's placeholder (a template file loaded as is)."""
    try:
        import cupy as cp
    except ImportError as exc:
        raise RuntimeError(f"{who} needs CuPy (pip install cupy-cuda13x) and a CUDA GPU.") from exc
    if source.startswith("@SPARSEDITTO_INLINE"):
        raise RuntimeError(f"{who}: CUDA_SRC is still the placeholder: instantiate the template through "
                           "sparseditto.kernel_templates.registry, which inlines its .cu file(s).")
    names = tuple(names)
    with cp.cuda.Device(device.index if device.index is not None else 0):
        module = cp.RawModule(code=source, options=("-std=c++17",), name_expressions=names)
        return {name: module.get_function(name) for name in names}


def direct_launch_enabled() -> bool:
    """``SPARSEDITTO_DIRECT_LAUNCH=1``: CUDA C++ kernels launch through `DirectLaunch` from their plan's
    second call on (off by default until the H200 has measured and verified it: issue 12's eager host
    time; `benchmarks/launch_overhead_probe.py` times both)."""
    import os

    return os.environ.get("SPARSEDITTO_DIRECT_LAUNCH", "0") == "1"


_CTYPES_OF = {np.dtype(np.int32): "c_int32", np.dtype(np.int64): "c_int64", np.dtype(np.uint32): "c_uint32",
              np.dtype(np.uint64): "c_uint64", np.dtype(np.float32): "c_float", np.dtype(np.float64): "c_double"}


class DirectLaunch:
    """One planned CuPy kernel launched with ``cuLaunchKernel`` through ctypes, its argument block built
    once: per call only the pointer slots change and torch's raw current stream is read.

    Why: a decode kernel runs 5-30 us, and in eager PyTorch the host's launch path is what a patched
    layer pays on top (the H200, session 24: a patched 3-layer MLP 2x slower than dense eagerly, faster
    inside a CUDA graph). CuPy's call converts every argument and enters its device and stream
    contexts each time. Built only after CuPy launched the plan once (module loaded, dynamic shared
    memory allowed) and only for arguments that are fixed-width numpy scalars; the caller keeps CuPy
    for anything else (a tensor map argument, another device than the thread's current one)."""

    def __init__(self, fn, grid, block, smem: int, args: tuple, slots: tuple[int, ...]):
        import ctypes

        func = getattr(getattr(fn, "kernel", None), "ptr", None) or getattr(fn, "ptr", None)
        if not func:
            raise ValueError("DirectLaunch needs the kernel's CUfunction (CuPy's Function.ptr).")
        values = []
        for i, a in enumerate(args):
            if i in slots:
                values.append(ctypes.c_uint64(0))
                continue
            name = _CTYPES_OF.get(getattr(a, "dtype", None))
            if name is None or np.ndim(a) != 0:
                raise ValueError(f"DirectLaunch takes fixed-width numpy scalars, got {type(a).__name__} at argument {i}.")
            values.append(getattr(ctypes, name)(a.item()))
        self._values = values                              # kept alive: the block points into them
        self._slots = [values[i] for i in slots]
        self._params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                          for v in values])
        g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
        b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
        self._dims = g + b
        self._smem = int(smem)
        self._func = ctypes.c_void_p(int(func))
        self._launch = _cu_launch_kernel()

    def __call__(self, stream: int, *pointers: int) -> None:
        for slot, ptr in zip(self._slots, pointers):
            slot.value = ptr
        rc = self._launch(self._func, *self._dims, self._smem, stream, self._params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernel failed: CUDA driver error {rc} ({_cu_error_name(rc)}).")


_DRIVER: list = []


def libcuda():
    """The CUDA driver library through ctypes, loaded once (DirectLaunch). tensor_map loads its own:
    an exported tc kernel inlines that module and may import nothing of SparseDitto."""
    import ctypes

    if not _DRIVER:
        _DRIVER.append(ctypes.CDLL("libcuda.so.1"))
    return _DRIVER[0]


def _cu_launch_kernel():
    import ctypes

    fn = libcuda().cuLaunchKernel
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _cu_error_name(rc: int) -> str:
    import ctypes

    name = ctypes.c_char_p()
    try:
        libcuda().cuGetErrorName(rc, ctypes.byref(name))
    except (OSError, AttributeError):
        return "?"
    return name.value.decode() if name.value else "?"


def raw_stream(device) -> int | None:
    """torch's current stream on ``device`` as a raw handle, or None when ``device`` is not the thread's
    current device (a driver launch goes to the current context: the caller keeps CuPy there)."""
    current = torch.cuda.current_device()
    index = device.index if device.index is not None else current
    if index != current:
        return None
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(getter(index)) if getter is not None else int(torch.cuda.current_stream(device).cuda_stream)


def launch_cuda(packed: dict, key: tuple, make_plan, b, target, out) -> None:
    """One launch of a CuPy kernel on torch's current stream, its plan made once per ``key`` (the
    N and layout of B and C the plan depends on) and kept in ``packed["scratch"]``.

    ``make_plan()`` returns {"kernel", "grid", "block", "head", "tail"} (and "smem", the dynamic
    shared-memory bytes, when the kernel uses any): the kernel is called with
    head + (B's pointer, C's pointer) + tail, fixed-width numpy scalars built once, so a repeated
    call only reads two pointers. A plan may add "then": launches that follow on the same stream
    and take C only (dicts of "kernel", "grid", "block", "head", "tail": called with head + (C's
    pointer,) + tail), e.g. a fixup pass over the first kernel's partial sums. ``target`` is where
    the kernels write (`cuda_operands`), copied into ``out`` when it is a stand-in."""
    scratch = packed["scratch"]
    plan = scratch.get(key)
    if plan is None:
        plan = scratch[key] = make_plan()
    direct = plan.get("direct")
    stream_handle = raw_stream(b.device) if direct else None
    if stream_handle is not None:
        direct[0](stream_handle, b.data_ptr(), target.data_ptr())
        for then in direct[1:]:
            then(stream_handle, target.data_ptr())
    else:
        device, stream = cupy_stream(scratch, b.device)
        c_ptr = np.uint64(target.data_ptr())
        args = plan["head"] + (np.uint64(b.data_ptr()), c_ptr) + plan["tail"]
        with device, stream:
            plan["kernel"](plan["grid"], plan["block"], args, shared_mem=plan.get("smem", 0))
            for then in plan.get("then", ()):
                then["kernel"](then["grid"], then["block"], then["head"] + (c_ptr,) + then["tail"])
            if direct is None and direct_launch_enabled():
                plan["direct"] = _direct_plan(plan)
    if target is not out:
        out.copy_(target)


def direct_launch(fn, grid, block, smem: int, head: tuple, tail: tuple, pointers: int = 2):
    """A DirectLaunch of ``fn`` whose arguments are head + ``pointers`` pointer slots (B and C, or C
    alone) + tail, or False (never asked again) when it cannot be built: an argument that is not a
    fixed-width numpy scalar, no CUfunction, no driver library."""
    slots = tuple(range(len(head), len(head) + pointers))
    try:
        return DirectLaunch(fn, grid, block, smem, head + (None,) * pointers + tail, slots)
    except (ValueError, OSError, AttributeError):
        return False


def _direct_plan(plan: dict) -> list | bool:
    """The plan's launches as DirectLaunch objects (the first: B and C pointer slots; each "then": C),
    or False when one of them cannot be built."""
    launches = [direct_launch(plan["kernel"], plan["grid"], plan["block"], plan.get("smem", 0), plan["head"],
                              plan["tail"])]
    launches += [direct_launch(t["kernel"], t["grid"], t["block"], 0, t["head"], t["tail"], pointers=1)
                 for t in plan.get("then", ())]
    return launches if all(launches) else False


def make_plan(kernel, named: dict, grid, options: dict, **extra) -> dict:
    """A launch plan from the kernel's arguments by name (B and C as None at b_ptr / out_ptr)."""
    names = list(kernel.arg_names)
    return {"kernel": kernel, "grid": grid, "args": [named[n] for n in names],
            "b_at": names.index("b_ptr") if "b_ptr" in names else None, "out_at": names.index("out_ptr"),
            "options": options, "compiled": None, **extra}


def launch(plan: dict, B, out) -> None:
    """Launch a planned kernel. The first call goes through Triton's JIT (compiling if needed) and
    keeps the CompiledKernel it returns; later calls launch that kernel directly, which skips the
    JIT's per-call argument specialization and cache lookup. That is safe because the plan's cache
    key (see `run_plans`) fixes everything Triton specializes on: each int argument's value and
    each pointer's 16-byte alignment. In the interpreter the JIT path runs every time. Grids are
    always 3-tuples: the compiled kernel's launcher reads grid[0..2] (the JIT pads shorter grids,
    it does not)."""
    args = list(plan["args"])
    if plan["b_at"] is not None:
        args[plan["b_at"]] = B
    args[plan["out_at"]] = out
    compiled = plan["compiled"]
    if compiled is not None:
        compiled[plan["grid"]](*args)
        return
    result = plan["kernel"][plan["grid"]](*args, **plan["options"])
    if B.is_cuda and result is not None:
        plan["compiled"] = result


def run_plans(packed: dict, B, out, make_plans, meta: dict, params: dict, *, same_dtype: bool = False) -> None:
    """The body of a Triton template's ``spmm``: check the operands, find (or make, once) the launch
    plan(s) for this N and layout of B and C in ``packed["scratch"]``, launch them in order.

    ``make_plans(packed, B, out)`` returns one plan or a list of plans (launched in order);
    ``same_dtype`` makes an output dtype other than B's an error (kernels that store B's dtype).
    """
    N = check_operands(packed, B, out)
    if same_dtype and out.dtype != B.dtype:
        raise ValueError(f"Expected out in B's dtype {B.dtype}, got {out.dtype}.")
    if N == 0 or packed["shape"][0] == 0:
        return
    key = (N, B.dtype, out.dtype, B.device, B.stride(0), B.stride(1), out.stride(0), out.stride(1),
           B.data_ptr() % 16, out.data_ptr() % 16)
    plans = packed["scratch"].get(key)
    if plans is None:
        check_params(meta, params)
        plans = make_plans(packed, B, out)
        packed["scratch"][key] = plans
    if isinstance(plans, list):
        for plan in plans:
            launch(plan, B, out)
    else:
        launch(plans, B, out)
