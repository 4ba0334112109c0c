"""The on-disk cache's files: a directory only its user can write, atomic writes, checksums.

Whoever can write the cache directory can run code in every process that loads from it (it
holds shared libraries and wrapper source), so a directory that is a symlink, owned by someone
else, or writable by group/others is refused: caching is then off, with one warning. Every
file is written to a temporary name, fsynced and renamed into place, and carries a SHA-256
checked on read, so a truncated or garbage entry is a miss, never a crash.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
from typing import Optional

from trainc.config import Config

_checked: dict[str, Optional[str]] = {}  # directory -> None (usable) or why it is refused
_warned: set[str] = set()
_private: Optional[str] = None  # a per-process directory when the cache is refused


class CorruptEntry(Exception):
    """An entry that is empty, truncated, garbage or fails its checksum."""


def root(config: Config) -> str:
    return os.path.abspath(config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "trainc"))


def subdir(config: Config, name: str) -> Optional[str]:
    """The cache's directory `name` (created 0700), or None when it is refused (then warned
    once: caching is off for this process)."""
    base = root(config)
    path = os.path.join(base, name)
    for d in (base, path):
        if d not in _checked:
            _checked[d] = _prepare(d)
        if _checked[d] is not None:
            warn_once(d, f"trainc: not caching compiled code: {_checked[d]}")
            return None
    return path


def scratch_dir(config: Config, name: str) -> str:
    """subdir(), or where the cache is refused, a private directory of this process (the
    backends need a file to load generated code from); its files are never read again."""
    d = subdir(config, name)
    if d is not None:
        return d
    global _private
    if _private is None:
        _private = tempfile.mkdtemp(prefix="trainc-nocache-")  # 0700, ours
    d = os.path.join(_private, name)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def _prepare(d: str) -> Optional[str]:
    """Create d 0700 when missing; why it cannot be trusted, or None."""
    if not os.path.lexists(d):
        try:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)  # mkdir's mode is masked by the umask; 0700 is never looser
        except FileExistsError:
            pass  # another process created it meanwhile: checked below like any other
        except OSError as e:
            return f"cannot create {d} ({e}). Fix: set TRAINC_CACHE_DIR to a directory you own."
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or os.path.realpath(d) != d:
        return (f"{d} is reached through a symlink (it resolves to {os.path.realpath(d)}). "
                f"Fix: set TRAINC_CACHE_DIR={os.path.realpath(d)} if you own that directory, or "
                "remove the link.")
    if not stat.S_ISDIR(st.st_mode):
        return f"{d} is not a directory. Fix: remove it or set TRAINC_CACHE_DIR elsewhere."
    if st.st_uid != os.getuid():
        return (f"{d} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}). Fix: set "
                "TRAINC_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{d} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}). "
                f"Fix: chmod 700 {d}")
    return None


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: str, data: bytes) -> None:
    """Temporary file in the same directory, fsync, rename: readers see all or nothing."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_entry(path: str, payload: bytes, header: Optional[dict] = None) -> None:
    """One JSON header line (the payload's length and SHA-256, plus `header`), then the
    payload."""
    head = dict(header or {}, length=len(payload), sha256=sha256(payload))
    write_atomic(path, json.dumps(head, sort_keys=True).encode() + b"\n" + payload)


def read_header(path: str) -> dict:
    """The header of the entry at path (not checksummed: for diagnostics only)."""
    with open(path, "rb") as f:
        line = f.readline(1 << 16)
    try:
        head = json.loads(line)
    except ValueError as e:
        raise CorruptEntry(f"{path}: header is not JSON") from e
    if not isinstance(head, dict):
        raise CorruptEntry(f"{path}: header is not a JSON object")
    return head


def read_entry(path: str) -> bytes:
    """The payload written by write_entry; CorruptEntry when anything does not check out."""
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise CorruptEntry(f"{path} is empty")
    line, sep, payload = data.partition(b"\n")
    try:
        head = json.loads(line)
        length, digest = head["length"], head["sha256"]
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptEntry(f"{path}: header is not a trainc cache header") from e
    if not sep or len(payload) != length:
        raise CorruptEntry(f"{path} is truncated ({len(payload)} of {length} bytes)")
    if sha256(payload) != digest:
        raise CorruptEntry(f"{path} fails its SHA-256 checksum")
    return payload


def put_blob(d: str, data: bytes) -> str:
    """Store data under its content hash in d; the hash."""
    digest = sha256(data)
    path = os.path.join(d, digest)
    if not os.path.exists(path):
        write_atomic(path, data)
    return digest


def get_blob(d: str, digest: str) -> bytes:
    if not isinstance(digest, str) or len(digest) != 64 or \
            any(c not in "0123456789abcdef" for c in digest):
        raise CorruptEntry(f"bad blob name {digest!r}")
    path = os.path.join(d, digest)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorruptEntry(f"blob {path} is missing ({e})") from e
    if sha256(data) != digest:
        raise CorruptEntry(f"blob {path} fails its SHA-256 checksum")
    return data


def file_checksum_ok(path: str) -> bool:
    """Whether the file at path matches the SHA-256 stored next to it (path + ".sha256")."""
    try:
        with open(path + ".sha256") as f:
            want = f.read().strip()
        with open(path, "rb") as f:
            return sha256(f.read()) == want
    except OSError:
        return False


def write_checksum(path: str) -> None:
    with open(path, "rb") as f:
        digest = sha256(f.read())
    write_atomic(path + ".sha256", digest.encode() + b"\n")
