"""Cheat: shell out to another program."""
import subprocess


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    subprocess.run(["true"], check=True)
    out.zero_()
