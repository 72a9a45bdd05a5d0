"""taskiq-redis's RedisStreamBroker with its default settings, on the test's own stream.

The stream (queue) name and the result prefix come from the environment; every other setting
is taskiq-redis's default (consumer group `taskiq`, the `data` field). Results go to Redis
through taskiq-redis with JSONSerializer and prefix_str = ferriq's prefix.
"""

import os

from taskiq.serializers import JSONSerializer
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

broker = RedisStreamBroker(
    url=os.environ["INTEROP_REDIS_URL"],
    queue_name=os.environ["INTEROP_QUEUE"],
).with_result_backend(
    RedisAsyncResultBackend(
        os.environ["INTEROP_REDIS_URL"],
        serializer=JSONSerializer(),
        prefix_str=os.environ["INTEROP_PREFIX"],
    )
)


@broker.task(task_name="interop.add")
async def add(a: int, b: int) -> int:
    """Run by the ferriq worker: this body is never called in Python."""
    raise RuntimeError("ferriq runs this task")


@broker.task(task_name="interop.py_mul")
async def py_mul(a: int, b: int) -> int:
    """Run by the Python worker for the ferriq client."""
    return a * b
