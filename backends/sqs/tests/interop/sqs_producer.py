"""Kicks interop.sqs.add through taskiq-aio-sqs (as a Python service would) for the ferriq
worker on the same queue, and prints what taskiq-redis reads back."""

import asyncio
import json
import os
import time

from taskiq.kicker import AsyncKicker
from taskiq.serializers import JSONSerializer
from taskiq_aio_sqs import SQSBroker
from taskiq_redis import RedisAsyncResultBackend


async def main() -> None:
    backend = RedisAsyncResultBackend(
        os.environ["INTEROP_REDIS_URL"],
        serializer=JSONSerializer(),
        prefix_str=os.environ["INTEROP_PREFIX"],
    )
    broker = SQSBroker(
        os.environ["INTEROP_QUEUE"],
        endpoint_url=os.environ["INTEROP_SQS_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).with_result_backend(backend)
    await broker.startup()
    out = {}
    for name, labels, args in (
        ("now", {}, (2, 3)),
        # Applied by taskiq-aio-sqs as DelaySeconds: the worker must not delay it again.
        ("delayed", {"delay": 2}, (10, -4)),
    ):
        sent = time.monotonic()
        task = await AsyncKicker(task_name="interop.sqs.add", broker=broker, labels=labels).kiq(*args)
        result = await task.wait_result(check_interval=0.05, timeout=60)
        out[name] = {
            "is_err": result.is_err,
            "value": result.return_value,
            "task_id": task.task_id,
            "seconds": time.monotonic() - sent,
        }
    await broker.shutdown()
    print(json.dumps(out))


asyncio.run(main())
