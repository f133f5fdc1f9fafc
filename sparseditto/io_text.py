"""Text sparse-matrix formats: Matrix Market (`.mtx`) and DLMC (`.smtx`), read and written.

Both formats are plain whitespace-separated numbers, so they are parsed with one vectorized call
(`np.fromstring(..., sep=" ")`, C speed: a 700k-nonzero DLMC file parses in tens of milliseconds)
instead of a per-line Python loop. The parsers check every count the header promises against what
the body actually holds, because a truncated download otherwise loads as a silently smaller matrix.

Parsers return a `ParsedText` (COO triplets in 0-based indices, or a dense array, plus the value
dtype name and metadata); `sparseditto.io` turns that into the canonical `SparseMatrix`. Errors are
`ValueError`s describing the problem; `sparseditto.io` prefixes the file name.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from sparseditto.io_limits import check_declared
from sparseditto.matrix import VALUE_DTYPES

MM_FIELDS = ("real", "double", "integer", "pattern")
MM_SYMMETRIES = ("general", "symmetric", "skew-symmetric")
# save_matrix writes this comment so a round trip keeps the user's value dtype name.
_DTYPE_COMMENT = re.compile(r"^%\s*sparseditto:.*\bdtype=(\w+)", re.IGNORECASE)


@dataclass
class ParsedText:
    """What a text parser found: COO triplets (0-based) or a dense array, never both."""

    shape: tuple[int, int]
    dtype: str
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    values: np.ndarray | None = None
    dense: np.ndarray | None = None
    meta: dict = field(default_factory=dict)


def parse_numbers(text: str, dtype, what: str) -> np.ndarray:
    """Parse whitespace-separated numbers in C; name the first bad token when parsing fails."""
    stripped = text.strip()
    if not stripped:  # np.fromstring returns a bogus [0] / [-1.] for whitespace-only input
        return np.empty(0, dtype=dtype)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # numpy < 2 warns instead of raising
            return np.fromstring(stripped, dtype=dtype, sep=" ")
    except (ValueError, DeprecationWarning):
        pass
    convert = int if np.dtype(dtype).kind in "iu" else float
    for position, token in enumerate(stripped.split()):  # error path only: find the culprit
        try:
            convert(token)
        except ValueError:
            raise ValueError(f"malformed {what}: token #{position + 1} {token[:40]!r} is not a valid "
                             f"{'integer' if convert is int else 'number'}.") from None
    raise ValueError(f"malformed {what}: could not parse it as numbers.")


def _seeded_values(count: int, seed: int) -> np.ndarray:
    """Values for pattern-only files: standard normal, reproducible from `seed`."""
    return np.random.default_rng(seed).standard_normal(count)


# ---- Matrix Market ----------------------------------------------------------------------------
def _split_header(text: str) -> tuple[list[str], list[str], str, str, int]:
    """Return (banner tokens, comment lines, size line, body, number of lines before the body)."""
    first_nl = text.find("\n")
    banner = text[: first_nl if first_nl >= 0 else len(text)].strip()
    if not banner.lower().startswith("%%matrixmarket"):
        raise ValueError(f"not a Matrix Market file: the first line must start with '%%MatrixMarket', "
                         f"found {banner[:60]!r}.")
    comments: list[str] = []
    pos = first_nl + 1 if first_nl >= 0 else len(text)
    line_no = 1
    while pos < len(text):
        nl = text.find("\n", pos)
        end = nl if nl >= 0 else len(text)
        line = text[pos:end].strip()
        pos = end + 1
        line_no += 1
        if line.startswith("%"):
            comments.append(line)
        elif line:
            return banner.split(), comments, line, text[pos:], line_no
    raise ValueError("truncated Matrix Market file: no size line after the header.")


def parse_matrix_market(text: str, *, seed: int = 0) -> ParsedText:
    """Parse a Matrix Market file (coordinate or array; real/integer/pattern; general/symmetric/
    skew-symmetric). Symmetric halves are mirrored; pattern entries get seeded normal values."""
    tokens, comments, size_line, body, header_lines = _split_header(text)
    if len(tokens) != 5:
        raise ValueError(f"malformed Matrix Market header {' '.join(tokens)!r}: expected "
                         f"'%%MatrixMarket matrix <coordinate|array> <field> <symmetry>'.")
    obj, layout, fld, symmetry = (t.lower() for t in tokens[1:])
    if obj != "matrix":
        raise ValueError(f"Matrix Market object {obj!r} is not supported; expected 'matrix'.")
    if fld in ("complex", "hermitian") or symmetry == "hermitian":
        raise ValueError(f"unsupported value dtype: Matrix Market field {fld!r} / symmetry {symmetry!r} means "
                         f"complex values; SparseDitto supports real, integer and pattern matrices.")
    if fld not in MM_FIELDS:
        raise ValueError(f"unknown Matrix Market field {fld!r}; expected one of {MM_FIELDS}.")
    if symmetry not in MM_SYMMETRIES:
        raise ValueError(f"unknown Matrix Market symmetry {symmetry!r}; expected one of {MM_SYMMETRIES}.")

    dtype = {"integer": "float32", "pattern": "float32"}.get(fld, "float64")
    for line in comments:  # a file written by save_matrix remembers the user's dtype name
        match = _DTYPE_COMMENT.match(line)
        if match and match.group(1) in VALUE_DTYPES:
            dtype = match.group(1)
    meta = {"mm_layout": layout, "mm_field": fld, "mm_symmetry": symmetry,
            "values": "seeded_normal" if fld == "pattern" else "file"}

    if layout == "coordinate":
        size = parse_numbers(size_line, np.int64, "size line")
        if size.shape != (3,):
            raise ValueError(f"malformed size line {size_line!r}: expected 'rows cols nnz'.")
        nrows, ncols, nnz = (int(v) for v in size)
        if min(nrows, ncols, nnz) >= 0:  # negative counts get their own message below
            # Every entry is at least "i j v" plus separators: the text must be long enough to hold
            # what the header promises, before anything of that size is allocated.
            check_declared(nrows, ncols, nnz * (1 if symmetry == "general" else 2), file_bytes=len(body) + 1,
                           bytes_per_entry=2 * (2 if fld == "pattern" else 3) // (1 if symmetry == "general" else 2),
                           what=f"the Matrix Market header ({nrows} x {ncols}, {nnz} entries)")
        parsed = _parse_coordinate(body, nrows, ncols, nnz, fld, symmetry, seed, header_lines)
        meta["file_entries"] = nnz
    elif layout == "array":
        if fld == "pattern":
            raise ValueError("malformed Matrix Market file: 'array' layout cannot have field 'pattern'.")
        size = parse_numbers(size_line, np.int64, "size line")
        if size.shape != (2,):
            raise ValueError(f"malformed size line {size_line!r}: expected 'rows cols' for array layout.")
        nrows, ncols = (int(v) for v in size)
        if min(nrows, ncols) >= 0:
            cells = nrows * ncols if symmetry == "general" else nrows * (nrows + 1) // 2
            check_declared(nrows, ncols, cells, file_bytes=len(body) + 1, bytes_per_entry=2, dense=True,
                           what=f"the Matrix Market array header ({nrows} x {ncols})")
        parsed = ParsedText(shape=(nrows, ncols), dtype=dtype, dense=_parse_array(body, nrows, ncols, symmetry))
    else:
        raise ValueError(f"unknown Matrix Market layout {layout!r}; expected 'coordinate' or 'array'.")
    parsed.dtype = dtype
    parsed.meta.update(meta)
    return parsed


def _strip_comment_lines(body: str) -> str:
    if "%" not in body:
        return body
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("%"))


def _parse_coordinate(body: str, nrows: int, ncols: int, nnz: int, fld: str, symmetry: str, seed: int,
                      header_lines: int) -> ParsedText:
    if nrows < 0 or ncols < 0 or nnz < 0:
        raise ValueError(f"malformed size line: negative count in ({nrows}, {ncols}, {nnz}).")
    if symmetry != "general" and nrows != ncols:
        raise ValueError(f"malformed Matrix Market file: a {symmetry} matrix must be square, "
                         f"header says {nrows} x {ncols}.")
    per_entry = 2 if fld == "pattern" else 3
    numbers = parse_numbers(_strip_comment_lines(body), np.float64, "coordinate entries")
    if numbers.size != nnz * per_entry:
        found = numbers.size / per_entry
        raise ValueError(
            f"truncated or malformed file: header declares {nnz} entries ({nnz * per_entry} numbers at "
            f"{per_entry} per entry), found {numbers.size} numbers ({found:g} entries).")
    table = numbers.reshape(nnz, per_entry)
    rows_f, cols_f = table[:, 0], table[:, 1]
    bad = np.flatnonzero((rows_f != np.floor(rows_f)) | (cols_f != np.floor(cols_f)))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"malformed entry #{k + 1} (line {header_lines + k + 1}): indices "
                         f"({rows_f[k]:g}, {cols_f[k]:g}) are not integers.")
    rows = rows_f.astype(np.int64) - 1
    cols = cols_f.astype(np.int64) - 1
    _check_range(rows, cols, nrows, ncols, base=1, header_lines=header_lines)
    values = _seeded_values(nnz, seed) if fld == "pattern" else table[:, 2].copy()

    if symmetry != "general":
        diagonal = rows == cols
        if symmetry == "skew-symmetric" and np.any(values[diagonal] != 0):
            k = int(np.flatnonzero(diagonal & (values != 0))[0])
            raise ValueError(f"malformed skew-symmetric file: entry #{k + 1} is a nonzero diagonal "
                             f"value at ({rows[k] + 1}, {cols[k] + 1}).")
        off = ~diagonal
        sign = -1.0 if symmetry == "skew-symmetric" else 1.0
        rows, cols = np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])
        values = np.concatenate([values, sign * values[off]])
    return ParsedText(shape=(nrows, ncols), dtype="float64", rows=rows, cols=cols, values=values)


def _parse_array(body: str, nrows: int, ncols: int, symmetry: str) -> np.ndarray:
    """Dense column-major values; symmetric files hold the lower triangle column by column."""
    if nrows < 0 or ncols < 0:
        raise ValueError(f"malformed size line: negative count in ({nrows}, {ncols}).")
    values = parse_numbers(_strip_comment_lines(body), np.float64, "array values")
    if symmetry == "general":
        expected = nrows * ncols
    else:
        if nrows != ncols:
            raise ValueError(f"malformed Matrix Market file: a {symmetry} matrix must be square, "
                             f"header says {nrows} x {ncols}.")
        expected = nrows * (nrows + 1) // 2 if symmetry == "symmetric" else nrows * (nrows - 1) // 2
    if values.size != expected:
        raise ValueError(f"truncated or malformed file: a {nrows} x {ncols} {symmetry} array needs "
                         f"{expected} values, found {values.size}.")
    if symmetry == "general":
        return values.reshape(ncols, nrows).T.copy()
    # Column-major lower triangle == row-major upper triangle of the transpose.
    col_idx, row_idx = np.triu_indices(nrows, k=0 if symmetry == "symmetric" else 1)
    dense = np.zeros((nrows, ncols))
    dense[row_idx, col_idx] = values
    sign = 1.0 if symmetry == "symmetric" else -1.0
    off = row_idx != col_idx
    dense[col_idx[off], row_idx[off]] = sign * values[off]
    return dense


def _check_range(rows: np.ndarray, cols: np.ndarray, nrows: int, ncols: int, *, base: int,
                 header_lines: int | None = None) -> None:
    bad = np.flatnonzero((rows < 0) | (rows >= nrows) | (cols < 0) | (cols >= ncols))
    if bad.size:
        k = int(bad[0])
        where = f" (line {header_lines + k + 1})" if header_lines is not None else ""
        raise ValueError(
            f"out-of-range index in entry #{k + 1}{where}: ({rows[k] + base}, {cols[k] + base}) is outside "
            f"the {nrows} x {ncols} matrix (indices are {base}-based); {bad.size} out-of-range entries in total.")


# ---- DLMC .smtx -------------------------------------------------------------------------------
def parse_smtx(text: str, *, seed: int = 0) -> ParsedText:
    """Parse a DLMC `.smtx` file: 'rows, cols, nnz', then nrows+1 row offsets, then nnz column
    indices (0-based). The format stores no values; they are drawn from N(0, 1) with `seed`."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty .smtx file: expected a 'rows, cols, nnz' header line.")
    if len(lines) > 3:
        raise ValueError(f"malformed .smtx file: expected 3 lines (header, row offsets, column indices), "
                         f"found {len(lines)} non-empty lines.")
    header = [tok for tok in re.split(r"[,\s]+", lines[0].strip()) if tok]
    if len(header) != 3 or not all(tok.isdigit() for tok in header):
        raise ValueError(f"malformed .smtx header {lines[0].strip()[:80]!r}: expected 'rows, cols, nnz'.")
    nrows, ncols, nnz = (int(tok) for tok in header)
    check_declared(nrows, ncols, nnz + nrows + 1, file_bytes=len(text) + 2, bytes_per_entry=2, dense=True,
                   what=f"the .smtx header ({nrows} x {ncols}, {nnz} entries)")
    if nnz > nrows * ncols:
        raise ValueError(f"the .smtx header declares {nnz} entries, more than its {nrows} x {ncols} cells.")
    offsets = parse_numbers(lines[1] if len(lines) > 1 else "", np.int64, "row offsets line")
    if offsets.size != nrows + 1:
        raise ValueError(f"truncated or malformed file: expected {nrows + 1} row offsets (rows + 1), "
                         f"found {offsets.size}.")
    indices = parse_numbers(lines[2] if len(lines) > 2 else "", np.int64, "column indices line")
    if indices.size != nnz:
        raise ValueError(f"truncated or malformed file: header declares nnz = {nnz} column indices, "
                         f"found {indices.size}.")
    if offsets[0] != 0 or offsets[-1] != nnz:
        raise ValueError(f"malformed row offsets: expected to start at 0 and end at nnz = {nnz}, "
                         f"found {int(offsets[0])} ... {int(offsets[-1])}.")
    drops = np.flatnonzero(np.diff(offsets) < 0)
    if drops.size:
        r = int(drops[0])
        raise ValueError(f"malformed row offsets: they decrease at row {r} "
                         f"({int(offsets[r])} -> {int(offsets[r + 1])}).")
    rows = np.repeat(np.arange(nrows, dtype=np.int64), np.diff(offsets))
    _check_range(rows, indices, nrows, ncols, base=0)
    return ParsedText(shape=(nrows, ncols), dtype="float32", rows=rows, cols=indices,
                      values=_seeded_values(nnz, seed),
                      meta={"values": "seeded_normal", "file_entries": nnz})


# ---- writers ----------------------------------------------------------------------------------
def format_matrix_market(shape, rows, cols, values, *, dtype: str, name: str) -> str:
    """Coordinate real general text, 1-based; values printed with enough digits to round-trip."""
    digits = 17 if dtype == "float64" else 9
    lines = np.char.add(np.char.add((rows + 1).astype(str), " "), (cols + 1).astype(str))
    vals = np.char.mod(f"%.{digits}g", np.asarray(values, dtype=np.float64))
    entries = "\n".join(np.char.add(np.char.add(lines, " "), vals).tolist())
    safe_name = re.sub(r"\s+", "_", name)
    head = (f"%%MatrixMarket matrix coordinate real general\n"
            f"% sparseditto: name={safe_name} dtype={dtype}\n"
            f"{shape[0]} {shape[1]} {len(values)}\n")
    return head + entries + ("\n" if len(values) else "")


def format_smtx(shape, indptr, indices) -> str:
    """DLMC text: header, row offsets, column indices (pattern only; values are not stored)."""
    return (f"{shape[0]}, {shape[1]}, {len(indices)}\n"
            + " ".join(map(str, np.asarray(indptr).tolist())) + "\n"
            + " ".join(map(str, np.asarray(indices).tolist())) + "\n")
