"""What one benchmark case is: a matrix (generated or read from a file), an N and a dtype.

Why a model and not a dict: the case id that `--resume` matches on must be stable across runs and
machines, so it is computed from a canonical JSON of exactly these fields, and every row in
``results.jsonl`` carries the same spec back. Matrices are built once per case group (all N and
dtypes of one matrix run back to back) and generated ones are cached (an uncompressed ``.npz`` in
an `ArtifactStore`, found by the spec's key), so a resumed run does not regenerate a weight it
already drew.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparseditto.matrix import SparseMatrix


def _digest(obj: Any, length: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


class MatrixSpec(BaseModel):
    """A matrix to benchmark: a `sparseditto.generate` call or a file.

    ``label`` is the short human name (``4096x4096/unstructured_magnitude_50``); ``pattern`` the
    pruning family the plots group by (``unstructured_magnitude``, ``nm_2:4``, ``block32``, ...);
    ``sparsity`` the nominal sparsity (the measured one is in each row). Files are identified by
    their path relative to the suite's data root (``rel_path``) and their size, so the same file
    under another checkout keeps its case id.
    """

    model_config = ConfigDict(frozen=True)

    source: Literal["generate", "file"]
    label: str
    pattern: str
    sparsity: float | None = None
    generator: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    path: str | None = None
    rel_path: str | None = None
    file_bytes: int | None = None

    def identity(self) -> dict:
        """The fields that decide which matrix this is (not where the file happens to live)."""
        if self.source == "generate":
            return {"generator": self.generator, "args": self.args}
        return {"file": self.rel_path, "bytes": self.file_bytes}

    @property
    def key(self) -> str:
        return _digest(self.identity())


def expected_nnz(spec: MatrixSpec) -> float | None:
    """About how many nonzeros a generated matrix will have, from its generator's arguments alone
    (None for files and generators this does not know): what the bench's budget scales its time
    estimate of a matrix not yet built by (`runner.Budget`)."""
    if spec.source != "generate":
        return None
    a = spec.args
    try:
        if spec.generator == "rmat":
            return float(2 ** int(a["scale"]) * int(a.get("edge_factor", 16)))
        if spec.generator == "laplacian_2d":
            return 5.0 * int(a["nx"]) * int(a["ny"])
        if spec.generator == "laplacian_3d":
            return 7.0 * int(a["nx"]) * int(a["ny"]) * int(a["nz"])
        m, k = int(a["m"]), int(a["k"])
        if spec.generator == "banded":
            return float(m) * (1 + 2 * int(a["bandwidth"]) * float(a.get("fill", 1.0)))
        if spec.generator == "nm_magnitude_pruned":
            return m * k * int(a.get("n", 2)) / float(a.get("m_group", 4))
        if spec.generator == "block_sparse":
            return m * k * float(a.get("block_density", 0.25)) * float(a.get("occupancy", 1.0))
        if spec.generator in ("row_pruned", "column_pruned"):
            return m * k * (1.0 - float(a["prune_fraction"])) * float(a.get("density", 1.0))
        if "sparsity" in a:
            return m * k * (1.0 - float(a["sparsity"]))
    except (KeyError, TypeError, ValueError):
        return None
    return None


class Case(BaseModel):
    """One (matrix, N, dtype) of a suite; ``case_id`` is what `--resume` skips on."""

    model_config = ConfigDict(frozen=True)

    suite: str
    matrix: MatrixSpec
    n: int
    dtype: str

    @property
    def case_id(self) -> str:
        return _digest({"suite": self.suite, "matrix": self.matrix.identity(), "n": self.n, "dtype": self.dtype})

    @property
    def label(self) -> str:
        return f"{self.matrix.label} N={self.n} {self.dtype}"


def generated(label: str, pattern: str, generator: str, args: dict, sparsity: float | None = None) -> MatrixSpec:
    from sparseditto.generate import GENERATORS

    if generator not in GENERATORS:
        raise ValueError(f"Unknown generator {generator!r} for case {label!r}; expected one of {sorted(GENERATORS)}.")
    return MatrixSpec(source="generate", label=label, pattern=pattern, sparsity=sparsity, generator=generator,
                      args=dict(args))


def from_file(path: Path, root: Path | None, pattern: str, label: str | None = None) -> MatrixSpec:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Matrix file not found: {path}")
    rel = str(path.resolve().relative_to(root.resolve())) if root is not None else path.name
    return MatrixSpec(source="file", label=label or _strip_suffixes(rel), pattern=pattern, path=str(path),
                      rel_path=rel, file_bytes=path.stat().st_size)


def _strip_suffixes(name: str) -> str:
    for suffix in (".gz", ".smtx", ".mtx", ".npz", ".safetensors", ".pt", ".pth"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


# ---- building matrices ---------------------------------------------------------------------------

def default_matrix_cache() -> Path:
    from sparseditto.paths import cache_dir

    return cache_dir() / "bench_matrices"


def build_matrix(spec: MatrixSpec, cache: Path | None = None) -> SparseMatrix:
    """The spec's matrix. Generated ones are kept in an `ArtifactStore` under ``cache`` (when given),
    found again through a one-line ``<spec key>.key`` file holding the content key."""
    if spec.source == "file":
        from sparseditto.io import load_matrix

        return load_matrix(spec.path, seed=0, name=spec.label)
    from sparseditto.artifacts import ArtifactStore
    from sparseditto.generate import make

    store = ArtifactStore(cache) if cache is not None else None
    pointer = Path(cache) / f"{spec.key}.key" if cache is not None else None
    if pointer is not None and pointer.exists():
        try:
            return store.get_matrix(pointer.read_text().strip())
        except (KeyError, ValueError, OSError):
            pointer.unlink(missing_ok=True)  # a torn or stale pointer: regenerate below
    matrix = make(spec.generator, **spec.args)
    matrix = SparseMatrix(matrix.indptr, matrix.indices, matrix.data, matrix.shape, matrix.dtype, spec.label,
                          dict(matrix.meta))
    if store is not None:
        key = store.put_matrix(matrix)
        store.forget(key)
        pointer.write_text(key + "\n")
    return matrix
