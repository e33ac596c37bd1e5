"""``latencylab optimize``: accuracy-guarded search over optimisation variants."""
