"""Launch and op tracing of one ``spmm`` call: the result must come from the candidate's own kernels.

Two tracers, both active during every verification call of ``spmm`` (not during timing):

* `OpTracer` (every backend): a ``TorchDispatchMode`` plus a ``TorchFunctionMode``. The dispatch
  mode sees each ATen operator that runs in this thread, whatever Python route reached it
  (``torch.mm`` through an alias, ``torch.overrides``, a Tensor subclass, ``F.conv1d``,
  ``conv_tbc``, RNN cells and ``cdist``, which decompose into ``mm``/``addmm``), and refuses any
  operator outside `ALLOWED_OPS`: allocation, copies and casts, views, indexing and scatter,
  element-wise math, and the reductions a split-K kernel needs. The function mode refuses moving
  tensor data to the host (``.numpy()``, ``__array__``, ``tolist``, ``__dlpack__``, storages)
  unless Triton's interpreter does it for a launch, so NumPy/SciPy cannot be handed the work
  (NumPy's matmul is a ufunc that no Python-level hook can see). Element-by-element reads
  (``item``) are capped at `MAX_SCALAR_READS` per call.
* `KernelTracer` (CUDA): ``torch.profiler`` with CUDA activity (CUPTI) records every kernel
  launched during the call, whichever library launched it (torch, CuPy, cuBLAS through CuPy...),
  and refuses library GEMM/SpMM kernels (`VENDOR_KERNEL`) and any kernel that is neither the
  candidate's own (its ``@triton.jit`` functions, the ``__global__`` functions of its CUDA
  source) nor one of torch's fill/copy kernels (`TORCH_KERNELS_ALLOWED`).
"""
from __future__ import annotations

import ast
import functools
import re

from .guard import SandboxViolation

MAX_SCALAR_READS = 256

