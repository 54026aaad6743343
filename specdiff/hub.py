"""The Hugging Face hub, only where the user named a hub id: one probe of the endpoint before
transformers' minute of retries, one LoadError line for its many failure types, and the download
of a model's files (a local directory is used as it is).
May import: errors; huggingface_hub.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from huggingface_hub import constants as hub_constants, snapshot_download, try_to_load_from_cache
from huggingface_hub import get_session
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # public, in a lazy __all__

from .errors import LoadError

HUB_PROBE_TIMEOUT_S = 3.0  # one request to the hub's endpoint before transformers' retries (a minute offline)


def hub_call(what: str, source: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a from_pretrained call, turning its many failure types into one LoadError line. A source
    that is no local path and cannot be a hub id either (an absolute path that does not exist) is
    refused first: the hub library's checks of it raised HFValidationError."""
    if not Path(source).exists():
        if not _is_repo_id(source):
            raise LoadError(f"cannot load {what} from '{source}': no such directory (and not a hub id)")
        check_hub(source)
    try:
        return fn(source, *args, **kwargs)
    except Exception as e:  # transformers raises OSError, ValueError, SafetensorError, ...
        if not Path(source).exists() and hub_constants.HF_HUB_OFFLINE and not _cached(source):
            raise LoadError(f"'{source}' is not a local directory and not in the local Hugging Face cache "
                            "(HF_HUB_OFFLINE is set: cached models only); name a local directory, or "
                            "download it once with network access") from e
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = "" if Path(source).exists() else " (not a local directory; the hub needs network access)"
        raise LoadError(f"cannot load {what} from '{source}'{hint}: {first}") from e


def check_hub(repo_id: str) -> None:
    """Fail in seconds, not after a minute of retries, when a hub id is not in the local Hugging
    Face cache and the hub does not answer. Not asked with HF_HUB_OFFLINE set (the hub library then
    reads the cache only) or when the id is cached."""
    if hub_constants.HF_HUB_OFFLINE or _cached(repo_id):
        return
    failure = _hub_unreachable(hub_constants.ENDPOINT)
    if failure:
        raise LoadError(f"'{repo_id}' is not in the local Hugging Face cache and the hub ({hub_constants.ENDPOINT}) "
                        f"does not answer ({failure}); name a local directory, or set HF_HUB_OFFLINE=1 to use "
                        "cached models only")


def _is_repo_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds the repository's config.json."""
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


@lru_cache(maxsize=None)
def _hub_unreachable(endpoint: str) -> str | None:
    """None if the endpoint answers one HEAD request within HUB_PROBE_TIMEOUT_S (any HTTP status:
    it is there), else why not. Through the hub library's session: its proxies and certificates."""
    try:
        get_session().head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as e:  # the session's transport errors (httpx or requests, by hub version)
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def fetch(source: str, files: tuple[str, ...]) -> Path:
    """A local directory as is; a hub id -> a local snapshot holding those of `files` it has."""
    if Path(source).is_dir():
        return Path(source)
    return Path(hub_call("model files", source, snapshot_download, allow_patterns=list(files)))
