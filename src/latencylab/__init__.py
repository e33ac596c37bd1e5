"""latencylab: find where inference time goes."""
__version__ = "0.1.0"
