"""Count a forward pass's work: FLOPs (torch's FlopCounterMode) and bytes moved (an operator-level model).

**FLOPs** are ``torch.utils.flop_counter.FlopCounterMode``'s count of one FP32 forward: 2 per
multiply-accumulate in matmuls, convolutions and attention (``2 M N K`` for an ``(M, K) x (K, N)``
product); element-wise ops, softmax and normalisation are not counted (they are a few percent of a
transformer's FLOPs, and their cost is memory traffic, which the bytes below count).

**Bytes** come from one traced FP32 forward (a ``TorchDispatchMode`` sees every aten operator with its
tensors): *weight bytes* are the parameters and buffers each operator reads (an embedding lookup reads only
the rows it gathers), *activation bytes* are every other input an operator reads plus every output it
writes. View and metadata operators move nothing. This is the unfused traffic model (each operator reads
its inputs from memory and writes its output back): an upper bound on what the caches must serve; fusion
removes activation bytes, not weight bytes.

Other dtypes are derived from the FP32 trace rather than traced again, so one model gives all three points
with the same FLOPs: BF16 halves weights and activations; INT8 (dynamic quantisation of the Linear layers,
as torch.ao and ONNX Runtime's dynamic mode do) stores 2-D Linear/MatMul weights in one byte, keeps other
parameters (embeddings, norms, biases, convolutions) and activations in FP32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from latencylab.errors import LatencyLabError, require

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}
_NO_TRAFFIC = {
    *("detach", "alias", "lift_fresh", "_unsafe_view", "view", "expand", "t", "transpose", "permute", "slice"),
    *("select", "unsqueeze", "squeeze", "as_strided", "_reshape_alias", "unbind", "split", "split_with_sizes"),
    *("_to_copy_noop", "sym_size", "sym_stride", "sym_numel", "is_same_size", "empty", "empty_like", "zeros"),
    "zeros_like",
}


@dataclass(frozen=True, slots=True)
class Work:
    """One forward pass's FLOPs and FP32 traffic split by kind, from which each dtype's bytes follow."""

    flops: float
    linear_weight_elems: int  # 2-D weights of Linear layers / matmuls: what INT8 dynamic quantisation shrinks
    other_weight_elems: int  # embeddings (rows read), norms, biases, conv weights
    activation_elems: int  # operator inputs read + outputs written, other than weights
    flops_by_op: tuple[tuple[str, float], ...] = ()
    padding_fraction: float | None = None  # share of padded positions in the input (text), if known

    def weight_bytes(self, dtype: str) -> float:
        if dtype == "int8":
            return self.linear_weight_elems * 1 + self.other_weight_elems * 4
        return (self.linear_weight_elems + self.other_weight_elems) * _bytes(dtype)

    def activation_bytes(self, dtype: str) -> float:
        return self.activation_elems * (4 if dtype == "int8" else _bytes(dtype))

    def bytes(self, dtype: str) -> float:
        return self.weight_bytes(dtype) + self.activation_bytes(dtype)

    def intensity(self, dtype: str) -> float:
        """FLOPs per byte moved for ``dtype``."""
        return self.flops / self.bytes(dtype)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "linear_weight_elems": self.linear_weight_elems,
            "other_weight_elems": self.other_weight_elems,
            "activation_elems": self.activation_elems,
            "flops_by_op": dict(self.flops_by_op),
            "padding_fraction": self.padding_fraction,
            "bytes": {d: self.bytes(d) for d in ("fp32", "bf16", "int8")},
        }


def _bytes(dtype: str) -> int:
    try:
        return BYTES_PER_ELEMENT[dtype]
    except KeyError:
        raise LatencyLabError(f"roofline: unknown dtype {dtype!r}; known: fp32, bf16, fp16, int8") from None


def count_flops(model: Any, args: Sequence[Any]) -> tuple[float, dict[str, float]]:
    """(total FLOPs, FLOPs by aten op) of ``model(*args)`` under FlopCounterMode."""
    torch = _torch()
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with torch.inference_mode(), mode:
        model(*args)
    by_op: dict[str, float] = {}
    for ops in mode.get_flop_counts().values():
        for op, n in ops.items():
            by_op[str(op)] = max(by_op.get(str(op), 0.0), float(n))  # the "Global" entry holds the totals
    return float(mode.get_total_flops()), by_op


def count_traffic(model: Any, args: Sequence[Any]) -> tuple[int, int, int]:
    """(linear weight elements, other weight elements, activation elements) moved by ``model(*args)``."""
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    linear_ptrs: set[int] = set()
    weight_ptrs: set[int] = set()
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            ptr = p.untyped_storage().data_ptr()
            weight_ptrs.add(ptr)
            if name == "weight" and p.ndim == 2 and isinstance(module, torch.nn.Linear):
                linear_ptrs.add(ptr)
    counts = {"linear": 0, "other": 0, "act": 0}

    def tensors(x: Any) -> list[Any]:
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, (list, tuple)):
            return [t for item in x for t in tensors(item)]
        return []

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if getattr(func, "is_view", False) or name in _NO_TRAFFIC:
                return out
            outs = tensors(out)
            for i, t in enumerate(tensors(list(args) + list((kwargs or {}).values()))):
                ptr = t.untyped_storage().data_ptr()
                if ptr in weight_ptrs:
                    if name == "embedding" and i == 0:  # a lookup reads only the rows it gathers
                        counts["other"] += sum(o.numel() for o in outs)
                    else:
                        counts["linear" if ptr in linear_ptrs else "other"] += t.numel()
                else:
                    counts["act"] += t.numel()
            counts["act"] += sum(o.numel() for o in outs)
            return out

    with torch.inference_mode(), Tracer():
        model(*args)
    return counts["linear"], counts["other"], counts["act"]


def count_work(model: Any, args: Sequence[Any], padding_fraction: float | None = None) -> Work:
    """FLOPs and traffic of one FP32 forward of ``model(*args)``."""
    flops, by_op = count_flops(model, args)
    lin, other, act = count_traffic(model, args)
    ranked = tuple(sorted(by_op.items(), key=lambda kv: -kv[1]))
    return Work(flops, lin, other, act, ranked, padding_fraction)


def workload_work(workload: str, batch_size: int = 1, seq_len: int | None = 128, adapter: Any = None) -> Work:
    """Work of the built-in text (batch x seq_len tokens, MiniLM + pooling) or vision (batch x 3 x 64 x 64)
    forward, on the optimize adapter's first held-out feed (the same model and input the lab times), or on its
    ``shape_feed()`` where the work depends on the input's shape alone (vision)."""
    torch = _torch()
    if adapter is None:
        from latencylab.optimize.adapters import adapter_for

        adapter = adapter_for(workload, seq_len=seq_len, batch_size=batch_size)
    shape_feed = getattr(adapter, "shape_feed", None)
    feed = shape_feed() if shape_feed is not None else adapter.heldout()[0]
    args = [torch.from_numpy(feed[n]) for n in adapter.input_names]
    padding = None
    if "attention_mask" in feed:
        padding = 1.0 - float(feed["attention_mask"].mean())
    return count_work(adapter.torch_model(), args, padding)


