"""Profiling apart from pricing: a network measured once on this machine's device and stored (`cache`, in the
suite's process; `measure`, in the child it starts); the performance model reads the stored profiles."""
