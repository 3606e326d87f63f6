"""The router's tokens against Hugging Face's: generated chat requests, rendered and
tokenized by `prefix-router tokenize` and by transformers' `apply_chat_template(...,
tokenize=True)` on the same messages as vLLM hands them to the template. The simulator
(`prefix-router sim --tokenizer`, its own implementation) is checked the same way through
its `/tokenize` endpoint.

Usage: compare.py ROUTER_BINARY MODEL_DIR NAME [COUNT]
"""

import json
import random
import socket
import subprocess
import sys
import time
import urllib.request

from transformers import AutoTokenizer

WORDS = ["fix", "the", "failing", "test", "in", "src/lib.rs", "réponse", "naïve", "日本語",
         "emoji 🎉", "👩‍💻", "مرحبا", "tab\there", "line\nbreak", "quote\"s", "back\\slash",
         "  spaced  ", "", "<html>", "{json: 1}", "x" * 40, "e\u0301", "\u200bzero-width"]


def text(rng, lo, hi):
    n = rng.randint(lo, hi)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tools(rng):
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": text(rng, 0, 8),
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": text(rng, 0, 4)},
            "limit": {"type": "integer", "minimum": 1, "default": 10},
            "ratio": {"type": "number", "default": rng.choice([0.5, 1.0, 1e-05])}},
            "required": ["path"]}}} for i in range(rng.randint(1, 3))]


def content(rng):
    kind = rng.random()
    if kind < 0.15:
        return [{"type": "text", "text": text(rng, 0, 20)} for _ in range(rng.randint(1, 3))] + \
            ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] if rng.random() < 0.3 else [])
    if kind < 0.2:
        return ""
    if kind < 0.25:
        return text(rng, 2000, 8000)
    return text(rng, 1, 60)


def conversation(rng, with_tools):
    messages = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": content(rng)})
    for turn in range(rng.randint(1, 6)):
        messages.append({"role": "user", "content": content(rng)})
        if turn == 0 and rng.random() < 0.3:
            continue
        if with_tools and rng.random() < 0.5:
            call_id = f"call_{turn}"
            args = json.dumps({"path": text(rng, 1, 3), "limit": rng.randint(1, 50)})
            messages.append({"role": "assistant", "content": None if rng.random() < 0.5 else text(rng, 0, 10),
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": "tool_0", "arguments": args}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content(rng)})
        else:
            answer = {"role": "assistant", "content": content(rng)}
            if rng.random() < 0.1 and isinstance(answer["content"], str):
                answer["content"] = "<think>\n" + text(rng, 1, 10) + "\n</think>\n\n" + answer["content"]
            messages.append(answer)
    if messages[-1]["role"] == "assistant" and rng.random() < 0.5:
        messages.append({"role": "user", "content": content(rng)})
    return messages


def request(rng):
    with_tools = rng.random() < 0.4
    body = {"model": "m", "messages": conversation(rng, with_tools)}
    if with_tools:
        body["tools"] = tools(rng)
    if rng.random() < 0.2:
        body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    if rng.random() < 0.1:
        body["add_generation_prompt"] = False
    return body


def as_vllm_gives_them(messages):
    """The messages as vLLM hands them to the template (string content format)."""
    out = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        if c is None:
            m["content"] = ""
        elif isinstance(c, list):
            m["content"] = "\n".join(p["text"] for p in c if isinstance(p.get("text"), str))
        for call in m.get("tool_calls") or []:
            f = call["function"]
            if isinstance(f.get("arguments"), str):
                try:
                    f["arguments"] = json.loads(f["arguments"])
                except ValueError:
                    pass
        out.append(m)
    return out


def reference(tok, body):
    kwargs = dict(body.get("chat_template_kwargs") or {})
    ids = tok.apply_chat_template(
        as_vllm_gives_them(body["messages"]), tools=body.get("tools"),
        add_generation_prompt=body.get("add_generation_prompt", True), tokenize=True, **kwargs)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def router_answers(binary, model_dir, bodies):
    lines = "\n".join(json.dumps(b) for b in bodies) + "\n"
    run = subprocess.run([binary, "tokenize", "--tokenizer", model_dir], input=lines,
                         capture_output=True, text=True, check=True)
    return [json.loads(l) for l in run.stdout.splitlines()]


def sim_answers(binary, model_dir, bodies):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen([binary, "sim", "--tokenizer", model_dir, "--base-port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        answers = []
        for body in bodies:
            request = urllib.request.Request(url + "/tokenize", data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as r:
                    answers.append({"ids": json.load(r)["tokens"]})
            except urllib.error.HTTPError as e:
                answers.append({"error": e.read().decode()[:200], "reason": str(e.code)})
        return answers
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def compare(label, tok, bodies, answers):
    assert len(answers) == len(bodies), (len(answers), len(bodies))
    mismatches, errors, tokens = [], [], 0
    for i, (body, answer) in enumerate(zip(bodies, answers)):
        try:
            want = reference(tok, body)
        except Exception as e:  # the template refused it: the router must refuse too
            if "error" not in answer:
                mismatches.append((i, f"transformers refused ({e}), {label} rendered it"))
            continue
        if "error" in answer:
            errors.append((i, answer["reason"], answer["error"][:200]))
            continue
        got = answer["ids"]
        tokens += len(want)
        if got != want:
            at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            mismatches.append((i, f"first difference at token {at} of {len(want)}: "
                                  f"{label} {tok.decode(got[max(0, at - 3):at + 5])!r} "
                                  f"vs transformers {tok.decode(want[max(0, at - 3):at + 5])!r}"))
    print(f"{label}: {len(bodies)} requests, {tokens} tokens: "
          f"{len(bodies) - len(mismatches) - len(errors)} identical, "
          f"{len(mismatches)} different, {len(errors)} not rendered")
    for m in mismatches[:10]:
        print("  different:", m)
    for e in errors[:10]:
        print("  not rendered:", e)
    return not mismatches and not errors


def main():
    binary, model_dir, name = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    rng = random.Random(f"{name}-{count}")
    bodies = [request(rng) for _ in range(count)]
    tok = AutoTokenizer.from_pretrained(model_dir)
    router = compare(f"{name} router", tok, bodies, router_answers(binary, model_dir, bodies))
    sim = compare(f"{name} simulator", tok, bodies, sim_answers(binary, model_dir, bodies))
    sys.exit(0 if router and sim else 1)


if __name__ == "__main__":
    main()