def shape_work(model: Any, input_names: Sequence[str], batch_size: int, seq_len: int) -> Work:
    """Work of one forward of a token model on ``batch_size`` x ``seq_len`` positions, every position
    attended (all-ones inputs: FLOPs and bytes depend on the shapes, not on the token ids). This is the
    work of a call that ran exactly that shape, as an exact-shape (trimmed) or natural-length input does."""
    torch = _torch()
    if batch_size < 1 or seq_len < 1:
        raise LatencyLabError(
            f"roofline: a forward needs batch_size >= 1 and seq_len >= 1, got {batch_size} x {seq_len}"
        )
    args = [torch.ones((batch_size, seq_len), dtype=torch.int64) for _ in input_names]
    return count_work(model, args)


def mean_work(works: Sequence[tuple[Work, float]], padding_fraction: float | None = None) -> Work:
    """The weighted mean of ``(work, weight)`` pairs: the work of an average call when the calls ran
    different shapes (weights = how many calls ran each). Element counts are rounded to whole elements."""
    total = sum(w for _, w in works)
    if not works or total <= 0:
        raise LatencyLabError("roofline: the mean work of no calls is undefined")
    if len(works) == 1:
        return replace(works[0][0], padding_fraction=padding_fraction)

    def avg(attr: str) -> float:
        return sum(float(getattr(wk, attr)) * w for wk, w in works) / total

    by_op: dict[str, float] = {}
    for wk, w in works:
        for op, n in wk.flops_by_op:
            by_op[op] = by_op.get(op, 0.0) + n * w / total
    return Work(
        flops=avg("flops"),
        linear_weight_elems=round(avg("linear_weight_elems")),
        other_weight_elems=round(avg("other_weight_elems")),
        activation_elems=round(avg("activation_elems")),
        flops_by_op=tuple(sorted(by_op.items(), key=lambda kv: -kv[1])),
        padding_fraction=padding_fraction,
    )


