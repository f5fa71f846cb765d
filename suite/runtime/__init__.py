"""What a rank's training step is built from: its place in the job, the process group, timers, memory,
precision, optimizers, communication counts; used by the training loop and the strategies."""
