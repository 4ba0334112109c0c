"""`python -m trainc debug DIR` indexes a TRAINC_DEBUG_DIR dump; TRAINC_DEBUG prints stage seconds."""
import re

import pytest
import torch
import torch.nn as nn

import trainc
from trainc.__main__ import main


def _compile_dump(tmp_path, **options):
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    compiled = trainc.compile(model, backend="cpp", debug_dir=str(tmp_path), cache_artifacts=False,
                              **options)
    compiled(torch.randn(4, 8)).sum().backward()


def test_index_lists_stages_kernels_partition_and_memory(tmp_path, capsys):
    _compile_dump(tmp_path)
    assert main(["debug", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 graphs" in out and re.search(r"^graph_\d+$", out, re.M)  # ids count per process
    joint = next(line for line in out.splitlines() if "00_joint.py" in line)
    assert int(joint.split()[-2]) > 10  # nodes counted in the dump
    assert "10_0_remove_aliases.py" in out and "31_bwd.py" in out
    for stage in ("trace", "joint passes", "partition", "post-grad passes", "codegen forward"):
        assert f"    {stage} " in out
    assert "partition (20_partition.txt):" in out and "saved (" in out
    kernels = [line for line in out.splitlines() if "read" in line and "written" in line]
    assert kernels and all("nodes " in k for k in kernels)
    assert "# forward:" in out and "# backward:" in out and "codegen" in out
    assert "43_fwd_memory.txt: memory plan:" in out and "planned peak" in out


def test_debug_prints_stage_seconds(tmp_path, capsys):
    _compile_dump(tmp_path, debug=True)
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "stage seconds" in line)
    assert "trace" in line and "codegen backward" in line
    assert "train backend=cpp" in err  # the one-line summary is still there


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_bad_directory_is_a_clear_error(tmp_path, make):
    path = tmp_path / "nothing" if make == "missing" else tmp_path
    with pytest.raises(SystemExit, match="trainc debug: .*(not a directory|no graph_)"):
        main(["debug", str(path)])
