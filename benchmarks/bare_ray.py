"""The Ray reference of scenario 10: the bare app's echo (parse the reward input, count the
messages, serialise the output) as a plain Ray Serve deployment of one replica on a local
cluster, answering on Serve's proxy. What Ray alone costs, beside ``serve --ray``.

    RAY_PYTHON benchmarks/bare_ray.py PORT    # until SIGTERM
"""

import signal
import sys
import threading

import orjson
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

HEALTHY = b'{"status":"healthy"}'


@serve.deployment(max_ongoing_requests=128, ray_actor_options={"num_cpus": 1})
class BareEcho:
    async def __call__(self, request: Request) -> Response:
        if request.url.path == "/health":
            return Response(HEALTHY, media_type="application/json")
        data = orjson.loads(await request.body())
        messages = (data.get("agent_output") or {}).get("messages") or []
        done = {"reward": {"reward_score": float(len(messages)), "reward_metrics": None}}
        body = orjson.dumps({**done, "status": "success", "error": None, "error_code": None})
        return Response(body, media_type="application/json")


def main() -> None:
    port = int(sys.argv[1])
    stop = threading.Event()
    # "local": a cluster of its own, never one `ray start` left on this machine
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    # after ray.init, which puts in a SIGTERM handler of its own
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(BareEcho.bind(), name="bare", route_prefix="/")
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
