"""report on generative load results: the token section (percentiles with CIs, output tokens, goodput,
stall windows) and its two figures; absent for a load result without token metrics."""

from __future__ import annotations

import json
import re

from gen_synthetic import synthetic_gen_result
from latencylab.report.html import ReportInput, render_report
from latencylab.results import loaded


def _html(*results) -> str:  # type: ignore[no-untyped-def]
    docs = [loaded(json.loads(json.dumps(r.to_dict())), f"run{i}.json") for i, r in enumerate(results)]
    return render_report(ReportInput(tuple(docs)))


def test_token_section_with_percentiles_cis_and_figures() -> None:
    res = synthetic_gen_result(pauses=((8.0, 600.0),), slos=("ttft_p99=1s", "tpot_p99=50ms"), seed=4)
    html = _html(res)
    assert '<section id="tokens"><h2>Token latency (generative load)</h2>' in html
    section = html.split('<section id="tokens">')[1].split("</section>")[0]
    t = res.summary["tokens"]
    for name in ("TTFT (from intended send)", "TTFT (from actual send)", "TPOT", "ITL (every gap)", "E2E"):
        assert name in section
    # the ITL row carries p50 and its CI as the summary states them
    row = re.search(r"<td>ITL \(every gap\)</td>(.*?)</tr>", section)
    assert row is not None and f"{t['itl']['p50_ms']:.3g}" in row.group(1) and "[" in row.group(1)
    assert "tokens/s in aggregate" in section and "goodput" in section and "stall windows" in section
    assert section.count('<img alt="') == 2 and "figure not drawn" not in section


def test_no_token_section_without_token_metrics() -> None:
    res = synthetic_gen_result(seed=5)
    doc = json.loads(json.dumps(res.to_dict()))
    del doc["summary"]["tokens"]
    html = render_report(ReportInput((loaded(doc, "plain.json"),)))
    assert 'id="tokens"' not in html
