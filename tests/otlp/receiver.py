"""An OTLP/HTTP trace receiver for the router's tests: decodes each POST /v1/traces body
with the official opentelemetry-proto classes and keeps the spans. GET /spans answers them
as JSON (ids in hex, attributes as a dict, the resource's attributes on each span); GET
/stats answers how many export requests arrived and were answered. With --delay S each
export is answered S seconds late; with --discard bodies are read and answered without
being decoded or kept (a sink for benchmarks). Prints its port on the first line of stdout.

Usage: python receiver.py [--delay S] [--discard]
"""
import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

spans, lock = [], threading.Lock()
counts = {"received": 0, "answered": 0}


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def keep(request):
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attributes": attributes(s.attributes),
                    "status": MessageToDict(s.status),
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with lock:
            counts["received"] += 1
        if args.discard:
            return self.answer()
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(400)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        time.sleep(args.delay)
        with lock:
            spans.extend(keep(request))
        self.answer()

    def answer(self):
        with lock:
            counts["answered"] += 1
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        with lock:
            body = json.dumps(spans if self.path == "/spans" else counts).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


parser = argparse.ArgumentParser()
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--discard", action="store_true")
args = parser.parse_args()
class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # an exporter that gave up on a late answer closed its connection


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
