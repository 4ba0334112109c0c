"""C++ source -> loaded shared library, built once with the system compiler and cached on disk.

The cache key is a hash of source, compiler and flags; a build writes a temporary file and
renames it into place, so concurrent processes never load a half-written library.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from trainc.config import Config

_loaded: dict[str, ctypes.CDLL] = {}


class CompilerMissing(RuntimeError):
    pass


def cache_dir(config: Config) -> str:
    d = config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "trainc")
    d = os.path.join(d, "cpp")
    os.makedirs(d, exist_ok=True)
    return d


def build(source: str, config: Config) -> tuple[ctypes.CDLL, str, bool]:
    """(library, path, cache_hit) for `source`."""
    cxx = shutil.which(config.cpp_compiler)
    if cxx is None:
        raise CompilerMissing(
            f"trainc: backend='cpp' needs a C++ compiler with OpenMP, but {config.cpp_compiler!r}"
            " was not found. Install g++ (Debian/Ubuntu: `apt-get install g++`), point "
            "TRAINC_CXX at a compiler, or use backend='aten'.")
    flags = config.cpp_flags.split()
    key = hashlib.sha256("\0".join([source, cxx, *flags]).encode()).hexdigest()[:24]
    path = os.path.join(cache_dir(config), f"k_{key}.so")
    if path in _loaded:
        return _loaded[path], path, True
    hit = os.path.exists(path)
    if not hit:
        _compile(cxx, flags, source, path)
    lib = ctypes.CDLL(path)
    _loaded[path] = lib
    return lib, path, hit


def _compile(cxx: str, flags: list[str], source: str, path: str) -> None:
    d = os.path.dirname(path)
    fd, tmp_so = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    src = path[:-3] + ".cpp"
    fd, tmp_src = tempfile.mkstemp(suffix=".cpp", dir=d)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    cmd = [cxx, *flags, "-shared", "-fPIC", "-o", tmp_so, tmp_src]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"trainc: C++ compile failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")
        os.replace(tmp_src, src)
        os.replace(tmp_so, path)
    finally:
        for t in (tmp_so, tmp_src):
            if os.path.exists(t):
                os.unlink(t)
