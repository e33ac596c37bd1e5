from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np
import pytest

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.serve.cache import CacheHit, ResultCache
from latencylab.serve.types import InferRequest, Tensor

S = 1_000_000_000


def tensor(name: str, data: Any, datatype: str = "FP32") -> Tensor:
    arr = np.array(data, dtype=object) if datatype == "BYTES" else np.asarray(data)
    return Tensor(name, datatype, tuple(arr.shape), arr)


def request(*inputs: Tensor, outputs: tuple[str, ...] | None = None, version: str | None = None) -> InferRequest:
    return InferRequest(model="text", version=version, inputs=inputs, outputs=outputs)


def answer(x: float = 1.0) -> tuple[Tensor, ...]:
    return (tensor("embedding", np.full((1, 4), x, dtype=np.float32)),)


# -- keys ------------------------------------------------------------------------------------


def test_same_content_in_different_objects_is_one_key() -> None:
    a = request(tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3)), tensor("t", [b"hi", b"there"], "BYTES"))
    b = request(
        tensor("t", np.array([b"hi", b"there"], dtype=object), "BYTES"),  # inputs in another order
        tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3).copy()),
    )
    assert a is not b and ResultCache.key("text", a) == ResultCache.key("text", b)
    cache = ResultCache(clock=FakeClock())
    cache.put(ResultCache.key("text", a), answer(), "fp32")
    hit = cache.get(ResultCache.key("text", b))
    assert hit is not None and hit.variant == "fp32" and not hit.stale


def test_non_contiguous_arrays_key_by_content() -> None:
    base = np.arange(12, dtype=np.int64).reshape(3, 4)
    strided = base.T  # a view, Fortran-ordered
    dense = np.ascontiguousarray(base.T)
    assert ResultCache.key("m", request(tensor("x", strided))) == ResultCache.key("m", request(tensor("x", dense)))


def test_one_byte_different_is_another_key_and_a_miss() -> None:
    data = np.zeros(1000, dtype=np.uint8)
    other = data.copy()
    other[777] = 1
    k1 = ResultCache.key("text", request(tensor("x", data, "UINT8")))
    k2 = ResultCache.key("text", request(tensor("x", other, "UINT8")))
    assert k1 != k2 and len(k1) == len(k2)
    cache = ResultCache(clock=FakeClock())
    cache.put(k1, answer(), "fp32")
    assert cache.get(k2) is None
    assert (cache.hits, cache.misses) == (0, 1)


def test_key_is_the_full_content_not_a_digest() -> None:
    small = ResultCache.key("text", request(tensor("x", np.zeros(10, dtype=np.float32))))
    big = ResultCache.key("text", request(tensor("x", np.zeros(1010, dtype=np.float32))))
    assert len(big) - len(small) == 1000 * 4  # grows byte for byte with the data
    payload = np.arange(50, dtype=np.float32)
    assert payload.tobytes() in ResultCache.key("text", request(tensor("x", payload)))
    words = ResultCache.key("text", request(tensor("t", [b"alpha", b"beta"], "BYTES")))
    assert b"alpha" in words and b"beta" in words


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # same bytes, different dtype
        (tensor("x", np.zeros(4, dtype=np.int32), "INT32"), tensor("x", np.zeros(4, dtype=np.float32), "FP32")),
        # same bytes, different byte order (so different values)
        (
            tensor("x", np.frombuffer(b"\x00\x00\x80\x3f", dtype="<f4")),
            tensor("x", np.frombuffer(b"\x00\x00\x80\x3f", dtype=">f4")),
        ),
        # same bytes, different shape
        (tensor("x", np.zeros((2, 3), dtype=np.float32)), tensor("x", np.zeros((3, 2), dtype=np.float32))),
        # same data, different name
        (tensor("x", np.zeros(3, dtype=np.float32)), tensor("y", np.zeros(3, dtype=np.float32))),
        # element boundaries matter for BYTES
        (tensor("t", [b"ab", b"c"], "BYTES"), tensor("t", [b"a", b"bc"], "BYTES")),
        (tensor("t", [b"abc"], "BYTES"), tensor("t", [b"ab", b"c"], "BYTES")),
    ],
)
def test_keys_differ_on_any_part_of_the_content(a: Tensor, b: Tensor) -> None:
    assert ResultCache.key("text", request(a)) != ResultCache.key("text", request(b))


def test_model_version_and_requested_outputs_are_part_of_the_key() -> None:
    x = tensor("x", np.ones(3, dtype=np.float32))
    base = ResultCache.key("text", request(x))
    assert ResultCache.key("vision", request(x)) != base
    assert ResultCache.key("text", request(x, version="2")) != base
    subset = ResultCache.key("text", request(x, outputs=("logits",)))
    assert subset != base
    assert ResultCache.key("text", request(x, outputs=("a", "b"))) == ResultCache.key(
        "text", request(x, outputs=("b", "a"))
    )
    # request id and parameters do not change the answer
    other = InferRequest(model="text", version=None, inputs=(x,), id="r-42", parameters={"trace": "on"})
    assert ResultCache.key("text", other) == base


