"""report and diagnose on ``optimize --workload gen`` results (kind ``optimize-gen``, issue 19).

The documents are the real search's (:func:`latencylab.optimize.gen_search.search`, written by
:func:`latencylab.optimize.gen_lab.result_doc`) on the toy Llama of test_gen_optimize.py, timed by its
FakeClock at a stated cost per forward: an FP32 baseline, an exact speculative candidate, INT8 dynamic
(cheaper) and weight-only (dearer), a deliberately unfaithful candidate (the cheapest of all), one whose build
fails and one skipped with why. Every expectation is read from the document itself.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

from latencylab.cli import main
from latencylab.diagnose.engine import diagnose_results
from latencylab.errors import LatencyLabError
from latencylab.optimize.gen_candidates import GenCandidate
from latencylab.optimize.gen_lab import GenLabConfig, result_doc
from latencylab.optimize.gen_search import GenBudget, search
from latencylab.results import loaded, parse, read_result
from latencylab.results.optimize_gen import OptimizeGenResult
from test_gen_optimize import Toy

CANDIDATES = (
    GenCandidate("fp32", "fp32", {"weights": "fp32", "threads": 1}),
    GenCandidate("spec-lookup-k4", "speculative", {"weights": "fp32", "threads": 1, "draft": "lookup", "k": 4},
                 exact=True),
    GenCandidate("int8-dynamic", "int8-dynamic", {"weights": "dynamic", "threads": 1}),
    GenCandidate("int8-weight", "int8-weight", {"weights": "weight", "threads": 1}),
    GenCandidate("noisy", "test", {"noise": 0.5}),  # 5x cheaper than FP32, and wrong
    GenCandidate("fp16", "test", {"weights": "fp32", "dtype": "fp16"}),  # build() refuses it: a failed candidate
    GenCandidate("kv-int8", "kv-dtype", {"kv": "int8"}, skip="not built: no INT8 KV cache here"),
)  # fmt: skip


def _gen_doc(budget: str, cands: tuple[GenCandidate, ...] = CANDIDATES, rounds: int = 2) -> dict[str, Any]:
    toy = Toy()
    res = search(toy.context(toy.subject), cands, GenBudget.parse(budget), tokens=6, rounds=rounds,
                 builder=toy.builder)  # fmt: skip
    doc = result_doc(GenLabConfig.quick(budget=budget, tokens=6, rounds=rounds), toy.subject, res)
    return json.loads(json.dumps(doc))  # as a file holds it (NaN included)


@pytest.fixture(scope="module")
def gen_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gen") / "optimize.json"
    path.write_text(json.dumps(_gen_doc("token_agreement>=0.5")))
    return path


def _section(html: str) -> str:
    return html.split('<section id="optimize-gen">')[1].split("</section>")[0]


def test_the_registry_reads_the_kind_into_frozen_typed_rows(gen_file: Path) -> None:
    import dataclasses

    doc = json.loads(gen_file.read_text())
    res = read_result(gen_file).result()
    assert isinstance(res, OptimizeGenResult) and res.kind == "optimize-gen" and res.schema_version == 1
    assert [r.name for r in res.rows] == [c["name"] for c in doc["candidates"]]
    assert res.chosen == doc["summary"]["chosen"] is not None and res.baseline == "fp32"
    for r, c in zip(res.rows, doc["candidates"], strict=True):
        assert r.status == c["status"] and r.tpot_ms == c.get("tpot_ms")
        assert r.speedup_tpot == (doc["summary"]["speedups"].get(r.name) or {}).get("tpot")
        assert r.token_agreement == (c.get("fidelity") or {}).get("token_agreement")
    assert res.row("kv-int8").status == "skipped" and not res.row("kv-int8").measured
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.rows[0].name = "x"  # type: ignore[misc]


def test_report_draws_the_section_every_candidate_and_one_png_plot(
    gen_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(gen_file.read_text())
    out = tmp_path / "r.html"
    assert main(["report", str(gen_file), "-o", str(out)]) == 0
    html = out.read_text()
    assert '<a href="#optimize-gen">Generative optimisation: TPOT vs fidelity</a>' in html
    sec = _section(html)
    assert "figure not drawn" not in sec
    imgs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)">', sec)
    assert len(imgs) == 1 and base64.b64decode(imgs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    rows = re.findall(r"<tr[^>]*><td>(.*?)</td>", sec.split("<table>")[-1])
    assert len(rows) == len(doc["candidates"])  # every candidate, measured or not, has its row
    chosen = doc["summary"]["chosen"]
    for c in doc["candidates"]:
        row = next(r for r in re.findall(r"<tr[^>]*>(.*?)</tr>", sec) if f"<td>{c['name']}" in r)
        assert html_escape(c["reason"]) in row  # in budget or why not / skipped, failed and why
        sp = (doc["summary"]["speedups"].get(c["name"]) or {}).get("tpot")
        assert (f"{sp:.2f}x" in row) if sp is not None else (c["status"] in row)
        if c.get("fidelity"):
            assert f"{c['fidelity']['token_agreement']:.3f}" in row
    assert f"<td>{chosen} (chosen)</td>" in sec and _section(html).count("OUTSIDE") == sum(
        c["status"] == "outside-budget" for c in doc["candidates"]
    )
    assert f"chosen: {chosen}" in sec and doc["summary"]["verdict"] in sec
    # the terminal summary: the verdict, the choice, every candidate
    text = capsys.readouterr().out
    assert doc["summary"]["verdict"] in text and f"chosen: {chosen}" in text and "wrote" in text
    assert all(c["name"] in text for c in doc["candidates"])


def test_the_plot_names_only_the_pareto_front_and_the_choice(gen_file: Path) -> None:
    from latencylab.report.figures.gen_pareto import fidelity_axis, gen_figure, gen_pareto_front

    assert gen_pareto_front([("a", 1.0, 0.0), ("b", 2.0, 0.1), ("c", 1.5, 0.2), ("d", 3.0, 0.1)]) == ["d", "a"]
    res = parse(json.loads(gen_file.read_text()))
    axis = fidelity_axis(res.budget)
    assert axis.metric == "token_agreement" and axis.bound == 0.5  # the budget's line: 1 - 0.5
    pts = [(r.name, r.speedup_tpot, loss) for r in res.rows if r.speedup_tpot and (loss := axis.loss(r)) is not None]
    fig, named = gen_figure(res)
    want = set(gen_pareto_front(pts)) | {res.chosen}
    assert set(named) == want and "int8-weight" not in named and "fp32" not in named  # both dominated
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert want <= labels and not ({r.name for r in res.rows} - want) & labels
    assert fidelity_axis("ppl_delta<=2%").metric == "ppl_delta" and fidelity_axis("ppl_delta<=2%").bound == 0.02


def test_diagnose_finds_the_faster_rejected_candidate_and_the_failed_build(
    gen_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(gen_file.read_text())
    res = parse(doc)
    bar = res.row(res.chosen).speedup_tpot
    faster = [r.name for r in res.rows if r.status == "outside-budget" and r.speedup_tpot > bar
              and r.ratio_ci_high < 1]  # fmt: skip
    assert faster == ["noisy"]  # the scenario: 5x FP32, twice the choice, with wrong answers
    fs = {f.rule: f for f in diagnose_results([loaded(doc, "gen.json")])}
    f = fs["gen-faster-rejected"]
    assert f.severity == "info" and f.details["rejected"] == faster and "token_agreement" in f.title
    assert fs["gen-not-measured"].details == {"failed": ["fp16"], "cut": []}  # kv-int8's skip is by design
    assert "gen-no-choice" not in fs and "gen-recipe-not-reproduced" not in fs
    low = [r.name for r in res.rows if r.acceptance is not None and r.acceptance < 0.5]
    assert ("gen-spec-acceptance-low" in fs) == bool(low)
    assert main(["diagnose", str(gen_file)]) == 0
    assert "(gen-faster-rejected)" in capsys.readouterr().out


def test_diagnose_without_a_choice_names_the_fastest_inside_and_the_faster_outside() -> None:
    cands = (CANDIDATES[0], CANDIDATES[1], CANDIDATES[4])  # FP32, exact speculation, the unfaithful one
    doc = _gen_doc("token_agreement>=0.95", cands, rounds=1)
    assert doc["summary"]["chosen"] is None  # the scenario: speculation is not significantly faster here
    fs = {f.rule: f for f in diagnose_results([loaded(doc, "nochoice.json")])}
    assert fs["gen-no-choice"].severity == "warning"
    assert any("spec-lookup-k4" in e.label for e in fs["gen-no-choice"].evidence)
    assert fs["gen-faster-rejected"].severity == "warning" and fs["gen-faster-rejected"].details["rejected"] == [
        "noisy"
    ]


def test_diagnose_low_acceptance_slow_first_token_and_an_unreproduced_recipe(gen_file: Path) -> None:
    doc = json.loads(gen_file.read_text())
    d = copy.deepcopy(doc)
    spec = next(c for c in d["candidates"] if c["name"] == "spec-lookup-k4")
    spec["acceptance"] = 0.2  # a draft the target mostly rejects, and no faster than FP32
    d["summary"]["speedups"]["spec-lookup-k4"]["tpot"] = 0.9
    chosen = d["summary"]["chosen"]
    d["summary"]["speedups"][chosen]["ttft"] = 0.5
    d["recipe"] = {"path": "recipe.json", "recorded": {"name": chosen, "speedup_tpot": 2.5},
                   "reproduced": {"name": chosen, "speedup_tpot": 0.95}, "forced": []}  # fmt: skip
    fs = {f.rule: f for f in diagnose_results([loaded(d, "edited.json")])}
    assert fs["gen-spec-acceptance-low"].severity == "warning" and "20%" in fs["gen-spec-acceptance-low"].title
    assert "0.50x" in fs["gen-choice-ttft-slower"].title
    assert "slower than FP32" in fs["gen-recipe-not-reproduced"].title
    assert not {"gen-choice-ttft-slower", "gen-recipe-not-reproduced"} & {
        f.rule for f in diagnose_results([loaded(doc, "gen.json")])
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("candidates"), "malformed optimize-gen result: missing candidates"),
        (lambda d: d["candidates"][1].pop("name"), "candidate 1 has no name"),
        (lambda d: d["candidates"][0].update(tpot_ms="fast"), "candidate 'fp32''s tpot_ms is 'fast', not a number"),
        (lambda d: d["summary"].update(chosen="nope"), "summary.chosen 'nope' is not a candidate"),
        (lambda d: d.update(schema_version=9), "unsupported schema_version 9"),
    ],
)
def test_a_malformed_gen_result_is_one_line_error(
    gen_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, message: str
) -> None:
    doc = json.loads(gen_file.read_text())
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r.html").exists()
    if "schema_version" not in doc or doc["schema_version"] == 1:
        with pytest.raises(LatencyLabError, match=re.escape(message)):
            read_result(bad).result()


def test_the_choice_names_the_recipe_the_search_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toy = Toy()
    toy.lab(GenLabConfig.quick(budget="token_agreement>=0", only=("int8-dynamic",), tokens=6), tmp_path)
    recipe = tmp_path / "recipe.json"
    assert recipe.is_file()  # the search chose int8-dynamic (test_gen_optimize's recipe round trip)
    assert main(["report", str(tmp_path / "optimize.json"), "-o", str(tmp_path / "r.html")]) == 0
    assert f"; recipe: {recipe}" in capsys.readouterr().out
    assert f"; recipe: {html_escape(str(recipe))}</p>" in _section((tmp_path / "r.html").read_text())
