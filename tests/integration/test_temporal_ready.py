"""The session's Temporal dev server is waited on until its frontend is healthy, not until its port
accepts (a CI run's client failed on ``Frontend is not healthy yet`` just after the port opened)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import TemporalServer
from workers.client import connect
from workers.stack.servers import temporal_unhealthy

pytestmark = pytest.mark.integration


async def test_the_fixture_hands_over_a_healthy_frontend(temporal_server: TemporalServer) -> None:
    assert temporal_unhealthy(temporal_server.address) is None
    client = await connect(temporal_server.address)
    assert await client.service_client.check_health()
