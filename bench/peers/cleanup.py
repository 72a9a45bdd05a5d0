"""Deletes what a peer run made on the shared servers: its queues (and dramatiq's delay and
dead-letter queues, taskiq's exchange) and its Redis keys."""

import os
import sys

import pika
import redis

import common

NAME = sys.argv[1]
params = pika.URLParameters(common.AMQP_URL)
connection = pika.BlockingConnection(params)
for queue in [NAME, f"{NAME}.dead_letter", f"{NAME}.DQ", f"{NAME}.XQ"]:
    channel = connection.channel()
    try:
        channel.queue_delete(queue)
    except pika.exceptions.ChannelClosedByBroker:
        pass
channel = connection.channel()
try:
    channel.exchange_delete(NAME)
except pika.exceptions.ChannelClosedByBroker:
    pass
connection.close()
r = redis.Redis.from_url(common.REDIS_URL)
for key in r.scan_iter(match=f"{NAME}*", count=1000):
    r.delete(key)
# dramatiq's results use its namespace as the key prefix.
for key in r.scan_iter(match=f"*{os.environ.get('PEER_QUEUE', NAME)}*", count=1000):
    r.delete(key)
