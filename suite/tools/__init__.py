"""Developer tools the suite itself never imports: benchmarks, the Horovod build, a local Slurm."""
