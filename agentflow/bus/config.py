"""Kafka settings: one typed dataclass, validated once at start-up, mapped onto kafka-python's options.

Every field can be set from ``AGENTFLOW_KAFKA_<FIELD>`` (upper case), e.g. ``AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS`` or
``AGENTFLOW_KAFKA_SASL_PASSWORD``. The consumer defaults are the ones the embedded tansu broker needs
(docs/event-bus.md) and are harmless on Apache Kafka.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, fields

from agentflow.config import from_env as _from_env
from agentflow.config import setting
from agentflow.errors import InvalidInput

ENV_PREFIX = "KAFKA_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
COMPRESSION_TYPES = ("", "gzip", "snappy", "lz4", "zstd")
RECORD_LIMIT = 1024 * 1024  # Kafka's own default (message.max.bytes, max.request.size)
#: What a record carries beyond its key and value: headers (trace context), record and batch framing. The producer's
#: request limit, the fetch sizes and the topics' max.message.bytes are max_record_bytes plus this.
RECORD_OVERHEAD = 16 * 1024
#: Dead letters keep at most this much of the poison record's key (it is also the dead letter's own key).
DEAD_LETTER_KEY_BYTES = 1024


@dataclass(frozen=True)
class BusConfig:
    # --- where, and who -------------------------------------------------------------------------------------------
    bootstrap_servers: str = setting("127.0.0.1:9092", "comma-separated host:port list of the Kafka (or tansu) brokers")
    topic_prefix: str = setting("", "prepended verbatim to every topic name, e.g. 'prod.' -> 'prod.plans'")
    client_id: str = setting("agentflow", "client id sent to the broker (logs, quotas); workers append their name")
    group_id: str = setting("", "consumer group of a worker; empty: the worker's name (one group per service)")
    # --- topics -------------------------------------------------------------------------------------------------------
    partitions: int = setting(4, "partitions per topic created by ensure_topics (the parallelism limit of a service)")
    replication_factor: int = setting(1, "replicas per partition created by ensure_topics (3 on a production cluster)")
    create_topics: bool = setting(True, "workers create their topics at start (off where topics are managed, "
                                        "e.g. Strimzi)")
    # --- security -----------------------------------------------------------------------------------------------------
    security_protocol: str = setting("PLAINTEXT", "PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL")
    tls_cafile: str = setting("", "PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL)")
    tls_certfile: str = setting("", "PEM client certificate for mutual TLS (may also hold the key)")
    tls_keyfile: str = setting("", "PEM private key of the client certificate")
    tls_check_hostname: bool = setting(True, "verify that the broker certificate matches its host name")
    sasl_mechanism: str = setting("", "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (SASL_PLAINTEXT, SASL_SSL)")
    sasl_username: str = setting("", "SASL user name")
    sasl_password: str = setting("", "SASL password (prefer the environment or a mounted secret)", repr=False)
    # --- consumer (tansu needs the first three; see docs/event-bus.md) ------------------------------------------------
    session_timeout_ms: int = setting(6000, "a silent group member is dropped after this long (tansu: ~6000)")
    heartbeat_interval_ms: int = setting(1000, "heartbeat period; at most a third of session_timeout_ms "
                                               "(tansu: ~1000)")
    fetch_max_wait_ms: int = setting(10, "longest the broker holds an empty fetch; tansu re-checks at W/2, 3W/4, "
                                         "... so new data waits ~W/6 on average: keep it small")
    fetch_min_bytes: int = setting(1, "the broker answers a fetch once this much data is there (1: at once)")
    max_poll_interval_ms: int = setting(300000, "longest gap between polls before the member is considered stuck")
    max_poll_records: int = setting(10, "records per poll, committed together: keep max_poll_records x the slowest "
                                        "handler call well under max_poll_interval_ms; a crash redelivers at most "
                                        "one poll")
    auto_offset_reset: str = setting("earliest", "where a new group starts: earliest (tansu's 'latest' is unreliable)")
    enable_auto_commit: bool = setting(False, "must stay off: workers commit after their output is produced")
    # --- producer -----------------------------------------------------------------------------------------------------
    linger_ms: int = setting(0, "producer batching delay; 0 keeps per-hop latency lowest")
    compression_type: str = setting("", "'' | gzip | snappy | lz4 | zstd")
    request_timeout_ms: int = setting(30000, "deadline of one broker request")
    # --- record size (one limit for the producers, the consumers and the topics; docs/event-bus.md) ---------------
    max_record_bytes: int = setting(RECORD_LIMIT, "largest key + value of a record: producers refuse larger ones, "
                                                  "workers dead-letter larger inputs before decoding them, topics "
                                                  "are created with max.message.bytes to match")
    dead_letter_value_bytes: int = setting(64 * 1024, "bytes of the poison record's value a dead letter keeps (the "
                                                      "rest is left out; its size and SHA-256 are kept)")
    # --- both ------------------------------------------------------------------------------------------------------
    client_metrics: bool = setting(False, "kafka-python's own per-request metrics (sensors); off halves an idle "
                                          "consumer's CPU, and nothing here reads them")
    # --- worker error policy and connection ---------------------------------------------------------------------------
    max_attempts: int = setting(3, "handler attempts for a retryable error before the record is dead-lettered")
    retry_backoff_ms: int = setting(100, "first retry delay; doubles per attempt up to retry_backoff_max_ms")
    retry_backoff_max_ms: int = setting(5000, "longest retry delay")
    connect_timeout_ms: int = setting(3000, "one attempt to reach the brokers at start-up")
    reconnect_backoff_max_ms: int = setting(5000, "longest wait between connection attempts, at start-up and "
                                                  "after a broker is lost (it doubles from 100)")

    def __post_init__(self):
        def bad(name: str, why: str):
            raise InvalidInput(f"Kafka setting {name} (AGENTFLOW_{ENV_PREFIX}{name.upper()}) {why}")

        if not self.servers():
            bad("bootstrap_servers", "is empty: give at least one host:port")
        for server in self.servers():
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                bad("bootstrap_servers", f"has {server!r}: expected host:port")
        for name in ("partitions", "replication_factor", "max_poll_records", "max_attempts", "session_timeout_ms",
                     "fetch_min_bytes",
                     "heartbeat_interval_ms", "request_timeout_ms", "connect_timeout_ms", "max_poll_interval_ms"):
            if getattr(self, name) < 1:
                bad(name, f"must be at least 1, got {getattr(self, name)}")
        for name in ("fetch_max_wait_ms", "linger_ms", "retry_backoff_ms", "retry_backoff_max_ms",
                     "reconnect_backoff_max_ms"):
            if getattr(self, name) < 0:
                bad(name, f"must not be negative, got {getattr(self, name)}")
        if not 1024 <= self.max_record_bytes <= 100 * RECORD_LIMIT:
            bad("max_record_bytes", f"must be in 1024..{100 * RECORD_LIMIT} (100 MiB: kafka-python could not fetch "
                f"larger records from tansu), got {self.max_record_bytes}")
        if not 0 <= self.dead_letter_value_bytes <= self.max_record_bytes // 2:
            bad("dead_letter_value_bytes", f"must be in 0..max_record_bytes/2 ({self.max_record_bytes // 2}) so that "
                f"a dead letter always fits in a record, got {self.dead_letter_value_bytes}")
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            bad("heartbeat_interval_ms", f"is {self.heartbeat_interval_ms}: it must be at most a third of "
                f"session_timeout_ms ({self.session_timeout_ms}) or one lost heartbeat ends the membership")
        if self.fetch_max_wait_ms >= self.request_timeout_ms:
            bad("fetch_max_wait_ms", f"({self.fetch_max_wait_ms}) must be below request_timeout_ms "
                f"({self.request_timeout_ms})")
        if self.auto_offset_reset not in ("earliest", "latest"):
            bad("auto_offset_reset", f"must be earliest or latest, got {self.auto_offset_reset!r}")
        if self.enable_auto_commit:
            bad("enable_auto_commit", "must be false: offsets are committed after the output is produced "
                "(auto-commit could commit a record whose output was never written)")
        if self.compression_type not in COMPRESSION_TYPES:
            bad("compression_type", f"must be one of {', '.join(c or repr(c) for c in COMPRESSION_TYPES)}, "
                f"got {self.compression_type!r}")
        if self.security_protocol not in SECURITY_PROTOCOLS:
            bad("security_protocol", f"must be one of {', '.join(SECURITY_PROTOCOLS)}, got {self.security_protocol!r}")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        sasl = self.security_protocol.startswith("SASL_")
        for name in ("tls_cafile", "tls_certfile", "tls_keyfile"):
            path = getattr(self, name)
            if path and not tls:
                bad(name, f"is set but security_protocol is {self.security_protocol}: use SSL or SASL_SSL")
            if path and not os.path.isfile(path):
                bad(name, f"names {path!r}, which is not a readable file")
        if self.tls_keyfile and not self.tls_certfile:
            bad("tls_keyfile", "is set without tls_certfile")
        if sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                bad("sasl_mechanism", f"must be one of {', '.join(SASL_MECHANISMS)} with {self.security_protocol}, "
                    f"got {self.sasl_mechanism!r}")
            if not self.sasl_username or not self.sasl_password:
                bad("sasl_username" if not self.sasl_username else "sasl_password",
                    f"is required with {self.security_protocol}")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            bad("sasl_mechanism", f"and its credentials need security_protocol SASL_PLAINTEXT or SASL_SSL, "
                f"got {self.security_protocol}")

    # --- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_env(cls, base: BusConfig | None = None, environ: typing.Mapping[str, str] | None = None) -> BusConfig:
        """``base`` (or the defaults) overridden by every AGENTFLOW_KAFKA_* variable that is set."""
        return _from_env(cls, ENV_PREFIX, base=base, environ=environ)

    # --- derived --------------------------------------------------------------------------------------------------

    def servers(self) -> list[str]:
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    def topic(self, name: str) -> str:
        """The full name of a logical topic ("plans" -> "<prefix>plans")."""
        return self.topic_prefix + name

    def common_options(self) -> dict:
        """Connection and security options shared by producers, consumers and admin clients."""
        options = {
            "bootstrap_servers": self.servers(),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            "bootstrap_timeout_ms": self.connect_timeout_ms,
            # kafka-python's default (30 s) would keep a client away that long after a broker restart
            "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            options.update(ssl_check_hostname=self.tls_check_hostname, ssl_cafile=self.tls_cafile or None,
                           ssl_certfile=self.tls_certfile or None, ssl_keyfile=self.tls_keyfile or None)
        if self.security_protocol.startswith("SASL_"):
            # kafka-python takes the SCRAM credentials in the sasl_plain_* options too.
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password)
        return options

    def consumer_options(self, group_id: str | None) -> dict:
        return {
            **self.common_options(),
            "group_id": group_id,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            "fetch_min_bytes": self.fetch_min_bytes,
            "max_poll_interval_ms": self.max_poll_interval_ms,
            "max_poll_records": self.max_poll_records,
            "auto_offset_reset": self.auto_offset_reset,
            "enable_auto_commit": False,
            "metrics_enabled": self.client_metrics,
            # A record of max_record_bytes comes whole in one fetch, also from brokers that cut a fetch at the limit.
            "max_partition_fetch_bytes": self.max_record_bytes + RECORD_OVERHEAD,
            "fetch_max_bytes": max(50 * RECORD_LIMIT, self.max_record_bytes + RECORD_OVERHEAD),
            # A consumer must never create a topic: tansu would give it 4 partitions, whatever was configured.
            "allow_auto_create_topics": False,
        }

    def producer_options(self) -> dict:
        return {
            **self.common_options(),
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": self.linger_ms,
            "metrics_enabled": self.client_metrics,
            "compression_type": self.compression_type or None,
            "max_request_size": self.max_record_bytes + RECORD_OVERHEAD,
            "allow_auto_create_topics": False,
        }

    def admin_options(self) -> dict:
        return self.common_options()


def help_text() -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in fields(BusConfig)}
