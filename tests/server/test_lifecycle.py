"""Lifecycle of a real `preheat-server` process: cold start exported, SIGTERM drains, exit 0."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

PROMPT = "Readiness must turn 503 as soon as the replica starts draining"


class _StreamReader(threading.Thread):
    """Reads one SSE response to its end in the background, keeping every data payload."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.events: list[str] = []
        self.first = threading.Event()
        self.error: BaseException | None = None
        self._response = requests.post(url + "/v1/completions", json={**body, "stream": True}, stream=True,
                                       timeout=120)

    def run(self) -> None:
        try:
            for line in self._response.iter_lines():
                if line.startswith(b"data: "):
                    self.events.append(line[6:].decode())
                    self.first.set()
        except requests.RequestException as exc:   # cut by the drain deadline
            self.error = exc
        finally:
            self.first.set()

    def finish_reason(self) -> str | None:
        reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in self.events if e != "[DONE]"]
        return next((r for r in reversed(reasons) if r), None)


def test_sigterm_readiness_503_inflight_finish_exit_0(spawn_server_process: Any, server_tools: Any) -> None:
    parse_metrics, wait_ready = server_tools.parse_metrics, server_tools.wait_ready
    server = spawn_server_process(["--model", "tiny", "--max-num-seqs", "2", "--drain-timeout-s", "5",
                                   "--completion-cache-size", "0"])
    assert requests.get(server.url + "/health/live", timeout=120).status_code == 200
    wait_ready(server.url)
    metrics = parse_metrics(requests.get(server.url + "/metrics", timeout=120).text)
    cold_start = metrics[("preheat:model_load_seconds", ())]
    assert cold_start > 0
    assert metrics[("preheat:server_state", (("state", "ready"),))] == 1

    long = _StreamReader(server.url, {"prompt": PROMPT, "max_tokens": 1000 - 20, "ignore_eos": True})
    short = _StreamReader(server.url, {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True})
    long.start()
    short.start()
    assert long.first.wait(120) and short.first.wait(120)
    assert long.events and short.events, (long.error, short.error)

    server.proc.terminate()                       # SIGTERM
    for _ in range(1000):
        ready = requests.get(server.url + "/health/ready", timeout=120)
        if ready.status_code == 503:
            break
    assert ready.status_code == 503 and ready.json()["state"] == "draining"
    assert requests.get(server.url + "/health/live", timeout=120).status_code == 200
    refused = requests.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=120)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_draining"
    metrics = parse_metrics(requests.get(server.url + "/metrics", timeout=120).text)
    assert metrics[("preheat:server_state", (("state", "draining"),))] == 1

    short.join(60)
    assert short.events[-1] == "[DONE]" and short.finish_reason() == "length"   # in-flight finished
    assert server.proc.wait(timeout=120) == 0
    long.join(30)
    # The long one either finished inside the drain deadline or was cut at it; both end the process.
    assert long.events[-1] == "[DONE]" or "drain timeout" in server.log()
    assert "drained; exiting with 0" in server.log()


def test_failed_load_exits_non_zero_with_the_reason(spawn_server_process: Any, tmp_path: Path) -> None:
    server = spawn_server_process(["--model", str(tmp_path / "no-such-model")])
    assert server.proc.wait(timeout=120) == 1
    assert "loading" in server.log() and "failed" in server.log()


def test_cli_rejects_impossible_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from preheat_server.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--max-num-seqs", "0"])
    assert exc.value.code == 2
    assert "--max-num-seqs" in capsys.readouterr().err
    assert main(["--kv-cache-memory-fraction", "0.5", "--embedding-max-batch-size", "1", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--min-step-ms", "-5"])
    assert "--min-step-ms" in capsys.readouterr().err


def test_host_defaults_to_pod_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    from preheat_server.config import ServerConfig

    monkeypatch.setenv("POD_IP", "127.0.3.7")
    assert ServerConfig().bind_host() == "127.0.3.7"
    assert ServerConfig(host="127.0.0.9").bind_host() == "127.0.0.9"
    monkeypatch.delenv("POD_IP")
    assert ServerConfig().bind_host() == "127.0.0.1"


def test_process_start_time_lies_between_spawn_and_now() -> None:
    """The cold start counts from the kernel's record of the process start: not before the parent spawned
    it (the old btime arithmetic put it 0.9 s early on a VM) and not after the child looked."""
    import subprocess
    import sys
    import time

    code = ("import time; from preheat_server.lifecycle import process_start_time; "
            "print(process_start_time(), time.time())")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    started, child_now = map(float, out.split())
    tick = 0.02   # /proc reports the start in clock ticks (10 ms at USER_HZ=100)
    assert before - tick <= started <= child_now
