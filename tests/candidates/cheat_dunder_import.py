"""Cheat: import os behind the allow-list's back."""
import torch


def prepare(A, dtype, device):
    os = __import__("os")
    return {"env": os.environ.get("HOME", "")}


def spmm(packed, B, out):
    out.zero_()
