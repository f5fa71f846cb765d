"""The sweeps of the GPU checks (`make test-gpu`: conf/sweep/gpu_checks.yaml on one GPU, gpu_multi_checks.yaml on two)
pass every check made before launch, here, without a GPU: planned for a Slurm cluster, whose GPUs are not this
machine's to look for. A misspelt key, or a point its strategy refuses, shows in `make test` rather than on the rare
machine with GPUs."""

from suite.sweep.plan import plan

# NCCL's default buffer (NCCL_BUFFSIZE): a larger send cannot complete into the buffer before its receive is posted, so
from suite.sweep.sweep_files import expand, sweep_lines

# NCCL's default buffer (NCCL_BUFFSIZE): a larger send cannot complete into the buffer before its receive is posted, so
# a pipeline whose sends and receives can wait on each other on one NCCL stream (review gpu-paths, B4 and R6) hangs.
PIPELINE_MESSAGE_BYTES = 4 * 2**20
FP32_BYTES = 4


def planned(sweep: str) -> list:
    invalid = []
    points = plan([job for line in sweep_lines(sweep) for job in expand([*line, "cluster=slurm"], multirun=True)],
                  experiment=sweep, invalid=invalid)
    assert not invalid, [f"{p.label}: {p.error}" for p in invalid]
    return points


def test_every_point_of_the_one_gpu_checks_plans():
    points = planned("gpu_checks")
    assert len(points) == 34
    assert {p.cfg.cluster.device for p in points} == {"cuda"}
    assert {p.cfg.precision for p in points if p.cfg.strategy.name in ("zero", "fsdp", "megatron")} == {
        "fp32", "bf16", "fp16"}


def test_every_point_of_the_multi_gpu_checks_plans_and_its_pipelines_send_megabytes():
    points = planned("gpu_multi_checks")
    assert len(points) == 11
    assert {p.cfg.workers for p in points} == {2}
    pipelines = [p for p in points if p.cfg.strategy.name in ("pipedream", "1f1b", "gpipe_dist")]
    assert len(pipelines) == 4
    for point in pipelines:
        micro_batch = point.layout.mini_batch // point.layout.micro_batches
        message = micro_batch * point.cfg.dataset.seq_len * point.cfg.network.n_embd * FP32_BYTES
        assert message > PIPELINE_MESSAGE_BYTES, f"{point.label}: {message} bytes a message"
