"""`make wheelhouse`'s choice of what a GPU machine without network needs carried."""

from suite.tools.wheelhouse import names_in, wanted


def test_the_machines_stack_and_what_it_has_are_not_carried_but_nvml_is(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# lock\ntorch==2.14.1\ntorchvision==0.29.1\nnvidia-nccl-cu13==2.30.7\n"
                           "nvidia-cublas==13.1.1.3\nnvidia-ml-py==13.615.71\ntriton==3.7\n"
                           "horovod==0.28.1\nruff==0.17.5\nmlflow==3.17.2\nhydra-core==1.3.8\nPyYAML==6.0.3\n"
                           "deepspeed==0.19.8  # source only\n")
    have = tmp_path / "have.txt"
    have.write_text("pyyaml==6.0.2\nnumpy @ file:///wheels/numpy.whl\n# comment\nHydra_Core\n")
    assert names_in(have) == {"pyyaml", "numpy", "hydra-core"}
    assert wanted(constraints, names_in(have)) == ["deepspeed==0.19.8", "mlflow==3.17.2", "nvidia-ml-py==13.615.71"]
