"""The benchmark suites and their presets: which matrices, which N, which dtypes.

Three suites answer the question for three kinds of users:

* ``llm``: Llama-style layer weights (M x K = out x in) pruned the ways people prune LLMs
  (per-row magnitude and random unstructured, 2:4 and 4:8 by magnitude, blocks, pruned output rows
  and input channels), at decode/prefill N; the decode-kernels issue's cross product.
* ``dlmc``: every file of the Deep Learning Matrix Collection subset in ``<data>/dlmc`` (or a user
  folder) at N = 256, the ResNet-50 layers also at their own N (``rn50_batchsizes.txt``).
* ``graphs``: the SuiteSparse / Graph Challenge files in ``<data>/suitesparse`` plus generated
  large ones (R-MAT and Kronecker power-law graphs, 2-D / 3-D Laplacians, FEM-like bands), fp32.

Presets trade coverage for device time: ``quick`` is a few small cases the CPU interpreter
finishes in CI (correctness only: not GPU timings), ``core`` the subset meant to fit a few
minutes of an H200, ``full`` the whole cross product. Everything is seeded.
"""
from __future__ import annotations

import os
from pathlib import Path

from .cases import Case, MatrixSpec, from_file, generated

SUITES = ("llm", "dlmc", "graphs")
PRESETS = ("quick", "core", "full")
MATRIX_SUFFIXES = (".mtx", ".smtx", ".npz", ".pt", ".pth", ".safetensors")

# ---- llm ------------------------------------------------------------------------------------------

LLM_SHAPES_FULL = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))
LLM_SHAPES_CORE = ((4096, 4096), (11008, 4096))
LLM_N_FULL = (1, 2, 4, 8, 16, 32, 64, 128)
LLM_N_CORE = (1, 16, 64)


def llm_pattern(name: str, m: int, k: int) -> MatrixSpec:
    """``unstructured_magnitude_50``, ``unstructured_random_70``, ``nm_2of4``, ``block32_75``,
    ``row_pruned_50``, ``channel_pruned_50`` ... at M x K (seeded per pattern family)."""
    label = f"{m}x{k}/{name}"
    family, _, tail = name.rpartition("_")
    if name.startswith("nm_"):
        n, m_group = (int(x) for x in name[3:].split("of"))
        return generated(label, f"nm_{n}:{m_group}", "nm_magnitude_pruned",
                         dict(m=m, k=k, n=n, m_group=m_group, seed=3), 1 - n / m_group)
    s = int(tail) / 100
    if family == "unstructured_magnitude":
        return generated(label, family, "magnitude_pruned", dict(m=m, k=k, sparsity=s, seed=1), s)
    if family == "unstructured_random":
        return generated(label, family, "unstructured", dict(m=m, k=k, sparsity=s, seed=1), s)
    if family.startswith("block"):
        b = int(family[5:])
        return generated(label, family, "block_sparse",
                         dict(m=m, k=k, block=[b, b], block_density=round(1 - s, 6), occupancy=1.0, seed=2), s)
    if family == "row_pruned":
        return generated(label, family, "row_pruned", dict(m=m, k=k, prune_fraction=s, density=1.0, seed=4), s)
    if family == "channel_pruned":
        return generated(label, family, "column_pruned", dict(m=m, k=k, prune_fraction=s, density=1.0, seed=5), s)
    raise ValueError(f"Unknown llm pattern {name!r}.")


LLM_PATTERNS_CORE = ("unstructured_magnitude_50", "unstructured_magnitude_70", "unstructured_magnitude_90",
                     "nm_2of4", "nm_4of8", "block32_75", "row_pruned_50")
LLM_PATTERNS_FULL = (
    *(f"unstructured_magnitude_{s}" for s in (50, 60, 70, 80, 90)),
    *(f"unstructured_random_{s}" for s in (50, 60, 70, 80, 90)),
    "nm_2of4", "nm_4of8",
    *(f"block{b}_{s}" for b in (16, 32, 64) for s in (50, 70, 90)),
    "row_pruned_50", "channel_pruned_50",
)
# bf16 "on a few" in core: the two headline patterns at the decode N most users run
LLM_BF16_CORE = {("unstructured_magnitude_50", 16), ("nm_2of4", 16)}


