"""Fixtures for tests of the Kafka plumbing against a real tansu broker (imported by conftest.py).

One broker per test session; each test gets a BusConfig with its own topic prefix, so its topics and consumer
groups (worker groups are prefixed too) never meet another test's.
"""

from __future__ import annotations

import itertools
import os

import pytest

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A tansu broker on a free 127.0.0.1 port for the whole session (in-memory storage)."""
    from agentflow.bus.broker import start_tansu

    with start_tansu(log_dir=tmp_path_factory.mktemp("tansu")) as running:
        yield running


@pytest.fixture
def bus_config(broker):
    """Settings for the session broker with a topic prefix (and so consumer groups) private to this test."""
    from agentflow.bus.config import BusConfig

    return BusConfig(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{os.getpid()}-{next(_prefixes)}.",
                     partitions=4, retry_backoff_ms=20, client_id="agentflow-test")
