"""A layer's kernel against dense cuBLAS at each N of the batch, so patch_model can pick per N.

Why: a batch searches each group at its first N (`BatchSettings.n`) and verifies the winner at all
of them, but the fastest kernel at one N can lose badly at another: delta_spmv, chosen at N = 1,
measured 4-5x slower than cuBLAS at N = 16 on the H200 (docs/kernels.md), and the example's patched
MLP at N = 16 was 3-4x slower than dense (session 23). So every layer with a kernel gets its ratio
at each N (`LayerResult.n_speedups`): at the first N its own timing; at the others, for a group's
winner, one benchmark per N with dense cuBLAS beside it in the same worker (GPU), or the cost
model's estimate (interpreter: CPU times say nothing); the group's other layers take the winner's
ratios at those N (same kernel, same shape class; their own first-N timing is theirs). patch_model
runs dense at every N below 1.0.
"""
from __future__ import annotations

import dataclasses

from sparseditto.batch.models import LayerResult
from sparseditto.batch.reuse import BatchSettings, estimates

REPEATS = (30, 5)          # (repeats, warmup) of one extra-N benchmark


def _at_n(settings: BatchSettings, n: int) -> BatchSettings:
    """The settings with ``n`` as the batch's first N (what estimates() and the cost table use)."""
    return dataclasses.replace(settings, n_values=[n] + [v for v in settings.n_values if v != n])


def measured(layer: LayerResult, A, report: dict, settings: BatchSettings) -> dict[int, float]:
    """{N: kernel-vs-dense ratio} for ``layer`` at every N of the batch (see the module doc);
    an N whose benchmark fails is left out (patch_model then treats it as before: verified, run)."""
    from sparseditto import harness
    from sparseditto.batch.reuse import _runnable

    ratios = inherited(layer, None, settings)          # its own ratio at the first N
    for n in settings.n_values:
        if n in ratios:
            continue
        if settings.gpu:
            try:
                res = harness.bench(_runnable(layer), A, n, dtype=settings.dtype, backend=settings.backend,
                                    repeats=REPEATS[0], warmup=REPEATS[1], baselines=False)
            except harness.BenchError:
                continue
            ratio = res.speedup_vs_dense_graph or res.speedup_vs_dense
        else:
            est = estimates(report, _at_n(settings, n), layer.template or "dense", layer.params)
            ratio = (est["dense"] / est["kernel"]) if est["dense"] and est["kernel"] else None
        if ratio is not None:
            ratios[int(n)] = float(ratio)
    return ratios


def inherited(layer: LayerResult, lead: LayerResult | None, settings: BatchSettings) -> dict[int, float]:
    """``layer``'s own ratio at the first N and ``lead``'s (the layer whose kernel it took) at the
    others."""
    ratios = {int(n): float(v) for n, v in (lead.n_speedups if lead is not None else {}).items()}
    if layer.speedup_vs_dense is not None:
        ratios[settings.n] = float(layer.speedup_vs_dense)
    return ratios
