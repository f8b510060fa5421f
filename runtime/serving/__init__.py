"""Serving one function over HTTP: the ASGI app and its /api/v1 and trainer routes,
admission, the HTTP protocol and sending, metrics, the uvicorn server and the
supervisor of --workers."""
