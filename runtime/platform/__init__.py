"""The client of the training platform: register functions, test them, upload datasets,
submit and manage training jobs (the contract is docs/platform-api.md).

Separate from the serving modules: nothing here is imported by ``serve`` or ``invoke``.
Modules: ``config`` (the job YAML), ``http`` (transport, errors, retries), ``packaging``
(the zip and its start script), ``functions`` (registration and instances), ``datasets``,
``jobs`` (the submit body and job management), ``progress``, ``cli`` (commands, output).
"""