def _lagrange(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """The value at ``x`` of the polynomial through the points (xs, ys)."""
    total = 0.0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        term = yi
        for j, xj in enumerate(xs):
            if j != i:
                term *= (x - xj) / (xi - xj)
        total += term
    return total


def _interpolate(fits: Sequence[tuple[int, Work]], n: int) -> Work:
    """The work at length ``n`` from the quadratic through three counted lengths (values rounded: counts
    are whole numbers)."""
    xs = [x for x, _ in fits]
    works = [w for _, w in fits]
    ops = sorted({op for w in works for op, _ in w.flops_by_op})
    by_op = [(op, float(round(_lagrange(xs, [dict(w.flops_by_op).get(op, 0.0) for w in works], n)))) for op in ops]
    return Work(
        flops=float(round(_lagrange(xs, [w.flops for w in works], n))),
        linear_weight_elems=round(_lagrange(xs, [w.linear_weight_elems for w in works], n)),
        other_weight_elems=round(_lagrange(xs, [w.other_weight_elems for w in works], n)),
        activation_elems=round(_lagrange(xs, [w.activation_elems for w in works], n)),
        flops_by_op=tuple(sorted(by_op, key=lambda kv: -kv[1])),
    )


def _same(a: Work, b: Work, rel: float = 1e-9) -> bool:
    pairs = [(a.flops, b.flops), (a.linear_weight_elems, b.linear_weight_elems),
             (a.other_weight_elems, b.other_weight_elems), (a.activation_elems, b.activation_elems)]  # fmt: skip
    return all(abs(x - y) <= rel * max(abs(x), abs(y), 1.0) for x, y in pairs)


def works_at_lengths(count: Callable[[int, int], Work], batch: int, lengths: Sequence[int]) -> dict[int, Work]:
    """The work of one forward at ``batch`` x each of ``lengths``, with ``count(batch, length)`` the exact
    count (~0.2-1 s each for MiniLM).

    A transformer's FLOPs and element counts are polynomials of degree 2 in the sequence length (linear
    layers and embedding rows grow with it, attention with its square, weights not at all), so with more
    than 5 distinct lengths three counts (the shortest, the longest, one between) determine the rest;
    that is used only when two further exact counts (at the lower and upper quartile lengths) equal the
    polynomial's values, else every length is counted. Either way each value is the exact count."""
    todo = sorted(set(lengths))
    if len(todo) <= 5:
        return {n: count(batch, n) for n in todo}
    k = len(todo)
    anchors = [todo[0], todo[k // 2], todo[-1]]
    checks = [n for n in (todo[k // 4], todo[(3 * k) // 4]) if n not in anchors]
    out = {n: count(batch, n) for n in (*anchors, *checks)}
    fits = [(n, out[n]) for n in anchors]
    if all(_same(_interpolate(fits, n), out[n]) for n in checks):
        for n in todo:
            if n not in out:
                out[n] = _interpolate(fits, n)
        return out
    return {n: out.get(n) or count(batch, n) for n in todo}


def _torch() -> Any:
    return require("torch", "torch")
