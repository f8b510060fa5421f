"""``python -m serve_losing_first_proxy serve TARGET --ray ...``: ``python -m runtime``,
whose first Ray Serve HTTP proxies are killed while ``serve.start()`` waits for them to be
ready, as Serve's controller kills a proxy slow to start on a busy machine.

It wraps the Ray 2.x function ``serve.start()`` creates the controller with (a private
name: where Ray renames it, this fails at once, saying so)."""

import runpy
from typing import Any

import ray
from ray.serve._private import api


def kill_first_proxies() -> None:
    create = api._create_controller_and_proxy_refs

    def creating_then_killing(*args: Any, **kwargs: Any) -> Any:
        api._create_controller_and_proxy_refs = create  # once
        controller, ready = create(*args, **kwargs)
        for proxy in ray.get(controller.get_proxies.remote()).values():
            ray.kill(proxy)
        print("killed the first proxies", flush=True)
        return controller, ready

    api._create_controller_and_proxy_refs = creating_then_killing


kill_first_proxies()
runpy.run_module("runtime", run_name="__main__", alter_sys=True)
