"""Pinned cost-model numbers: the planner's view of each template may not drift by accident.

The numbers below were computed on main before the template knowledge moved into per-template
planning modules (issue 7: META + applicability + grid + cost hooks beside each kernel; shared
roofline arithmetic in kernel_templates/cost.py). The expert policy ranks templates by exactly
these estimates, so equal numbers mean equal plans. A deliberate cost-model change updates them
here, with the reason in the commit.

The reports are hand-made dicts (only the fields the cost models read), so a change in the
analyzer does not move them.
"""
from __future__ import annotations

import pytest

from sparseditto.kernel_templates.registry import get_template


def _report(shape, nnz, mean, longest, cv, empty_rows=0, empty_cols=0, nm=None, blocks=(), best=None) -> dict:
    return {"shape": shape, "nnz": nnz, "row_stats": {"mean": mean, "max": longest, "cv": cv},
            "empty_rows": empty_rows, "empty_cols": empty_cols, "nm_conformance": nm or {},
            "blocks": list(blocks), "best_block_shape": best}


REPORTS = {
    "unstructured": _report((1024, 4096), 419430, 409.6, 480, 0.08, nm={"2:4": {"row": 0.31}}),
    "powerlaw": _report((4096, 4096), 65536, 16.0, 2048, 3.5, empty_rows=300),
    "block": _report((2048, 2048), 838656, 409.5, 640, 0.2, blocks=[{"shape": (32, 32), "nonzero_blocks": 819}],
                     best=(32, 32)),
    "nm": _report((4096, 4096), 8388608, 2048.0, 2048, 0.0,
                  nm={"2:4": {"row": 1.0}, "1:2": {"row": 0.5}, "4:8": {"row": 1.0}}),
    "pruned": _report((2048, 1024), 1048576, 512.0, 1024, 1.0, empty_rows=1024),
}

