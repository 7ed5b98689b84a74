"""Register steps of occupancy: a walk that ptxas compiled a few registers above a step gets a second compile bounded
to one more resident block per SM (issue 15; measurements in benchmarks/occupancy_21st.md).

An SM holds 65536 registers, handed out per warp in units of 256 (8 per thread). With 128-thread blocks, a walk at
168 registers runs 3 blocks (12 warps) per SM and one at 169-176 only 2 (8 warps): a third fewer warps to cover
the gathers' latency. ptxas lands walks there by itself (nequip-toluene's fp32 forward 173, nequip-oam-l's forward
174 and backward 190, MACE-MP-0-medium's double_forward 178, a split part of nequip-benzene's forward 174), and a
bound (``__launch_bounds__(threads, blocks)``) brings them under the step with at most a few dozen bytes of spill:
measured 7-16 % faster. A bound everywhere is worse: it lets walks below the step use more registers (backward
walks 128 -> 168, 4 -> 3 blocks) and makes walks far above it spill heavily (5-7 % slower). So the choice needs the
walk's own register count, which only ptxas knows: :func:`step_bound` reads it from the compiled image
(:func:`kernel_registers`, the cubin's EIATTR_REGCOUNT) and asks for the bound only for walks with few warps per
SM (:data:`LOW_WARPS`) within :data:`ROOM` of the next step; runtime.compiler then compiles the same source again
with ``-DMLA_MIN_BLOCKS=<blocks>`` (the walk template's ``MLA_WALK_BOUNDS``) and keeps that image. Both images are
cached on disk, so a warm start compiles neither. Which walks may take a bound their launch plans say (tuning
``register_step``, set by runtime.tuning.register_step_applies): the deterministic walks without a radial table, the
kind measured, and the tabulated walks of MACE's fp32 ASE call (its forward at 183 registers: the call 0.980x bounded,
twenty-second session; bounded and unbounded bitwise equal on an H200, twenty-third; ``$MLIP_ACCEL_REGISTER_STEP_
TABULATED=0`` leaves them unbounded); the atomic variant and the batched tensor product are left as ptxas made them.

``$MLIP_ACCEL_REGISTER_STEP``: ``0`` never bounds (the images ptxas chose alone), ``1`` (default) the rule;
``runtime.tuning.register_step`` overrides it in tests and benchmarks, also forcing a bound on every stepped walk.
"""
from __future__ import annotations

import struct

from .tuning import register_step_mode

REGISTER_FILE = 65536  # registers per SM (every architecture since sm_50)
ALLOCATION_UNIT = 8  # registers per thread are allocated in steps of 8 (256 per warp)
MAX_REGISTERS = 255
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
# bound a walk to the next step when its registers are at most this fraction above that step's limit: measured
# gains at +3 % to +13 % (173, 174, 178, 190 registers over 168), losses at +46 % to +52 % (245, 255)
ROOM = 0.15
# only walks with fewer resident warps per SM than this: from 8 warps to 12 the latency the other warps cover grows
# by half (measured); with 24 or more, one block more adds little and its spills still cost (not measured: no bound)
LOW_WARPS = 12
MACRO = "MLA_MIN_BLOCKS"  # the walk template's bound (codegen/templates/walk.cu)
EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL, _EIFMT_HVAL, _EIFMT_BVAL = 4, 3, 2


