"""The built-in workloads as the experiments' calls: MiniLM forward, the vision CNN's stages and forward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def text_forward_fn(tokenizer: Any, model: Any, batch_size: int, seq_len: int = 128) -> Callable[[], Any]:
    """A call running MiniLM forward + mean pool on ``batch_size`` corpus texts padded/truncated to ``seq_len``.

    The input is tokenised once, outside the call: the call times the model (fixed shape batch x seq_len).
    """
    import torch

    from latencylab.workloads import text as text_wl

    texts = text_wl.corpus()
    # Passages long enough to fill seq_len where possible, so the tokens are real text rather than padding.
    longest = sorted(texts, key=len, reverse=True)
    batch = [longest[i % len(longest)] for i in range(batch_size)]
    enc = tokenizer(batch, padding="max_length", truncation=True, max_length=seq_len, return_tensors="pt")
    feed = dict(enc)

    def run() -> Any:
        with torch.inference_mode():
            out = model(**feed)
            return text_wl.mean_pool_normalize(out.last_hidden_state, feed["attention_mask"])

    return run


def vision_stages(model: Any, res: int = 64) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(prepare, infer) for the vision workload: decode + preprocess, forward + postprocess."""
    from latencylab.workloads import vision

    pre = vision.Preprocess(res)
    fwd = vision.Forward(model.eval())

    def prepare(jpeg: bytes) -> Any:
        return pre(vision.decode(jpeg))

    def infer(x: Any) -> Any:
        return vision.postprocess(fwd(x))

    return prepare, infer


def vision_forward_fn(model: Any, jpegs: Sequence[bytes], batch_size: int, res: int = 64) -> Callable[[], Any]:
    """A call running the vision CNN forward on ``batch_size`` decoded, preprocessed images (prepared once)."""
    from latencylab.workloads import vision

    x = vision.Preprocess(res)(vision.decode([jpegs[i % len(jpegs)] for i in range(batch_size)]))
    fwd = vision.Forward(model.eval())
    return lambda: fwd(x)
