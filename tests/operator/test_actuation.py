"""Warm-pool planning from pods as they are: promotions, demotions, counting, cold starts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs
from preheat.controller import actuation as a
from preheat.controller.builders import COST_SERVING, COST_WARM, DELETION_COST, LABEL_ROLE


def pod(name, role="warm", ready=True, created="2026-01-01T00:00:00Z", ready_at="2026-01-01T00:00:20Z",
        cost=None, deleting=False, waiting=None, terminated=None, phase="Running"):
    annotations = {DELETION_COST: cost if cost is not None else (COST_SERVING if role == "serving" else COST_WARM)}
    cs = {"name": "model-server", "restartCount": 0, "state": {}}
    if waiting:
        cs["state"] = {"waiting": {"reason": waiting}}
        cs["lastState"] = {"terminated": {"exitCode": 1, "message": terminated or ""}}
        cs["restartCount"] = 3
    return {
        "metadata": {"name": name, "labels": {LABEL_ROLE: role}, "annotations": annotations,
                     "creationTimestamp": created,
                     **({"deletionTimestamp": "2026-01-01T00:10:00Z"} if deleting else {})},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": ready_at}],
                   "containerStatuses": [cs]},
    }


def views(*pods):
    return [a.pod_view(p) for p in pods]


def test_promotes_longest_ready_warm_pods():
    pods = views(pod("s1", "serving"), pod("w-new", ready_at="2026-01-01T00:01:00Z"),
                 pod("w-old", ready_at="2026-01-01T00:00:30Z"))
    plan = a.plan(pods, serving=2, total=3, current_replicas=3)
    assert plan.promote == ("w-old",) and plan.demote == () and plan.replicas is None
    assert plan.patches()[0].body()["metadata"]["labels"][LABEL_ROLE] == "serving"


def test_shortfall_when_no_warm_pod_is_ready_and_replicas_raised():
    pods = views(pod("s1", "serving"), pod("w1", ready=False))
    plan = a.plan(pods, serving=3, total=4, current_replicas=2)
    assert plan.promote == () and plan.shortfall == 2 and plan.replicas == 4


def test_scale_down_demotes_youngest_serving_first_and_lowers_replicas():
    pods = views(pod("s-old", "serving", ready_at="2026-01-01T00:00:10Z"),
                 pod("s-new", "serving", ready_at="2026-01-01T00:05:00Z"), pod("w1"))
    plan = a.plan(pods, serving=1, total=2, current_replicas=3)
    assert plan.demote == ("s-new",) and plan.replicas == 2
    demote_patch = next(p for p in plan.patches() if p.name == "s-new")
    assert demote_patch.body()["metadata"]["annotations"][DELETION_COST] == COST_WARM


def test_idempotent_after_restart_mid_scale():
    # The first operator promoted w1 then died: the pods now say so, and the plan promotes no more.
    before = views(pod("s1", "serving"), pod("w1"), pod("w2"))
    first = a.plan(before, serving=2, total=3, current_replicas=3)
    assert first.promote == ("w1",)
    after = views(pod("s1", "serving"), pod("w1", "serving"), pod("w2"))
    assert a.plan(after, serving=2, total=3, current_replicas=3).empty


def test_crash_looping_and_deleting_pods_are_not_capacity_and_not_starting():
    pods = views(pod("s1", "serving"),
                 pod("bad", "serving", ready=False, waiting="CrashLoopBackOff",
                     terminated="model path /nope does not exist"),
                 pod("gone", "serving", deleting=True), pod("loading", ready=False))
    counts = a.count(pods)
    assert (counts.serving_ready, counts.warm_ready, counts.starting, counts.failing) == (1, 0, 1, 1)
    failing = a.first_failure(pods)
    assert failing.name == "bad" and "model path /nope does not exist" in failing.failure


def test_wrong_deletion_cost_is_repaired():
    pods = views(pod("s1", "serving", cost="0"))
    plan = a.plan(pods, serving=1, total=1, current_replicas=1)
    assert [(p.name, p.cost) for p in plan.fix_cost] == [("s1", COST_SERVING)]


def test_cold_start_and_percentile():
    pods = views(pod("a", ready_at="2026-01-01T00:00:20Z"), pod("b", ready_at="2026-01-01T00:01:00Z"),
                 pod("c", ready=False))
    samples = a.cold_start_samples(pods)
    assert samples == {"a": 20.0, "b": 60.0}
    assert a.percentile([20.0, 60.0], 0.9) == 60.0
    assert a.percentile([], 0.9) is None


@settings(max_examples=200, deadline=None)
@given(
    roles=hs.lists(hs.tuples(hs.sampled_from(["warm", "serving"]), hs.booleans(), hs.booleans()), max_size=12),
    serving=hs.integers(0, 15),
    extra=hs.integers(0, 5),
)
def test_plan_never_exceeds_what_exists(roles, serving, extra):
    pods = views(*[pod(f"p{i}", role, ready=ready, deleting=deleting) for i, (role, ready, deleting) in enumerate(roles)])
    plan = a.plan(pods, serving=serving, total=serving + extra, current_replicas=len(roles))
    live_ready = {p.name: p for p in pods if p.ready and not p.deleting}
    assert set(plan.promote) <= {n for n, p in live_ready.items() if p.role == "warm"}
    assert set(plan.demote) <= {n for n, p in live_ready.items() if p.role == "serving"}
    serving_after = sum(p.role == "serving" for p in live_ready.values()) + len(plan.promote) - len(plan.demote)
    # Reach the target exactly unless there is nothing left to promote.
    assert serving_after == serving or (serving_after < serving and plan.shortfall == serving - serving_after)
    # A second plan over the patched pods changes no roles: promotions happen once.
    patched = [a.with_role(p, "serving") if p.name in plan.promote else
               a.with_role(p, "warm") if p.name in plan.demote else p for p in pods]
    again = a.plan(patched, serving=serving, total=serving + extra, current_replicas=serving + extra)
    assert again.promote == () and again.demote == ()


def test_a_pod_restarting_after_a_crash_stays_failing():
    p = pod("bad", ready=False)
    p["status"]["containerStatuses"][0].update(
        {"state": {"running": {}}, "ready": False, "restartCount": 2,
         "lastState": {"terminated": {"exitCode": 2, "message": "model path /x does not exist"}}})
    view = a.pod_view(p)
    assert view.failing and "model path /x does not exist" in view.failure and "exit code 2" in view.failure
    assert a.count([view]).starting == 0
