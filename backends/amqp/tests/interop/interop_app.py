"""taskiq-aio-pika 0.6.1 with its default broker settings, on the test's own names.

The exchange, lane and dead-letter queue names come from the environment (each test uses
unique ones on the shared RabbitMQ); every other setting is taskiq-aio-pika's default, so the
topology's arguments are the ones ferriq must match. Results go to Redis through taskiq-redis
with JSONSerializer and prefix_str = ferriq's prefix.
"""

import os

from taskiq.serializers import JSONSerializer
from taskiq_aio_pika import AioPikaBroker
from taskiq_aio_pika.exchange import Exchange
from taskiq_aio_pika.queue import Queue
from taskiq_redis import RedisAsyncResultBackend

broker = AioPikaBroker(
    url=os.environ["INTEROP_AMQP_URL"],
    exchange=Exchange(name=os.environ["INTEROP_EXCHANGE"]),
    task_queues=[Queue(name=os.environ["INTEROP_QUEUE"])],
    dead_letter_queue=Queue(name=os.environ["INTEROP_QUEUE"] + ".dead_letter"),
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
