"""Broken: never returns (a loop whose exit condition can't become true)."""


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    i = 0
    while i >= 0:
        i += 1
