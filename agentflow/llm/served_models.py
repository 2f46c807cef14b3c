"""What the LLM server serves, as vLLM's routes show it: ``GET /v1/models`` (``list_models``) and the runtime LoRA
API (``load_lora``, ``unload_lora``), over the server's ``Versions``, with vLLM's status codes and error bodies."""

from __future__ import annotations

import time

from agentflow.errors import InvalidInput
from agentflow.llm.protocol import RequestError
from agentflow.llm.versions import VersionError, Versions
from agentflow.versions import check_version_name


def load_lora(versions: Versions, served_name: str, body: dict) -> str:
    """``POST /v1/load_lora_adapter``: load ``lora_path`` as version ``lora_name`` with weight 0 (like ``POST
    /admin/versions``: the server's loader applies the URI allow-list). vLLM's answers: 200 with a text body; 400
    ``InvalidUserInput`` for a missing field, a name ``check_version_name`` refuses, the served name, or a name
    loaded already. A checkpoint that cannot (or may not) be loaded is a 400 ``BadRequestError`` with the reason,
    where vLLM answers 404 (no adapter at the path) or 500 (an adapter its engine refuses)."""
    name, path = body.get("lora_name"), body.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise RequestError(400, "Both 'lora_name' and 'lora_path' must be provided.", kind="InvalidUserInput")
    try:
        check_version_name(name)
    except InvalidInput as e:
        raise RequestError(400, str(e), "lora_name", kind="InvalidUserInput") from None
    if name == served_name:
        raise RequestError(400, f"The lora adapter '{name}' conflicts with a served base model.",
                           kind="InvalidUserInput")
    if body.get("load_inplace"):
        raise RequestError(400, "load_inplace is not supported: load changed weights under a new name",
                           "load_inplace", kind="InvalidUserInput")
    try:
        versions.add(name, path)
    except VersionError as e:
        if e.status == 409:
            raise RequestError(400, f"The lora adapter '{name}' has already been loaded.",
                               kind="InvalidUserInput") from None
        raise RequestError(400, str(e), kind="BadRequestError") from None
    return f"Success: LoRA adapter '{name}' added successfully."


def unload_lora(versions: Versions, served_name: str, body: dict) -> str:
    """``POST /v1/unload_lora_adapter``: unload version ``lora_name``. vLLM's answers: 200 with a text body; 400
    ``InvalidUserInput`` without a name; 404 ``NotFoundError`` for a name that is not loaded or is the served name
    (the base model, never unloaded). A version that still has weight (``PUT /admin/weights``) is a 409
    ``ConflictError`` (vLLM has no weights)."""
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", kind="InvalidUserInput")
    missing = RequestError(404, f"The lora adapter '{name}' cannot be found.", kind="NotFoundError")
    if name == served_name:
        raise missing
    try:
        versions.remove(name)
    except VersionError as e:
        if e.status == 404:
            raise missing from None
        raise RequestError(e.status, str(e), kind="ConflictError" if e.status == 409 else None) from None
    return f"Success: LoRA adapter '{name}' removed successfully."


def list_models(versions: Versions, served_name: str) -> dict:
    """``GET /v1/models`` as vLLM answers it: the served name first (``parent`` null; ``root`` the URI of the
    version of that name, if one is loaded), then every other version as an adapter of it."""
    now = int(time.time())
    described = versions.describe()
    uris = {v["name"]: v["uri"] for v in described}
    base = {"id": served_name, "object": "model", "created": now, "owned_by": ",".join(uris),
            "root": uris.get(served_name) or None, "parent": None}
    return {"object": "list", "data": [base, *(
        {"id": v["name"], "object": "model", "created": now, "owned_by": "agentflow", "root": v["uri"] or None,
         "parent": served_name} for v in described if v["name"] != served_name)]}