def llm_cases(preset: str) -> list[Case]:
    if preset == "quick":
        # Small enough for the Triton interpreter (CI runs the whole preset in well under two minutes),
        # large enough that the cost model (which decides on a CPU) picks a sparse kernel on three of
        # them, each clearing finalize's 5% model margin (estimates 0.92-0.93x dense); the lightly
        # pruned weight (10%: near dense) is answered with dense cuBLAS without a sparse candidate.
        # N = 1 where verification's odd N (1 and 3) already include it: one N class fewer in the
        # interpreter. float32 on one so that torch's CPU CSR (which has no half kernels) is a vendor
        # path even there. The cheapest sparse case comes first: a run's first case also gets the
        # memory repeat (re-verifying the remembered kernel).
        picks = [((512, 512), "row_pruned_50", 8, "float32"), ((256, 512), "unstructured_magnitude_10", 1, "float16"),
                 ((1024, 512), "nm_2of4", 1, "float16"), ((512, 512), "block32_75", 16, "bfloat16")]
        return [Case(suite="llm", matrix=llm_pattern(p, *shape), n=n, dtype=d) for shape, p, n, d in picks]
    shapes, patterns, ns = ((LLM_SHAPES_CORE, LLM_PATTERNS_CORE, LLM_N_CORE) if preset == "core"
                            else (LLM_SHAPES_FULL, LLM_PATTERNS_FULL, LLM_N_FULL))
    out = []
    for m, k in shapes:
        for p in patterns:
            spec = llm_pattern(p, m, k)
            for n in ns:
                dtypes = ("float16", "bfloat16") if preset == "full" or (p, n) in LLM_BF16_CORE else ("float16",)
                out.extend(Case(suite="llm", matrix=spec, n=n, dtype=d) for d in dtypes)
    return out


# ---- dlmc -----------------------------------------------------------------------------------------

DLMC_N = 256
DLMC_CORE = (
    "transformer/magnitude_pruning/0.5/body_decoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.7/body_encoder_layer_0_self_attention_multihead_attention_q_fully_connected",
    "transformer/magnitude_pruning/0.8/body_encoder_layer_0_ffn_conv2_fully_connected",
    "transformer/magnitude_pruning/0.9/body_decoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.95/body_encoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.98/body_encoder_layer_0_ffn_conv2_fully_connected",
    "transformer/random_pruning/0.7/body_encoder_layer_0_ffn_conv1_fully_connected",
    "transformer/random_pruning/0.9/body_decoder_layer_0_encdec_attention_multihead_attention_k_fully_connected",
    "rn50/magnitude_pruning/0.8/bottleneck_2_block_group2_2_1",
    "rn50/magnitude_pruning/0.9/bottleneck_3_block_group4_2_1",
    "rn50/magnitude_pruning/0.95/bottleneck_projection_block_group_projection_block_group2",
    "rn50/magnitude_pruning/0.98/bottleneck_1_block_group1_1_1",
)
DLMC_QUICK = ("transformer/magnitude_pruning/0.9/body_encoder_layer_0_self_attention_multihead_attention_q_fully_connected",)


def rn50_batch_sizes(root: Path) -> dict[str, int]:
    """Layer name -> N of that ResNet-50 conv layer for one image (``rn50_batchsizes.txt``)."""
    path = root / "rn50_batchsizes.txt"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        name, _, n = line.strip().partition(",")
        if name and n.strip().isdigit():
            out[name] = int(n)
    return out


def dlmc_cases(preset: str, root: Path) -> list[Case]:
    if not root.is_dir():
        raise ValueError(f"DLMC folder not found: {root} (pass --data DIR or set SPARSEDITTO_DATA; the "
                         f"suite reads DIR/dlmc)")
    files = {_stem(p.relative_to(root)): p for p in sorted(root.rglob("*")) if _is_matrix_file(p)}
    if preset == "quick":
        names = [n for n in DLMC_QUICK if n in files]
    elif preset == "core":
        names = [n for n in DLMC_CORE if n in files]
    else:
        names = sorted(files)
    if not names:
        raise ValueError(f"No DLMC matrix files for preset {preset!r} under {root}.")
    batch = rn50_batch_sizes(root)
    out = []
    for name in names:
        spec = from_file(files[name], root, pattern=_dlmc_pattern(name), label=name)
        ns = [16] if preset == "quick" else [DLMC_N]
        layer = name.rsplit("/", 1)[-1]
        if name.startswith("rn50/") and preset != "quick" and batch.get(layer, DLMC_N) != DLMC_N:
            ns.append(batch[layer])
        out.extend(Case(suite="dlmc", matrix=spec, n=n, dtype="float16") for n in ns)
    return out


