"""Broken/hostile: kills the process it runs in."""
import os


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    os._exit(3)
