"""`sparseditto export RUN_ID --out kernel.py`: one verified kernel as a standalone Python module.

The kernel comes from a run in the memory (its best verified candidate, source checked against
its content hash) or from a batch's bundle (``bundle=DIR``: RUN_ID is a layer name or the run id
of a layer's kernel). The module holds the kernel source, its parameters and packed-format
metadata (``EXPORT``), the trusted helpers it needs inlined (`standalone`), and the user API of
`export_entry` (``SpMM(weight)(B)``, ``python kernel.py`` self-check). Its third-party imports
are torch, numpy and triton (or cupy for a CUDA C++ kernel); the rest is the standard library.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DOC = """{template} SpMM kernel for {layer} ({m}x{k}, {dtype}), exported by SparseDitto {version}.

Standalone: the third-party imports are torch, numpy and {backend_module}; SparseDitto's helpers the
kernel uses are inlined below. Verified by SparseDitto for N in {ns} ({verification}).

    import torch, kernel
    k = kernel.SpMM(W)          # W: the [{m}, {k}] weight (torch tensor or numpy array); packs it once
    C = k(B)                    # B: [{k}, N] {dtype} on the same device -> C = W @ B, [{m}, N]

`python {filename} [--weight W.npy|W.pt] [--n N]` checks it against a float64 dense product (without
--weight on a synthetic weight of the same shape, density and structure). On a CPU, set
TRITON_INTERPRET=1 for a Triton kernel. EXPORT holds the template, parameters, packed format,
structure signature and the verification it passed."""


def _structure(template: str, params: dict, report: dict | None) -> dict:
    """What the self-check's synthetic weight must look like for this packed format."""
    nm = params.get("NM")
    if template == "tc_sp24" or (isinstance(nm, str) and ":" in nm):
        n, m = (2, 4) if template == "tc_sp24" else (int(x) for x in nm.split(":"))
        return {"kind": "nm", "n": n, "m": m}
    if template == "nm_compressed":     # NM="auto": the row-wise ratio the analysis found best
        conformance = (report or {}).get("nm_conformance") or {}
        rows = {r: (a or {}).get("row", 0.0) for r, a in conformance.items()}
        best = max(rows, key=lambda r: (rows[r], -int(r.split(":")[1])), default="2:4")
        n, m = (int(x) for x in best.split(":"))
        return {"kind": "nm", "n": n, "m": m}
    if isinstance(params.get("BM"), int) and isinstance(params.get("BK"), int):
        return {"kind": "block", "bm": params["BM"], "bk": params["BK"]}
    return {"kind": "unstructured"}


def from_memory(run_id: str, memory=None) -> dict[str, Any]:
    """EXPORT fields and the source of a memory run's best verified kernel."""
    from sparseditto.memory import Memory

    mem = memory if isinstance(memory, Memory) else Memory(memory)
    run = mem.get_run(run_id)
    cand = mem.best_kernel(run["id"])
    if cand is None:
        raise ValueError(f"Run {run['id'][:8]} has no verified kernel to export.")
    if "dense" in (cand["template"], run.get("best_template")):
        raise ValueError(f"Run {run['id'][:8]}'s best answer is dense (torch.matmul): there is no kernel to export.")
    from sparseditto.harness.vendor_kernels import is_vendor_kernel

    if is_vendor_kernel(run.get("best_template")):
        raise ValueError(f"Run {run['id'][:8]}'s best answer is the vendor library path {run['best_template']}: "
                         "there is no generated kernel to export (call the library, or result.kernel).")
    m, k = run["shape_m"], run["shape_k"]
    params = cand.get("params") or {}
    timings = cand.get("timings") or {}
    return {"source": cand["source"], "layer": run.get("matrix_name") or "matrix", "run_id": run["id"],
            "template": cand["template"], "params": params, "source_hash": cand["source_hash"],
            "signature": run["signature"], "matrix_shape": [m, k], "dtype": run["dtype"],
            "verified_ns": sorted(set(run.get("n_values") or [])), "density": (run["nnz"] or 0) / float(m * k),
            "structure": _structure(cand["template"], params, run.get("report")),
            "packed_format": {"format": _template_format(cand["template"]), "params": params},
            "verification": {"status": cand["status"], "source": "memory run"},
            "kernel_ms": timings.get("median_ms"), "timings_are_gpu": timings.get("timings_are_gpu")}


