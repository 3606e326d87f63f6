"""A tiny misbehaving OpenAI-compatible backend on raw sockets, for the cut-stream cases.

GET /health answers 200 (so the router takes it in). POST bodies choose the fault with their
`model` field:

  cut-chunked       200 SSE, Transfer-Encoding: chunked, two `data:` chunks, then the socket is
                    closed (FIN) without the last chunk, `[DONE]` or the terminating 0-chunk
  cut-chunked-rst   the same, closed with a TCP reset (SO_LINGER 0)
  cut-length        200 SSE with Content-Length: 100000, two `data:` events, then closed
  cut-headers-only  200 SSE headers (chunked), no body byte, then closed
  cut-eof           200 SSE delimited by connection close (no Content-Length, no chunked,
                    Connection: close), two `data:` events, then closed: valid HTTP framing,
                    only the SSE stream lacks its end
  cut-responses     a /v1/responses event stream (chunked) cut after response.created and one
                    output_text.delta
  close-no-response the request is read, then the socket closed without any response

Each accepted POST is counted per model in `hits` (the router must not resend a request
whose response had started)."""

import json
import socket
import struct
import threading
import time

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# The faults it plays, by the model a request names (each listed on /v1/models, so that a
# router routing by model sends them here).
FAULTS = ("cut-chunked", "cut-chunked-rst", "cut-length", "cut-headers-only", "cut-eof",
          "cut-responses", "close-no-response")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _chat_event(i, text):
    return ("data: " + json.dumps({
        "id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
        "system_fingerprint": "fake-cut",
        "choices": [{"index": 0, "delta": ({"role": "assistant", "content": text} if i == 0 else {"content": text}),
                     "finish_reason": None, "logprobs": None}],
    }) + "\n\n").encode()


def _responses_events():
    resp = {"id": "resp_cut", "object": "response", "created_at": 0, "model": MODEL, "status": "in_progress",
            "output": [], "error": None, "incomplete_details": None, "metadata": {}, "usage": None}
    yield ("event: response.created\ndata: " + json.dumps(
        {"type": "response.created", "sequence_number": 0, "response": resp}) + "\n\n").encode()
    yield ("event: response.output_text.delta\ndata: " + json.dumps(
        {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_cut", "output_index": 0,
         "content_index": 0, "delta": "partial "}) + "\n\n").encode()


class FakeBackend:
    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.hits = {}
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn, buf):
        """One request from the connection: (method, path, headers, body, rest) or None."""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                while b"\r\n" not in buf:
                    buf += conn.recv(65536)
                size_line, _, buf = buf.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                while len(buf) < size + 2:
                    buf += conn.recv(65536)
                body += buf[:size]
                buf = buf[size + 2:]
                if size == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            while len(buf) < n:
                data = conn.recv(65536)
                if not data:
                    return None
                buf += data
            body, buf = buf[:n], buf[n:]
        return method, path, headers, body, buf

    def _serve(self, conn):
        buf = b""
        try:
            conn.settimeout(10)
            while True:
                req = self._read_request(conn, buf)
                if req is None:
                    return
                method, path, headers, body, buf = req
                if method == "GET":
                    models = [{"id": m, "object": "model", "owned_by": "fake"} for m in (MODEL,) + FAULTS]
                    payload = b'{"status":"ok"}' if path.startswith("/health") else json.dumps(
                        {"object": "list", "data": models}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
                    continue
                try:
                    model = json.loads(body).get("model", "")
                except ValueError:
                    model = ""
                with self.lock:
                    self.hits[model] = self.hits.get(model, 0) + 1
                self._fault(conn, model)
                return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    @staticmethod
    def _fault(conn, model):
        """Answers (or not) as `model`, one of FAULTS, says."""
        sse_chunked = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                       b"x-sim-instance: fake-cut\r\ntransfer-encoding: chunked\r\n\r\n")
        if model in ("cut-chunked", "cut-chunked-rst"):
            conn.sendall(sse_chunked)
            for i, text in enumerate(["partial ", "answer "]):
                conn.sendall(_chunk(_chat_event(i, text)))
                time.sleep(0.05)
            if model == "cut-chunked-rst":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif model == "cut-length":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100000\r\n\r\n")
            for i, text in enumerate(["partial ", "answer "]):
                conn.sendall(_chat_event(i, text))
                time.sleep(0.05)
        elif model == "cut-headers-only":
            conn.sendall(sse_chunked)
            time.sleep(0.05)
        elif model == "cut-eof":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            for i, text in enumerate(["partial ", "answer "]):
                conn.sendall(_chat_event(i, text))
                time.sleep(0.05)
        elif model == "cut-responses":
            conn.sendall(sse_chunked)
            for ev in _responses_events():
                conn.sendall(_chunk(ev))
                time.sleep(0.05)
        # close-no-response and anything else: close without answering.
