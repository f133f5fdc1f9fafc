"""Run the real `langgraph dev` server from the repository root for a while, then stop it.

Used by tests/test_studio_integration.py and scripts/studio_screenshot.py. The server runs in its
own session, so stopping it by process group also stops the kernel workers it spawned.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGGRAPH = Path(sys.executable).parent / "langgraph"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"langgraph dev exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ok", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"langgraph dev did not answer {url}/ok within {timeout:.0f} s")


@contextlib.contextmanager
def langgraph_dev(env: dict, log_path: Path, timeout: float = 120.0):
    """Yield the URL of a `langgraph dev --no-browser --no-reload` server on a free port; on an
    error the end of the server's log is printed before the error propagates."""
    port = free_port()
    env = dict(env, LANGGRAPH_CLI_NO_ANALYTICS="1", LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false")
    log = open(log_path, "w")
    proc = subprocess.Popen([str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ok(url, proc, timeout)
        yield url
    except Exception:
        log.flush()
        print(Path(log_path).read_text()[-4000:])
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