# (template, report, N, dtype, target, applicable, reason, first grid point (changes from the
#  defaults), (bytes, flops, seconds, bound, unit) at the defaults, the same at the first grid point,
#  (index, seconds) of the lowest estimate among the first 6 grid points: what the planner ranks by)
PINS = [
    ('csr_rowsplit', 'unstructured', 16, 'float16', 'H200',
     True, 'CSR fits any pattern (419430 nonzeros, mean row 409.6)', {},
     (1845660.0, 13421760.0, 4.9170873023255815e-06, 'decode', 'cuda_core'),
     (1845660.0, 13421760.0, 4.9170873023255815e-06, 'decode', 'cuda_core'), (0, 4.9170873023255815e-06)),
    ('csr_rowsplit', 'powerlaw', 1, 'float16', 'A100',
     True, 'CSR fits any pattern (65536 nonzeros, mean row 16.0)', {'ROWS_PER_PROGRAM': 4, 'REORDER': 'length'},
     (294916.0, 131072.0, 3.2964600686611085e-06, 'decode', 'cuda_core'),
     (311300.0, 131072.0, 3.2964600686611085e-06, 'decode', 'cuda_core'), (0, 3.2964600686611085e-06)),
    ('csr_balanced', 'powerlaw', 16, 'float16', 'H200',
     True, 'CSR fits any pattern; nnz splitting balances rows (row cv 3.50, longest row 2048 vs mean 16.0)', {'NNZ_PER_PROGRAM': 128},
     # session 30: the wide-N floor (NNZ_COLUMN_S per nonzero and column past N = 8, H200 graphs suite)
     (606212.0, 2097152.0, 6.364825570232559e-06, 'decode', 'cuda_core'),
     (606212.0, 2097152.0, 6.364825570232559e-06, 'decode', 'cuda_core'), (0, 6.364825570232559e-06)),
    ('csr_balanced', 'unstructured', 256, 'float32', 'A100',
     True, 'CSR fits any pattern; nnz splitting balances rows (row cv 0.08, longest row 480 vs mean 409.6)', {'NNZ_PER_PROGRAM': 1024, 'BLOCK_NNZ': 64},
     (11120232.0, 214748160.0, 0.0012372455571652771, 'decode', 'cuda_core'),
     (8603240.0, 214748160.0, 0.0012372455571652771, 'decode', 'cuda_core'), (0, 0.0012372455571652771)),
    ('csr_vector', 'unstructured', 1, 'float16', 'H200',
     True, 'CSR fits any pattern (419430 nonzeros, mean row 409.6)', {},
     (2530920.0, 838860.0, 3.088586046511628e-06, 'memory', 'cuda_core'),
     (2530920.0, 838860.0, 3.088586046511628e-06, 'memory', 'cuda_core'), (0, 3.088586046511628e-06)),
    ('compact_rows_cols', 'pruned', 16, 'float16', 'H200',
     True, '1024 empty rows and 0 empty columns to drop; the kept block is 50.0% of A, 100.0% full', {},
     (2203648.0, 33554432.0, 3.0124762790697676e-06, 'memory', 'tensor'),
     (2203648.0, 33554432.0, 3.0124762790697676e-06, 'memory', 'tensor'), (0, 3.0124762790697676e-06)),
    ('compact_rows_cols', 'pruned', 256, 'float32', 'A100',
     True, '1024 empty rows and 0 empty columns to drop; the kept block is 50.0% of A, 100.0% full', {},
     (7348224.0, 536870912.0, 3.0031841641025642e-05, 'compute', 'cuda_core'),
     (7348224.0, 536870912.0, 3.0031841641025642e-05, 'compute', 'cuda_core'), (0, 3.0031841641025642e-05)),
    ('bsr_tc', 'block', 16, 'float16', 'H200',
     True, 'analyzer found block structure, best block shape (32, 32)', {},
     (1811920.0, 26836992.0, 2.9213767441860466e-06, 'memory', 'tensor'),
     (1811920.0, 26836992.0, 2.9213767441860466e-06, 'memory', 'tensor'), (0, 2.9213767441860466e-06)),
    ('nm_compressed', 'nm', 16, 'float16', 'H200',
     True, '4:8 row conformance 1.000 >= 0.9', {},
     (19136512.0, 536870912.0, 6.950351627906977e-06, 'memory', 'tensor'),
     (19136512.0, 536870912.0, 6.950351627906977e-06, 'memory', 'tensor'), (0, 6.950351627906977e-06)),
    ('nm_compressed', 'unstructured', 16, 'float16', 'H200',
     False, 'best N:M row conformance is 0.310 (2:4) < 0.9', {},
     (9227634.0, 134217728.0, 4.645961395348838e-06, 'memory', 'tensor'),
     (9227634.0, 134217728.0, 4.645961395348838e-06, 'memory', 'tensor'), (0, 4.645961395348838e-06)),
    ('bitmap_tiles', 'unstructured', 16, 'bfloat16', 'H100',
     True, 'density 0.100: a bitmap costs 1/8 byte per element, values dominate', {},
     # session 21: the measured decode floor (2.2 ps per element, H200-scaled by bandwidth)
     (1531088.0, 134217728.0, 1.3875954072835819e-05, 'decode', 'tensor'),
     (1531088.0, 134217728.0, 1.3875954072835819e-05, 'decode', 'tensor'), (0, 1.3875954072835819e-05)),
    ('dense', 'unstructured', 16, 'float32', 'H200',
     True, 'dense cuBLAS is always a candidate (the floor to beat)', {},
     (17104896.0, 134217728.0, 6.477882790697674e-06, 'memory', 'cuda_core'),
     (17104896.0, 134217728.0, 6.477882790697674e-06, 'memory', 'cuda_core'), (0, 6.477882790697674e-06)),
]


@pytest.mark.parametrize("pin", PINS, ids=[f"{p[0]}-{p[1]}-N{p[2]}-{p[3]}-{p[4]}" for p in PINS])
def test_cost_model_numbers_are_pinned(pin):
    name, report, n, dtype, target, ok, reason, first, at_defaults, at_first, best = pin
    t = get_template(name)
    rep = REPORTS[report]
    assert t.applicable(rep) == (ok, reason)
    grid = t.param_grid(rep, n, target, limit=6)
    assert grid[0] == t.validate_params(first)
    for params, want in (({}, at_defaults), (grid[0], at_first)):
        est = t.cost(rep, n, dtype, target, params)
        assert (est.bytes, est.flops, est.bound, est.unit) == (want[0], want[1], want[3], want[4])
        assert est.seconds == pytest.approx(want[2], rel=1e-12)
    seconds = [t.cost(rep, n, dtype, target, p).seconds for p in grid]
    assert seconds.index(min(seconds)) == best[0]
    assert min(seconds) == pytest.approx(best[1], rel=1e-12)
