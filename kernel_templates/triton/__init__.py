"""Triton SpMM templates, one per file."""
