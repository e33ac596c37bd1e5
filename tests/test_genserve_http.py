"""The generative server's HTTP layer on a real uvicorn, over the fake engine (no model): OpenAI and OIP routes,
streaming, stop strings, bad input as 4xx JSON, shedding, disconnects, and the load generator driving it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from genserve_servers import counts_of, events, fake_service, get, post, run_load
from latencylab.genserve.fake import FakeTokenizer
from latencylab.genserve.server import serve_in_thread

make_service = fake_service
PREFIX = "PFX:"  # the module server's engine caches this prompt prefix's K/V (the other tests' prompts miss it)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    svc = make_service()
    svc.engine.prefix = tuple(FakeTokenizer().encode(PREFIX))  # type: ignore[attr-defined]
    with serve_in_thread(svc) as u:
        yield u


def test_models_lists_the_served_model(url: str) -> None:
    status, body = get(url, "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["gen"]


def test_completions_whole_answer_with_usage(url: str) -> None:
    status, _, body = post(url, "/v1/completions", {"model": "gen", "prompt": "hello", "max_tokens": 10})
    obj = json.loads(body)
    assert status == 200 and obj["object"] == "text_completion"
    assert obj["choices"][0]["text"] == "abcd" and obj["choices"][0]["finish_reason"] == "stop"
    assert obj["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                            "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_prompt_tokens_the_prefix_cache_held_are_counted_in_usage_and_metrics(url: str) -> None:
    def cached_tokens() -> float:
        text = get(url, "/metrics")[1].decode()
        line = 'latencylab_gen_tokens_total{kind="prompt_cached",model="gen"} '
        return sum(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))

    before = cached_tokens()
    _, _, body = post(url, "/v1/completions", {"prompt": PREFIX + "hello", "max_tokens": 10})
    obj = json.loads(body)
    # the same answer as without a prefix cache (the fake's reply does not depend on it), 4 prompt tokens skipped
    assert obj["choices"][0]["text"] == "abcd"
    assert obj["usage"]["prompt_tokens"] == 9 and obj["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    _, _, body = post(url, "/v2/models/gen/generate", {"text_input": PREFIX + "hi", "parameters": {"max_tokens": 3}})
    assert json.loads(body)["cached_prompt_tokens"] == 4
    assert cached_tokens() == before + 8


def test_chat_stream_chunks_usage_and_done(url: str) -> None:
    req = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True,
           "stream_options": {"include_usage": True}}  # fmt: skip
    status, headers, body = post(url, "/v1/chat/completions", req)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    ev = events(body)
    assert ev[-1] == "[DONE]"
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = [e["choices"][0]["delta"].get("content") for e in ev[1:-3]]
    assert "".join(text) == "abcd" and all(text)  # a chunk per token (fewer only if the writer fell behind)
    assert ev[-3]["choices"][0]["finish_reason"] == "stop" and ev[-3]["choices"][0]["delta"] == {}
    assert ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 4
    assert all(e["object"] == "chat.completion.chunk" for e in ev[:-1])


def test_max_tokens_and_stop_strings(url: str) -> None:
    _, _, body = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    choice = json.loads(body)["choices"][0]
    assert choice["text"] == "ab" and choice["finish_reason"] == "length"
    _, _, body = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 10, "stop": ["cd", "zz"]})
    choice = json.loads(body)["choices"][0]
    assert choice["text"] == "ab" and choice["finish_reason"] == "stop"
    # streamed: the held-back "c" (a possible start of "cd") is never sent
    _, _, body = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 10, "stop": "cd", "stream": True})
    texts = "".join(e["choices"][0]["text"] for e in events(body)[:-1])
    assert texts == "ab"


def test_seeded_sampling_parameters_are_accepted(url: str) -> None:
    status, _, _ = post(url, "/v1/completions", {"prompt": "x", "temperature": 0.7, "top_p": 0.9, "seed": 3})
    assert status == 200


def test_oip_generate_and_generate_stream(url: str) -> None:
    status, _, body = post(url, "/v2/models/gen/generate", {"text_input": "hi", "parameters": {"max_tokens": 3}})
    obj = json.loads(body)
    assert status == 200 and obj["text_output"] == "abc" and obj["finish_reason"] == "length"
    status, _, body = post(url, "/v2/models/gen/generate_stream", {"text_input": "hi", "parameters": {"stream": True}})
    ev = events(body)
    assert status == 200 and "".join(e["text_output"] for e in ev) == "abcd" and ev[-1]["text_output"] == ""
    assert ev[-1]["finish_reason"] == "stop"
    status, _, body = post(url, "/v2/models/nope/generate", {"text_input": "hi"})
    assert status == 404 and "unknown model" in json.loads(body)["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", {"prompt": "y" * 250}, 400, "context window of 200"),
        ("/v1/completions", {"prompt": "y" * 150, "max_tokens": 60}, 400, "context window of 200"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "at least 1"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "at least 1"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 101}, 400, "limit of 100"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400, "whole number"),
        ("/v1/completions", {"prompt": "x", "max_token": 5}, 400, "unknown field 'max_token'"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n must be 1"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "unknown model"),
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", [1, 2], 400, "JSON object"),
        ("/v1/chat/completions", {"messages": []}, 400, "non-empty list"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "content must be a string"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be one of"),
        ("/v1/chat/completions", {"messages": ["hi"]}, 400, "messages[0]"),
        ("/v2/models/gen/generate", {"text_input": "x", "parameters": {"max_tokens": 0}}, 400, "at least 1"),
        ("/v2/models/gen/generate", {"text_input": "x", "parameters": {"bogus": 1}}, 400, "unknown field 'bogus'"),
    ],
)
def test_bad_input_is_a_4xx_json_answer(url: str, path: str, body: Any, status: int, needle: str) -> None:
    got, headers, raw = post(url, path, body)
    assert got == status and headers["content-type"] == "application/json"
    obj = json.loads(raw)
    message = obj["error"]["message"] if isinstance(obj["error"], dict) else obj["error"]
    assert needle in message


def test_a_body_over_the_size_limit_is_413_before_it_is_read(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2000000\r\n\r\n{")  # fmt: skip
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    assert got.startswith(b"HTTP/1.1 413") and b"exceeds the limit of 1048576 bytes" in got


def test_metrics_expose_token_times_and_batch_state(url: str) -> None:
    post(url, "/v1/completions", {"prompt": "x", "max_tokens": 5})
    status, body = get(url, "/metrics")
    text = body.decode()
    assert status == 200
    for name in ("latencylab_gen_ttft_seconds_bucket", "latencylab_gen_tpot_seconds", "latencylab_gen_itl_seconds",
                 "latencylab_gen_queue_seconds", "latencylab_gen_prefill_step_seconds",
                 "latencylab_gen_decode_step_seconds", "latencylab_gen_running_seqs", "latencylab_gen_waiting_seqs",
                 "latencylab_gen_output_tokens_per_second", "latencylab_gen_kv_usage_ratio"):  # fmt: skip
        assert name in text, name
    # no request was admitted near its deadline: admission trusts its forecast as it is
    assert 'latencylab_gen_admission_forecast_scale{model="gen"} 1.0' in text


def test_bearer_token_is_required_when_set() -> None:
    with serve_in_thread(make_service(), token="s3cret") as u:
        assert post(u, "/v1/completions", {"prompt": "x"})[0] == 401
        status, _, _ = post(u, "/v1/completions", {"prompt": "x"}, {"Authorization": "Bearer s3cret"})
        assert status == 200


def test_admission_sheds_with_503_and_retry_after() -> None:
    svc = make_service(ttft_slo_s=0.001)
    svc.sched.costs.prefill_per_token_s = 0.01  # 10 ms a token: any prompt misses a 1-ms TTFT deadline
    with serve_in_thread(svc) as u:
        status, headers, body = post(u, "/v1/completions", {"prompt": "hello"})
        code, raw = get(u, "/v2/models/gen/guard")
    assert code == 200
    snap = json.loads(raw)
    assert status == 503 and int(headers["retry-after"]) >= 1 and "overloaded (deadline)" in body.decode()
    # the refusal, with what decided it, in the guard route's admission block
    (shed,) = snap["admission"]["recent_sheds"]
    assert shed["forecast_s"] * shed["scale"] > shed["allowed_s"] and shed["prefill_ms_per_token"] == 10.0
    assert snap["admission"]["forecast_scale"] == 1.0 and shed["age_s"] >= 0


def test_a_client_that_disconnects_frees_its_slot_within_a_step() -> None:
    svc = make_service(reply=10_000, max_tokens_limit=5000, context_window=6000)
    with serve_in_thread(svc) as u:
        host, port = u.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "x", "max_tokens": 5000, "stream": True}).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        got = b""
        sock.settimeout(10)
        while b"data: " not in got:  # the headers may come in a packet of their own, before the first token
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        assert len(svc.sched.running) == 1
        seq = svc.sched.running[0]
        sock.close()
        give_up = time.monotonic() + 2
        while svc.sched.running and time.monotonic() < give_up:
            time.sleep(0.005)
        assert not svc.sched.running and seq.finish_reason == "cancelled"
        # freed at the start of the first step after the server saw the disconnect: at most the token of the step
        # in progress then was chosen after it
        assert seq.cancel_ns is not None and seq.finished_ns is not None and seq.finished_ns >= seq.cancel_ns
        assert sum(1 for t in seq.token_ns if t > seq.cancel_ns) <= 1
        assert len(seq.tokens) < 5000
        metrics = get(u, "/metrics")[1].decode()
        assert 'latencylab_gen_cancel_to_free_seconds_count{model="' in metrics
        after = [ln for ln in metrics.splitlines() if ln.startswith("latencylab_gen_tokens_after_cancel_bucket")]
        assert any('le="1.0"' in ln and ln.endswith(" 1.0") for ln in after), after


def test_a_slow_reader_does_not_hold_up_the_batch() -> None:
    n = 2000  # ~300 KB of SSE: more than the socket buffers hold while the client reads nothing
    svc = make_service(reply=n + 1, max_tokens_limit=n, context_window=4 * n)
    with serve_in_thread(svc) as u:
        host, port = u.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "x", "max_tokens": n, "stream": True}).encode()
        slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect((host, int(port)))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        time.sleep(0.05)  # the slow client reads nothing while another request is served
        t0 = time.monotonic()
        status, _, raw = post(u, "/v1/completions", {"prompt": "y", "max_tokens": 300})
        fast_s = time.monotonic() - t0
        assert status == 200 and len(json.loads(raw)["choices"][0]["text"]) == 300
        assert fast_s < 5
        # the unread stream kept generating to its end without its client reading
        give_up = time.monotonic() + 20
        while svc.sched.running and time.monotonic() < give_up:
            time.sleep(0.01)
        assert not svc.sched.running
        slow.settimeout(10)
        got = b""
        while b"[DONE]" not in got:
            chunk = slow.recv(65536)
            if not chunk:
                break
            got += chunk
        slow.close()
        assert b"[DONE]" in got and b'"finish_reason": "length"' in got


def test_the_load_generator_drives_it_unchanged(tmp_path: Any) -> None:
    # the workload's prompts run to ~900 tokens: a context window that holds them (the shared fixture's is 200)
    with serve_in_thread(make_service(context_window=4096)) as url:
        for api in ("chat", "completions", "generate_stream"):
            _drive(url, api, tmp_path)


def _drive(url: str, api: str, tmp_path: Any) -> None:
    result = run_load(url, tmp_path / f"{api}.json", "--api", api, "--rate", "20", "--duration", "1",
                      "--max-tokens", "8")  # fmt: skip
    c = counts_of(result)
    assert c["sent"] > 5 and c["ok"] == c["sent"], (api, c)
    assert "ttft" in json.dumps(result).lower()
