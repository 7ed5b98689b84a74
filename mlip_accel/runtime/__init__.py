"""CuPy/NVRTC runtime of the generated kernels: compile and cache (compiler.py), launch on PyTorch's stream
(executor.py), one launch path (launch_plan.py), launch sequences run step by step (sequence.py), the
backend interface (backend.py). Nothing here imports CuPy at import time."""
