"""Kafka plumbing shared by every service: settings, topics, the envelope codec, the worker loop, a publisher,
group-less followers and a topic reader, and the embedded tansu broker. See docs/event-bus.md."""

from agentflow.bus import codec, topics
from agentflow.bus.broker import Broker, BrokerError, start_tansu
from agentflow.bus.clients import (AssignedConsumer, BusUnavailable, Follower, Publisher, Received, TopicReader,
                                   wait_for_broker)
from agentflow.bus.codec import DecodeError
from agentflow.bus.config import BusConfig
from agentflow.bus.topics import ensure_topics
from agentflow.bus.worker import Retryable, Worker, is_retryable

__all__ = [
    "AssignedConsumer", "Broker", "BrokerError", "BusConfig", "BusUnavailable", "DecodeError", "Follower", "Publisher",
    "Received", "Retryable", "TopicReader", "Worker", "codec", "ensure_topics", "is_retryable", "start_tansu", "topics",
    "wait_for_broker",
]
