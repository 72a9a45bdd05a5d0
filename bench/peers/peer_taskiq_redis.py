"""taskiq on Redis Streams (taskiq-redis's RedisStreamBroker, its defaults: consumer group
`taskiq`, XACK without XDEL) with results in Redis (taskiq-redis), the same Redis.
`taskiq worker peer_taskiq_redis:broker` runs the worker; running this file is the producer."""

import asyncio
import os

from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

import common

NAME = os.environ.get("PEER_QUEUE", "ferriq.peer.taskiq_redis")

broker = RedisStreamBroker(url=common.REDIS_URL, queue_name=NAME).with_result_backend(
    RedisAsyncResultBackend(common.REDIS_URL, prefix_str=NAME, result_ex_time=600)
)


@broker.task(task_name="peer.add")
async def add(a: int, b: int) -> int:
    return a + b


async def wait_all(handles):
    for h in handles:
        result = await h.wait_result(check_interval=0.001, timeout=120)
        assert not result.is_err, result.error


async def main():
    await broker.startup()
    await wait_all([await add.kiq(i, 1) for i in range(common.WARM_UP)])
    start = common.now()
    handles = []
    for first in range(0, common.TASKS, common.BATCH):
        last = min(first + common.BATCH, common.TASKS)
        handles += await asyncio.gather(*(add.kiq(i, 1) for i in range(first, last)))
    await wait_all(handles)
    e2e = common.now() - start
    round_trips = []
    for i in range(common.ROUND_TRIPS):
        t = common.now()
        await wait_all([await add.kiq(i, 1)])
        round_trips.append(common.now() - t)
    common.report("taskiq_redis", e2e, round_trips)
    await broker.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
