"""CUDA C++ source generation (plain data in, source text out; no GPU), one module per kernel family:
``tensor_product`` (batched TP and fused convolution walk), ``symmetric_contraction`` (MACE), each emitting
source plus launch plans (``launch_plan``) over the shared pieces (``emit``, ``nonzeros``, ``literals``,
``schedule``); the whole launch of an op as data (``sequence``), with the layout and reduction steps around a
walk (``steps``). Adding a family is adding a module."""
from .tensor_product import (BLOCK_THREADS, DIRECTIONS, VARIANTS, GeneratedModule, KernelSpec, generate,
                        schedule_for, unsupported_reason)
from .literals import hex_literal, parse_hex_literal
from .schedule import Phase, Schedule, Segment, build_schedule

__all__ = ["BLOCK_THREADS", "DIRECTIONS", "VARIANTS", "GeneratedModule", "KernelSpec", "generate", "schedule_for",
           "unsupported_reason", "hex_literal", "parse_hex_literal", "Phase", "Schedule", "Segment",
           "build_schedule"]