def blocks_per_sm(registers: int, block_threads: int) -> int:
    """Resident blocks of ``block_threads`` threads per SM at ``registers`` per thread (registers bound only)."""
    per_thread = -(-max(registers, 1) // ALLOCATION_UNIT) * ALLOCATION_UNIT
    return min(REGISTER_FILE // (per_thread * block_threads), MAX_THREADS_PER_SM // block_threads, MAX_BLOCKS_PER_SM)


def register_limit(blocks: int, block_threads: int) -> int:
    """The most registers per thread that still fit ``blocks`` blocks of ``block_threads`` threads per SM."""
    limit = REGISTER_FILE // (blocks * block_threads) // ALLOCATION_UNIT * ALLOCATION_UNIT
    return min(limit, MAX_REGISTERS)


def step_bound(registers: int, block_threads: int, room: float = ROOM) -> int:
    """The blocks per SM to bound a walk of ``registers`` per thread to (0: none): one more than it has, when it
    runs fewer than :data:`LOW_WARPS` warps per SM, its registers are within ``room`` of that step's limit and the
    step exists."""
    blocks = blocks_per_sm(registers, block_threads)
    if blocks * block_threads // 32 >= LOW_WARPS:
        return 0
    target = blocks + 1
    if target < 2 or target * block_threads > MAX_THREADS_PER_SM or target > MAX_BLOCKS_PER_SM:
        return 0  # one block per SM is what __launch_bounds__(threads) already guarantees
    limit = register_limit(target, block_threads)
    return target if limit >= 16 and registers <= limit * (1 + room) else 0


def kernel_registers(image: bytes) -> dict[str, int]:
    """{kernel: registers per thread} of a cubin (the EIATTR_REGCOUNT records of its .nv.info section); {} for
    anything else (PTX, which the driver compiles at load: no count to read) or an ELF that does not parse (then
    no walk is bounded: the image ptxas made is used as it is)."""
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2:  # a 64-bit ELF, as every cubin
        return {}
    try:
        return _regcounts(image)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return {}


def _regcounts(image: bytes) -> dict[str, int]:
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]

    def text(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        return image[start:image.index(b"\0", start)].decode()

    symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        return {}
    info = [s for s in sections if text(shstrndx, s[0]) == ".nv.info"]
    counts = {}
    for section in info:
        pos, end = section[4], section[4] + section[5]
        while pos + 2 <= end:
            fmt, attr = image[pos], image[pos + 1]
            if fmt == _EIFMT_SVAL:
                size, = struct.unpack_from("<H", image, pos + 2)
                if attr == EIATTR_REGCOUNT and size >= 8:
                    symbol, count = struct.unpack_from("<II", image, pos + 4)
                    name_offset, = struct.unpack_from("<I", image, symtab[4] + symbol * symtab[9])
                    counts[text(symtab[6], name_offset)] = count
                pos += 4 + size
            elif fmt == _EIFMT_HVAL:
                pos += 4
            elif fmt == _EIFMT_BVAL:
                pos += 3
            else:
                pos += 2
    return counts


def bound_for(image: bytes, steps) -> int:
    """The blocks per SM to compile the program of ``image`` again with (0: keep ``image``): ``steps`` are its
    (kernel, block threads) that take the bound; the largest any of them asks for (a program holds one walk)."""
    mode = register_step_mode()
    if mode == "off" or not steps:
        return 0
    counts = kernel_registers(image)
    bounds = []
    for kernel, threads in steps:
        registers = counts.get(kernel)
        if registers is None:
            continue
        bound = step_bound(registers, threads)
        if mode == "force" and not bound:
            bound = min(blocks_per_sm(registers, threads) + 1, MAX_THREADS_PER_SM // threads)
        bounds.append(bound)
    return max(bounds, default=0)


def likely_bound(steps) -> int:
    """The bound :func:`bound_for` asks for when it asks for one on a walk ptxas made heavy: one block above what the
    most registers allow (3 blocks of 128 threads: the step of every walk measured above it), for the first of
    ``steps`` (compile_many starts that compile beside the first, where threads are free)."""
    if not steps:
        return 0
    threads = steps[0][1]
    blocks = blocks_per_sm(MAX_REGISTERS, threads) + 1
    return blocks if blocks >= 2 and blocks * threads <= MAX_THREADS_PER_SM else 0


def option(blocks: int) -> str:
    return f"-D{MACRO}={blocks}"
