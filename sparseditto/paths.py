"""Where SparseDitto keeps its files: one cache directory for artifacts, kernel sources, the default
memory and the graph checkpoints, so one environment variable moves all of them together."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPARSEDITTO_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparseditto``, else ``~/.cache/sparseditto``."""
    env = os.environ.get("SPARSEDITTO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sparseditto"
