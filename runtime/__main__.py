from runtime.platform.cli import keep_workspace_off_path

# `python -m runtime` puts the current directory first on sys.path: a workspace's
# yaml.py, httpx/ or processors_base/ would shadow the runtime's own imports. Every
# command imports the workspace's code only through the loader (which puts the workspace
# on the path after the runtime's own packages are in), so the directory goes now.
keep_workspace_off_path()

from runtime.cli import main  # noqa: E402 (after the path is made safe)

main()
