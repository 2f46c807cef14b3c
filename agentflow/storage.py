"""Folders behind URIs: a local path, file://..., or any fsspec URI (s3://, gs://, memory://, ...), and the local
cache that remote folders are downloaded into.

The cache is ``$AGENTFLOW_MODEL_CACHE`` or ``<agentflow cache>/models`` (``$AGENTFLOW_CACHE/models``, by default
``~/.cache/agentflow/models``); a remote folder ``<parent>/<name>`` is kept in
``<cache>/<parent's name>-<hash of the parent URI>/<name>``, so the versions of one model store share a subfolder.
A folder is downloaded into a temporary sibling and renamed into place: a half download is never used.

Credentials and endpoints come from the backend's usual sources (for S3: ``AWS_*`` variables or ~/.aws, and
``AWS_ENDPOINT_URL`` for an S3-compatible server) or from fsspec's configuration (``FSSPEC_S3='{"key": ...}'``).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import tempfile
from pathlib import Path

from agentflow.errors import InvalidInput

CACHE_ENV = "AGENTFLOW_MODEL_CACHE"
_EXTRAS = {"s3": "agentflow[s3]"}  # protocol -> what to pip install for it


def local_path(uri: str | Path) -> Path | None:
    """The folder a local URI names (a path or file://...); None for any other protocol."""
    from fsspec.core import split_protocol

    protocol, path = split_protocol(str(uri))
    return Path(path).expanduser() if protocol in (None, "file", "local") else None


def check_allowed(uri: str, allowed: list[str]) -> None:
    """Refuse (``InvalidInput``) a model URI outside ``allowed``: absolute local folders (a URI may name the folder or
    anything below it, after symbolic links and ``..`` are resolved) and remote URI prefixes (``s3://bucket/models``:
    that folder and below). A relative path, ``~``, a ``..`` segment in a remote URI, and any protocol no entry
    names (``http://``, ``memory://``, ...) are refused."""
    from fsspec.core import split_protocol

    if not isinstance(uri, str) or not uri or "\x00" in uri:
        raise InvalidInput(f"a model URI must be a non-empty string, got {uri!r}")
    protocol, path = split_protocol(uri)
    if protocol in (None, "file", "local"):
        if not path.startswith("/"):
            raise InvalidInput(f"model URI {uri!r} is not an absolute path (relative paths and ~ are refused)")
        real = os.path.realpath(path)
        for root in allowed:
            local = local_path(root) if split_protocol(root)[0] in (None, "file", "local") else None
            if local is not None and _inside(real, os.path.realpath(local)):
                return
    else:
        if ".." in uri.split("://", 1)[1].split("/"):
            raise InvalidInput(f"model URI {uri!r} has a '..' segment")
        for prefix in allowed:
            if "://" in prefix and split_protocol(prefix)[0] not in ("file", "local") and _inside(uri, prefix):
                return
    raise InvalidInput(f"model URI {uri!r} is outside the allowed roots ({', '.join(allowed) or 'none'}); add its "
                       "store with serve-llm --model-store or --allow-model-uri")


def _inside(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def filesystem(uri: str):
    """``(fsspec filesystem, path inside it)`` for ``uri``, with a clear error for an unknown protocol or a missing
    backend package."""
    from fsspec.core import split_protocol, url_to_fs

    protocol = split_protocol(uri)[0]
    try:
        return url_to_fs(uri)
    except ImportError as e:  # fsspec knows the protocol; its package is not installed
        hint = f" (pip install '{_EXTRAS[protocol]}')" if protocol in _EXTRAS else ""
        raise InvalidInput(f"cannot open {uri}: {e}{hint}") from e
    except ValueError as e:
        raise InvalidInput(f"cannot open {uri}: {e} (not a local path or a protocol fsspec knows)") from e


def cache_dir() -> Path:
    """This install's cache (converted models, copies of remote folders, indexes, tools): $AGENTFLOW_CACHE or
    ~/.cache/agentflow."""
    return Path(os.environ.get("AGENTFLOW_CACHE") or Path.home() / ".cache" / "agentflow")


def cache_root() -> Path:
    """Where remote folders are cached on this machine."""
    return Path(os.environ.get(CACHE_ENV) or cache_dir() / "models").expanduser()


def cache_for(fs, path: str) -> Path:
    """The cache subfolder of the remote folder ``path`` (a model store's root: its versions go inside)."""
    uri = fs.unstrip_protocol(path.rstrip("/"))
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return cache_root() / f"{posixpath.basename(path.rstrip('/')) or 'root'}-{digest}"


def cached_folder(fs, path: str) -> Path:
    """Where the remote folder ``path`` is (or would be) cached."""
    parent, name = posixpath.split(path.rstrip("/"))
    return cache_for(fs, parent) / name


def local_copy(uri: str | Path, *, marker: str | None = None) -> Path:
    """A local folder with the contents of ``uri``: a local folder as it is, a remote one downloaded into the cache
    (once). With ``marker`` (a file name), a cached copy is used only while its marker file equals the remote one,
    so a folder written again under the same URI (a store wiped and restarted) is downloaded again."""
    local = local_path(uri)
    if local is not None:
        return local
    fs, path = filesystem(str(uri))
    target = cached_folder(fs, path)
    if target.is_dir() and (marker is None or _same_marker(fs, path, target, marker)):
        return target
    download(fs, path, target)
    return target


def download(fs, path: str, target: Path) -> None:
    """Copy every file under the remote folder ``path`` to ``target`` through a temporary folder. A ``target``
    that exists already is replaced; one that appears meanwhile (another process was faster) is kept."""
    fs.invalidate_cache(path)
    files = fs.find(path)
    if not files:
        raise InvalidInput(f"{fs.unstrip_protocol(path)} does not exist or is empty")
    stale = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        for remote in files:
            name = posixpath.relpath(remote, path)
            if name == ".." or name.startswith("../") or posixpath.isabs(name):  # an object key with ".." in it
                raise InvalidInput(f"{fs.unstrip_protocol(remote)} is not inside {fs.unstrip_protocol(path)}: "
                                   "refusing to download it")
            local = tmp / name
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(local))
        if stale or not target.exists():
            replace_folder(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def upload(folder: Path, fs, path: str, *, last: str | None = None) -> None:
    """Copy every file under ``folder`` to the remote folder ``path`` (whatever was there is removed first); the
    file named ``last`` goes last, so that its presence says the upload is complete."""
    fs.invalidate_cache(path)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    names = [n for n in names if n != last] + [n for n in names if n == last]
    for parent in sorted({posixpath.dirname(n) for n in names}):
        fs.makedirs(posixpath.join(path, parent) if parent else path, exist_ok=True)
    for name in names:
        fs.put_file(str(folder / name), posixpath.join(path, name))
    fs.invalidate_cache(path)


def replace_folder(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``. A previous ``target`` is moved aside first and then deleted, so a reader never
    sees a mix of the two (one that holds its files open keeps reading the old ones)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-old-"))
        target.rename(old / target.name)
    try:
        tmp.rename(target)
    except OSError:
        if not target.is_dir():  # not merely another process that put the folder there first
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _same_marker(fs, path: str, cached: Path, marker: str) -> bool:
    local = cached / marker
    try:
        remote = fs.cat_file(posixpath.join(path, marker))
    except FileNotFoundError:
        return not local.exists()
    return local.is_file() and local.read_bytes() == remote
