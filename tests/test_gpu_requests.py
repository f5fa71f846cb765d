"""What a rank's GPUs are: how many a batch job asks for when one process drives several (gpipe), which a
gpipe process may take, which math dtypes calibration measures on a GPU, and which collectives it calls on the
torch at hand."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import DIGITS
from launchers import BATCH_SCHEDULERS, jobscript
from launchers.batch import Job
from suite.errors import ConfigError
from suite.shared_names import MathDtype
from suite.strategies.gpipe import GPipe
from suite.sweep.jobs import _job
from suite.sweep.plan import plan
from suite.worker.calibration_rank import collective_runs, default_dtypes

GPIPE = [*(o for o in DIGITS if not o.startswith("batch_size=")), "batch_size=16", "strategy=gpipe"]


def job(*overrides: str) -> Job:
    """The batch job of one point, built as a sweep builds it."""
    (point,) = plan([[*GPIPE, *overrides]])
    return _job("t", [(point, SimpleNamespace(path=Path("/p")))])


def script(*overrides: str) -> str:
    """The job script of one point (nothing written or submitted)."""
    built = job(*overrides)
    return jobscript.render(built, BATCH_SCHEDULERS[built.cluster.scheduler])


@pytest.mark.parametrize("workers", [2, 4])
def test_a_gpipe_job_asks_for_a_gpu_per_partition_for_its_one_process(results, workers):
    slurm = script("cluster=slurm", f"workers={workers}", "cluster.hardware.cores_per_node=64")
    assert f"#SBATCH --gpus-per-node={workers}\n" in slurm and "#SBATCH --ntasks-per-node=1\n" in slurm
    assert "srun --mpi=none --nodes=1 --ntasks=1 " in slurm
    lassen = script("cluster=lassen", f"workers={workers}", "cluster.job.account=a")
    assert f"--tasks_per_rs 1 --cpu_per_rs 10 --gpu_per_rs {workers} " in lassen
    polaris = ("cluster=polaris", f"workers={workers}", "cluster.job.account=a")  # whole nodes: every GPU seen
    assert job(*polaris).gpus_per_node == workers  # what picks its queue
    assert "#PBS -l select=1:system=polaris\n" in script(*polaris)


def test_a_ddp_job_still_asks_for_a_gpu_per_rank(results):
    slurm = script("cluster=slurm", "workers=4", "strategy=ddp", "cluster.hardware.cores_per_node=64")
    assert "#SBATCH --gpus-per-node=4\n" in slurm and "#SBATCH --ntasks-per-node=4\n" in slurm


def test_gpipe_refuses_more_partitions_than_the_gpus_its_process_sees(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # no GPU here: the count is what the logic reads
    gpipe, cuda = GPipe("gpipe"), torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"^strategy gpipe: 4 partitions but this process sees 1 GPU\(s\); "):
        gpipe._devices(cuda, 4, share_gpus=False)
    assert gpipe._devices(cuda, 4, share_gpus=True) == [cuda] * 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert gpipe._devices(cuda, 4, share_gpus=False) == [torch.device("cuda", i) for i in range(4)]


@pytest.mark.parametrize("capability, bf16", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_calibration_measures_bf16_on_a_gpu_only_where_it_is_native(capability, bf16):
    dtypes = default_dtypes("cuda", capability)
    assert (MathDtype.bf16 in dtypes) == bf16
    assert {MathDtype.fp32, MathDtype.tf32, MathDtype.fp16} <= set(dtypes)
    assert default_dtypes("cpu") == [MathDtype.fp32, MathDtype.bf16]


def older_dist(calls: list) -> SimpleNamespace:
    """torch.distributed as a torch before all_gather_single, reduce_scatter_single and broadcast's group_src."""

    def call(name):
        return lambda *args, **kwargs: calls.append((name, args, kwargs))

    def broadcast(tensor, src=None, group=None, async_op=False):
        calls.append(("broadcast", (tensor,), {"src": src, "group": group}))

    return SimpleNamespace(all_reduce=call("all_reduce"), all_gather_into_tensor=call("all_gather_into_tensor"),
                           reduce_scatter_tensor=call("reduce_scatter_tensor"), broadcast=broadcast,
                           get_global_rank=lambda group, group_rank: {"node1": 4}[group] + group_rank)


def test_calibration_collectives_fall_back_to_the_older_torchs_names():
    calls, whole, part = [], torch.zeros(8), torch.zeros(2)
    for run in collective_runs(older_dist(calls), "node1", whole, part).values():
        run()
    assert [(name, [a is whole for a in args], kwargs) for name, args, kwargs in calls] == [
        ("all_reduce", [True], {"group": "node1"}),
        ("all_gather_into_tensor", [True, False], {"group": "node1"}),
        ("reduce_scatter_tensor", [False, True], {"group": "node1"}),
        ("broadcast", [True], {"src": 4, "group": "node1"}),  # the group's first rank, by its global rank
    ]

