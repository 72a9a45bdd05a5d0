"""Kicks interop.add from inside an OpenTelemetry span, with taskiq's OpenTelemetryMiddleware,
and prints the trace id and the id of the span the message was sent under (taskiq's
`send/<task>` span, whose context the middleware injects into the labels)."""

import asyncio
import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from taskiq.middlewares.opentelemetry_middleware import OpenTelemetryMiddleware

from interop_app import add, broker

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
broker.add_middlewares(OpenTelemetryMiddleware())


async def main() -> None:
    await broker.startup()
    tracer = trace.get_tracer("interop")
    with tracer.start_as_current_span("python.request") as root:
        task = await add.kiq(20, 22)
        trace_id = format(root.get_span_context().trace_id, "032x")
    result = await task.wait_result(check_interval=0.05, timeout=60)
    await broker.shutdown()
    sent = [s for s in exporter.get_finished_spans() if s.name == "send/interop.add"]
    print(
        json.dumps(
            {
                "value": result.return_value,
                "trace_id": trace_id,
                "send_span_id": format(sent[0].context.span_id, "016x"),
            }
        )
    )


asyncio.run(main())
