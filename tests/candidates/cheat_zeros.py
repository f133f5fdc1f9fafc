"""Cheat: skip the work and write zeros (passes a verifier whose outputs are tiny vs its atol)."""


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    out.zero_()
