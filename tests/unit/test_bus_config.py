"""BusConfig: defaults tansu needs, validation naming the setting, env mapping, kafka-python options (no broker)."""

import pytest

from agentflow.bus.config import BusConfig, help_text
from agentflow.errors import InvalidInput


def test_defaults_carry_the_settings_tansu_needs():
    config = BusConfig()
    consumer = config.consumer_options("planner")
    assert consumer["session_timeout_ms"] == 6000 and consumer["heartbeat_interval_ms"] == 1000
    assert consumer["fetch_max_wait_ms"] == 10 and consumer["fetch_min_bytes"] == 1
    # kafka-python's own sensors are off (nothing reads them; they cost CPU on every fetch); the admin client,
    # which rejects unknown options, does not get the flag
    assert consumer["metrics_enabled"] is False and config.producer_options()["metrics_enabled"] is False
    assert "metrics_enabled" not in config.admin_options()
    assert BusConfig.from_env(environ={"AGENTFLOW_KAFKA_CLIENT_METRICS": "true"}).consumer_options(None)[
        "metrics_enabled"] is True
    assert consumer["auto_offset_reset"] == "earliest" and consumer["enable_auto_commit"] is False
    assert consumer["group_id"] == "planner" and consumer["allow_auto_create_topics"] is False
    producer = config.producer_options()
    assert producer["acks"] == "all" and producer["enable_idempotence"] is True
    assert producer["security_protocol"] == "PLAINTEXT" and "sasl_mechanism" not in producer
    assert all(help_text().values()), "every setting has a help text"


def test_servers_and_prefix():
    config = BusConfig(bootstrap_servers=" a:9092, b:9093 ,", topic_prefix="prod.")
    assert config.servers() == ["a:9092", "b:9093"]
    assert config.common_options()["bootstrap_servers"] == ["a:9092", "b:9093"]
    assert config.topic("plans") == "prod.plans"


def test_from_env_maps_agentflow_kafka_variables():
    env = {"AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092", "AGENTFLOW_KAFKA_PARTITIONS": "12",
           "AGENTFLOW_KAFKA_CREATE_TOPICS": "false", "AGENTFLOW_KAFKA_TOPIC_PREFIX": "staging.",
           "AGENTFLOW_PARTITIONS": "99"}
    config = BusConfig.from_env(environ=env)
    assert (config.servers(), config.partitions, config.create_topics, config.topic_prefix) == (
        ["k1:9092", "k2:9092"], 12, False, "staging.")
    assert BusConfig.from_env(environ={}) == BusConfig()
    with pytest.raises(InvalidInput, match="AGENTFLOW_KAFKA_PARTITIONS"):
        BusConfig.from_env(environ={"AGENTFLOW_KAFKA_PARTITIONS": "many"})


def test_sasl_over_tls_maps_onto_kafka_python(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = BusConfig.from_env(environ={
        "AGENTFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "AGENTFLOW_KAFKA_TLS_CAFILE": str(ca),
        "AGENTFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "AGENTFLOW_KAFKA_SASL_USERNAME": "svc",
        "AGENTFLOW_KAFKA_SASL_PASSWORD": "s3cret"})
    options = config.consumer_options("g")
    assert options["security_protocol"] == "SASL_SSL" and options["ssl_cafile"] == str(ca)
    assert options["ssl_certfile"] is None and options["ssl_check_hostname"] is True
    assert (options["sasl_mechanism"], options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "SCRAM-SHA-512", "svc", "s3cret")
    assert "s3cret" not in repr(config)


def test_mutual_tls_options(tmp_path):
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("x")
    config = BusConfig(security_protocol="SSL", tls_cafile=str(tmp_path / "ca.pem"),
                       tls_certfile=str(tmp_path / "client.pem"), tls_keyfile=str(tmp_path / "client.key"))
    options = config.admin_options()
    assert (options["ssl_certfile"], options["ssl_keyfile"]) == (str(tmp_path / "client.pem"),
                                                                 str(tmp_path / "client.key"))
    assert "sasl_mechanism" not in options


@pytest.mark.parametrize("settings, named", [
    ({"bootstrap_servers": ""}, "bootstrap_servers"),
    ({"bootstrap_servers": "localhost"}, "bootstrap_servers"),
    ({"bootstrap_servers": "h:99999"}, "bootstrap_servers"),
    ({"partitions": 0}, "partitions"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"fetch_max_wait_ms": -1}, "fetch_max_wait_ms"),
    ({"fetch_min_bytes": 0}, "fetch_min_bytes"),
    ({"heartbeat_interval_ms": 3000}, "heartbeat_interval_ms"),
    ({"fetch_max_wait_ms": 40000}, "fetch_max_wait_ms"),
    ({"auto_offset_reset": "smallest"}, "auto_offset_reset"),
    ({"enable_auto_commit": True}, "enable_auto_commit"),
    ({"compression_type": "brotli"}, "compression_type"),
    ({"security_protocol": "TLS"}, "security_protocol"),
    ({"tls_cafile": "/etc/hosts"}, "tls_cafile"),
    ({"security_protocol": "SSL", "tls_cafile": "/no/such/ca.pem"}, "tls_cafile"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "sasl_password"),
    ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"}, "sasl_mechanism"),
])
def test_validation_names_the_setting(settings, named):
    with pytest.raises(InvalidInput) as info:
        BusConfig(**settings)
    message = str(info.value)
    assert f"Kafka setting {named} (AGENTFLOW_KAFKA_{named.upper()})" in message, message
