"""CUDA C++ source generation for the tensor-product kernels (plain data in, source text out; no GPU)."""
from .generator import (BLOCK_THREADS, DIRECTIONS, VARIANTS, GeneratedModule, KernelSpec, generate,
                        schedule_for, unsupported_reason)
from .literals import hex_literal, parse_hex_literal
from .schedule import Phase, Schedule, Segment, build_schedule

__all__ = ["BLOCK_THREADS", "DIRECTIONS", "VARIANTS", "GeneratedModule", "KernelSpec", "generate", "schedule_for",
           "unsupported_reason", "hex_literal", "parse_hex_literal", "Phase", "Schedule", "Segment",
           "build_schedule"]
