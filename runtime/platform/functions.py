"""Function components: resolve their classes, register them, and use their instances.

Registration of the components that have no ``entity_id`` yet:

1. import every class in a clean subprocess (one per workspace), as ``serve`` would, which
   also gives each reward's sub-reward weights from its registry;
2. build each component's zip (its class baked into its ``start.sh``) into a temporary
   file, removed once it is uploaded, or whatever stops the registration (Ctrl-C too);
3. create one dependency layer per distinct set of requirements (the SDK makes one per
   component; layers are slow to build);
4. per component: a signed upload URL, the zip PUT to it (streamed from the file, sent
   again from its start if it fails), the register call;
5. unless lazy: wait for the layers, start an instance of each, wait until it is active.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.platform import answers, packaging
from runtime.platform.config import FunctionSpec
from runtime.platform.http import Platform, PlatformError, decode
from runtime.platform.progress import Reporter, size_text

__all__ = [
    "KINDS",
    "Component",
    "ComponentError",
    "delete_instance",
    "instance_logs",
    "invoke",
    "register",
    "resolve",
]

KINDS = ("rollout", "reward", "group_reward")


class ComponentError(Exception):
    """A component that cannot be packaged or registered (found locally, before upload)."""


@dataclass
class Component:
    kind: str
    label: str  # how messages name it: "functions[0] (rollout-1)" or the classpath
    zipdir: Path
    file: str = ""  # the class's file, relative to zipdir
    module: str = ""
    class_name: str = ""
    requirements_path: str | None = "./requirements.txt"
    extra_files: tuple[Path, ...] = ()
    spec: FunctionSpec | None = None
    entity_id: str | None = None
    layer_code: str | None = None
    weights: dict[str, float] | None = None
    instance_id: str | None = None
    requirements: str = ""
    # the zip, a temporary file while ``register`` runs (None once it is removed)
    package: packaging.PackageFile | None = field(default=None, repr=False)
    where: str = ""  # "job.yaml:12: functions[1].fcmodel.classpath", when from a job file

    @property
    def target(self) -> str:
        return f"{self.module}:{self.class_name}"

    def runtime_body(self) -> dict[str, Any]:
        """The component's runtime settings, as the load call and the job body take them."""
        runtime = self.spec.runtime if self.spec and self.spec.runtime else None
        body = runtime.model_dump(exclude_none=True) if runtime else {}
        if self.layer_code:
            body["layer_code"] = self.layer_code
        return body


def _module_file(zipdir: Path, module: str) -> str | None:
    base = module.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if (zipdir / candidate).is_file():
            return candidate
    return None


def resolve(
    kind: str,
    classpath: str,
    zipdir: Path,
    *,
    label: str | None = None,
    filepath: str = "",
    classname: str = "",
) -> Component:
    """A component from any classpath form: the SDK's (``pkg.mod.Cls``, ``path/file.py:Cls``,
    filepath + classname) and ours (``pkg.mod:Cls``)."""
    label = label or classpath or f"{filepath}:{classname}"
    text = classpath.strip().replace("\\", "/")
    if not zipdir.is_dir():
        raise ComponentError(f"{label}: the workspace {str(zipdir)!r} is not a directory")
    if not text:
        if not (filepath and classname):
            raise ComponentError(f"{label}: no classpath (nor filepath and classname)")
        file = filepath.replace("\\", "/")
        file, class_name = (file if file.endswith(".py") else f"{file}.py"), classname
    elif ":" in text:
        left, _, class_name = text.partition(":")
        if ":" in class_name or not left or not class_name:
            raise ComponentError(f"{label}: expected path/to/file.py:Class or package.module:Class")
        if left.endswith(".py") or "/" in left:
            file = left if left.endswith(".py") else f"{left}.py"
        else:  # ours: a module path; else the SDK's reading, a file named like one
            file = _module_file(zipdir, left) or f"{left}.py"
    else:
        left, _, class_name = text.rpartition(".")
        if not left:
            raise ComponentError(f"{label}: expected package.module.Class (two segments at least)")
        file = _module_file(zipdir, left) or f"{left.replace('.', '/')}.py"
    path = (zipdir / file).resolve()
    try:
        file = path.relative_to(zipdir.resolve()).as_posix()
    except ValueError:
        raise ComponentError(f"{label}: {file} is outside the workspace {zipdir}") from None
    if not path.is_file():
        raise ComponentError(f"{label}: {file} does not exist in the workspace {zipdir}")
    module = file[: -len(".py")].replace("/", ".")
    module = module[: -len(".__init__")] if module.endswith(".__init__") else module
    return Component(kind, label, zipdir, file, module, class_name)


