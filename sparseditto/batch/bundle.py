"""The kernel bundle: what a batch found, in a folder that runs without the agents.

``bundle/manifest.json`` lists, per layer that got a kernel, the kernel's template, parameters,
packed-format metadata (format name and the bytes of A it moves), the matrix's structure
signature and shape, the N values and dtype it was verified for, and that verification (status,
seed, checks). Each kernel source is one file, ``bundle/kernels/<sha256>.py`` (layers that share
a kernel share the file). A layer whose answer is a vendor path (cuSPARSE via torch, ...) has no
source file: its entry says ``origin: "vendor"`` and names the path, and loading rebuilds the
library's format from the layer's weight (the harness's vendor kernels, no agents needed). `load_bundle(dir)` reads it back, checks every source against its hash,
and hands out callables through `sparseditto.api.SpMMKernel` (the same contract as
``result.kernel``), so deployment needs neither the graph nor an LLM nor the memory.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sparseditto.batch.models import LayerResult

MANIFEST = "manifest.json"
BUNDLE_VERSION = 1


class BundleKernel(BaseModel):
    """One layer's kernel in the bundle."""

    layer: str
    matrix_shape: tuple[int, int]
    weight_shape: tuple[int, ...]
    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    source_hash: str | None = None        # None for a vendor path
    source_file: str | None = None        # relative to the bundle folder; None for a vendor path
    origin: str = "generated"             # generated | vendor (template names the vendor path)
    packed_format: dict[str, Any] = Field(default_factory=dict)   # {"format", "params", "bytes"}
    signature: str
    verified_ns: list[int]
    verified_dtype: str
    verification: dict[str, Any] = Field(default_factory=dict)
    kernel_ms: float | None = None
    dense_ms: float | None = None
    timings_are_estimates: bool = True
    run_id: str | None = None             # the run_graph search that found the kernel (memory / export)
    sparsity: float | None = None
    # N -> kernel-vs-dense ratio the batch measured there (GPU) or estimated (cost model):
    # patch_model runs dense at an N where it is below 1.0 (empty in bundles made before it existed)
    n_speedups: dict[int, float] = Field(default_factory=dict)


class Bundle(BaseModel):
    """A loaded bundle: ``bundle.kernels[layer_name]`` and ``bundle.kernel(name, weight)``."""

    path: str
    version: int = BUNDLE_VERSION
    kernels: dict[str, BundleKernel]

    def source(self, name: str) -> str:
        """The layer's kernel source, checked against its recorded sha256 (never run if it differs)."""
        from sparseditto.harness.source_loader import source_hash

        entry = self._entry(name)
        if entry.source_file is None:
            raise ValueError(f"Bundle {self.path}: {name} runs the vendor path {entry.template}, which has no source.")
        text = (Path(self.path) / entry.source_file).read_text(encoding="utf-8")
        if source_hash(text) != entry.source_hash:
            raise ValueError(f"Bundle {self.path}: the source of {name} ({entry.source_file}) does not match its "
                             "recorded sha256; it was changed after the batch verified it and will not be run.")
        return text

    def _entry(self, name: str) -> BundleKernel:
        if name not in self.kernels:
            raise KeyError(f"Bundle {self.path} has no kernel for {name!r}; it has {sorted(self.kernels)[:10]}.")
        return self.kernels[name]

    def check_weight(self, name: str, matrix) -> None:
        """ValueError when ``matrix`` (a SparseMatrix of the weight now) is not the one the kernel
        was verified for: another shape or another sparsity structure."""
        from sparseditto.pattern_features import structure_signature

        entry = self._entry(name)
        if tuple(matrix.shape) != tuple(entry.matrix_shape):
            raise ValueError(f"{name}: the weight is {matrix.shape[0]}x{matrix.shape[1]} now, but the bundle's kernel "
                             f"was made for {entry.matrix_shape[0]}x{entry.matrix_shape[1]}.")
        if structure_signature(matrix) != entry.signature:
            raise ValueError(f"{name}: the weight's sparsity structure changed since the bundle was made (signature "
                             f"{structure_signature(matrix)[:12]} vs {entry.signature[:12]}); re-run the batch "
                             "(with previous= the old out folder, only changed layers are re-tuned).")

    def kernel(self, name: str, matrix):
        """``kernel(B) -> W @ B`` for the layer's current weight ``matrix`` (a SparseMatrix), after
        the signature check; it runs only at the verified N values and dtype."""
        from sparseditto.api import SpMMKernel

        self.check_weight(name, matrix)
        entry = self._entry(name)
        source = None if entry.origin == "vendor" else self.source(name)
        return SpMMKernel(matrix, source, entry.template, verified_ns=entry.verified_ns,
                          verified_dtype=entry.verified_dtype, backend="auto", verify_new_n=False)


