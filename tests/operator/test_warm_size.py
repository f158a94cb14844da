"""Cheap warm pools (scaling.warmPool.resources): the spec's checks, the cost model, the builders and the
plan's in-place resizes, and the status that counts warm replicas at their cost."""

from __future__ import annotations

import pytest
from preheat.controller import actuation as a
from preheat.controller import warm_size
from preheat.controller.builders import CONTAINER, LABEL_ROLE, pod_sizes, pod_template
from preheat.controller.collect import Collected
from preheat.controller.endpoint import Endpoint
from preheat.controller.observe import MetricsResult
from preheat.controller.spec import describe_error, parse_spec
from preheat.controller.step import StepContext, step
from preheat.scaling.from_spec import policy_config
from pydantic import ValidationError

SERVING = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
WARM = {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}


def spec_with(resources=SERVING, warm=WARM, **pool):
    return parse_spec({"model": {"builtin": "tiny"}, "resources": resources,
                       "scaling": {"forecasting": {"enabled": False},
                                   "warmPool": {"min": 1, "max": 2, "resources": warm, **pool}}})


def rejected(**kw) -> str:
    with pytest.raises(ValidationError) as exc:
        spec_with(**kw)
    return describe_error(exc.value)


def test_warm_resources_above_serving_are_rejected_with_the_field_and_both_values():
    why = rejected(warm={"requests": {"cpu": "3"}, "limits": {"cpu": "3"}})
    assert "scaling.warmPool.resources.requests.cpu (3) is above resources.requests.cpu (2)" in why
    assert "must not be larger than a serving one" in why


def test_warm_resources_need_the_serving_value_they_resize_back_to():
    why = rejected(resources={"requests": {"cpu": "2"}}, warm={"requests": {"memory": "1Gi"}})
    assert "scaling.warmPool.resources.requests.memory needs resources.requests.memory" in why


def test_warm_resources_only_resize_cpu_and_memory():
    why = rejected(warm={"requests": {"ephemeral-storage": "1Gi"}})
    assert "requests.ephemeral-storage: only cpu and memory are resized in place" in why


def test_a_change_of_qos_class_is_rejected():
    # Guaranteed serving, warm with only a lower request: Burstable, which a resize cannot reach.
    why = rejected(warm={"requests": {"cpu": "100m"}})
    assert "QoS class (Guaranteed -> Burstable)" in why


def test_gpu_endpoints_cannot_have_warm_resources():
    with pytest.raises(ValidationError) as exc:
        parse_spec({"model": {"builtin": "tiny"}, "accelerator": {"type": "gpu", "count": 1}, "resources": SERVING,
                    "scaling": {"warmPool": {"resources": WARM}}})
    assert "scaling.warmPool.resources is for CPU endpoints" in describe_error(exc.value)


def test_unparseable_quantity_is_rejected():
    assert "scaling.warmPool.resources" in rejected(warm={"requests": {"cpu": "lots"}, "limits": {"cpu": "lots"}})


def test_cost_fraction_prices_cores_and_memory_by_the_stated_ratio():
    spec = spec_with()
    gib = warm_size.MEMORY_COST_PER_GIB
    assert spec.warm_cost_fraction() == pytest.approx((0.1 + 2 * gib) / (2 + 2 * gib))
    # Memory priced at nothing: the CPU ratio alone; an explicit costFraction wins over the model.
    assert spec_with(memoryCostPerGib=0.0).warm_cost_fraction() == pytest.approx(0.05)
    assert spec_with(costFraction=0.5).warm_cost_fraction() == 0.5
    assert policy_config(spec).warm_cost_fraction == spec.warm_cost_fraction()


def test_quantities_compare_as_numbers_and_requests_default_to_limits():
    assert warm_size.same({"limits": {"cpu": "2"}}, {"requests": {"cpu": "2000m"}, "limits": {"cpu": 2}})
    assert not warm_size.same({"requests": {"cpu": "2"}}, {"requests": {"cpu": "1"}})
    assert warm_size.cost({"limits": {"cpu": "500m", "memory": "1Gi"}}, 1.0) == pytest.approx(1.5)


def test_pods_start_at_the_serving_size_with_a_resize_policy_that_never_restarts():
    spec = spec_with()
    c = pod_template("ep", spec)["spec"]["containers"][0]
    assert c["resources"] == SERVING
    assert {p["resourceName"]: p["restartPolicy"] for p in c["resizePolicy"]} == {"cpu": "NotRequired",
                                                                                  "memory": "NotRequired"}
    serving, warm = pod_sizes(spec)
    assert serving == SERVING
    assert warm == {"requests": {"cpu": "100m", "memory": "2Gi"}, "limits": {"cpu": "100m", "memory": "2Gi"}}
    assert "resizePolicy" not in pod_template("ep", parse_spec({"model": {"builtin": "tiny"}}))["spec"]["containers"][0]
    assert pod_sizes(parse_spec({"model": {"builtin": "tiny"}})) is None


