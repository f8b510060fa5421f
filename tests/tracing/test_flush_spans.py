"""--flush-spans (env AGENTIC_RL_FORCE_FLUSH_MODE): a setting of the table like any other,
end to end on a real server exporting to a real OTLP receiver."""

from __future__ import annotations

import argparse

import pytest
from conftest import reward_body

from runtime.config import SettingsError, resolve

# a batch delay no test waits for: a span that arrives was flushed after its response
NEVER = {"OTEL_BSP_SCHEDULE_DELAY": "600000"}


@pytest.mark.parametrize(
    ("args", "env"),
    [(("--flush-spans", "request"), {}), ((), {"AGENTIC_RL_FORCE_FLUSH_MODE": "request"})],
    ids=["flag", "environment"],
)
def test_request_mode_exports_each_span_after_its_response(start_server, receiver, args, env):
    server = start_server(
        "workspace.fns:EchoReward",
        "--tracing",
        *args,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **NEVER, **env},
    )
    server.wait_output("flush_spans=request")  # the startup line shows it
    assert server.post(reward_body()).status_code == 200
    spans = receiver.wait_for(1, timeout=30)
    assert [s["name"] for s in spans] == ["reward EchoReward"]


def _resolve(**environ: str) -> str:
    return resolve(argparse.Namespace(target="m:C"), environ).flush_spans


def test_values_as_the_sdk_reads_them_and_a_typo_refused():
    assert _resolve() == "shutdown"
    assert _resolve(AGENTIC_RL_FORCE_FLUSH_MODE="REQUEST") == "request"
    # the SDK's "none" (no forced flush): spans still go in batches and at a graceful stop
    assert _resolve(AGENTIC_RL_FORCE_FLUSH_MODE="none") == "shutdown"
    with pytest.raises(SettingsError, match="AGENTIC_RL_FORCE_FLUSH_MODE='per-request'"):
        _resolve(AGENTIC_RL_FORCE_FLUSH_MODE="per-request")
