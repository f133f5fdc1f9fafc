"""Batch jobs over a model's layers: `runner.run_batch` (a kernel per weight, a report, a bundle),
`bundle.load_bundle` (the kernels without the agents) and `patch.patch_model` (the kernels back
into an nn.Module). The package root exports all three lazily (``sparseditto.run_batch``, ...)."""
