"""Kicks interop.add on the ferriq worker through RedisStreamBroker; prints what taskiq reads back."""

import asyncio
import json

from stream_app import add, broker


async def main() -> None:
    await broker.startup()
    by_position = await add.kiq(2, 3)
    by_keyword = await add.kiq(a=10, b=-4)
    out = {}
    for name, task in (("by_position", by_position), ("by_keyword", by_keyword)):
        result = await task.wait_result(check_interval=0.05, timeout=60)
        out[name] = {"is_err": result.is_err, "value": result.return_value, "task_id": task.task_id}
    await broker.shutdown()
    print(json.dumps(out))


asyncio.run(main())
