"""What the pipeline strategies share: micro-batching rules, partitioning into stages, the rank
layout of pipelines and their data-parallel replicas, point-to-point transfer, and PipeDream's
asynchronous engine (the one schedule no maintained library provides)."""
