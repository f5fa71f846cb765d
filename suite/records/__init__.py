"""A point's directory and its one MLflow run: written by the ranks, judged and recorded by whoever ends the point."""
