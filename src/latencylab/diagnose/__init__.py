"""Automatic findings with evidence: rules over result files, the sandwich method, the roofline."""
