"""Published GPU measurements as data the suite reads: a records file (analysis/published/gpu_measurements.yaml, or
any file of its schema) loaded into typed records (records), and each record mapped onto the suite's datasets,
networks, clusters and strategies as a point's overrides, planned as a sweep plans it, or given the reason it cannot
be (mapping). Driver side: the sweep, the performance model, the tools and the reports may all import it; it imports
the sweep's planner, never suite.predict or the tools."""
