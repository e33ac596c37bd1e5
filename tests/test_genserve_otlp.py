"""``latencylab serve --otlp-endpoint URL``: the flag reaches both servers' configs, and the generative server's
spans arrive, over OTLP/HTTP, at an in-process receiver (protobuf decoded with the collector's own schema)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from genserve_servers import fake_service, post
from latencylab.cli import build_parser
from latencylab.genserve.server import config_from_args, serve_in_thread, tracer_provider_of


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP traces receiver on 127.0.0.1 (any free port); yields (endpoint, the requests received)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    got: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            got.append((self.path, self.headers.get("Content-Type"), req))
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", got
    finally:
        server.shutdown()
        server.server_close()


def test_the_gen_server_exports_its_spans_to_the_otlp_endpoint_given_on_the_command_line() -> None:
    with otlp_receiver() as (endpoint, got):
        args = build_parser().parse_args(["serve", "--model", "gen", "--otlp-endpoint", endpoint])
        cfg = config_from_args(args)
        assert cfg.otlp_endpoint == endpoint
        provider = tracer_provider_of(cfg)
        try:
            with serve_in_thread(fake_service(), tracer_provider=provider) as url:
                status, _, _ = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 3})
                assert status == 200
            assert provider.force_flush(10_000)
        finally:
            provider.shutdown()
    assert got and all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype, _ in got)
    spans, services = [], set()
    for _, _, req in got:
        for rs in req.resource_spans:
            services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            for ss in rs.scope_spans:
                spans += list(ss.spans)
    assert services == {"latencylab-genserve"}
    root = next(s for s in spans if s.name == "infer")
    kids = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_time_unix_nano)
    assert [k.name for k in kids] == ["queue", "prefill", "decode", "send"]
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["latencylab.completion_tokens"].int_value == 3


def test_the_oip_server_takes_the_same_flag() -> None:
    from latencylab.serve.frontend import config_from_args as oip_config

    url = "http://127.0.0.1:4318/v1/traces"
    args = build_parser().parse_args(["serve", "--model", "text", "--otlp-endpoint", url])
    assert oip_config(args).otlp_endpoint == url
    args = build_parser().parse_args(["serve", "--model", "text"])
    assert oip_config(args).otlp_endpoint is None  # tracing stays off unless asked


@pytest.mark.parametrize("bad", ["localhost:4318", "ftp://x/v1/traces", "http://"])
def test_a_bad_endpoint_is_one_line_and_exit_2(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--model", "gen", "--otlp-endpoint", bad])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "--otlp-endpoint" in err
