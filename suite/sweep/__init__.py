"""The driver side: from overrides or a sweep file to validated points, run here or submitted as jobs."""
