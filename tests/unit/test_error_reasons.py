"""One idiom for why a call failed: ``agentflow.errors.Reason``. Every reason has a gRPC status and an HTTP status,
every domain error class in the code names one, and a reason that is not a ``Reason`` fails where it is written."""

import importlib
import pkgutil

import grpc
import pytest

import agentflow
from agentflow import httpd
from agentflow.errors import AgentFlowError, EngineTimeout, InvalidInput, Reason
from agentflow.rpc.errors import STATUS_BY_REASON, status_for


def test_every_reason_has_a_grpc_and_an_http_status():
    assert set(STATUS_BY_REASON) == set(Reason)
    assert set(httpd.HTTP_STATUS_BY_REASON) == set(Reason)
    for reason in Reason:  # the two maps agree where gRPC's own mapping to HTTP says so
        code, status = STATUS_BY_REASON[reason], httpd.HTTP_STATUS_BY_REASON[reason]
        assert (code == grpc.StatusCode.UNAVAILABLE) == (status == 503), reason
        assert (code == grpc.StatusCode.INVALID_ARGUMENT) <= (status == 400), reason


@pytest.mark.parametrize("error, code, status", [
    (InvalidInput("empty query"), grpc.StatusCode.INVALID_ARGUMENT, 400),
    (EngineTimeout("too slow"), grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (AgentFlowError("broker down", reason="unavailable"), grpc.StatusCode.UNAVAILABLE, 503),
    (AgentFlowError("bug"), grpc.StatusCode.INTERNAL, 500),
])
def test_an_error_maps_by_its_reason(error, code, status):
    assert status_for(error) == (code, f"{error.reason}: {error}")
    assert httpd.http_status(error) == status


def test_a_reason_that_is_not_one_fails_where_it_is_written():
    with pytest.raises(ValueError):
        AgentFlowError("x", reason="unavailabel")
    with pytest.raises(ValueError):
        type("Typo", (AgentFlowError,), {"reason": "not-a-reason"})
    assert AgentFlowError("x", reason="not_found").reason is Reason.NOT_FOUND
    assert f"{Reason.NOT_FOUND}" == "not_found" and Reason.NOT_FOUND == "not_found"


def every_module():
    import agentflow.services
    import agentflow.trainer

    packages = [(agentflow, "agentflow."), (agentflow.services, "agentflow.services."),
                (agentflow.trainer, "agentflow.trainer.")]
    for info in (i for package, prefix in packages for i in pkgutil.walk_packages(package.__path__, prefix)):
        if not info.name.startswith(("agentflow.proto", "agentflow.demo.view")):
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra (kubernetes, vllm) not installed here
                continue


def test_every_error_class_in_the_code_names_a_reason():
    every_module()
    classes, seen = [AgentFlowError], set()
    while classes:
        cls = classes.pop()
        seen.add(cls)
        classes += cls.__subclasses__()
    ours = {cls for cls in seen if cls.__module__.startswith("agentflow")}  # not a test's (the typo above)
    assert len(ours) > 25  # the bus, the LLM layer, the services, the rollout backends
    assert [cls for cls in ours if not isinstance(cls.reason, Reason)] == []
