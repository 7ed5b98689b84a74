"""Exact C99 hexadecimal floating-point literals.

A decimal literal can round differently from the Python value it came from; a hex literal names the bits.
float32 kernels get the value rounded once to float32 (what ``torch.tensor(v, dtype=float32)`` holds), so
the generated constants equal the reference backend's ``(cg * path_weight).to(dtype)`` bit for bit.
"""
from __future__ import annotations

import math
import struct

DTYPES = ("float32", "float64")


def round_to_float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def hex_literal(value: float, dtype: str) -> str:
    """The C literal of ``value`` in ``dtype``: ``0x1.8p-1`` (double) or ``0x1.8p-1f`` (float)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not math.isfinite(value):
        raise ValueError(f"constant {value!r} is not finite")
    if dtype == "float32":
        value = round_to_float32(value)
    text = float(value).hex()  # e.g. '-0x1.6a09e667f3bcdp-1', '0x0.0p+0'
    mantissa, exponent = text.split("p")
    if "." in mantissa:  # float32 values carry 29 trailing zero bits of the double's mantissa
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}p{exponent}" + ("f" if dtype == "float32" else "")


def parse_hex_literal(text: str) -> float:
    """Inverse of :func:`hex_literal` (used by tests to check the round trip)."""
    return float.fromhex(text.rstrip("f"))
