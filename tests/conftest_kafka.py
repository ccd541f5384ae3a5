"""The ``kafka`` fixture: one Kafka broker process for the session (see kafka_broker.py).

Loaded by tests/conftest.py (``pytest_plugins = ["conftest_kafka"]``).
"""
from __future__ import annotations

import pytest

from kafka_broker import Broker


@pytest.fixture(scope="session")
def kafka():
    """A running Kafka broker (``$STREAMLB_KAFKA_BOOTSTRAP``: that cluster instead)."""
    broker = Broker.start()
    yield broker
    broker.close()
