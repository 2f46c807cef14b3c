"""kmock's Kubernetes API emulator on 127.0.0.1, run on its own event-loop thread so the real (synchronous)
``kubernetes`` client can talk to it over HTTP.

kmock keeps objects in memory and applies creates, JSON merge patches (``null`` deletes a key) and deletes. This
subclass adds what the rollout controller relies on from a real API server:

* 201 Created on create (kmock answers 200), a ``metadata.uid``; 409 when the name exists (kmock's);
* ``metadata.resourceVersion`` bumped on every write (status writes too), ``metadata.generation`` on spec changes;
* optimistic concurrency: a patch carrying a stale ``metadata.resourceVersion`` gets 409 Conflict, and so does a
  delete whose ``preconditions`` (uid, resourceVersion) do not match;
* deletes of objects with ``metadata.finalizers`` only set ``deletionTimestamp`` (kmock's; ``release`` drops the
  finalizers, as the owning controller would, and the object goes);
* only ``application/merge-patch+json`` patches (415 otherwise);
* injected failures (``fail(method, status)``) and hooks run just before a patch, create or delete is applied
  (``before_patch``, ``before_create``, ``before_delete``: one per request, e.g. a concurrent writer).

What it does NOT check or do, so the tests cannot catch it either:

* there is no KServe controller: nothing reconciles an InferenceService, creates Knative revisions, splits traffic
  or writes ``status`` — tests write status themselves (as KServe would) through the status subresource;
* no admission webhooks, no OpenAPI/CRD schema validation (a misspelt field is stored as sent), no defaulting;
* no authentication or RBAC (the chart's Role is checked by tests/deploy, not here);
* no strategic-merge or JSON-patch semantics, no server-side apply, no field managers, no watch bookmarks;
* status is not a separate subresource: a patch to ``/status`` merges into the whole object.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid

import kmock


class KServeApiEmulator(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.versions = itertools.count(1)
        self.failures: list[tuple[str, int]] = []
        self.before_patch: list = []
        self.before_create: list = []
        self.before_delete: list = []
        self.log: list[tuple[str, str, int | None]] = []

    def fail(self, method: str, status: int, times: int = 1) -> None:
        self.failures.extend([(method.upper(), status)] * times)

    async def _handle(self, request):
        method = request.method.value if request.method is not None else ""
        status = None
        try:
            if request.resource is not None:
                for i, (m, code) in enumerate(self.failures):
                    if m == method:
                        del self.failures[i]
                        raise kmock.KubernetesError(status=code, reason="Injected",
                                                    message=f"injected {code} for {method}")
                if request.action == kmock.action.CREATE:
                    if self.before_create:
                        self.before_create.pop(0)(self)
                    meta = request.data.setdefault("metadata", {})
                    meta.update(resourceVersion=str(next(self.versions)), generation=1, uid=str(uuid.uuid4()),
                                namespace=meta.get("namespace") or request.namespace)
                elif request.action == kmock.action.UPDATE:
                    await self._check_patch(request)
                elif request.action == kmock.action.DELETE:
                    self._check_delete(request)
            response = await super()._handle(request)
            if request.action == kmock.action.CREATE and response.status == 200:
                response.set_status(201)
            status = response.status
            return response
        except kmock.KubernetesError as e:
            status = e.status
            raise
        finally:
            self.log.append((method, str(request.url.path), status))

    async def _check_patch(self, request) -> None:
        content_type = request.headers.get("Content-Type", "")
        if "application/merge-patch+json" not in content_type:
            raise kmock.KubernetesError(status=415, reason="UnsupportedMediaType",
                                        message=f"only merge patches here, got {content_type!r}")
        if self.before_patch:  # one hook per patch
            self.before_patch.pop(0)(self)
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        current = self.objects[key]
        meta = current.get("metadata", {})
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != meta.get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict",
                                        message="the object has been modified; please apply your changes to the "
                                                "latest version and try again")
        changes = request.data.setdefault("metadata", {})
        changes["resourceVersion"] = str(next(self.versions))
        if request.subresource is None and "spec" in request.data:
            changes["generation"] = int(meta.get("generation", 0)) + 1

    def _check_delete(self, request) -> None:
        if self.before_delete:
            self.before_delete.pop(0)(self)
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        meta = self.objects[key].get("metadata", {})
        wanted = (request.data or {}).get("preconditions") or {} if isinstance(request.data, dict) else {}
        for field in ("uid", "resourceVersion"):
            if wanted.get(field) is not None and wanted[field] != meta.get(field):
                raise kmock.KubernetesError(status=409, reason="Conflict",
                                            message=f"Precondition failed: {field} in precondition: {wanted[field]}, "
                                                    f"{field} in object meta: {meta.get(field)}")

    def release(self, key: tuple) -> None:
        """The owner of a finalizer lets go (e.g. KServe after cleaning up): a deleted object goes."""
        self.objects[key].patch({"metadata": {"finalizers": None}})
        if self.objects[key].get("metadata", {}).get("deletionTimestamp"):
            self.objects[key].delete()

    def bump(self, key: tuple) -> None:
        """A concurrent writer (e.g. the KServe controller updating status): the resourceVersion moves on."""
        self.objects[key].patch({"metadata": {"resourceVersion": str(next(self.versions))}})


class KubeApi:
    """The emulator on a background loop; ``api`` is a real ``kubernetes.client.CustomObjectsApi`` pointed at it."""

    def __enter__(self) -> KubeApi:
        from kubernetes import client

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)
        self.thread.start()
        self.emulator, self.server = self.run(self._start())
        self.url = str(self.server.url).rstrip("/")
        configuration = client.Configuration()
        configuration.host = self.url
        self.api_client = client.ApiClient(configuration)
        self.api = client.CustomObjectsApi(self.api_client)
        return self

    async def _start(self):
        emulator = KServeApiEmulator()
        await emulator.__aenter__()
        server = kmock.Server(emulator)
        await server.__aenter__()
        return emulator, server

    def run(self, coroutine, timeout_s: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, fn):
        """Run ``fn(emulator)`` on the emulator's loop (its objects are not thread-safe)."""
        async def wrapped():
            return fn(self.emulator)

        return self.run(wrapped())

    def __exit__(self, *exc) -> None:
        self.api_client.close()
        self.run(self.server.__aexit__(None, None, None))
        self.run(self.emulator.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
