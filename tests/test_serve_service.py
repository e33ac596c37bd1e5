"""ModelService's request path: what a handler's cancellation does to its queued item."""

from __future__ import annotations

import asyncio
import json
import time

from fake_variants import FakeVariant
from latencylab.serve import protocol
from latencylab.serve.app import build_state
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.service import Timing

BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_a_handler_cancelled_while_queued_takes_its_item_out_of_the_batch() -> None:
    """The handler awaits the batcher's future itself (no shield): a client that goes away while its request
    waits for the compute thread cancels the item, and the batcher skips it rather than computing an answer
    nobody reads. The request ahead of it is answered as usual."""
    variant = FakeVariant("fp32", 0.2)  # long enough that a busy machine cannot reorder the steps below
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=1),)
    )
    state = build_state(cfg, {"fake": [variant]})
    svc = state.services["fake"]
    body = protocol.parse_infer_request(json.dumps(BODY).encode(), "fake", None, svc.inputs)

    async def go() -> tuple[int, bool]:
        await svc.start()
        try:
            variant.batch_sizes.clear()
            first = asyncio.create_task(svc.infer(body, Timing(time.perf_counter_ns())))
            await asyncio.sleep(0.015)  # the first is computing (200 ms); the second will queue behind it
            second = asyncio.create_task(svc.infer(body, Timing(time.perf_counter_ns())))
            await asyncio.sleep(0.015)
            second.cancel()
            resp, _ = await first
            await asyncio.sleep(0.3)  # time enough for a second batch, had the item stayed queued
            return len(variant.batch_sizes), second.cancelled() and resp.outputs is not None
        finally:
            await svc.stop()

    batches, ok = asyncio.run(go())
    assert ok
    assert batches == 1
    assert svc.in_flight == 0 and len(svc.batchers[0]) == 0