def pod(name, role, resources, ready=True, ready_at="2026-01-01T00:00:20Z"):
    return a.pod_view({
        "metadata": {"name": name, "labels": {LABEL_ROLE: role}, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": CONTAINER, "resources": resources}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                        "lastTransitionTime": ready_at}]},
    })


def test_plan_resizes_up_on_promotion_down_on_demotion_and_leaves_loading_pods_alone():
    sizes = pod_sizes(spec_with())
    serving, warm = sizes
    pods = [pod("s1", "serving", serving), pod("w-ready", "warm", warm),
            pod("w-new", "warm", serving, ready_at="2026-01-01T00:05:00Z"), pod("w-loading", "warm", serving, ready=False)]
    up = a.plan(pods, serving=2, total=4, current_replicas=4, sizes=sizes)
    assert up.promote == ("w-ready",)
    assert [(r.name, r.up) for r in up.resize] == [("w-ready", True), ("w-new", False)]
    assert [r.name for r in up.resize_up] == ["w-ready"] and [r.name for r in up.resize_down] == ["w-new"]
    body = up.resize_up[0].body()["spec"]["containers"][0]
    assert body == {"name": CONTAINER, "resources": serving}
    down = a.plan(pods, serving=0, total=4, current_replicas=4, sizes=sizes)
    assert down.demote == ("s1",) and ("s1", False) in [(r.name, r.up) for r in down.resize]
    # Once the pods are at their role's size the plan asks nothing more (idempotent after a restart).
    settled = [pod("s1", "serving", serving), pod("w-ready", "serving", serving), pod("w-new", "warm", warm)]
    assert a.plan(settled, serving=2, total=3, current_replicas=3, sizes=sizes).resize == ()
    assert a.plan(pods, serving=2, total=4, current_replicas=4).resize == ()  # no warmPool.resources


def test_status_and_policy_count_warm_replicas_at_their_cost():
    spec = spec_with()
    sizes = pod_sizes(spec)
    ep = Endpoint()
    ep.autoscaler_for(spec, policy_config(spec), None, "ns/ep")
    seen = Collected(1_800_000_000.0, 2, [pod("s1", "serving", sizes[0]), pod("w1", "warm", sizes[0])],
                     MetricsResult(True, "MetricsFound", "", signal=1.0, signal_panic=1.0, queue=0.0, targets=2))
    out = step(ep, spec, seen, StepContext(name="ep", generation=1, previous={}, now="2027-01-15T08:00:00Z",
                                           interval_s=15.0))
    fraction = spec.warm_cost_fraction()
    assert out.status["warmCostFraction"] == round(fraction, 4) < 1
    assert out.status["replicaCost"] == round(out.serving + out.warm * fraction, 3)
    assert out.warm >= 1 and [(r.name, r.up) for r in out.applied.resize] == [("w1", False)]


def test_warm_memory_below_serving_is_rejected_the_model_stays_loaded():
    why = rejected(resources={"requests": {"cpu": "2", "memory": "2Gi"}}, warm={"requests": {"memory": "1Gi"}})
    assert "memory must not be below the serving memory" in why
    # The same memory (any spelling) is fine: only CPU is given back.
    spec_with(resources={"requests": {"cpu": "2", "memory": "2Gi"}},
              warm={"requests": {"cpu": "100m", "memory": str(2 * 2**30)}})
    assert warm_size.memory_shrinks({"limits": {"memory": "2Gi"}}, {"limits": {"memory": "1500Mi"}})
    assert not warm_size.memory_shrinks({"requests": {"memory": "2Gi"}}, {"requests": {"cpu": "1"}})


def test_the_readmes_warm_cost_stand_in_comes_out_of_the_cost_model():
    # README's frontier section: a 4 vCPU / 16 GiB replica resized to 0.1 vCPU while warm, at list prices.
    # From GCP's N2 on-demand prices (us-central1) the module states: USD per GiB-hour / per vCPU-hour.
    per_gib_in_cores = 0.004237 / 0.031611
    assert abs(warm_size.MEMORY_COST_PER_GIB - per_gib_in_cores) < 5e-4
    serving = {"requests": {"cpu": "4", "memory": "16Gi"}}
    fraction = warm_size.cost_fraction(serving, {"requests": {"cpu": "100m"}}, per_gib_in_cores)
    assert fraction == pytest.approx((0.1 + 16 * per_gib_in_cores) / (4 + 16 * per_gib_in_cores))
    assert round(fraction, 2) == 0.37
