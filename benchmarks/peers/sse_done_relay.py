"""A loopback relay that ends an OpenAI Server-Sent Events stream with ``data: [DONE]`` when the server behind it
does not.

``transformers serve`` (transformers 5.24) ends its ``/v1/chat/completions`` stream after the chunk with
``finish_reason`` and ``usage`` and never sends ``data: [DONE]``, which the OpenAI API sends last and
``latencylab load`` requires (a stream without it counts as an error: "stream ended without [DONE]"). This
relay passes every request and every byte of the answer through unchanged, as it arrives, and only appends
``data: [DONE]`` to an event stream that ended without one, so that the same generator can measure it.
benchmarks/gen_serve_vs_peers.py runs it on the generator's core; it adds one loopback hop per request.

    python benchmarks/peers/sse_done_relay.py --upstream http://127.0.0.1:8000 --port 8001
"""

from __future__ import annotations

import argparse
import socket

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

DONE = b"data: [DONE]\n\n"


def build_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=1 << 20)

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app["session"] = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None))
        yield
        await app["session"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        session: ClientSession = request.app["session"]
        async with session.request(
            request.method, upstream + request.path_qs, data=body or None, headers=headers
        ) as up:
            ctype = up.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                return web.Response(status=up.status, body=await up.read(), headers={"Content-Type": ctype})
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            tail = b""
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
                tail = (tail + chunk)[-64:]
            if b"[DONE]" not in tail:
                await resp.write(DONE)
            await resp.write_eof()
            return resp

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"listening http://{args.host}:{sock.getsockname()[1]}", flush=True)
    web.run_app(build_app(args.upstream.rstrip("/")), sock=sock, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
