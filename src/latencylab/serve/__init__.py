"""``latencylab serve``: an Open Inference Protocol (KServe v2) server with deadline-aware dynamic batching,
an SLO guard with a fallback ladder, a result cache, Prometheus metrics and OpenTelemetry traces."""