def _dlmc_pattern(name: str) -> str:
    """'dlmc_magnitude' / 'dlmc_random' from the collection's folder names."""
    return "dlmc_random" if "random_pruning" in name else "dlmc_magnitude"


# ---- graphs ---------------------------------------------------------------------------------------

GRAPH_N_FULL = (8, 32, 64, 128, 256)
GRAPH_N_CORE_FILES = (128,)
GRAPH_N_CORE_GENERATED = (32, 128)


# Stochastic Kronecker graphs with a 2x2 initiator are R-MAT with other quadrant probabilities;
# (0.45, 0.22, 0.22) is less skewed than Graph500's R-MAT default (0.57, 0.19, 0.19).
KRONECKER = dict(a=0.45, b=0.22, c=0.22)


def _rmat(scale: int, edge_factor: int, kronecker: bool = False) -> MatrixSpec:
    name = f"{'kronecker' if kronecker else 'rmat'}_s{scale}_ef{edge_factor}"
    extra = KRONECKER if kronecker else {}
    return generated(name, "power_law", "rmat", dict(scale=scale, edge_factor=edge_factor, seed=12 if kronecker
                                                    else 11, **extra))


def _mesh(*dims: int) -> MatrixSpec:
    kind = "laplacian_2d" if len(dims) == 2 else "laplacian_3d"
    label = f"laplacian{len(dims)}d_" + "x".join(map(str, dims))
    return generated(label, "mesh", kind, dict(zip(("nx", "ny", "nz"), dims)))


def _band(rows: int, bandwidth: int, fill: float, seed: int) -> MatrixSpec:
    return generated(f"fem_band_{rows}_bw{bandwidth}_fill{fill:g}", "banded", "banded",
                     dict(m=rows, k=rows, bandwidth=bandwidth, fill=fill, seed=seed))


def graph_generated(preset: str) -> list[MatrixSpec]:
    """Large seeded graph / scientific matrices (the SuiteSparse files are all small).

    The harness densifies A for every cuBLAS timing (run_graph's per candidate, the bench's own):
    17 GB of fp32 at 65536^2, seconds each time. So core has the two 65536-vertex power-law graphs
    (the graph issue's R-MAT example) and ~32768-row meshes and bands. Full adds the issue's larger
    graphs (R-MAT to scale 22, 1M-row meshes); until the dense baseline handles matrices whose dense
    form does not fit, those become error rows saying so (`measure.dense_does_not_fit`).
    """
    core = [_rmat(16, 16), _rmat(16, 8, kronecker=True), _mesh(181, 181), _mesh(32, 32, 32),
            _band(32768, 16, 0.3, seed=13)]
    if preset != "full":
        return core
    return core + [_rmat(16, 8), _rmat(16, 32), _rmat(18, 16), _rmat(20, 16), _rmat(22, 8),
                   _rmat(18, 16, kronecker=True), _mesh(256, 256), _mesh(512, 512), _mesh(1024, 1024),
                   _mesh(40, 40, 40), _mesh(64, 64, 64), _mesh(100, 100, 100), _band(65536, 16, 0.3, seed=13),
                   _band(262144, 16, 0.3, seed=13), _band(1048576, 8, 0.5, seed=14)]


GRAPH_QUICK_FILES = ("karate", "jagmesh7")