ALLOWED_OPS = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like
new_zeros new_ones new_full arange linspace scalar_tensor eye rand rand_like randn randn_like randint
randint_like randperm bernoulli normal uniform random lift_fresh lift_fresh_copy
copy copy_ _to_copy to clone contiguous detach detach_ alias _copy_from _copy_from_and_resize resize_
resize_as_ _has_compatible_shallow_copy_type is_same_size _local_scalar_dense item is_nonzero equal
view _unsafe_view reshape _reshape_alias expand expand_as permute t t_ transpose transpose_ unsqueeze
unsqueeze_ squeeze squeeze_ flatten unflatten slice slice_scatter select select_scatter narrow as_strided
as_strided_ unbind split split_with_sizes chunk movedim view_as unfold diagonal
index index_select index_put index_put_ _index_put_impl_ index_add index_add_ index_copy index_copy_
index_fill index_fill_ gather scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_
masked_fill masked_fill_ masked_select masked_scatter masked_scatter_ take take_along_dim nonzero where
repeat_interleave repeat cat stack flip roll sort argsort searchsorted bucketize bincount unique_consecutive
_unique2 cumsum cumsum_ cumprod diff tril triu isin histc
add add_ sub sub_ rsub mul mul_ div div_ neg neg_ abs abs_ exp exp_ exp2 expm1 log log_ log2 log1p sqrt
sqrt_ rsqrt pow pow_ clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ maximum minimum fmax fmin sign
sgn floor ceil round trunc frac remainder fmod floor_divide reciprocal square lerp addcmul addcdiv
bitwise_and bitwise_and_ bitwise_or bitwise_or_ bitwise_xor bitwise_not bitwise_left_shift
bitwise_right_shift logical_and logical_or logical_not logical_xor eq ne lt le gt ge isnan isinf
isfinite nan_to_num relu sigmoid tanh sin cos erf fill fill_ zero_ mul_ masked_fill
sum mean amax amin max min any all count_nonzero argmax argmin prod
sym_size sym_stride sym_numel sym_storage_offset record_stream set_.source_Storage_storage_offset
""".split()) - {"set_.source_Storage_storage_offset"}

#: Host conversions the function mode refuses outside Triton's interpreter.
#: Ops Triton's interpreter itself uses to move kernel arguments (refused from anyone else).
INTERPRETER_OPS = frozenset({"set_", "resize_", "_copy_from"})
HOST_EXPORTS = frozenset({"numpy", "__array__", "__array_wrap__", "tolist", "__dlpack__", "untyped_storage",
                          "storage", "_typed_storage", "__reduce_ex__", "__getstate__"})

VENDOR_KERNEL = re.compile(r"gemm|gemv|cublas|cutlass|cusparse|sm\d+_xmma|xmma_|nvjet|ampere_|turing_|"
                           r"volta_|hopper_|sm90_|sm80_|sm100_|csrmm|coomm|spmm|spmv|cudnn|splitKreduce|"
                           r"dot_kernel|bmm_|matmul|cutensor|_mma_", re.IGNORECASE)
TORCH_KERNELS_ALLOWED = re.compile(r"FillFunctor|fill_kernel|direct_copy_kernel|copy_kernel|"
                                   r"CatArrayBatchedCopy|float8_copy_kernel|bfloat16_copy_kernel|"
                                   r"vectorized_elementwise_kernel<\d+, at::native::\(anonymous namespace\)::"
                                   r"(direct_)?copy|Memcpy|Memset|unrolled_elementwise_kernel.*copy", re.IGNORECASE)
# Own kernel names that imitate library kernels are not trusted as own (a candidate declaring a
# dummy @triton.jit function called "ampere_sgemm_128x64_nn" must not whitelist cuBLAS's kernel).
_IMPERSONATION = re.compile(r"^(ampere|turing|volta|hopper|blackwell|sm\d+|cutlass|cublas|cusparse|nvjet|xmma|"
                            r"gemm|gemv|void)", re.IGNORECASE)
# __global__, the return type, then any attributes (__launch_bounds__(...), __cluster_dims__(...)),
# then the kernel's name before its parameter list or template arguments.
_CUDA_GLOBAL = re.compile(r"__global__\s+(?:[\w:\*]+\s+)*?(?:__\w+__\s*\([^)]*\)\s*)*(?!__\w+__)(\w+)\s*[<(]")


def own_kernel_names(source: str) -> set[str]:
    """Names of the kernels a candidate defines: @triton.jit functions and __global__ functions in
    any string constant of the source (CUDA C++ for CuPy). Parsed once per source: a verification
    asks for every one of its ~16 calls (27 ms each for delta_spmv's 48 KB source)."""
    return set(_own_kernel_names(source))


@functools.lru_cache(maxsize=16)
def _own_kernel_names(source: str) -> frozenset[str]:
    names: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return frozenset()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                text = ast.unparse(target)
                if text.endswith(("jit", "autotune", "heuristics")):
                    names.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            names.update(_CUDA_GLOBAL.findall(node.value))
    return frozenset(names)


class TraceRefusal(SandboxViolation):
    """The call ran compute that must not run inside ``spmm`` (kind: 'vendor_op', 'host_export',
    'scalar_reads', 'vendor_kernel', 'foreign_kernel')."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class OpTracer:
    """Context manager: refuse ATen ops outside `ALLOWED_OPS` and host exports during one call."""

    def __init__(self, interpreter_roots: tuple[str, ...] = ()) -> None:
        self.interpreter_roots = interpreter_roots
        self.refusals: list[TraceRefusal] = []
        self.ops: dict[str, int] = {}
        self._modes = None

    def _refuse(self, kind: str, message: str):
        refusal = TraceRefusal(kind, message)
        self.refusals.append(refusal)
        raise refusal

    def __enter__(self) -> "OpTracer":
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        tracer = self

        def dispatch(mode, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            tracer.ops[name] = tracer.ops.get(name, 0) + 1
            if name not in ALLOWED_OPS and not (name in INTERPRETER_OPS and tracer._from_interpreter()):
                tracer._refuse("vendor_op", f"spmm ran the torch operator aten::{name}, which is not "
                                            f"allowed inside a kernel (only Triton/CUDA launches, "
                                            f"allocation, copies, indexing, element-wise ops and "
                                            f"simple reductions; matmul-like ops call vendor libraries)")
            if name == "_local_scalar_dense" and tracer.ops[name] > MAX_SCALAR_READS:
                tracer._refuse("scalar_reads", f"spmm read more than {MAX_SCALAR_READS} tensor elements "
                                               f"to the host one by one (the work must run in the kernel)")
            return func(*args, **(kwargs or {}))

        class _Dispatch(TorchDispatchMode):
            __torch_dispatch__ = dispatch

        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo (~2 s of every worker's start-up). Nothing in the worker
        # runs torch.compile (its code generation is refused inside a candidate's scope), so the
        # plain function is what runs, without that import.
        _Dispatch.__torch_dispatch__ = dispatch

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in HOST_EXPORTS and not tracer._from_interpreter():
                    tracer._refuse("host_export", f"spmm moved tensor data to the host with {name}() "
                                                  f"(NumPy/SciPy may not do the kernel's work)")
                return func(*args, **(kwargs or {}))

        self._modes = (_Functions(), _Dispatch())
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes or ()):
            mode.__exit__(None, None, None)
        self._modes = None

    def _from_interpreter(self) -> bool:
        import sys

        frame = sys._getframe(2)
        depth = 0
        while frame is not None and depth < 12:
            filename = frame.f_code.co_filename
            if any(filename.startswith(root) for root in self.interpreter_roots):
                return True
            frame, depth = frame.f_back, depth + 1
        return False


class KernelTracer:
    """Context manager (CUDA): record the kernels one call launches; `check` refuses foreign ones."""

    def __init__(self, own: set[str]) -> None:
        self.own = {name for name in own if not _IMPERSONATION.search(name)}
        self.kernels: list[str] = []
        self._prof = None

    def __enter__(self) -> "KernelTracer":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CUDA])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        names = []
        for event in self._prof.events():
            if str(getattr(event, "device_type", "")).endswith("CUDA"):
                names.append(event.name)
        self.kernels = names

    def check(self) -> None:
        for name in self.kernels:
            if self.is_own(name) or TORCH_KERNELS_ALLOWED.search(name):
                continue
            if VENDOR_KERNEL.search(name):
                raise TraceRefusal("vendor_kernel", f"spmm launched the library kernel '{name[:160]}' "
                                                    f"(cuBLAS/cuBLASLt/CUTLASS/cuSPARSE work is not the "
                                                    f"candidate's own)")
            raise TraceRefusal("foreign_kernel", f"spmm launched '{name[:160]}', which is not one of the "
                                                 f"candidate's kernels ({', '.join(sorted(self.own)) or 'none declared'})")

    def is_own(self, name: str) -> bool:
        for own in self.own:
            if name == own or re.search(rf"(^|[^\w]){re.escape(own)}([^\w]|$)", name) or \
                    re.search(rf"\d{re.escape(own)}I", name) or re.search(rf"\d{re.escape(own)}P", name) or \
                    name.startswith(own + "_"):
                return True
        return False
