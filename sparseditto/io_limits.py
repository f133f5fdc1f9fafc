"""Bounds on what an input may declare, checked before anything is allocated.

A matrix file is small but says how big its matrix is, and every later step trusts that: a
100-byte Matrix Market file whose header declares 8 x 10^9 rows would make the CSR row pointer
alone 64 GB. So each reader compares the declared shape and entry count with what the file can
physically hold (every entry takes at least a few bytes of text), with `MAX_DIM`, and with the
memory this machine has free, and refuses with a ValueError that names the numbers. Decompression
is bounded the same way (a gzip bomb stops at the memory budget, not at the OOM killer).
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

#: Largest row or column count accepted (``$SPARSEDITTO_MAX_DIM`` overrides it). Column ids are
#: int32 in the canonical matrix, and a pruned LLM weight has at most a few 10^5 rows.
DEFAULT_MAX_DIM = 1 << 26
#: Fraction of the free memory one input may take (the kernels and references need the rest).
MEMORY_FRACTION = 0.5
_CHUNK = 1 << 20


def max_dim() -> int:
    text = os.environ.get("SPARSEDITTO_MAX_DIM")
    if not text:
        return DEFAULT_MAX_DIM
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"SPARSEDITTO_MAX_DIM must be a positive integer, got {text!r}.") from None
    if value < 1:
        raise ValueError(f"SPARSEDITTO_MAX_DIM must be a positive integer, got {value}.")
    return value


def available_memory() -> int:
    """Bytes of memory free for a new allocation (MemAvailable on Linux, else a generous guess),
    capped by ``$SPARSEDITTO_MEMORY_LIMIT`` (bytes) when set, e.g. on a shared machine."""
    free = _free_memory()
    cap = os.environ.get("SPARSEDITTO_MEMORY_LIMIT")
    if cap:
        try:
            return min(free, int(cap))
        except ValueError:
            raise ValueError(f"SPARSEDITTO_MEMORY_LIMIT must be a number of bytes, got {cap!r}.") from None
    return free


def proc_kib_field(path: str, key: str) -> int | None:
    """A 'Key:   123 kB' field of a /proc file, in bytes (None when absent or unreadable)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _free_memory() -> int:
    free = proc_kib_field("/proc/meminfo", "MemAvailable")
    if free is not None:
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def check_allocation(nbytes: float, what: str) -> None:
    budget = MEMORY_FRACTION * available_memory()
    if nbytes > budget:
        raise ValueError(f"{what} would need about {_gb(nbytes)} of memory, more than the {_gb(budget)} this "
                         f"machine can spare ({_gb(available_memory())} free).")


def check_shape(rows: int, cols: int, what: str = "the matrix") -> None:
    limit = max_dim()
    for label, value in (("rows", rows), ("columns", cols)):
        if value < 0:
            raise ValueError(f"{what} declares a negative number of {label} ({value}).")
        if value > limit:
            raise ValueError(f"{what} declares {value} {label}, more than the supported maximum of {limit} "
                             f"(set SPARSEDITTO_MAX_DIM to raise it).")


def check_declared(rows: int, cols: int, entries: int, *, file_bytes: int | None, bytes_per_entry: int,
                   what: str, dense: bool = False) -> None:
    """The header's promises against the file's size, the shape limit and free memory.

    ``bytes_per_entry``: the fewest bytes one entry takes in the file (e.g. 4 for "1 1\\n").
    ``dense``: the entries are the rows x cols cells of an array, not a list of nonzeros.
    """
    check_shape(rows, cols, what)
    if entries < 0:
        raise ValueError(f"{what} declares a negative entry count ({entries}).")
    if not dense and rows * cols < entries:
        raise ValueError(f"{what} declares {entries} entries, more than its {rows} x {cols} cells.")
    # Far more than the text can hold (a wrong header; a plain truncation gets the parser's exact
    # count message instead).
    if file_bytes is not None and entries * bytes_per_entry > 2 * file_bytes + 64:
        raise ValueError(f"{what} declares {entries} entries, but its {file_bytes} bytes of data can hold at most "
                         f"{file_bytes // max(bytes_per_entry, 1)} (truncated file or a wrong header).")
    # CSR row pointer (int64) twice over, plus COO triplets and values in float64, a few copies.
    check_allocation((rows + 1) * 8 * 3 + entries * 24 * 4 + (rows * cols * 8 if dense else 0), f"Loading {what}")


def bounded_decompress(data: bytes) -> bytes:
    """gzip data decompressed, refusing to grow past the memory budget (a decompression bomb)."""
    limit = int(MEMORY_FRACTION * available_memory())
    inflater = zlib.decompressobj(wbits=31)
    parts, total = [], 0
    view = memoryview(data)
    for start in range(0, len(data), _CHUNK):
        chunk = inflater.decompress(view[start:start + _CHUNK], limit + 1 - total)
        while True:
            parts.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"gzip data decompresses to more than {_gb(limit)}, more than this machine can "
                                 f"spare (a damaged file or a decompression bomb).")
            if not inflater.unconsumed_tail:
                break
            chunk = inflater.decompress(inflater.unconsumed_tail, limit + 1 - total)
        if inflater.eof:
            break
    if not inflater.eof:
        raise ValueError("corrupt or truncated gzip data (the stream ends early).")
    return b"".join(parts)
