"""The load generator against the real model server (`preheat-server --model tiny`, a subprocess)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from preheat.sim.traces import load_trace
from preheat_lab.loadgen import ReplayConfig, Replayer, StaticEndpoints, TokenShaping, from_trace, summarize

DATA = Path(__file__).parent / "data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_server():
    port = _free_port()
    server = Path(sys.executable).parent / "preheat-server"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(server), "--model", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--max-num-seqs", "4", "--max-queue", "64"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"preheat-server exited: {proc.stdout.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{address}/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("preheat-server --model tiny did not become ready within 240 s")
            time.sleep(0.5)
        yield address
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _metric(address: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    pat = re.compile(rf'^{re.escape(name)}\{{([^}}]*)\}} ([0-9.eE+-]+)$', re.M)
    return sum(float(v) for labels, v in pat.findall(text) if 'api="completions"' in labels or "api=" not in labels)


def test_replay_of_a_real_trace_excerpt_against_the_real_server(tiny_server):
    trace = load_trace(DATA / "azure_code_2023_excerpt.csv")
    shaping = TokenShaping(prompt_max=16, output_max=6)
    # the first 30 s of the excerpt, 10x faster: real inter-arrival gaps, bursts included
    arrivals = from_trace(trace, compress=10, duration_s=30, shaping=shaping)
    assert len(arrivals) >= 10
    before = _metric(tiny_server, "preheat:requests_received_total")
    rp = Replayer(StaticEndpoints([tiny_server]), ReplayConfig(slo_s=60.0, request_timeout_s=60.0))
    records = asyncio.run(rp.run(arrivals))
    after = _metric(tiny_server, "preheat:requests_received_total")
    assert all(r.status == 200 for r in records), [r.error for r in records if r.status != 200]
    # every request reached the server once, and each generated at most what it asked for
    assert after - before == len(arrivals)
    assert all(1 <= r.output_tokens <= r.max_tokens for r in records)
    assert summarize(records, 60.0)["slo_attainment"] == 1.0
