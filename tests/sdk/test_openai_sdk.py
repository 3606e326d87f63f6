#!/usr/bin/env python3
"""Conformance of prefix-router with the official `openai` Python SDK.

Usage: test_openai_sdk.py [ROUTER_BINARY]   (else $PREFIX_ROUTER, else target/debug/prefix-router)

Starts, on free loopback ports: 2 simulated vLLM backends (`prefix-router sim`), the router in
front of them, a second router with a small --max-body-bytes, a third whose only backend is a
closed port, a fourth in front of a misbehaving raw-socket backend (fake_backend.py). Every
check goes through the SDK (sync client; one async). Prints one line per check and
'N passed, N failed'; exits 1 if any check failed. Every process started is killed on exit.
"""

import asyncio
import os
import sys
import tempfile
import time
import traceback
import uuid

import openai

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
from fake_backend import FakeBackend  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEADLINE_S = 240  # the whole run; each request also has its own timeout

results = []  # (name, ok, detail)
known = []  # (name, detail): known router bugs, reported but not failing (STRICT=1 makes them fail)


def check(name):
    def wrap(fn):
        def run():
            t = time.monotonic()
            try:
                detail = fn() or ""
                results.append((name, True, detail))
                print(f"PASS {name} ({time.monotonic() - t:.1f}s) {detail}", flush=True)
            except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
                msg = f"{type(e).__name__}: {e}"
                if not isinstance(e, AssertionError):
                    msg += "\n" + "".join(traceback.format_exception(e)[-4:])
                results.append((name, False, msg))
                print(f"FAIL {name}: {msg}", flush=True)
        run()  # a check runs where it is defined
        return fn
    return wrap


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def filler(tag, n_chars):
    """Deterministic prose of about n_chars, unique to `tag` from its first bytes."""
    words = ("router prefix cache backend token session prompt stream latency request tool "
             "answer context budget shard tree evict health retry").split()
    out, i = [f"[{tag}] You are a careful assistant. Rules follow."], 0
    while sum(len(w) + 1 for w in out) < n_chars:
        out.append(words[(i * 7 + len(tag)) % len(words)] + ("." if i % 11 == 10 else ""))
        i += 1
    return " ".join(out)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PREFIX_ROUTER", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "debug", "prefix-router"))
    if not os.access(binary, os.X_OK):
        print(f"router binary not executable: {binary}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="sdk-conformance-")
    t0 = time.monotonic()
    print(f"openai {openai.__version__}; router {binary}; logs in {work}", flush=True)

    sims = [procs.start_sim(binary, work, "sim", time_scale=50) for _ in range(2)]
    router = procs.start_router(binary, work, [s.url for s in sims])
    small = procs.start_router(binary, work, [s.url for s in sims], ["--max-body-bytes", "2048"])
    dead_port = procs.closed_port()
    dead = procs.start_router(binary, work, [f"http://127.0.0.1:{dead_port}"], wait_healthy=False)
    fake = FakeBackend()
    faulty = procs.start_router(binary, work, [fake.url])

    def client(base=router.url + "/v1", **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.OpenAI(base_url=base, api_key="test-key", **kw)

    c = client()
    instances = {s.instance for s in sims}

    @check("models.list")
    def _():
        ids = [m.id for m in c.models.list()]
        expect(MODEL in ids, f"{MODEL} not in {ids}")
        return f"ids={ids}"

    @check("chat.completions non-streaming")
    def _():
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8)
        expect(r.object == "chat.completion", r.object)
        expect(r.choices and r.choices[0].message.content, f"empty content: {r}")
        expect(r.choices[0].finish_reason in ("length", "stop"), r.choices[0].finish_reason)
        expect(r.usage and r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"usage {r.usage}")
        expect(r.system_fingerprint in instances, f"fingerprint {r.system_fingerprint} not one of {instances}")
        return f"content={r.choices[0].message.content!r} usage=({r.usage.prompt_tokens},{r.usage.completion_tokens})"

    @check("chat.completions streaming with include_usage")
    def _():
        chunks = list(c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Stream something"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True}))
        expect(len(chunks) >= 3, f"only {len(chunks)} chunks")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        expect(text, "no content in the stream")
        last = chunks[-1]
        expect(last.usage is not None and last.usage.completion_tokens == 12,
               f"last chunk usage {last.usage}")
        expect(last.choices == [], f"usage chunk has choices {last.choices}")
        expect(all(ch.usage is None for ch in chunks[:-1]), "usage before the last chunk")
        expect(any(ch.choices and ch.choices[0].finish_reason for ch in chunks), "no finish_reason")
        return f"{len(chunks)} chunks, text={text!r}, usage={last.usage.prompt_tokens}/{last.usage.completion_tokens}"

    @check("chat.completions streaming without stream_options")
    def _():
        chunks = list(c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Stream without usage"}], max_tokens=5, stream=True))
        content = [ch for ch in chunks if ch.choices]
        expect(content and all(ch.usage is None for ch in content), "usage in a content chunk")
        expect("".join(ch.choices[0].delta.content or "" for ch in content), "no content")
        # vLLM sends the usage chunk only with include_usage; the sim always does (sim, not router).
        extra = len(chunks) - len(content)
        return f"{len(chunks)} chunks" + (f" (INFO: the sim sent {extra} usage chunk(s) without include_usage)"
                                           if extra else "")

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

    @check("chat.completions with tools (definitions, assistant tool_calls, tool result)")
    def _():
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                      tools=tools, tool_choice="auto", max_tokens=8)
        expect(r.choices[0].message is not None, "no message")
        expect(r.usage.prompt_tokens > 20, f"tool definitions not in the prompt? prompt_tokens={r.usage.prompt_tokens}")
        follow = c.chat.completions.create(model=MODEL, tools=tools, max_tokens=8, messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'}])
        expect(follow.choices[0].message.content, "empty answer after the tool result")
        chunks = list(c.chat.completions.create(model=MODEL, tools=tools, max_tokens=4, stream=True,
                                                messages=[{"role": "user", "content": "Weather in Rome?"}]))
        expect(chunks, "no chunks with tools")
        return f"prompt_tokens {r.usage.prompt_tokens} -> {follow.usage.prompt_tokens} with tool call + result"

    @check("completions (text prompt, token-id prompt, streaming)")
    def _():
        r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
        expect(r.object == "text_completion" and r.choices[0].text, f"{r}")
        expect(r.usage.completion_tokens == 6, f"usage {r.usage}")
        r2 = c.completions.create(model=MODEL, prompt=[101, 2023, 2003, 1037], max_tokens=3)
        expect(r2.choices[0].text, f"{r2}")
        chunks = list(c.completions.create(model=MODEL, prompt="Stream a story", max_tokens=5, stream=True,
                                           stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        expect(text and chunks[-1].usage is not None, f"text={text!r} last usage={chunks[-1].usage}")
        return f"text={r.choices[0].text!r}, stream {len(chunks)} chunks"

    @check("responses non-streaming")
    def _():
        r = c.responses.create(model=MODEL, instructions="Be brief.", input="What is a router?", max_output_tokens=8)
        expect(r.status == "completed", r.status)
        expect(r.output_text, f"empty output_text: {r}")
        expect(r.usage and r.usage.input_tokens > 0 and r.usage.output_tokens == 8, f"usage {r.usage}")
        return f"output_text={r.output_text!r}"

    @check("responses streaming")
    def _():
        events = list(c.responses.create(model=MODEL, input=[{"role": "user", "content": "Stream please"}],
                                         max_output_tokens=6, stream=True))
        types = [e.type for e in events]
        expect(types[0] == "response.created", types)
        expect(types[-1] == "response.completed", types)
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        done = events[-1].response
        expect(deltas and deltas == done.output_text, f"deltas {deltas!r} vs final {done.output_text!r}")
        expect(done.usage and done.usage.output_tokens == 6, f"usage {done.usage}")
        with c.responses.stream(model=MODEL, input="Helper stream", max_output_tokens=4) as s:
            final = s.get_final_response()
        expect(final.output_text, "responses.stream helper: empty output")
        return f"{len(events)} events, text={deltas!r}"

    def conversation(tag, stream, extra_headers=None):
        """Two turns sharing a ~9000-character prefix; returns per turn (prompt, cached, backend)."""
        system = filler(tag, 9000)
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"{tag}: first question"}]
        turns = []
        for turn in (1, 2):
            kw = dict(model=MODEL, messages=msgs, max_tokens=16, extra_headers=extra_headers or {})
            if stream:
                raw = c.chat.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **kw)
                chunks = list(raw.parse())
                usage, fp = chunks[-1].usage, chunks[0].system_fingerprint
                answer = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            else:
                raw = c.chat.completions.with_raw_response.create(**kw)
                r = raw.parse()
                usage, fp, answer = r.usage, r.system_fingerprint, r.choices[0].message.content
            header = raw.headers.get("x-sim-instance")
            expect(header == fp, f"x-sim-instance {header} != system_fingerprint {fp}")
            expect(usage.prompt_tokens_details is not None, f"no prompt_tokens_details in {usage}")
            turns.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, header))
            msgs = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": f"{tag}: second question"}]
        return turns

    def check_cached(turns, tag):
        (p1, c1, b1), (p2, c2, b2) = turns
        expect(c1 < p1 // 4, f"turn 1 should be cold: cached {c1} of {p1}")
        expect(c2 > c1, f"cached_tokens did not rise: turn 1 {c1}, turn 2 {c2}")
        expect(c2 >= 0.8 * p1 - 32, f"turn 2 cached {c2} < 80% of turn 1's {p1} prompt tokens (shared prefix)")
        expect(c2 <= p2, f"cached {c2} > prompt {p2}")
        expect(b1 == b2, f"turns on different backends {b1}, {b2} (prefix routing should keep them together)")
        return f"{tag}: turn1 {c1}/{p1} cached, turn2 {c2}/{p2} cached, backend {b1}"

    @check("cached_tokens rises on turn 2 (non-streaming)")
    def _():
        return check_cached(conversation(uuid.uuid4().hex[:12], stream=False), "non-stream")

    @check("cached_tokens rises on turn 2 (streaming, usage in last chunk)")
    def _():
        return check_cached(conversation(uuid.uuid4().hex[:12], stream=True), "stream")

    @check("cached_tokens on the responses API (input_tokens_details)")
    def _():
        tag = uuid.uuid4().hex[:12]
        instr = filler(tag, 9000)
        r1 = c.responses.create(model=MODEL, instructions=instr, input=f"{tag} q1", max_output_tokens=8)
        r2 = c.responses.create(model=MODEL, instructions=instr, max_output_tokens=8, input=[
            {"role": "user", "content": f"{tag} q1"}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": f"{tag} q2"}])
        c1, c2 = r1.usage.input_tokens_details.cached_tokens, r2.usage.input_tokens_details.cached_tokens
        expect(c2 > c1 and c2 >= 0.8 * r1.usage.input_tokens - 32,
               f"responses cached {c1} -> {c2} of {r1.usage.input_tokens}/{r2.usage.input_tokens}")
        return f"turn1 {c1}/{r1.usage.input_tokens}, turn2 {c2}/{r2.usage.input_tokens}"

    @check("x-session-id via extra_headers keeps a session on one backend")
    def _():
        sessions, seen = [], set()
        for i in range(6):
            sid = f"sess-{uuid.uuid4().hex[:8]}"
            # Turn 2 shares no text with turn 1: only the session header can keep it there.
            backs = []
            for turn in (1, 2):
                raw = c.chat.completions.with_raw_response.create(
                    model=MODEL, max_tokens=4, extra_headers={"x-session-id": sid},
                    messages=[{"role": "user", "content": f"{uuid.uuid4().hex} unrelated turn {turn}"}])
                r = raw.parse()
                expect(raw.headers.get("x-sim-instance") == r.system_fingerprint, "header/fingerprint mismatch")
                backs.append(r.system_fingerprint)
            expect(backs[0] == backs[1], f"session {sid}: turn 1 on {backs[0]}, turn 2 on {backs[1]}")
            sessions.append(backs[0])
            seen.add(backs[0])
        turns = conversation(uuid.uuid4().hex[:12], stream=True, extra_headers={"x-session-id": "conv-session"})
        expect(turns[0][2] == turns[1][2], f"2-turn conversation with session split: {turns}")
        m = procs.metrics(router)
        # kv_aware (the default) keeps its sessions in its conversation table.
        n_sessions = procs.metric_sum(m, "prefix_router_table_entries")
        expect(n_sessions >= 7, f"prefix_router_table_entries = {n_sessions}, expected >= 7")
        return f"6 sessions on {sessions}; conversation on {turns[0][2]}; table entries={n_sessions:.0f}"

    @check("async client streaming")
    def _():
        async def go():
            ac = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="k", max_retries=0, timeout=30)
            try:
                s = await ac.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "async"}],
                                                     max_tokens=5, stream=True, stream_options={"include_usage": True})
                return [ch async for ch in s]
            finally:
                await ac.close()
        chunks = asyncio.run(asyncio.wait_for(go(), 30))
        expect(chunks and chunks[-1].usage is not None, f"{len(chunks)} chunks, last usage {chunks[-1].usage if chunks else None}")
        return f"{len(chunks)} chunks"

    def expect_error(call, cls, status, message_part, code=None):
        try:
            call()
        except cls as e:
            expect(e.status_code == status, f"status {e.status_code}, expected {status}")
            expect(message_part in e.message, f"message {e.message!r} lacks {message_part!r}")
            expect(isinstance(e.body, dict) and "message" in e.body and "type" in e.body and "code" in e.body,
                   f"body not OpenAI-shaped: {e.body!r}")
            if code is not None:
                expect(e.code == code, f"code {e.code!r}, expected {code!r}")
            return f"{type(e).__name__} {e.status_code} code={e.code!r} message={e.body['message']!r}"
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"expected {cls.__name__} {status}, got {type(e).__name__}: {e}") from e
        raise AssertionError(f"expected {cls.__name__} {status}, the call succeeded")

    @check("400 -> openai.BadRequestError (messages not a list, empty, items not objects)")
    def _():
        out = [expect_error(lambda: c.chat.completions.create(model=MODEL, messages="hello", max_tokens=2),
                            openai.BadRequestError, 400, "`messages` must be an array", "invalid_body")]
        out.append(expect_error(lambda: c.chat.completions.create(model=MODEL, messages=[], max_tokens=2),
                                openai.BadRequestError, 400, "must not be empty", "invalid_body"))
        out.append(expect_error(lambda: c.chat.completions.create(model=MODEL, messages=[1, 2], max_tokens=2),
                                openai.BadRequestError, 400, "must be an object", "invalid_body"))
        return "; ".join(out)

    @check("404 -> openai.NotFoundError (admin paths refused on the data plane)")
    def _():
        root = client(router.url)  # base_url without /v1: the SDK's generic verbs reach /metrics, /stats
        out = [expect_error(lambda: root.get("/metrics", cast_to=object), openai.NotFoundError, 404,
                            "/metrics is not served here", "not_found")]
        out.append(expect_error(lambda: root.post("/stats", body={}, cast_to=object), openai.NotFoundError, 404,
                                "/stats is not served here", "not_found"))
        out.append(expect_error(lambda: client(router.url + "/metrics").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]), openai.NotFoundError, 404,
            "/metrics/chat/completions"))
        return "; ".join(out) + " (the last one is the backend's 404, forwarded)"

    @check("413 -> openai.APIStatusError 413 (--max-body-bytes 2048)")
    def _():
        sc = client(small.url + "/v1")
        ok = sc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "small"}], max_tokens=2)
        expect(ok.choices, "small request refused")
        return expect_error(lambda: sc.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 5000}], max_tokens=2),
            openai.APIStatusError, 413, "")

    @check("503 -> openai.InternalServerError 503 (only backend is a closed port)")
    def _():
        time.sleep(3)  # a few health-check intervals (1 s)
        w = procs.workers(dead)
        expect(w and not any(x.get("healthy") for x in w), f"dead backend reported healthy: {w}")
        dc = client(dead.url + "/v1")
        a = expect_error(lambda: dc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}]),
                         openai.InternalServerError, 503, "")
        b = expect_error(lambda: dc.models.list(), openai.InternalServerError, 503, "")
        return f"chat: {a}; models: {b}"

    @check("502 -> openai.InternalServerError 502 (backend closes without answering)")
    def _():
        procs.wait_router_healthy(faulty)
        fc = client(faulty.url + "/v1")
        return expect_error(lambda: fc.chat.completions.create(
            model="close-no-response", messages=[{"role": "user", "content": "x"}]), openai.InternalServerError, 502, "")

    def cut_stream(model, make_stream):
        """Iterates the SDK stream from the faulty router; returns (items seen, exception)."""
        procs.wait_router_healthy(faulty)  # a cut counts as a passive failure; be independent of earlier cases
        fc = client(faulty.url + "/v1", timeout=15)
        items, err = [], None
        try:
            for item in make_stream(fc, model):
                items.append(item)
        except Exception as e:  # noqa: BLE001
            err = e
        return items, err

    def chat_stream(fc, model):
        return fc.chat.completions.create(model=model, messages=[{"role": "user", "content": "cut me"}],
                                          stream=True, stream_options={"include_usage": True})

    def describe(err):
        chain, e = [], err
        while e is not None:
            chain.append(f"{type(e).__module__}.{type(e).__name__}({str(e)[:90]!r})")
            e = e.__cause__ or e.__context__
        return " <- ".join(chain)

    def cut_case(model, make_stream=chat_stream, want_partial=True):
        items, err = cut_stream(model, make_stream)
        if err is None:
            raise AssertionError(f"ROUTER BUG? stream ended cleanly after {len(items)} items, no exception: "
                                 f"the client got a silently short answer ({items[-1] if items else 'nothing'})")
        expect(isinstance(err, openai.APIError), f"not an openai.APIError: {describe(err)}")
        if want_partial:
            expect(len(items) >= 1, f"no chunk arrived before the error: {describe(err)}")
        return f"{len(items)} items then {describe(err)}"

    @check("SSE cut (chunked, FIN after 2 chunks) -> SDK exception, not a clean end")
    def _():
        return cut_case("cut-chunked")

    @check("SSE cut (chunked, TCP reset after 2 chunks) -> SDK exception")
    def _():
        return cut_case("cut-chunked-rst")

    @check("SSE cut (Content-Length not reached) -> SDK exception")
    def _():
        return cut_case("cut-length")

    @check("SSE cut (headers, then close before any chunk) -> SDK exception")
    def _():
        return cut_case("cut-headers-only", want_partial=False)

    @check("responses SSE cut -> SDK exception")
    def _():
        return cut_case("cut-responses", lambda fc, model: fc.responses.create(model=model, input="cut", stream=True))

    @check("cut requests were not resent to the backend")
    def _():
        resent = {m: n for m, n in fake.hits.items() if n != 1}
        expect(not resent, f"requests sent more than once: {resent}")
        return f"hits={fake.hits}"

    # Not a router fault: HTTP framing says this body ended properly (EOF-delimited), only the
    # SSE stream lacks finish_reason/[DONE]. Reported, never failing.
    items, err = cut_stream("cut-eof", chat_stream)
    eof_note = (f"EOF-delimited upstream SSE without [DONE]: SDK saw {len(items)} chunks then "
                f"{'a clean end (no exception)' if err is None else describe(err)}")
    print(f"INFO {eof_note}", flush=True)

    # Known router bug: /v1/responses usage (input_tokens) is not counted in
    # prefix_router_backend_prompt_tokens_total / cached_tokens_total (src/stats/usage.rs scans
    # only "prompt_tokens"), so the delivered hit rate leaves out responses traffic.
    before = procs.metric_sum(procs.metrics(router), "prefix_router_backend_prompt_tokens_total")
    r = c.responses.create(model=MODEL, input="count my tokens", max_output_tokens=2)
    after = procs.metric_sum(procs.metrics(router), "prefix_router_backend_prompt_tokens_total")
    if after - before != r.usage.input_tokens:
        known.append(("responses usage not counted in prefix_router_backend_prompt_tokens_total",
                      f"a /v1/responses call with usage.input_tokens={r.usage.input_tokens} moved the counter by "
                      f"{after - before:.0f}"))
    else:
        results.append(("responses usage counted in backend_prompt_tokens_total", True, ""))
        print("PASS responses usage counted in backend_prompt_tokens_total (known bug fixed)", flush=True)

    fake.close()
    for (name, detail) in known:
        print(f"KNOWN-BUG {name}: {detail}", flush=True)
        if os.environ.get("STRICT") == "1":
            results.append((name, False, detail))
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    print(f"\nSummary: openai {openai.__version__}, 2 sims + 4 routers, {time.monotonic() - t0:.1f}s")
    for name, ok, _ in results:
        if not ok:
            print(f"  failed: {name}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"run exceeded {DEADLINE_S} s")))
    signal.alarm(DEADLINE_S)
    try:
        code = main()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR (setup): {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        code = 1
    finally:
        procs.cleanup()
    sys.exit(code)