def _entry(layer: LayerResult, source_file: str | None) -> BundleKernel:
    from sparseditto.batch.weights import WeightRef

    m_shape = WeightRef(layer.name, layer.shape, layer.dtype, lambda: None).matrix_shape
    return BundleKernel(layer=layer.name, matrix_shape=m_shape, weight_shape=tuple(layer.shape),
                        template=layer.template, params=dict(layer.params), source_hash=layer.source_hash,
                        source_file=source_file, origin="generated" if source_file else "vendor",
                        packed_format={"format": layer.kernel_format, "params": dict(layer.params),
                                       "bytes": layer.format_bytes},
                        signature=layer.signature, verified_ns=list(layer.verified_ns),
                        verified_dtype=layer.verified_dtype or "float16", verification=dict(layer.verification),
                        kernel_ms=layer.kernel_ms, dense_ms=layer.dense_ms,
                        timings_are_estimates=layer.timings_are_estimates, run_id=layer.run_id,
                        sparsity=layer.sparsity, n_speedups=dict(layer.n_speedups))


def write_bundle(folder: Path, layers: list[LayerResult]) -> Path:
    """Write the bundle of every layer that got a kernel (the manifest last, atomically)."""
    from sparseditto.harness.source_loader import write_source

    folder.mkdir(parents=True, exist_ok=True)
    kernels = {}
    from sparseditto.harness.vendor_kernels import is_vendor_kernel

    for layer in layers:
        if not layer.has_kernel or not layer.signature:
            continue
        if not layer.source:
            if is_vendor_kernel(layer.template):   # a vendor path: recorded by name, rebuilt when loaded
                kernels[layer.name] = _entry(layer, None)
            continue
        path = write_source(layer.source, folder)
        kernels[layer.name] = _entry(layer, str(path.relative_to(folder)))
    manifest = {"version": BUNDLE_VERSION, "kernels": {k: v.model_dump(mode="json") for k, v in kernels.items()}}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return folder


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Read a bundle folder (a batch's ``OUT/bundle``, or ``OUT`` itself)."""
    folder = Path(path).expanduser()
    if (folder / "bundle" / MANIFEST).is_file():
        folder = folder / "bundle"
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"{folder} is not a kernel bundle: it has no {MANIFEST}.")
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{manifest} is not valid JSON: {exc}") from None
    if data.get("version") != BUNDLE_VERSION:
        raise ValueError(f"{manifest} is bundle version {data.get('version')!r}; this SparseDitto reads "
                         f"version {BUNDLE_VERSION}.")
    bundle = Bundle(path=str(folder), kernels={k: BundleKernel.model_validate(v) for k, v in data["kernels"].items()})
    missing = [k.source_file for k in bundle.kernels.values()
               if k.source_file is not None and not (folder / k.source_file).is_file()]
    unknown = [f"{k.layer}: {k.template}" for k in bundle.kernels.values()
               if k.source_file is None and not _known_vendor(k.template)]
    if unknown:
        raise ValueError(f"Bundle {folder} names vendor path(s) this SparseDitto does not have: {unknown[:5]}.")
    if missing:
        raise ValueError(f"Bundle {folder} is missing kernel source file(s): {missing[:5]}.")
    return bundle


def _known_vendor(name: str) -> bool:
    from sparseditto.harness.vendor_kernels import is_vendor_kernel

    return is_vendor_kernel(name)
