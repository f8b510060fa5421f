"""``python -m serve_losing_first_proxy serve TARGET --ray ...``: ``python -m runtime``,
whose first Ray Serve HTTP proxies are killed while ``serve.start()`` waits for them to be
ready, as Serve's controller kills a proxy slow to start on a busy machine.

It wraps the function ``serve.start()`` creates the controller with in the Ray .ci/run
installs (2.60; a private name: where Ray renames it, this fails at once, saying so)."""

import runpy
import time
from typing import Any

import ray
from ray.serve._private import api


def kill_first_proxies() -> None:
    create = getattr(api, "_create_controller_and_proxy_refs", None)
    if create is None:
        raise SystemExit(f"Ray {ray.__version__} creates Serve's controller another way")

    def creating_then_killing(*args: Any, **kwargs: Any) -> Any:
        api._create_controller_and_proxy_refs = create  # once
        controller, _ = create(*args, **kwargs)
        deadline = time.monotonic() + 120
        while not (proxies := ray.get(controller.get_proxies.remote())):  # made by its loop
            assert time.monotonic() < deadline, "Serve started no proxy in 120 s"
            time.sleep(0.1)
        for proxy in proxies.values():
            ray.kill(proxy)
        print("killed the first proxies", flush=True)
        return controller, [proxy.ready.remote() for proxy in proxies.values()]  # they died

    api._create_controller_and_proxy_refs = creating_then_killing


kill_first_proxies()
runpy.run_module("runtime", run_name="__main__", alter_sys=True)