def check_imports(components: list[Component], reporter: Reporter) -> None:
    """Import every class in a clean subprocess, fail before any upload: from the unpacked
    package when the components have one (what ships), else from the workspace."""
    # one check per workspace: its components' packages differ only in start.sh
    groups: dict[object, list[Component]] = {}
    for component in components:
        key = (component.zipdir.resolve(), component.extra_files, component.package is None)
        groups.setdefault(key, []).append(component)
    with reporter.step(f"checking that {len(components)} class(es) import"):
        for group in groups.values():
            package = group[0].package
            if package is None:
                _import_in(group[0].zipdir.resolve(), group, "the workspace")
                continue
            with tempfile.TemporaryDirectory(prefix="agentic-rl-check-") as unpacked:
                with zipfile.ZipFile(package.path) as archive:
                    archive.extractall(unpacked)
                _import_in(Path(unpacked), group, "the package")


# Not `-m`, which puts the current directory (the workspace) first on sys.path before the
# runtime is imported: a workspace runtime.py (which --server sdk may ship) would run in its
# place. The check puts the workspace on sys.path itself once the runtime is imported, as
# serve does.
_IMPORT_CHECK = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "from runtime.platform.importcheck import main\n"
    "main()\n"
)


def _import_in(root: Path, group: list[Component], where: str) -> None:
    targets = [[c.target, str(root), c.kind] for c in group]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # write nothing into the workspace
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, json.dumps(targets)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        results = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise ComponentError(
            f"the import check of {group[0].zipdir} failed (exit {done.returncode}): {tail}"
        ) from None
    for component, result in zip(group, results, strict=False):
        if "error" in result:
            named = f"{component.where} ({component.label})" if component.where else component.label
            raise ComponentError(
                f"{named}: {result['error']} (imported from {where}, "
                "checked locally, nothing uploaded)"
            )
        component.weights = result.get("weights")


def _poll(interval: float, deadline: float, timeout: float, what: str, probe: Any) -> Any:
    """``probe()`` every ``interval`` until it is not None, up to ``deadline`` (monotonic;
    ``timeout``: the seconds it stands for, in the error)."""
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() + interval > deadline:
            raise PlatformError(what, f"not done after {timeout:g} s")
        time.sleep(interval)


def register(
    platform: Platform,
    components: list[Component],
    reporter: Reporter,
    *,
    lazy: bool = True,
    server: str = "runtime",
    poll_interval: float = 5.0,
    wait_timeout: float = 900.0,
) -> None:
    """Register the components without an entity id (in place); start instances unless lazy."""
    todo = [c for c in components if not c.entity_id]
    try:
        _package_and_register(platform, todo, reporter, server)
    finally:  # the zips' temporary files, whatever happened
        for c in todo:
            if c.package is not None:
                c.package.remove()
                c.package = None
    if lazy:
        return
    _start(platform, components, reporter, poll_interval, wait_timeout)


