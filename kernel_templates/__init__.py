"""The kernel template library the agents start from (installed as ``sparseditto.kernel_templates``)."""
