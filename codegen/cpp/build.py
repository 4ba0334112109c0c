"""C++ source -> loaded shared library, built once with the system compiler and cached on disk.

The cache key is a hash of source, compiler and flags; a build writes a temporary file and
renames it into place, so concurrent processes never load a half-written library.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from trainc.config import Config

_loaded: dict[str, ctypes.CDLL] = {}
_pending: dict[str, "PendingBuild"] = {}


class CompilerMissing(RuntimeError):
    pass


def cache_dir(config: Config) -> str:
    d = config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "trainc")
    d = os.path.join(d, "cpp")
    os.makedirs(d, exist_ok=True)
    return d


def build(source: str, config: Config) -> tuple[ctypes.CDLL, str, bool]:
    """(library, path, cache_hit) for `source`."""
    pending = start_build(source, config)
    return pending.library(), pending.path, pending.hit


class PendingBuild:
    """A library being compiled in a child process: the caller generates the next graph's
    code meanwhile (the compiler runs on the other core) and waits only when it needs it."""

    def __init__(self, path: str, hit: bool, job=None):
        self.path, self.hit, self.job = path, hit, job

    def library(self) -> ctypes.CDLL:
        if self.path not in _loaded:
            if self.job is not None:
                _finish(*self.job)
                self.job = None
            _loaded[self.path] = ctypes.CDLL(self.path)
        return _loaded[self.path]


def start_build(source: str, config: Config) -> PendingBuild:
    """Start compiling `source` unless a build of it is on disk (or loaded) already."""
    cxx = shutil.which(config.cpp_compiler)
    if cxx is None:
        raise CompilerMissing(
            f"trainc: backend='cpp' needs a C++ compiler with OpenMP, but {config.cpp_compiler!r}"
            " was not found. Install g++ (Debian/Ubuntu: `apt-get install g++`), point "
            "TRAINC_CXX at a compiler, or use backend='aten'.")
    flags = config.cpp_flags.split()
    key = hashlib.sha256("\0".join([source, cxx, *flags]).encode()).hexdigest()[:24]
    path = os.path.join(cache_dir(config), f"k_{key}.so")
    if path in _loaded or os.path.exists(path):
        return PendingBuild(path, True)
    if path not in _pending or _pending[path].job is None:  # one child per source
        _pending[path] = PendingBuild(path, False, _start(cxx, flags, source, path))
    return _pending[path]


@atexit.register
def _finish_pending() -> None:
    """Builds never waited for (a graph compiled, never run) still land in the cache, and
    leave no temporary files behind."""
    for pending in list(_pending.values()):
        if pending.job is not None:
            job, pending.job = pending.job, None
            try:
                _finish(*job)
            except RuntimeError:
                pass


def _start(cxx: str, flags: list[str], source: str, path: str) -> tuple:
    d = os.path.dirname(path)
    fd, tmp_so = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    fd, tmp_src = tempfile.mkstemp(suffix=".cpp", dir=d)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    cmd = [cxx, *flags, "-shared", "-fPIC", "-o", tmp_so, tmp_src]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, cmd, tmp_so, tmp_src, path


def _finish(proc, cmd, tmp_so: str, tmp_src: str, path: str) -> None:
    try:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"trainc: C++ compile failed ({' '.join(cmd)}):\n{err[-4000:]}")
        os.replace(tmp_src, path[:-3] + ".cpp")
        os.replace(tmp_so, path)
    finally:
        for t in (tmp_so, tmp_src):
            if os.path.exists(t):
                os.unlink(t)
