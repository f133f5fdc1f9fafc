"""CUDA C++ SpMM templates (compiled through CuPy NVRTC or nvcc)."""