def graph_cases(preset: str, root: Path) -> list[Case]:
    files = {}
    if root.is_dir():
        files = {_stem(p.relative_to(root)): p for p in sorted(root.rglob("*")) if _is_matrix_file(p)}
    if preset == "quick":
        specs = [from_file(files[n], root, "graph_file", label=f"suitesparse/{n}") for n in GRAPH_QUICK_FILES
                 if n in files]
        specs.append(_mesh(24, 24))
        return [Case(suite="graphs", matrix=s, n=8, dtype="float32") for s in specs]
    if not files:
        raise ValueError(f"SuiteSparse folder not found or empty: {root} (pass --data DIR or set SPARSEDITTO_DATA; "
                         f"the suite reads DIR/suitesparse)")
    out = []
    dtypes = ("float32",) if preset == "core" else ("float32", "float16")
    for name, path in files.items():
        spec = from_file(path, root, "graph_file", label=f"suitesparse/{name}")
        ns = GRAPH_N_CORE_FILES if preset == "core" else GRAPH_N_FULL
        out.extend(Case(suite="graphs", matrix=spec, n=n, dtype=d) for n in ns for d in dtypes)
    for spec in graph_generated(preset):
        big = spec.generator == "rmat"   # 65536^2: each dense timing densifies 17 GB: N=128 only in core
        ns = ((128,) if big else GRAPH_N_CORE_GENERATED) if preset == "core" else GRAPH_N_FULL
        out.extend(Case(suite="graphs", matrix=spec, n=n, dtype=d) for n in ns for d in dtypes)
    return out


# ---- user files -----------------------------------------------------------------------------------

def path_cases(paths: list[Path], ns: tuple[int, ...], dtypes: tuple[str, ...]) -> list[Case]:
    """Matrix files, or folders of them (searched recursively), at the given N and dtypes."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = [f for f in sorted(p.rglob("*")) if _is_matrix_file(f)]
            if not found:
                raise ValueError(f"No matrix files ({', '.join(MATRIX_SUFFIXES)}, optionally .gz) under {p}.")
            specs = [from_file(f, p, "file") for f in found]
        elif p.is_file():
            specs = [from_file(p, None, "file")]
        else:
            raise ValueError(f"Not a suite name, a matrix file or a folder: {p} (suites: {', '.join(SUITES)}, all).")
        out.extend(Case(suite="files", matrix=s, n=n, dtype=d) for s in specs for n in ns for d in dtypes)
    return out


def _is_matrix_file(path: Path) -> bool:
    name = path.name.lower()
    name = name[:-3] if name.endswith(".gz") else name
    return path.is_file() and name.endswith(MATRIX_SUFFIXES)


def _stem(rel: Path) -> str:
    text = str(rel)
    for suffix in (".gz", *MATRIX_SUFFIXES):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


# ---- selection ------------------------------------------------------------------------------------

def default_data_dir() -> Path:
    """``$SPARSEDITTO_DATA``, else ``../shared/data`` beside the current directory."""
    return Path(os.environ.get("SPARSEDITTO_DATA", "../shared/data"))


def select_cases(suites: list[str], preset: str = "core", *, data_dir: Path | None = None,
                 ns: tuple[int, ...] | None = None, dtypes: tuple[str, ...] | None = None) -> list[Case]:
    """The cases of the named suites (``all`` = every suite; other entries are files or folders).

    ``ns`` / ``dtypes`` replace each suite's own N values / dtypes (keeping its matrices).
    """
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; expected one of {PRESETS}.")
    if not suites:
        raise ValueError("Expected at least one suite name, matrix file or folder.")
    data = Path(data_dir) if data_dir is not None else default_data_dir()
    names: list[str] = []
    paths: list[Path] = []
    for s in suites:
        if s == "all":
            names.extend(SUITES)
        elif s in SUITES:
            names.append(s)
        else:
            paths.append(Path(s))
    cases: list[Case] = []
    for name in dict.fromkeys(names):
        if name == "llm":
            cases.extend(llm_cases(preset))
        elif name == "dlmc":
            cases.extend(dlmc_cases(preset, data / "dlmc"))
        else:
            cases.extend(graph_cases(preset, data / "suitesparse"))
    if paths:
        cases.extend(path_cases(paths, ns or (1, 16, 64), dtypes or ("float16",)))
    if ns or dtypes:
        cases = _override(cases, ns, dtypes)
    return list({c.case_id: c for c in cases}.values())


def _override(cases: list[Case], ns, dtypes) -> list[Case]:
    out, seen = [], set()
    for c in cases:
        for n in (ns or (c.n,)):
            for d in (dtypes or (c.dtype,)):
                key = (c.suite, c.matrix.key, n, d)
                if key not in seen:
                    seen.add(key)
                    out.append(Case(suite=c.suite, matrix=c.matrix, n=n, dtype=d))
    return out
