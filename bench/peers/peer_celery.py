"""Celery on RabbitMQ with its Redis result backend, its defaults otherwise (a classic durable
queue, no publisher confirms, the prefork pool with one process per CPU, prefetch 4 per
process). `celery -A peer_celery worker --without-gossip --without-mingle --without-heartbeat`
runs the worker (without those, and remote control, Celery leaves its broadcast exchanges on
the broker); running this file is the producer. Its result keys (`celery-task-meta-*` in the
peers' Redis database) expire after 10 minutes."""

import os

from celery import Celery

import common

NAME = os.environ.get("PEER_QUEUE", "ferriq.peer.celery")

app = Celery(NAME, broker=common.AMQP_URL, backend=common.REDIS_URL)
app.conf.update(
    task_default_queue=NAME,
    task_default_exchange=NAME,
    task_default_routing_key=NAME,
    result_expires=600,
    # No broadcast exchange left on the shared RabbitMQ (see above).
    worker_enable_remote_control=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="add")
def add(a, b):
    return a + b


def wait_all(results):
    for r in results:
        r.get(timeout=120)


def main():
    common.measure("celery", lambda i: add.delay(i, 1), wait_all)


if __name__ == "__main__":
    main()
