"""The `openai` Python package as the client of `latencylab serve --model gen` (on the fake engine): completions,
chat, streaming, the models list, errors mapped to the package's exception types, and the guard's label read
through the package's objects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from genserve_servers import fake_service
from latencylab.genserve.server import serve_in_thread

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with serve_in_thread(fake_service(), token="k3y") as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="k3y", max_retries=0, timeout=10)
        yield c
        c.close()


def test_models_list(client: Any) -> None:
    assert [m.id for m in client.models.list()] == ["gen"]


def test_completion(client: Any) -> None:
    r = client.completions.create(model="gen", prompt="hello", max_tokens=10)
    assert r.object == "text_completion" and r.choices[0].text == "abcd" and r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 4, 9)
    assert r.model_extra["latencylab"]["rung"] == "fp32"  # the guard's label, an extra field the client keeps


def test_chat_completion(client: Any) -> None:
    r = client.chat.completions.create(model="gen", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content == "abc" and r.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(client: Any) -> None:
    stream = client.chat.completions.create(
        model="gen", messages=[{"role": "user", "content": "hi"}], max_tokens=10, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "abcd"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_completion_stream(client: Any) -> None:
    chunks = list(client.completions.create(model="gen", prompt="x", max_tokens=2, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "ab" and chunks[-1].choices[0].finish_reason == "length"


def test_errors_map_to_the_packages_exception_types(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="gen", prompt="x", max_tokens=0)
    assert bad.value.status_code == 400 and "at least 1" in bad.value.message
    assert bad.value.body["param"] == "max_tokens"  # the body's "error" object, as OpenAI sends it
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        client.with_options(api_key="wrong").models.list()