def test_object_arrays_for_numeric_types_key_by_value() -> None:
    boxed = Tensor("x", "INT64", (3,), np.array([1, 2, 3], dtype=object))
    plain = Tensor("x", "INT64", (3,), np.array([1, 2, 3], dtype=np.int64))
    assert ResultCache.key("m", request(boxed)) == ResultCache.key("m", request(plain))


def test_bytes_elements_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        ResultCache.key("m", request(Tensor("t", "BYTES", (1,), np.array([3.5], dtype=object))))


# -- freshness -------------------------------------------------------------------------------


def test_ttl_and_the_stale_tier() -> None:
    clock = FakeClock()
    cache = ResultCache(ttl_s=60.0, stale_s=600.0, clock=clock)
    cache.put(b"k", answer(), "int8")
    clock.advance(60 * S)  # exactly ttl: still fresh
    hit = cache.get(b"k")
    assert hit is not None and hit == CacheHit(hit.outputs, "int8", 60.0, False)
    clock.advance(1)
    assert cache.get(b"k") is None  # expired for ordinary lookups...
    assert len(cache) == 1  # ...but kept for the stale tier
    stale = cache.get(b"k", allow_stale=True)
    assert stale is not None and stale.stale and stale.age_s == pytest.approx(60.0) and stale.variant == "int8"
    clock.advance(540 * S - 1)  # exactly stale_s
    assert cache.get(b"k", allow_stale=True) is not None
    clock.advance(1)
    assert cache.get(b"k", allow_stale=True) is None
    assert len(cache) == 0
    assert cache.stats() == {
        "entries": 0,
        "hits": 1,
        "stale_hits": 2,
        "misses": 2,
        "evictions": 0,
        "expired": 1,
    }


def test_put_refreshes_the_age() -> None:
    clock = FakeClock()
    cache = ResultCache(ttl_s=10.0, stale_s=10.0, clock=clock)
    cache.put(b"k", answer(1.0), "fp32")
    clock.advance(8 * S)
    cache.put(b"k", answer(2.0), "minilm-l3")
    clock.advance(8 * S)
    hit = cache.get(b"k")
    assert hit is not None and hit.age_s == 8.0 and hit.variant == "minilm-l3"
    assert float(hit.outputs[0].data[0, 0]) == 2.0


# -- bounds and safety -----------------------------------------------------------------------


def test_lru_eviction_order() -> None:
    cache = ResultCache(max_entries=3, clock=FakeClock())
    for k in (b"a", b"b", b"c"):
        cache.put(k, answer(), "fp32")
    assert cache.get(b"a") is not None  # a is now the most recent; b the least
    cache.put(b"d", answer(), "fp32")
    assert b"b" not in cache and all(k in cache for k in (b"a", b"c", b"d"))
    cache.put(b"c", answer(), "fp32")  # replacing does not evict, and makes c the most recent
    assert cache.evictions == 1 and len(cache) == 3
    cache.put(b"e", answer(), "fp32")
    cache.put(b"f", answer(), "fp32")
    assert [k in cache for k in (b"a", b"c", b"d", b"e", b"f")] == [False, True, False, True, True]
    assert cache.evictions == 3


def test_stored_answers_are_private_and_read_only() -> None:
    cache = ResultCache(clock=FakeClock())
    out = answer(1.0)
    cache.put(b"k", out, "fp32")
    out[0].data[0, 0] = 99.0  # the caller reuses its buffer
    hit = cache.get(b"k")
    assert hit is not None and float(hit.outputs[0].data[0, 0]) == 1.0
    with pytest.raises(ValueError):
        hit.outputs[0].data[0, 0] = 5.0


@pytest.mark.parametrize(
    "kw", [{"max_entries": 0}, {"max_entries": 1.5}, {"ttl_s": 0}, {"ttl_s": 10.0, "stale_s": 5.0}]
)
def test_rejects_nonsense(kw: dict[str, Any]) -> None:
    with pytest.raises(LatencyLabError):
        ResultCache(**kw)


def test_default_clock_is_the_host_clock() -> None:
    cache = ResultCache()
    cache.put(b"k", answer(), "fp32")
    hit = cache.get(b"k")
    assert hit is not None and 0 <= hit.age_s < 60 and not hit.stale


def test_thread_safety_smoke() -> None:
    cache = ResultCache(max_entries=50, clock=FakeClock())
    keys = [ResultCache.key("text", request(tensor("x", np.full(8, i, dtype=np.float32)))) for i in range(200)]
    gets = [0] * 8
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        rng = random.Random(worker)
        try:
            start.wait()
            for _ in range(3000):
                k = rng.choice(keys)
                if rng.random() < 0.5:
                    cache.put(k, answer(), "fp32")
                else:
                    gets[worker] += 1
                    hit = cache.get(k)
                    assert hit is None or hit.variant == "fp32"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) == 50
    assert cache.hits + cache.misses + cache.stale_hits == sum(gets)
    assert cache.hits > 0 and cache.misses > 0 and cache.evictions > 0
