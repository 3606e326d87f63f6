#!/usr/bin/env python3
"""Conformance of prefix-router's Messages API path with the official `anthropic` Python SDK.

Usage: test_anthropic_sdk.py [ROUTER_BINARY]   (else $PREFIX_ROUTER, else target/debug/prefix-router)

Starts, on free loopback ports: 2 simulated vLLM backends (`prefix-router sim`, which serve
`/v1/messages` as vLLM does), the router in front of them, a second router with a small
--max-body-bytes and a third whose only backend is a closed port. Every check goes through the
SDK. Prints one line per check and 'N passed, N failed'; exits 1 if any check failed.
"""

import os
import sys
import tempfile
import time
import uuid

import anthropic

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
from test_openai_sdk import check, expect, filler, results  # noqa: E402

MODEL = "claude-sonnet-4-5"  # any name: the fleet serves one model


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PREFIX_ROUTER", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "debug", "prefix-router"))
    work = tempfile.mkdtemp(prefix="sdk-anthropic-")
    print(f"anthropic {anthropic.__version__}; router {binary}; logs in {work}", flush=True)
    sims = [procs.start_sim(binary, work, "sim", time_scale=50) for _ in range(2)]
    router = procs.start_router(binary, work, [s.url for s in sims])
    small = procs.start_router(binary, work, [s.url for s in sims], ["--max-body-bytes", "2048"])
    dead = procs.start_router(binary, work, [f"http://127.0.0.1:{procs.closed_port()}"], wait_healthy=False)

    def client(base=router.url, **kw):
        return anthropic.Anthropic(base_url=base, api_key="dummy", max_retries=0, timeout=30, **kw)

    c = client()
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=1f2e3;"},
              {"type": "text", "text": filler("anthropic-sdk", 6000)}]

    @check("messages.create non-streaming")
    def _():
        r = c.messages.create(model=MODEL, max_tokens=8, system=system,
                              messages=[{"role": "user", "content": "Say hi"}])
        expect(r.type == "message" and r.role == "assistant", f"{r.type} {r.role}")
        expect(r.content and r.content[0].type == "text" and r.content[0].text, f"content {r.content}")
        expect(r.stop_reason in ("max_tokens", "end_turn"), r.stop_reason)
        expect(r.usage.input_tokens > 0 and r.usage.output_tokens == 8, f"usage {r.usage}")
        return f"text={r.content[0].text!r} usage={r.usage.input_tokens}/{r.usage.output_tokens}"

    @check("messages.stream (text_stream, final message)")
    def _():
        with c.messages.stream(model=MODEL, max_tokens=12, system=system,
                               messages=[{"role": "user", "content": "Stream something"}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        expect(text, "no text in the stream")
        expect(final.usage.output_tokens == 12, f"final usage {final.usage}")
        return f"text={text!r} usage={final.usage}"

    @check("turn 2 of a Claude Code session is read from the cache (cache_read_input_tokens)")
    def _():
        session = str(uuid.uuid4())
        headers = {"X-Claude-Code-Session-Id": session}
        turn1 = [{"role": "user", "content": filler(f"turn-{session}", 3000)}]
        r1 = c.messages.create(model=MODEL, max_tokens=8, system=system, messages=turn1,
                               extra_headers=headers)
        turn2 = turn1 + [{"role": "assistant", "content": r1.content[0].text},
                         {"role": "user", "content": "go on"}]
        r2 = c.messages.create(model=MODEL, max_tokens=8, system=system, messages=turn2,
                               extra_headers=headers)
        read = r2.usage.cache_read_input_tokens or 0
        expect(read > 1000, f"turn 2 usage {r2.usage}")
        return f"turn 2: {read} read from the cache, {r2.usage.input_tokens} computed"

    @check("messages.count_tokens")
    def _():
        r = c.messages.count_tokens(model=MODEL, system=system,
                                    messages=[{"role": "user", "content": "count me"}])
        expect(r.input_tokens > 1000, f"{r}")
        return f"input_tokens={r.input_tokens}"

    @check("400 -> anthropic.BadRequestError in Anthropic's shape (empty messages)")
    def _():
        try:
            c.messages.create(model=MODEL, max_tokens=8, messages=[])
        except anthropic.BadRequestError as e:
            expect(e.status_code == 400, e.status_code)
            expect(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body)
            return f"{e.body['error']['message']!r}"
        raise AssertionError("no error raised")

    @check("413 -> anthropic.APIStatusError request_too_large (--max-body-bytes 2048)")
    def _():
        try:
            client(small.url).messages.create(model=MODEL, max_tokens=8,
                                              messages=[{"role": "user", "content": "x" * 4000}])
        except anthropic.APIStatusError as e:
            expect(e.status_code == 413 and e.body["error"]["type"] == "request_too_large", e.body)
            return f"{e.status_code} {e.body['error']['type']}"
        raise AssertionError("no error raised")

    @check("503 -> anthropic.APIStatusError overloaded_error (only backend is a closed port)")
    def _():
        try:
            client(dead.url).messages.create(model=MODEL, max_tokens=8,
                                             messages=[{"role": "user", "content": "anyone?"}])
        except anthropic.APIStatusError as e:
            expect(e.status_code == 503 and e.body["error"]["type"] == "overloaded_error", e.body)
            return f"{e.status_code} {e.body['error']['type']}"
        raise AssertionError("no error raised")

    failed = [r for r in results if not r[1]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    t = time.monotonic()
    try:
        code = main()
    finally:
        procs.cleanup()
    print(f"{time.monotonic() - t:.1f} s", flush=True)
    sys.exit(code)
