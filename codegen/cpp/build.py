"""C++ source -> loaded shared library, built once with the system compiler and cached on disk.

The cache key is a hash of source, compiler and flags; a build writes a temporary file and
renames it into place, so concurrent processes never load a half-written library. Each library
has its SHA-256 next to it (k_<key>.so.sha256), checked before loading; a mismatch rebuilds.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from trainc import cache_store
from trainc.config import Config

_loaded: dict[str, ctypes.CDLL] = {}
_pending: dict[str, "PendingBuild"] = {}


class CompilerMissing(RuntimeError):
    pass


def cache_dir(config: Config) -> str:
    """The cache's cpp/ (trainc/cache_store.py checks who can write it), or a private one."""
    return cache_store.scratch_dir(config, "cpp")


def build(source: str, config: Config) -> tuple[ctypes.CDLL, str, bool]:
    """(library, path, cache_hit) for `source`."""
    pending = start_build(source, config)
    return pending.library(), pending.path, pending.hit


class PendingBuild:
    """A library being compiled in a child process: the caller generates the next graph's
    code meanwhile (the compiler runs on the other core) and waits only when it needs it."""

    def __init__(self, path: str, hit: bool, job=None, rebuild=None):
        self.path, self.hit, self.job, self.rebuild = path, hit, job, rebuild

    def library(self) -> ctypes.CDLL:
        if self.path not in _loaded:
            if self.job is not None:
                _finish(*self.job)
                self.job = None
            try:
                _loaded[self.path] = ctypes.CDLL(self.path)
            except OSError as e:  # changed since its checksum was read: build it again
                if self.rebuild is None:
                    raise
                cache_store.warn_once(f"so:{self.path}", f"trainc: cannot load {self.path} "
                                      f"({e}); rebuilding it")
                _finish(*_start(*self.rebuild, self.path))
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
    if path in _loaded:
        return PendingBuild(path, True)
    building = path in _pending and _pending[path].job is not None
    if not building and os.path.exists(path):
        if cache_store.file_checksum_ok(path):
            return PendingBuild(path, True, rebuild=(cxx, flags, source))
        if os.path.exists(path + ".sha256"):  # none: built before checksums, rebuilt quietly
            cache_store.warn_once(f"so:{path}", f"trainc: {path} does not match its checksum "
                                  "(truncated or changed); rebuilding it")
    if not building:  # one child per source
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
        with open(tmp_so, "rb") as f:
            os.fsync(f.fileno())
        cache_store.write_checksum(tmp_so)  # the library's SHA-256, checked before loading
        os.replace(tmp_so + ".sha256", path + ".sha256")
        os.replace(tmp_so, path)
    finally:
        for t in (tmp_so, tmp_src):
            if os.path.exists(t):
                os.unlink(t)
