"""dramatiq on RabbitMQ with its Results middleware on Redis, its defaults otherwise (classic
durable queue, no publisher confirms). `dramatiq peer_dramatiq` runs the worker (2 processes
x 8 threads by default); running this file is the producer."""

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

import common

NAME = os.environ.get("PEER_QUEUE", "ferriq.peer.dramatiq")

broker = RabbitmqBroker(url=common.AMQP_URL)
broker.add_middleware(Results(backend=RedisBackend(url=common.REDIS_URL, namespace=NAME)))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=NAME, store_results=True)
def add(a, b):
    return a + b


def wait_all(messages):
    for m in messages:
        m.get_result(block=True, timeout=120_000)


def main():
    common.measure("dramatiq", lambda i: add.send(i, 1), wait_all)


if __name__ == "__main__":
    main()
