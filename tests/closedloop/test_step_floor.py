"""The closed loop's emulated accelerator step: every mode's model server gets the same --min-step-ms."""

from __future__ import annotations

import pytest
from preheat.controller.builders import deployment
from preheat.controller.spec import parse_spec
from preheat_lab.closedloop import LoopConfig, endpoint_manifest
from preheat_lab.closedloop.__main__ import build_parser
from preheat_lab.closedloop.experiment import MODES, step_floor_ms

OWNER = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "t", "uid": "u"}}


def _server_args(cfg: LoopConfig, mode: str) -> list[str]:
    spec = parse_spec(endpoint_manifest(cfg, mode)["spec"])  # what the operator (and the CRD) accept
    [server] = deployment("tiny", "ns", spec, OWNER)["spec"]["template"]["spec"]["containers"]
    return server["args"]


def test_every_mode_runs_the_same_step_floor_and_none_when_off(tmp_path):
    paced = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://p", out_dir=tmp_path, min_step_ms=60.0)
    plain = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://p", out_dir=tmp_path)
    for mode in MODES:
        args = _server_args(paced, mode)
        assert args[args.index("--min-step-ms") + 1] == "60"
        assert "--min-step-ms" not in _server_args(plain, mode)


def test_the_step_floor_makes_a_replica_serve_the_stated_rate():
    # 2 slots, 6-token answers, 2 req/s: each slot finishes an answer a second, 6 steps of 1/6 s
    assert step_floor_ms(2, 2.0, 6.0) == pytest.approx(1000 / 6)
    assert step_floor_ms(1, 2.0, 6.0) == pytest.approx(step_floor_ms(2, 2.0, 6.0) / 2)
    with pytest.raises(ValueError, match="rate and tokens"):
        step_floor_ms(2, 0.0, 6.0)


def test_the_cli_paces_by_default_and_0_turns_it_off():
    base = ["--trace", "t.csv"]
    assert build_parser().parse_args(base).replica_rps == 2.0
    assert build_parser().parse_args([*base, "--replica-rps", "0"]).replica_rps == 0.0
