# The image of one function: the runtime plus a workspace of user functions.
#
#   docker build -t rl-fn . && docker run -p 8000:8000 rl-fn        # the sample reward
#   docker build --build-arg WORKSPACE=path/to/workspace -t my-fn .   # a workspace in this context
#   python -m runtime build path/to/workspace --image my-fn --target module:Class   # anywhere
#
# The default processor is the build argument PROCESSOR_CLASS (build's --target); at run
# time -e PROCESSOR_CLASS or the command's argument overrides it
# (docker run my-fn functions.reward.safety:SafetyProcessor). Every serve option has
# an environment variable (see the README), so `docker run -e ...` configures it.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# The runtime first: its layer is reused for every workspace and every rebuild.
COPY pyproject.toml README.md ./
COPY processors_base ./processors_base
COPY runtime ./runtime
RUN pip install . && rm -rf /src
ARG WORKSPACE=sample_functions
# The workspace's own dependencies, at build time: a container start installs nothing.
# (pyproject.toml rides along so that the COPY has a source when there is no requirements.txt.)
COPY pyproject.toml ${WORKSPACE}/requirements.tx[t] /tmp/requirements/
RUN if [ -f /tmp/requirements/requirements.txt ]; then pip install -r /tmp/requirements/requirements.txt; fi \
    && rm -rf /tmp/requirements
COPY ${WORKSPACE}/ /workspace/

FROM ${BASE_IMAGE}
# The default processor (`python -m runtime build --target` sets it); a `docker run`
# argument or -e PROCESSOR_CLASS overrides it.
ARG PROCESSOR_CLASS=functions.reward.reward:DemoRewardProcessor
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROCESSOR_CLASS=${PROCESSOR_CLASS} \
    PORT=8000
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin function
COPY --from=build /opt/venv /opt/venv
COPY --from=build /workspace /workspace
WORKDIR /workspace
USER 10001
EXPOSE 8000
# -I: not the workspace (the current directory) first on sys.path, where a urllib/ of its own
# would be imported in place of the standard library's
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-I", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=2)"]
# exec form: the server is PID 1 and receives docker stop's SIGTERM itself. The console
# script, not `python -m runtime`, which puts the workspace (the current directory) first
# on sys.path and so would run a workspace runtime.py (or runtime/) in place of the server.
ENTRYPOINT ["agentic-rl-runtime", "serve"]
