import sys

from runtime.platform.cli import COMMANDS, keep_workspace_off_path

if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
    # the platform commands import nothing from the workspace: a yaml.py there must not
    # shadow the client's own imports (serving, by contrast, imports from it)
    keep_workspace_off_path()

from runtime.cli import main

main()
