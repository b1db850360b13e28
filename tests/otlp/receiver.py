"""An OTLP/gRPC trace receiver for the trace tests: the collector's TraceService built from
the opentelemetry-proto definitions. It listens on loopback, prints `LISTENING <port>`, and
appends every exported span to a JSON-lines file (one object per span: trace and span ids
in hex, the parent's id, the name, its start and end in Unix nanoseconds, the service that
sent it and the attributes)."""

import json
import sys
from concurrent import futures

try:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
except ImportError as missing:
    # 77: cannot run here (`.ci/run` installs grpcio and opentelemetry-proto).
    print(f"MISSING {missing}", flush=True)
    sys.exit(77)


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, path):
        self.path = path

    def Export(self, request, context):
        lines = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(json.dumps({
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "service": resource.get("service.name"),
                        "attributes": {a.key: value_of(a.value) for a in span.attributes},
                    }))
        with open(self.path, "a") as out:
            for line in lines:
                out.write(line + "\n")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    path = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(path), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"LISTENING {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
