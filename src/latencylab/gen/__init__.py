"""The generative side of a profile: token-level latency (TTFT, TPOT, ITL) and the prefill / decode
roofline of a ``--workload gen`` result (:mod:`latencylab.gen.profile`). The model, its decode loop, its
prompts and its fidelity reference live with the workload (``latencylab.workloads.gen*``)."""
