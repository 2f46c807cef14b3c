"""LLM engines: OpenAI-compatible HTTP, embedded transformers, scripted; all behind ``Engine`` (base.py)."""

from __future__ import annotations

from agentflow.config import EngineSettings
from agentflow.errors import InvalidInput
from agentflow.llm.base import Engine


def build_engine(settings: EngineSettings, bus=None) -> Engine:
    """The engine ``settings`` describe, ready to serve (an embedded model is loaded here). With ``routing``, a
    ``RoutedEngine`` that follows the routing table on ``bus`` (a ``BusConfig``)."""
    if settings.engine == "openai":
        from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig

        config = OpenAIEngineConfig(endpoint=settings.endpoint, model=settings.model, api_key=settings.api_key,
                                    timeout_s=settings.timeout_s, retries=settings.retries,
                                    priority_scheduling=settings.priority_scheduling)
        if not settings.routing:
            return OpenAIEngine(config)
        from agentflow.llm.routing import RoutedEngine

        if bus is None:
            raise InvalidInput("routing by a routing table needs Kafka (AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
        return RoutedEngine(config, settings.routing, allowed_endpoints=settings.routing_endpoints,
                            wait_s=settings.routing_wait_s).follow(bus)
    from agentflow.llm.embedded import EmbeddedEngine, resolve_dtype
    from agentflow.llm.models import smollm2_dir

    model_dir = smollm2_dir() if settings.model in ("", "smollm2") else settings.model
    return EmbeddedEngine(model_dir, max_batch=settings.max_batch, dtype=resolve_dtype(settings.dtype))
