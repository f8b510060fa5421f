"""``python -m serve_losing_first_proxy serve TARGET --ray ...``: ``python -m runtime``,
whose first Ray Serve HTTP proxy is killed as soon as it exists, while ``serve.start()``
waits for it: as Serve's controller kills a proxy slow to start on a busy machine."""

import runpy
import sys
import threading
import time


def kill_first_proxy() -> None:
    import ray

    while not ray.is_initialized():
        time.sleep(0.01)
    while True:
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith("SERVE_PROXY_ACTOR"):
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))
                print("killed the first proxy", flush=True)
                return
        time.sleep(0.01)


threading.Thread(target=kill_first_proxy, daemon=True).start()
sys.argv = ["runtime", *sys.argv[1:]]
runpy.run_module("runtime", run_name="__main__", alter_sys=True)
