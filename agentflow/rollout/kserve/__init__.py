"""The KServe backends (``AGENTFLOW_ROLLOUT_KSERVE_MODE``), on ``serving.kserve.io/v1beta1`` InferenceServices:

* ``canary`` (``KServeBackend``, ``canary.py``): one InferenceService, Knative mode, the split by
  ``canaryTrafficPercent`` and each revision reached by its tag URL;
* ``pair`` (``KServePairBackend``, ``pair.py``): a stable and a canary InferenceService, Knative or Standard mode,
  the split in the routing table.

Both build on ``base.KServeBase`` (the API plumbing and the readers of InferenceService objects)."""

from agentflow.rollout.kserve.canary import KServeBackend
from agentflow.rollout.kserve.pair import KServePairBackend


def kserve_backend(settings, *, api=None):
    """The KServe backend ``settings.kserve_mode`` names (canary: ``KServeBackend``, pair: ``KServePairBackend``)."""
    backend = KServePairBackend if settings.kserve_mode == "pair" else KServeBackend
    return backend.from_settings(settings, api=api)