def _package_and_register(
    platform: Platform, todo: list[Component], reporter: Reporter, server: str
) -> None:
    if todo:
        with reporter.step(f"packaging {len(todo)} function(s)"):
            for c in todo:
                try:
                    c.requirements = packaging.layer_requirements(
                        c.zipdir, c.requirements_path, server
                    )
                    c.package = packaging.build_package_file(
                        c.zipdir,
                        c.kind,
                        c.module,
                        c.class_name,
                        c.requirements,
                        server=server,
                        extra_files=c.extra_files,
                    )
                except packaging.WorkspaceFileError as exc:  # a usage error (exit 2)
                    raise packaging.WorkspaceFileError(
                        f"{c.label}: {exc} (nothing was sent)"
                    ) from None
                except packaging.PackagingError as exc:
                    raise ComponentError(f"{c.label}: {exc}") from None
                reporter.note(
                    f"  {c.label}: {size_text(c.package.size)}, {len(c.package.entries)} files"
                )
        for secret in sorted({s for c in todo if c.package for s in c.package.left_out_secrets}):
            reporter.note(
                f"warning: {secret} looks like a credentials file and is not shipped "
                "(name it in FC_ZIP_INCLUDE to ship it)"
            )
        check_imports(todo, reporter)
    layers = _create_layers(platform, todo, reporter)
    for c in todo:
        assert c.package is not None
        unique_key = f"{c.kind}-{uuid.uuid4()}"
        size = c.package.size
        with reporter.transfer(f"uploading {c.label} ({size_text(size)})", size) as sent:
            url = platform.call(
                "getting an upload URL",
                "POST",
                platform.url("upload_url"),
                answer=answers.UploadUrl,
                json={"unique_key": unique_key},
                creates=f"for an upload URL of unique_key {unique_key}",
            ).url
            what = f"uploading the package of {c.label}"
            platform.put_file(what, url, c.package.path, progress=sent)
        c.package.remove()  # uploaded: its disk space back now
        c.layer_code = layers.get(c.requirements) or c.layer_code
        registered = platform.call(
            f"registering {c.label}",
            "POST",
            platform.url(f"register_{c.kind}"),
            answer=answers.REGISTERED[c.kind],
            json={"name": c.file, "func": c.class_name, "unique_key": unique_key, "code_url": url},
            creates=f"for a {c.kind} entity named {c.file} with unique_key {unique_key}",
        )
        c.entity_id = getattr(registered, f"{c.kind}_id")
        reporter.note(f"registered {c.label}: {c.entity_id}")


def _start(
    platform: Platform,
    components: list[Component],
    reporter: Reporter,
    poll_interval: float,
    wait_timeout: float,
) -> None:
    """Wait for the layers, start an instance of each component, wait until all are active."""
    # --timeout is one deadline for all of the waiting (layers, then instances), and every
    # request made while waiting ends with it, however slowly the platform answers
    deadline = time.monotonic() + wait_timeout
    with platform.time_limit(wait_timeout):
        _wait_layers(platform, components, reporter, poll_interval, deadline, wait_timeout)
        for c in components:
            c.instance_id = platform.call(
                f"starting an instance of {c.label}",
                "POST",
                platform.url("load", f"jobId-{uuid.uuid4()}", str(c.entity_id)),
                answer=answers.InstanceStarted,
                json=c.runtime_body(),
                creates=f"for an instance of entity {c.entity_id}",
            ).instance_id
        with reporter.step(f"waiting for {len(components)} instance(s) to be active"):
            for c in components:
                _poll(
                    poll_interval,
                    deadline,
                    wait_timeout,
                    f"waiting for instance {c.instance_id} to be active (its logs: "
                    f"python -m runtime instance logs {c.instance_id})",
                    lambda c=c: _active(platform, c, reporter),
                )
                reporter.update(f"instance {c.instance_id} of {c.label} is active")


_FAILED = -1  # the platform's instance status for an instance that did not start
_LOG_TAIL = 20


def _active(platform: Platform, c: Component, reporter: Reporter) -> bool | None:
    """True once the instance is active, None while it starts; a failed one is reported
    with its last log lines, deleted, and raised."""
    instance = str(c.instance_id)
    status = _instance(platform, instance).status
    if status == 2:
        return True
    if status != _FAILED:
        return None
    try:
        lines = instance_logs(platform, instance)[-_LOG_TAIL:]
    except PlatformError as exc:
        lines = [f"(its logs could not be read: {exc})"]
    reporter.note(f"instance {instance} of {c.label} failed to start; its last log lines:")
    for line in lines:
        reporter.note(f"  | {line}")
    try:
        delete_instance(platform, instance)
        fate = "deleted"
    except PlatformError as exc:
        fate = f"not deleted ({exc}): delete it with python -m runtime instance delete {instance}"
    raise PlatformError(
        f"starting an instance of {c.label}",
        f"instance {instance} failed to start (platform status {_FAILED}); its last log "
        f"lines are above; the instance was {fate}",
    )


