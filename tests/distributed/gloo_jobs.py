"""A test module's distributed jobs, run in one set of spawned gloo processes (each spawn costs
seconds of imports): `run` starts them and waits, `outcome` fails a test with a rank's
traceback or says the jobs did not finish. Each job leaves a file per rank: .ok, or .err with
its traceback; a failure ends that worker (its peer may wait in a collective) and `run` then
stops the others."""
import datetime
import importlib
import os
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException


def _worker(rank: int, module: str, world: int, store: str, out: str, jobs: list) -> None:
    torch.set_num_threads(1)
    table = importlib.import_module(module).JOBS
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    for job in jobs:
        try:
            table[job](rank)
        except BaseException:
            with open(os.path.join(out, f"{job}.{rank}.err"), "w") as f:
                f.write(traceback.format_exc())
            raise
        open(os.path.join(out, f"{job}.{rank}.ok"), "w").close()
    dist.destroy_process_group()


def run(module: str, jobs: list, tmp, world: int, timeout: int) -> tuple[str, str]:
    """Run `module`.JOBS[job] for each job, in order, on `world` ranks: (out dir, failure)."""
    out = str(tmp)
    ctx = mp.start_processes(_worker, args=(module, world, str(tmp / "store"), out, list(jobs)),
                             nprocs=world, join=False, start_method="spawn")
    try:
        for _ in range(timeout):
            if ctx.join(timeout=1):
                return out, ""
        return out, f"the workers did not finish in {timeout} s"
    except ProcessException as e:  # join stopped the other workers
        return out, f"a worker failed:\n{e}"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def outcome(ran: tuple[str, str], job: str, world: int) -> None:
    out, failure = ran
    for rank in range(world):
        err = os.path.join(out, f"{job}.{rank}.err")
        if os.path.exists(err):
            pytest.fail(f"rank {rank}:\n" + open(err).read(), pytrace=False)
    if not all(os.path.exists(os.path.join(out, f"{job}.{r}.ok")) for r in range(world)):
        pytest.fail(f"{job} did not finish: {failure}", pytrace=False)
