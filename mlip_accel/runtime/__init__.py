"""CuPy/NVRTC runtime of the generated kernels: compile and cache (compiler.py), launch on PyTorch's stream
(executor.py), the backend interface (backend.py). Nothing here imports CuPy at import time."""
