"""The rollout fleet's ``vllm`` kind: full-weight versions replaced in place in a running vLLM (docs/rollout.md).

The server is started with ``weights_token`` (``agentflow.llm.vllm_server.start_vllm``; in the chart, the fleet of
a full-weight backend), which loads ``agentflow/llm/vllm_plugin/agentflow_vllm.py`` into it. It holds one version at
a time, under the one model name it was started with; the routing table names that model (``fleet_model``). Loading
a version::

    POST /pause?mode=wait          the planner calls in flight finish, new ones wait
    POST /collective_rpc           {"method": "load_weights_from", "args": [folder, version]}
    POST /reset_prefix_cache       cached prefixes were computed with the old weights
    POST /resume                   always, also after a refused version

The folder is the version's checkpoint, an absolute path the server can read: the model store mounted at the same
path, or, for a remote store (``s3://...``), ``<mirror>/<version>``, where ``agentflow fleet-mirror`` beside the
server copies each new version (``agentflow.trainer.mirror``). A version not mirrored yet is tried again on the next
tick (a retryable error, nothing is paused); the server keeps the version it holds meanwhile.

Calls that reach the fleet between a load and the planner's next routing table are sampled from the new weights but
recorded under the previous name; their behaviour log-probs are the served ones, so the objective's importance
weights stay exact, and the trainer's check of the sampling version compares them with that version.
"""

from __future__ import annotations

import logging

from agentflow import storage
from agentflow.rollout.backends import (AdminClient, BackendError, Version, VersionRejected, error_message,
                                        local_path)

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 600.0  # draining the calls in flight and reading a large checkpoint take longer than a status call


class WeightsFleetServer:
    """A ``FleetServer`` (agentflow/rollout/fleet.py) on a vLLM that replaces its weights in place."""

    capacity = 1  # one set of weights

    def __init__(self, url: str, *, token: str, serving_url: str = "", mirror: str = "", **client):
        if not token:
            raise BackendError("the vllm fleet needs the admin token its server was started with "
                               "(AGENTFLOW_VLLM_ADMIN_TOKEN there; --fleet-admin-token here)", retryable=False)
        self.admin = AdminClient(url, token=token, **client)
        self.target = self.admin.target
        self.serving_url = serving_url.rstrip("/") or self.target + "/v1"
        self.model = ""  # the served model name, read from the server
        self.mirror = mirror.rstrip("/")

    def loaded(self) -> set[str]:
        state = self._rpc("loaded_version")
        try:
            self.model, version = str(state["model"]), str(state["version"])
        except (KeyError, TypeError) as e:
            raise BackendError(f"{self.target}: loaded_version answered {state!r}: is it started with the "
                               "agentflow_vllm worker extension?", retryable=False) from e
        return {version} if version else set()

    def load(self, version: Version) -> None:
        folder = self._folder(version)
        self.admin.request("POST", "/pause?mode=wait", timeout_s=LOAD_TIMEOUT_S)
        try:
            self._rpc("load_weights_from", folder, version.name)
            self.admin.request("POST", "/reset_prefix_cache")
        finally:
            self.admin.request("POST", "/resume")
        log.info("%s now serves %s from %s", self.target, version.name, folder)

    def unload(self, name: str) -> None:
        """Nothing to do: the next version's weights replace these."""

    def _folder(self, version: Version) -> str:
        """Where the server reads ``version``: its own local path, or its copy in the mirror."""
        if not self.mirror or storage.local_path(version.uri) is not None:  # a local folder is read where it is
            return local_path(version, "vllm fleet")
        folder = f"{self.mirror}/{version.name}"
        state = self._rpc("is_model_folder", folder)
        if not (isinstance(state, dict) and state.get("model_folder") is True):
            raise BackendError(f"{version.name} is not in the mirror ({folder}) yet: is agentflow fleet-mirror "
                               "running beside the server, with --store the trainer's model store?")
        return folder

    def _rpc(self, method: str, *args):
        """One worker-extension method through ``/collective_rpc``: the first worker's result."""
        response = self.admin.request("POST", "/collective_rpc", json={"method": method, "args": list(args)},
                                      accept=(200, 400, 500), timeout_s=LOAD_TIMEOUT_S)
        if response.status_code == 200:
            try:
                return response.json()["results"][0]
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise BackendError(f"{self.target}/collective_rpc answered {response.text[:200]!r}",
                                   retryable=False) from e
        why = error_message(response)
        if method == "load_weights_from" and "model folder" in why:
            raise VersionRejected(f"{self.target} refused {args[1]!r} from {args[0]}: {why}")
        raise BackendError(f"{self.target}: {method} failed with HTTP {response.status_code}: {why}")
