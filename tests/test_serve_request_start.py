"""X-Request-Start parsing: every unit it accepts, and every value it must refuse (serve/request_start.py)."""

from __future__ import annotations

import pytest

from latencylab.serve.request_start import parse_unix_ns, request_age_ns
from latencylab.serve.types import ProtocolError

NOW_NS = 1_764_500_000_123_456_789  # 2025-11-30, a unix time in ns


@pytest.mark.parametrize(
    ("text", "unix_ns"),
    [
        ("t=1764500000.123456", 1_764_500_000_123_456_000),  # NGINX t=${msec} (s with a fraction), more digits
        ("t=1764500000.123", 1_764_500_000_123_000_000),
        ("t=1764500000", 1_764_500_000_000_000_000),  # whole seconds
        ("t=1764500000123", 1_764_500_000_123_000_000),  # Heroku: ms
        ("t=1764500000123456", 1_764_500_000_123_456_000),  # µs (latencylab load)
        ("t=1764500000123.5", 1_764_500_000_123_500_000),  # ms with a fraction
        ("1764500000123456", 1_764_500_000_123_456_000),  # bare number
        ("  T=1764500000.5 ", 1_764_500_000_500_000_000),
        ("t=1764500000.123456789", 1_764_500_000_123_456_789),  # ns resolution in the fraction
    ],
)
def test_units_are_told_apart_by_magnitude(text: str, unix_ns: int) -> None:
    assert parse_unix_ns(text) == unix_ns


@pytest.mark.parametrize(
    "text",
    ["", "t=", "soon", "t=abc", "t=-1764500000", "t=1.7645e9", "t=NaN", "t=inf", "t=1764500000.1.2",
     "t=1764500000,5", "t=1764500000123456789", "t = 1764500000", "D=1764500000"],
)  # fmt: skip
def test_garbage_is_a_protocol_error_naming_the_header(text: str) -> None:
    with pytest.raises(ProtocolError, match="X-Request-Start") as exc:
        parse_unix_ns(text)
    assert exc.value.status == 400


def test_age_is_now_minus_the_stamp_and_small_skew_is_clamped_to_zero() -> None:
    assert request_age_ns("t=1764500000073456", NOW_NS) == 50_000_789  # 50 ms ago (µs stamp)
    assert request_age_ns("t=1764500000.073456789", NOW_NS) == 50_000_000
    assert request_age_ns(str((NOW_NS - 3_599 * 10**9) // 10**6), NOW_NS) == 3_599 * 10**9 + 456_789  # 1 h - 1 s
    assert request_age_ns(f"t={(NOW_NS + 900_000_000) // 1000}", NOW_NS) == 0  # 0.9 s ahead: skew, age 0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"t={(NOW_NS + 2 * 10**9) // 1000}", "in the future"),  # 2 s ahead
        (f"t={(NOW_NS - 3_601 * 10**9) // 10**6}", "old"),  # just over 1 h old
        ("t=5", "old"),  # 1970: a duration or a wrong unit, not a start time
        ("t=99999999999", "in the future"),  # seconds in the year 5138
    ],
)
def test_absurd_times_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment) as exc:
        request_age_ns(text, NOW_NS)
    assert "X-Request-Start" in str(exc.value) and exc.value.status == 400


def test_cli_flags_reach_the_configs() -> None:
    from latencylab.cli import build_parser
    from latencylab.serve.frontend import config_from_args

    parser = build_parser()
    assert config_from_args(parser.parse_args(["serve", "--model", "vision"])).trust_request_start is True
    off = parser.parse_args(["serve", "--model", "vision", "--no-trust-request-start"])
    assert config_from_args(off).trust_request_start is False
    load = parser.parse_args(["load", "--url", "http://127.0.0.1:1", "--model", "m", "--request-start-header"])
    assert load.request_start_header is True
    assert parser.parse_args(["load", "--url", "http://127.0.0.1:1", "--model", "m"]).request_start_header is False


def test_switch_interval_setting() -> None:
    import sys

    from latencylab.errors import LatencyLabError
    from latencylab.serve.config import parse_config
    from latencylab.serve.frontend import apply_process_settings

    models = [{"name": "vision", "ladder": ["fp32"]}]
    cfg = parse_config({"server": {"switch_interval_ms": 0.25}, "models": models})
    before = sys.getswitchinterval()
    try:
        apply_process_settings(cfg)
        assert sys.getswitchinterval() == pytest.approx(0.00025)
        apply_process_settings(parse_config({"models": models}))
        assert sys.getswitchinterval() == pytest.approx(0.0005)  # the server's default, not CPython's 5 ms
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(LatencyLabError, match="switch_interval_ms must be in"):
        parse_config({"server": {"switch_interval_ms": 0}, "models": models})


def test_admission_slack_setting() -> None:
    from latencylab.errors import LatencyLabError
    from latencylab.serve.config import parse_config

    cfg = parse_config({"models": [{"name": "vision", "ladder": ["fp32"], "admission_slack": "off"}]})
    assert cfg.models[0].admission_slack == "off"
    assert parse_config({"models": [{"name": "vision", "ladder": ["fp32"]}]}).models[0].admission_slack == "boundary"
    with pytest.raises(LatencyLabError, match="admission_slack must be boundary or off"):
        parse_config({"models": [{"name": "vision", "ladder": ["fp32"], "admission_slack": "tail"}]})
    with pytest.raises(LatencyLabError, match="preprocess_threads must be >= 0"):
        parse_config({"server": {"preprocess_threads": -1}, "models": [{"name": "vision", "ladder": ["fp32"]}]})
