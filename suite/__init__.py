"""Reproducible benchmark suite for distributed deep-learning training."""
