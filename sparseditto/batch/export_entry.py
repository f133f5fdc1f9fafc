"""The public end of an exported kernel module (`sparseditto export`): appended after the kernel.

Why a text constant, not importable code: these lines run inside the exported file, next to the
kernel's own ``prepare(A, dtype, device)`` / ``spmm(packed, B, out)`` and the inlined helpers
(``_sparseditto_matrix``, ``_sparseditto_pattern_features``); SparseDitto never runs them itself,
the export test does (in a fresh process, on the Triton interpreter). They give the file the
user's API: ``SpMM(weight)`` packs the weight once (after checking its shape and, by default, its
structure signature against the one the kernel was verified on) and ``k(B)`` / ``k.spmm(B)``
returns ``W @ B``; ``python kernel.py`` checks the kernel against a float64 dense product.
"""

ENTRY = r'''
# ---- the exported module's API (written by sparseditto export) ----
_SparseMatrix = _sparseditto_matrix.SparseMatrix
_structure_signature = _sparseditto_pattern_features.structure_signature
_TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 1e-3}   # max |C - ref| / max |ref|
_WARNED = set()
if EXPORT["kernel_backend"] != "cuda" and os.environ.get("TRITON_INTERPRET") == "1":
    _sparseditto_harness_interpreter_compat.patch_triton_interpreter()   # NumPy >= 2.4 in the interpreter


def as_sparse_matrix(weight, dtype=None):
    """A 2-D weight (torch tensor, dense or sparse; numpy array) as the kernel's input matrix:
    canonical CSR of its nonzeros (stored zeros are not part of the pattern)."""
    if isinstance(weight, torch.Tensor):
        weight = weight.detach().to("cpu")
        weight = weight.to_dense() if weight.layout != torch.strided else weight
        weight = weight.to(torch.float64 if weight.dtype == torch.float64 else torch.float32).numpy()
    dense = np.asarray(weight)
    if dense.ndim != 2:
        raise ValueError(f"Expected a 2-D weight, got shape {dense.shape}.")
    if tuple(dense.shape) != tuple(EXPORT["matrix_shape"]):
        raise ValueError(f"This kernel was made for a {EXPORT['matrix_shape'][0]}x{EXPORT['matrix_shape'][1]} "
                         f"weight, got {dense.shape[0]}x{dense.shape[1]}.")
    if not np.isfinite(dense).all():
        raise ValueError("The weight holds NaN or Inf values.")
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
    values = dense[rows, cols].astype(np.float64 if dense.dtype == np.float64 else np.float32)
    return _SparseMatrix(indptr, cols.astype(np.int32), values, tuple(int(s) for s in dense.shape),
                         dtype or EXPORT["dtype"], EXPORT["layer"])


class SpMM:
    """``SpMM(weight)(B) -> weight @ B`` through the exported kernel.

    ``prepare(weight)`` packs the weight into the kernel's format once (on ``device``: the current
    CUDA device when there is one, else the CPU, which needs TRITON_INTERPRET=1 for a Triton
    kernel). ``check_signature``: refuse a weight whose sparsity structure is not the one the kernel
    was verified on (other values are fine). B is [K, N] in EXPORT["dtype"]; N values outside
    EXPORT["verified_ns"] run with a one-time warning (check them with ``python kernel.py --n N``).
    """

    def __init__(self, weight=None, *, device=None, check_signature=True):
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = getattr(torch, EXPORT["dtype"])
        self.check_signature = check_signature
        self.packed = None
        if weight is not None:
            self.prepare(weight)

    def prepare(self, weight):
        A = as_sparse_matrix(weight)
        if self.check_signature and _structure_signature(A) != EXPORT["signature"]:
            raise ValueError(f"The weight's sparsity structure (signature {_structure_signature(A)[:12]}) is not the "
                             f"one this kernel was verified on ({EXPORT['signature'][:12]}); pass "
                             "check_signature=False to run it on another structure unverified.")
        self.packed = prepare(A, self.dtype, self.device)
        return self

    def spmm(self, B, out=None):
        if self.packed is None:
            raise ValueError("Call prepare(weight) first (or pass the weight to SpMM(...)).")
        if not isinstance(B, torch.Tensor) or B.dim() != 2 or B.shape[0] != EXPORT["matrix_shape"][1]:
            raise ValueError(f"Expected B as a torch tensor of shape ({EXPORT['matrix_shape'][1]}, N), got "
                             f"{getattr(B, 'shape', type(B).__name__)}.")
        if B.dtype != self.dtype:
            raise ValueError(f"This kernel was verified for {EXPORT['dtype']} inputs, got B in {B.dtype}.")
        n = int(B.shape[1])
        if n not in EXPORT["verified_ns"] and n not in _WARNED:
            _WARNED.add(n)
            warnings.warn(f"N={n} was not verified (verified: {EXPORT['verified_ns']}); run `python "
                          f"{__file__} --n {n}` to check it.", stacklevel=2)
        if out is None:
            out = torch.empty((EXPORT["matrix_shape"][0], n), dtype=B.dtype, device=B.device)
        spmm(self.packed, B, out)
        return out

    __call__ = spmm


def synthetic_weight(seed=0):
    """A random weight of the exported shape and density with the structure the packed format
    needs (N:M groups for an N:M format, blocks for a block format), for the self-check."""
    rng = np.random.default_rng(seed)
    m, k = EXPORT["matrix_shape"]
    structure = EXPORT["structure"]
    kind = structure.get("kind")
    if kind == "nm":
        n, g = structure["n"], structure["m"]
        mask = np.zeros((m, -(-k // g) * g), dtype=bool)
        picks = np.argsort(rng.random((m, mask.shape[1] // g, g)), axis=2)[:, :, :n]
        groups = mask.reshape(m, -1, g)
        np.put_along_axis(groups, picks, True, axis=2)
        mask = groups.reshape(m, -1)[:, :k]
    elif kind == "block":
        bm, bk = structure["bm"], structure["bk"]
        tiles = rng.random((-(-m // bm), -(-k // bk))) < max(EXPORT["density"], 1.0 / (m * k))
        mask = np.kron(tiles, np.ones((bm, bk), dtype=bool))[:m, :k].astype(bool)
    else:
        mask = rng.random((m, k)) < EXPORT["density"]
    return np.where(mask, rng.uniform(-1.0, 1.0, (m, k)), 0.0).astype(np.float32)


def _load_weight(path):
    if path.endswith(".npy"):
        return np.load(path)
    weight = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(weight, dict):
        weight = weight.get(EXPORT["layer"], weight.get("weight"))
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{path} holds no tensor named {EXPORT['layer']!r} or 'weight'.")
    return weight.reshape(weight.shape[0], -1)


def self_check(argv=None):
    """Run the kernel at the verified N values (or --n) on --weight (a .npy / .pt file; default: a
    synthetic weight of the same shape, density and structure) and compare with the float64 dense
    product. Prints one JSON line; returns 0 when every N is within tolerance."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=f"self-check of the exported {EXPORT['template']} kernel")
    parser.add_argument("--weight", help=".npy or .pt file of the weight (default: a synthetic one)")
    parser.add_argument("--n", type=int, action="append", help="columns of B (repeatable; default: verified N)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    weight = _load_weight(args.weight) if args.weight else synthetic_weight()
    kernel = SpMM(weight, device=args.device, check_signature=args.weight is not None)
    W = torch.as_tensor(as_sparse_matrix(weight).to_dense()).to(kernel.dtype).to(torch.float64)
    gen = torch.Generator().manual_seed(1)
    checks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in args.n or EXPORT["verified_ns"]:
            B = (torch.rand((W.shape[1], n), generator=gen) * 2 - 1).to(kernel.dtype)
            C = kernel(B.to(kernel.device)).to("cpu", torch.float64)
            ref = W @ B.to(torch.float64)
            err = float((C - ref).abs().max() / max(float(ref.abs().max()), 1e-30))
            checks.append({"n": n, "rel_err": err, "ok": bool(err <= _TOLERANCE[EXPORT["dtype"]])})
    ok = all(c["ok"] for c in checks)
    print(json.dumps({"template": EXPORT["template"], "device": str(kernel.device), "ok": ok, "checks": checks}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(self_check())
'''
