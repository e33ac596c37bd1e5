"""A/B comparison of two result files with significance, and CI gates."""
