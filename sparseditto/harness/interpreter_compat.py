"""Keep the Triton interpreter usable with NumPy >= 2.4 (applied in the interpreter worker).

Triton 3.6's interpreter converts scalar tensors to Python ints with ``int(ndarray)``; NumPy 2.4
refuses that for 1-element arrays of ndim > 0 (triton-lang/triton#9171), so every kernel whose loop
bounds come from loaded values (``for j in range(start, end)`` over a CSR row) fails with
"only 0-dimensional arrays can be converted to Python scalars". The interpreter worker is where all
CPU-side kernel runs happen, so it installs the upstream fix: take the single element explicitly.
Nothing changes when the installed NumPy still accepts the conversion.
"""
from __future__ import annotations

import numpy as np


def numpy_rejects_1elem_int() -> bool:
    try:
        int(np.ones(1, dtype=np.int64))
    except TypeError:
        return True
    return False


def patch_triton_interpreter() -> bool:
    """Install the ``__index__`` fix into triton.runtime.interpreter; True when it was needed."""
    if not numpy_rejects_1elem_int():
        return False
    try:
        import triton.runtime.interpreter as interp
    except ImportError:
        return False
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "sparseditto_index_fix", False):
        return False

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched.sparseditto_index_fix = True
    interp._patch_lang_tensor = patched
    return True
