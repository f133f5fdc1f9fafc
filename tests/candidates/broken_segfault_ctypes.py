"""Broken/hostile: dereferences a null pointer through ctypes (SIGSEGV)."""
import ctypes


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    ctypes.string_at(0)
