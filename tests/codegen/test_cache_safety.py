"""The artifact cache is safe to share a machine with (trainc/cache_store.py): its directory is
private, refused when others could write it, and every fault planted in an entry, a blob or a
library is one warning and a recompile, never a crash or a wrong result."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import stat
import warnings

import pytest
import torch

import trainc
from trainc import cache_store, records


class MLP(torch.nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, width), torch.nn.Linear(width, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).square().mean()


def _run(cache, backend="cpp", width=16):
    """(loss, grads, cache statuses, trainc warnings) of one compiled step of a fixed MLP."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, x = MLP(width), torch.randn(5, 8)
    with records.recording() as recs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = trainc.compile(m, backend=backend, cache_dir=str(cache), cache_artifacts=True)
        loss = f(x)
        loss.backward()
    msgs = [str(w.message) for w in caught if str(w.message).startswith("trainc")]
    return loss.detach(), [p.grad for p in m.parameters()], [r.cache for r in recs], msgs


def _entries(cache):
    d = os.path.join(cache, "artifacts")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("a_"))


def _same(a, b):
    assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_directory_is_created_private(tmp_path):
    cache = tmp_path / "new" / "trainc"
    first = _run(cache)
    assert first[2][0].startswith("miss") and first[2][0].endswith("stored"), first[2]
    for d in (cache, cache / "artifacts", cache / "cpp", cache / "blobs"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    second = _run(cache)
    assert second[2] == ["hit"] and not second[3]
    _same(first, second)


def _refused(cache, needle):
    loss, grads, statuses, msgs = _run(cache)
    assert statuses[0].startswith("off (cache directory refused"), statuses
    assert len(msgs) == 1 and str(cache) in msgs[0] and needle in msgs[0], msgs
    assert not os.path.exists(os.path.join(cache, "artifacts")) or not _entries(str(cache))
    return loss, grads


def test_group_or_world_writable_directory_is_refused(tmp_path):
    for mode in (0o770, 0o707):
        cache = tmp_path / f"m{mode:o}"
        cache.mkdir()
        os.chmod(cache, mode)
        _refused(cache, "chmod 700")


def test_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    _refused(link, f"TRAINC_CACHE_DIR={real}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_directory_owned_by_someone_else_is_refused(tmp_path):
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    _refused(cache, "owned by uid 65534")


def _replace(path, data: bytes):
    """A new file under the old name: a library this process has mapped keeps its pages
    (rewriting it in place raised SIGBUS in the process that had loaded it)."""
    with open(path + ".fault", "wb") as f:
        f.write(data)
    os.replace(path + ".fault", path)


def _truncate(path):
    data = open(path, "rb").read()
    _replace(path, data[:len(data) // 2])


def _empty(path):
    _replace(path, b"")


def _garbage(path):
    _replace(path, os.urandom(4096))


def _flip(path):  # same length, one payload byte changed: only the checksum can tell
    data = bytearray(open(path, "rb").read())
    data[len(data) * 3 // 4] ^= 1  # an entry's header line is far shorter than a quarter
    _replace(path, bytes(data))


@pytest.mark.parametrize("fault", [_truncate, _empty, _garbage, _flip])
def test_bad_entry_is_a_miss_with_one_warning_then_overwritten(tmp_path, fault):
    cold = _run(tmp_path)
    (entry,) = _entries(str(tmp_path))
    fault(entry)
    again = _run(tmp_path)
    assert again[2][0].startswith("miss (bad entry") and again[2][0].endswith("stored"), again[2]
    assert len(again[3]) == 1 and "bad cache entry" in again[3][0], again[3]
    cache_store.read_entry(entry)  # rewritten whole by the recompile
    warm = _run(tmp_path)
    assert warm[2] == ["hit"] and not warm[3]
    _same(cold, again)
    _same(cold, warm)


def _libraries(cache):
    d = os.path.join(cache, "cpp")
    return [os.path.join(d, n) for n in os.listdir(d) if n.endswith(".so")]


@pytest.mark.parametrize("fault,width", [(_truncate, 17), (_empty, 18), (_flip, 19)])
def test_bad_library_is_rebuilt_not_loaded(tmp_path, fault, width):
    # a width of its own: kernels this process built and loaded before are not rebuilt
    cold = _run(tmp_path, width=width)
    libs = _libraries(str(tmp_path))
    assert libs and all(os.path.exists(p + ".sha256") for p in libs)
    for p in libs:
        fault(p)
    # a fresh directory name for the same files: this process has not loaded them yet
    moved = tmp_path.parent / (tmp_path.name + "_moved")
    shutil.copytree(tmp_path, moved)  # copied, not moved: pytest may hand its name out again
    again = _run(moved, width=width)
    assert any("does not match its checksum" in m for m in again[3]), again[3]
    assert all(cache_store.file_checksum_ok(p) for p in _libraries(str(moved)))
    _same(cold, again)


def test_bad_blob_is_a_miss(tmp_path):
    torch._dynamo.reset()
    from trainc import artifact_cache
    from trainc.cache_key import Key
    from trainc.config import make_config
    config = make_config("cpp", cache_dir=str(tmp_path), cache_artifacts=True)
    k = Key("0" * 32, (("graph", "g"),))
    graph = trainc.codegen.CompiledGraph(print, extra={"recipe": ("cpp", torch.arange(5.0))})
    assert artifact_cache.store_graph(k, graph, None, config) == "stored"
    (blob,) = os.listdir(tmp_path / "blobs")
    _flip(str(tmp_path / "blobs" / blob))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, status = artifact_cache.load_graph(k, config)
    assert got is None and status.startswith("miss (bad entry") and "checksum" in status
    assert len(caught) == 1


def test_entries_are_json_and_no_cache_module_uses_pickle(tmp_path):
    _run(tmp_path)
    (entry,) = _entries(str(tmp_path))
    json.loads(cache_store.read_entry(entry))
    import trainc.artifact_cache, trainc.cache_codec, trainc.cache_key  # noqa: E401
    import trainc.codegen.cpp.build, trainc.codegen.triton.launch  # noqa: E401
    for mod in (trainc.artifact_cache, trainc.cache_codec, trainc.cache_key, cache_store,
                trainc.codegen.cpp.build, trainc.codegen.triton.launch):
        assert not re.search(r"import pickle|pickle\.|from pickle", open(mod.__file__).read()), \
            mod.__file__


def test_codec_refuses_names_outside_torch_and_trainc():
    from trainc import cache_codec
    with pytest.raises(ValueError, match="untrusted"):
        cache_codec.decode({"ref": ["os", "system"]}, None)
    with pytest.raises(ValueError, match="untrusted"):
        cache_codec.decode({"module": "subprocess"}, None)
    with pytest.raises(cache_codec.Unencodable):
        cache_codec.encode(lambda: 0, None)


def _compile_in_child(cache, barrier, queue):
    barrier.wait()
    loss, grads, statuses, msgs = _run(cache)
    queue.put((loss.item(), [g.sum().item() for g in grads], statuses, msgs))


def _watch(cache, stop, queue):
    """Read every entry and library checksum as they appear: none may ever be partial."""
    bad, seen = [], 0
    d = os.path.join(cache, "artifacts")
    while not stop.is_set():
        for n in os.listdir(d) if os.path.isdir(d) else []:
            if n.startswith("a_"):
                try:
                    cache_store.read_entry(os.path.join(d, n))
                    seen += 1
                except cache_store.CorruptEntry as e:
                    bad.append(str(e))
                except FileNotFoundError:
                    pass
    queue.put((bad, seen))


def test_concurrent_compiles_never_expose_a_partial_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    cache = str(tmp_path / "c")
    n = 3
    barrier, queue, stop = ctx.Barrier(n), ctx.Queue(), ctx.Event()
    watcher = ctx.Process(target=_watch, args=(cache, stop, queue))
    watcher.start()
    procs = [ctx.Process(target=_compile_in_child, args=(cache, barrier, queue))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    stop.set()
    bad, seen = queue.get(timeout=60)
    for p in procs + [watcher]:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert not bad, bad
    assert seen > 0, "the watcher never saw an entry"
    assert all(r[:2] == results[0][:2] for r in results)
    assert all(not r[3] for r in results), [r[3] for r in results]  # no corrupt-entry warning
    cache_store.read_entry(_entries(cache)[0])
    assert _run(cache)[2] == ["hit"]