def _create_layers(platform: Platform, todo: list[Component], reporter: Reporter) -> dict[str, str]:
    """One layer per distinct requirements text; ``{requirements: layer_code}``."""
    used = os.environ.get("FC_LAYER_USED", "true").strip().lower() in ("true", "1", "yes")
    layers: dict[str, str] = {}
    if not used:
        return layers
    for c in todo:
        if c.requirements in layers:
            continue
        digest = hashlib.sha256(c.requirements.encode()).hexdigest()[:8]
        code = platform.call(
            "creating a dependency layer",
            "POST",
            platform.url("layer_create"),
            answer=answers.Layer,
            json={"layer_name": f"fc_layer-{digest}", "requirements_content": c.requirements},
            creates=f"for a layer named fc_layer-{digest}",
        ).layer_code
        layers[c.requirements] = code
        sharing = sum(1 for other in todo if other.requirements == c.requirements)
        reporter.note(f"dependency layer {code or '(unnamed)'} for {sharing} function(s)")
    return layers


def _wait_layers(
    platform: Platform,
    components: list[Component],
    reporter: Reporter,
    interval: float,
    deadline: float,
    timeout: float,
) -> None:
    codes = sorted({c.layer_code for c in components if c.layer_code})
    if not codes:
        return
    with reporter.step(f"waiting for {len(codes)} dependency layer(s) to build"):
        for code in codes:

            def probe(code: str = code) -> bool | None:
                state = platform.call(
                    "querying a dependency layer",
                    "GET",
                    platform.url("layer_status"),
                    answer=answers.LayerStatus,
                    params={"layer_code": code},
                ).status.upper()
                if state == "SUCCESS":
                    return True
                if state in ("FAILED", "FAIL", "ERROR"):
                    raise PlatformError(
                        "building a dependency layer",
                        f"layer {code} is {state}: check the requirements it was built from",
                    )
                return None

            _poll(interval, deadline, timeout, f"waiting for layer {code}", probe)


def _instance(platform: Platform, instance_id: str) -> answers.InstanceInfo:
    return platform.call(
        f"querying instance {instance_id}",
        "POST",
        platform.url("query", instance_id),
        answer=answers.InstanceInfo,
        json={},
    )


def invoke(platform: Platform, instance_id: str, payload: dict[str, Any]) -> tuple[int, Any]:
    """POST ``payload`` to the instance; (HTTP status, JSON output) as the instance answered."""
    info = _instance(platform, instance_id)
    url, token = info.trigger_url, info.trigger_token
    if not url or not token:
        raise PlatformError(
            f"calling instance {instance_id}",
            f"the instance has no trigger URL yet (status {info.status}): is it started?",
        )
    response = platform.request(
        f"calling instance {instance_id}",
        "POST",
        f"{url}/api/v1",
        bare=True,
        creates=f"the instance's logs (python -m runtime instance logs {instance_id})",
        json=payload,
        headers={"Authorization": f"Bearer {token}"},
    )
    output, problem = decode(response.content)
    if output is None:
        text = " ".join(response.text[:2000].split())[:300] or response.reason_phrase
        raise PlatformError(
            f"calling instance {instance_id}",
            f"{problem}: {text}" if problem else text,
            status=response.status_code,
        )
    return response.status_code, output


def instance_logs(
    platform: Platform, instance_id: str, *, page_size: int = 100, max_pages: int = 100
) -> list[str]:
    """All log messages of an instance, page after page (either of the two answer shapes)."""
    messages: list[str] = []
    for page in range(1, max_pages + 1):
        out = platform.call(
            f"reading the logs of instance {instance_id}",
            "POST",
            platform.url("instance_logs", instance_id),
            answer=answers.InstanceLogs,
            json={"pageNumber": page, "pageSize": page_size},
        )
        for entry in out.entries:
            messages.append(str(entry.get("message")) if isinstance(entry, dict) else str(entry))
        if len(out.entries) < page_size or (out.total is not None and len(messages) >= out.total):
            break
    return messages


def delete_instance(platform: Platform, instance_id: str) -> dict[str, Any]:
    what = f"deleting instance {instance_id}"
    answer = platform.call(
        what,
        "POST",
        platform.url("instance_delete", instance_id),
        answer=answers.InstanceDeleted,
        json={},
    )
    if answer.code not in (None, 0, 200, "0", "200"):
        raise PlatformError(
            what, answer.message or "refused", code=answer.code, request_id=answer.request_id
        )
    return {"instance_id": instance_id, **(answer.data or {})}
