"""Alert rules: promtool accepts the file, its unit tests pass, and every alert the issue asks for exists."""

from __future__ import annotations

import yaml

from .tools import RULE_TESTS, RULES, find_tool, run


def test_promtool_check_rules() -> None:
    proc = run([find_tool("promtool"), "check", "rules", str(RULES)])
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_promtool_rule_unit_tests() -> None:
    # Fires/does not fire at the right times for metrics-missing, operator-down, warm-pool-empty and
    # the fast SLO burn rate (manifests/alerts/tests/preheat-rules.test.yaml).
    proc = run([find_tool("promtool"), "test", "rules", str(RULE_TESTS)])
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_alert_the_issue_names_exists_with_severity_and_summary() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    wanted = {
        "PreheatSLOBurnRateFast",
        "PreheatSLOBurnRateSlow",
        "PreheatWarmPoolEmptyWhileScalingUp",
        "PreheatForecastErrorHigh",
        "PreheatMetricsMissing",
        "PreheatOperatorDown",
    }
    assert wanted <= set(alerts), wanted - set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule.get("for"), f"{name} fires on a single evaluation; give it a for: duration"
