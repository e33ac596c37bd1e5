"""The built-in text workload: real all-MiniLM-L6-v2 weights, offline."""

from __future__ import annotations

import numpy as np
import pytest

from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.profiler import ProfileConfig, profile
from latencylab.workloads import WorkloadOptions, build_workload
from latencylab.workloads.text import corpus, model_dir


@pytest.fixture(scope="module")
def text_pipe() -> Pipeline:
    return build_workload("text", WorkloadOptions(batch_size=1))


def test_corpus_has_realistic_varied_lengths(text_pipe: Pipeline) -> None:
    texts = corpus()
    assert len(texts) >= 500
    lengths = text_pipe.metadata["token_lengths"]
    # short queries and long passages both present: p90 several times p50
    assert lengths["min"] <= 8
    assert lengths["p90"] >= 4 * lengths["p50"]
    assert lengths["max"] == 256  # longest passages hit the model's window and are truncated


def test_embeddings_match_sentence_transformers(text_pipe: Pipeline) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir()), device="cpu")
    idx = [0, 1, 2, 3, 50, 123]
    texts = [corpus()[i] for i in idx]
    ref = st.encode(texts, normalize_embeddings=True)
    ours = np.concatenate([text_pipe.run_once(i) for i in idx])
    assert ours.shape == (6, 384)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    cos = (ref * ours).sum(axis=1)
    assert cos.min() > 0.99999
    # different texts give different embeddings (not a constant vector)
    assert float(ours[0] @ ours[4]) < 0.95


def test_profile_text_records_every_stage(text_pipe: Pipeline) -> None:
    res = profile(text_pipe, ProfileConfig(warmup=2, iterations=12), env={})
    assert res.stage_names == ("tokenize", "forward", "postprocess")
    assert [s.kind for s in res.stages] == ["preprocess", "forward", "postprocess"]
    fwd = np.median(res.stage("forward").array())
    tok = np.median(res.stage("tokenize").array())
    assert fwd > tok > 0  # a 22M-parameter encoder costs more than tokenising one text


def test_batching_and_padding_options() -> None:
    pipe = build_workload("text", WorkloadOptions(batch_size=4, params={"padding": "max_length", "max_length": "64"}))
    enc = pipe.stages[0].fn(pipe.source(0))
    assert tuple(enc["input_ids"].shape) == (4, 64)
    assert pipe.run_once(0).shape == (4, 384)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"max_length": "abc"}, "max_length must be an integer"),
        ({"max_length": "4"}, r"max_length must be in \[8, 512\]"),
        ({"attn": "flash"}, "attn must be sdpa or eager"),
        ({"bogus": "1"}, "unknown text param"),
    ],
)
def test_bad_params(params: dict[str, str], match: str) -> None:
    with pytest.raises(LatencyLabError, match=match):
        build_workload("text", WorkloadOptions(params=params))
