"""Planning knowledge of the Triton templates: one module per template, named like its kernel file.

Each module says, without importing Triton or the kernel, when its template applies to an analyzed
pattern, which parameter sets are worth trying first, and what one instance moves and computes
(see `sparseditto.kernel_templates.registry` for the contract).
"""
