"""Locust peer for benchmarks/load_vs_locust.py: FastHttpUser POSTing one OIP v2 infer request, no wait.

Closed loop: each user sends its next request as soon as the previous answer arrives, so with enough users
one Locust process saturates its core, and its requests/s at saturation is its per-core rate.

Runs in Locust's own venv (benchmarks/.venvs/locust). The request body and path come from the environment,
so the benchmark sends Locust exactly the bytes it sends latencylab:

    LOCUST_BODY_FILE  file holding the JSON request body
    LOCUST_INFER_PATH e.g. /v2/models/null/infer
"""

from __future__ import annotations

import os
from pathlib import Path

from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

BODY = Path(os.environ["LOCUST_BODY_FILE"]).read_bytes()
PATH = os.environ.get("LOCUST_INFER_PATH", "/v2/models/null/infer")
HEADERS = {"Content-Type": "application/json"}


class InferUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def infer(self) -> None:
        self.client.post(PATH, data=BODY, headers=HEADERS, name="infer")
