"""One rank of a point: `python -m suite.worker <point dir>` and the training loop it runs."""
