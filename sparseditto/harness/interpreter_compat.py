"""Keep the Triton interpreter usable with NumPy >= 2.4 (applied in the interpreter worker).

Triton 3.6's interpreter converts scalar tensors to Python ints with ``int(ndarray)``; NumPy 2.4
refuses that for 1-element arrays of ndim > 0 (triton-lang/triton#9171), so every kernel whose loop
bounds come from loaded values (``for j in range(start, end)`` over a CSR row) fails with
"only 0-dimensional arrays can be converted to Python scalars". The interpreter worker is where all
CPU-side kernel runs happen, so it installs the upstream fix: take the single element explicitly.
Nothing changes when the installed NumPy still accepts the conversion.

It also stops the interpreter from re-patching ``triton.language`` on every call of a
``@triton.jit`` helper from inside a kernel (Triton 3.6 walks the language modules with
``inspect.getmembers`` per device-function call, about a third of an interpreted launch of the
templates that call helpers in a loop). The launch's own patch, made from the same module globals,
is still in force at that point, so the skipped re-patch would have installed equivalent wrappers.
"""
from __future__ import annotations

import numpy as np


def numpy_rejects_1elem_int() -> bool:
    try:
        int(np.ones(1, dtype=np.int64))
    except TypeError:
        return True
    return False


def _skip_nested_lang_patches(interp) -> None:
    """Patch ``triton.language`` once per launch, not again per helper call (see the module doc).

    ``GridExecutor.__call__`` (one kernel launch) is wrapped to note the launch; inside it, the
    launch's own ``_patch_lang`` runs as before, and a helper's call whose language modules that
    patch covered gets an empty scope. Anything else (a helper from a module that sees other
    language modules, a helper called outside a launch) is patched exactly as Triton does."""
    if getattr(interp._patch_lang, "sparseditto_once_per_launch", False):
        return
    original_patch, original_call = interp._patch_lang, interp.GridExecutor.__call__
    launches: list[dict] = []   # the launches in progress (innermost last)

    def langs(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is interp.tl or v is interp.tl.core)

    def patch_lang(fn):
        launch = launches[-1] if launches else None
        if launch is not None and launch["patched"] and langs(fn) <= launch["langs"]:
            return interp._LangPatchScope()   # restoring an empty scope changes nothing
        if launch is not None and not launch["patched"]:
            launch["patched"] = True
        return original_patch(fn)

    def launch_call(self, *args, **kwargs):
        launches.append({"langs": langs(self.fn), "patched": False})
        try:
            return original_call(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang.sparseditto_once_per_launch = True
    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch_call


def patch_triton_interpreter() -> bool:
    """Install the ``__index__`` fix into triton.runtime.interpreter; True when it was needed.
    The once-per-launch language patch (module doc) is installed either way."""
    try:
        import triton.runtime.interpreter as interp
    except ImportError:
        return False
    if all(hasattr(interp, name) for name in ("_patch_lang", "_LangPatchScope", "GridExecutor", "tl")):
        _skip_nested_lang_patches(interp)
    if not numpy_rejects_1elem_int():
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
