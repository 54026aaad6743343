"""A hub id that is not cached, with no hub to answer, fails in seconds with one line that names
HF_HUB_OFFLINE=1 (transformers' own retries took about a minute). Only local addresses are used:
a closed port on 127.0.0.1 as the unreachable hub, a local HTTP server as a reachable one."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import huggingface_hub.constants
import pytest
from click.testing import CliRunner

import specdiff.hub as hub_access
from specdiff import loading
from specdiff.errors import LoadError
from specdiff.sources import load_tokenizer
from specdiff_cli.main import cli

CLOSED_PORT = "http://127.0.0.1:9"  # discard: nothing listens there


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache, online mode, and a settable endpoint; the probe's memo cleared."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub_access._hub_unreachable.cache_clear()
    yield lambda endpoint: monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    hub_access._hub_unreachable.cache_clear()


def test_unreachable_hub_fails_fast_naming_hf_hub_offline(hub):
    hub(CLOSED_PORT)
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["generate", "--target", "nobody/not-cached", "--prompt", "x"])
    assert time.perf_counter() - start < 5
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("specdiff: error: 'nobody/not-cached' is not in the local Hugging Face cache "
                                    f"and the hub ({CLOSED_PORT}) does not answer")
    assert "HF_HUB_OFFLINE=1" in result.stderr


def test_a_hub_that_answers_passes_the_probe(hub):
    class NotFound(BaseHTTPRequestHandler):
        def do_HEAD(self):  # any status means the hub is there
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub(f"http://127.0.0.1:{server.server_port}")
        hub_access.check_hub("nobody/not-cached")
    finally:
        server.shutdown()
        server.server_close()


def test_no_probe_when_offline_or_cached(hub, monkeypatch, tmp_path):
    hub(CLOSED_PORT)
    with pytest.raises(LoadError, match="HF_HUB_OFFLINE=1"):
        hub_access.check_hub("someone/cached")
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = tmp_path / "models--someone--cached"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "config.json").write_text("{}")
    hub_access.check_hub("someone/cached")  # in the cache: the hub is not asked
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub_access.check_hub("nobody/not-cached")  # offline: the hub library reads the cache only


@pytest.mark.parametrize("load", [loading.load_target, loading.load_drafter])
def test_offline_names_the_missing_model_not_the_hubs_setting(load, monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 and an id not in the cache: one line that names the id and the setting,
    for a target too (it said "drafter files"), without the hub library's "set HF_HUB_OFFLINE=0"."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LoadError) as e:
        load("nobody/not-cached")
    assert str(e.value) == ("'nobody/not-cached' is not a local directory and not in the local Hugging Face cache "
                            "(HF_HUB_OFFLINE is set: cached models only); name a local directory, or download it "
                            "once with network access")


@pytest.mark.parametrize("offline", [True, False])
def test_a_path_that_does_not_exist_is_one_line(hub, offline, monkeypatch, tmp_path):
    """An absolute tokenizer path that does not exist (a cached export's tokenizer folder gone) was a
    three-deep HFValidationError traceback from the hub library's check of it as a repo id."""
    hub(CLOSED_PORT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(LoadError) as e:
        load_tokenizer(str(tmp_path / "gone" / "tokenizer"))
    assert str(e.value) == f"cannot load tokenizer from '{tmp_path / 'gone' / 'tokenizer'}': no such directory " \
                           "(and not a hub id)"