def from_bundle(ref: str, bundle) -> dict[str, Any]:
    """EXPORT fields and the source of a bundle entry (``ref``: a layer name or a run id)."""
    from sparseditto.batch.bundle import Bundle, load_bundle

    bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    if ref in bundle.kernels:
        entry = bundle.kernels[ref]
    else:
        hits = [e for e in bundle.kernels.values() if e.run_id and (e.run_id == ref or e.run_id.startswith(ref))]
        if not hits:
            raise ValueError(f"Bundle {bundle.path} has no layer or run id {ref!r}; its layers: "
                             f"{sorted(bundle.kernels)[:10]}.")
        if len(hits) > 1:
            raise ValueError(f"Run id {ref!r} is the kernel of {len(hits)} layers of bundle {bundle.path} "
                             f"({[e.layer for e in hits][:5]}); give the layer name instead.")
        entry = hits[0]
    density = 1.0 - entry.sparsity if entry.sparsity is not None else 0.5
    return {"source": bundle.source(entry.layer), "layer": entry.layer, "run_id": entry.run_id,
            "template": entry.template, "params": dict(entry.params), "source_hash": entry.source_hash,
            "signature": entry.signature, "matrix_shape": list(entry.matrix_shape), "dtype": entry.verified_dtype,
            "verified_ns": sorted(entry.verified_ns), "density": density,
            "structure": _structure(entry.template, entry.params, None), "packed_format": dict(entry.packed_format),
            "verification": {k: entry.verification.get(k) for k in ("status", "ok", "seed", "backend")},
            "kernel_ms": entry.kernel_ms, "timings_are_gpu": not entry.timings_are_estimates}


def _template_format(template: str) -> str | None:
    from sparseditto.kernel_templates.registry import get_template

    try:
        return get_template(template).format
    except ValueError:
        return None


def _kernel_backend(template: str, source: str) -> str:
    """'cuda' (CuPy) or 'triton': the template's own backend (a tc_* source reaches CuPy only
    through tc_launch), else what the source imports (an LLM-written kernel)."""
    from sparseditto.harness.candidate_spec import source_backend
    from sparseditto.kernel_templates.registry import get_template

    try:
        return "cuda" if get_template(template).backend == "cuda" else "triton"
    except ValueError:
        return source_backend(source)


def module_text(fields: dict[str, Any], filename: str = "kernel.py") -> str:
    """The standalone module for ``fields`` (from `from_memory` / `from_bundle`)."""
    from sparseditto import __version__
    from sparseditto.batch.export_entry import ENTRY
    from sparseditto.batch.standalone import standalone_source
    fields = dict(fields)
    source = fields.pop("source")
    backend = _kernel_backend(fields["template"], source)
    fields["sparseditto_version"] = __version__
    fields["kernel_backend"] = backend
    m, k = fields["matrix_shape"]
    verification = fields["verification"].get("status") or "verified"
    doc = DOC.format(template=fields["template"], layer=fields["layer"], m=m, k=k, dtype=fields["dtype"],
                     version=__version__, backend_module="cupy" if backend == "cuda" else "triton",
                     ns=fields["verified_ns"], verification=verification, filename=filename)
    return standalone_source(source, ENTRY, doc, fields, triton=backend != "cuda")


def export_kernel(ref: str, out: str | os.PathLike, *, bundle=None, memory=None) -> Path:
    """Write the standalone module of ``ref`` (a memory run id, or with ``bundle`` a layer name or
    run id) to ``out``; returns the path. ValueError for an unknown ref or an ``out`` that is a folder."""
    path = Path(out).expanduser()
    if path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a folder; give the file to write, e.g. {path / 'kernel.py'}.")
    if path.suffix != ".py":
        raise ValueError(f"--out {str(path)!r} must end in .py (the export is a Python module).")
    fields = from_bundle(ref, bundle) if bundle is not None else from_memory(ref, memory)
    text = module_text(fields, filename=path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
