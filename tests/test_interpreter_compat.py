"""The interpreter shims of sparseditto.harness.interpreter_compat, on a real interpreted kernel.

A kernel that calls a ``@triton.jit`` helper in a loop computes the same result as NumPy over
several launches (so each launch's language patch is still made and undone), and Triton's
``_patch_lang`` runs once per launch instead of once per helper call as well.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter shims: CPU (TRITON_INTERPRET=1) only", allow_module_level=True)

import triton
import triton.language as tl
import triton.runtime.interpreter as interp

from sparseditto.harness.interpreter_compat import patch_triton_interpreter


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _helper_loop_kernel(x_ptr, out_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for _ in range(STEPS):
        acc = _twice(acc) - acc          # one helper call per step: acc stays x
    tl.store(out_ptr + offs, acc + _twice(acc))


def test_a_kernel_with_helpers_patches_the_language_once_per_launch(monkeypatch):
    patch_triton_interpreter()
    assert getattr(interp._patch_lang, "sparseditto_once_per_launch", False)
    patched = []   # one entry per language module Triton's own _patch_lang patches
    real = interp._patch_lang_core
    monkeypatch.setattr(interp, "_patch_lang_core", lambda lang, scope: patched.append(lang) or real(lang, scope))
    x = torch.arange(64, dtype=torch.float32)
    for _ in range(3):
        out = torch.empty_like(x)
        _helper_loop_kernel[(4,)](x, out, STEPS=5, BLOCK=16)
        np.testing.assert_array_equal(out.numpy(), 3 * x.numpy())
    assert patched == [tl] * 3, f"{len(patched)} language patches for 3 launches of 4 programs x 6 helper calls"
    with pytest.raises(ValueError, match="triton.jit"):
        tl.arange(0, 16)                 # outside a launch the language is unpatched again
