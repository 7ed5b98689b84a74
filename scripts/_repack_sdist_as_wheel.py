"""Pack one package directory of an unpacked sdist as a pure ``py3-none-any`` wheel.

Used by fetch_device_wheels.sh for OpenEquivariance, whose sdist build downloads libtorch (impossible on
the offline device machine) while its torch extension can be JIT-built at import instead. Every file
under the package directory is kept (templates and C++ sources are read at run time).

    python scripts/_repack_sdist_as_wheel.py SDIST_DIR PACKAGE VERSION OUT_DIR
"""
from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(sdist_dir: Path, package: str, version: str, out_dir: Path) -> Path:
    dist = f"{package}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((sdist_dir / package).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(sdist_dir).as_posix()] = path.read_bytes()
    files[f"{dist}/METADATA"] = (sdist_dir / "PKG-INFO").read_bytes()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: mlip_accel-repack\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}/top_level.txt"] = f"{package}\n".encode()
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()

    out = out_dir / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out.with_suffix(".part"), "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    out.with_suffix(".part").rename(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    print(repack(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])))
