"""scaling.warmPool.resources on a real API server: the CRD's CEL rules store a warm pool that gives back
CPU and reject, in the operator's words, one that gives back memory or sits on a GPU endpoint."""

from __future__ import annotations

import pytest
import yaml
from ophelpers import SAMPLES

pytestmark = [pytest.mark.cluster]

SERVING = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}


def _endpoint(name: str, warm: dict, **spec) -> dict:
    body = yaml.safe_load((SAMPLES / "tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["resources"] = SERVING
    body["spec"]["scaling"].setdefault("warmPool", {})["resources"] = warm
    body["spec"].update(spec)
    return body


def test_a_warm_pool_that_gives_back_cpu_is_stored(cluster_view, namespace, crd_installed):
    cluster_view.create(_endpoint("warm-small", {"requests": {"cpu": "100m", "memory": "2048Mi"}}))
    assert cluster_view.endpoint("warm-small")["spec"]["scaling"]["warmPool"]["resources"]["requests"]["cpu"] == "100m"


@pytest.mark.parametrize(
    ("warm", "spec", "message"),
    [
        ({"requests": {"memory": "1Gi"}}, {}, "scaling.warmPool.resources memory must not be below the serving memory"),
        ({"limits": {"memory": "1536Mi"}}, {}, "scaling.warmPool.resources memory must not be below the serving memory"),
        ({"requests": {"cpu": "100m"}}, {"accelerator": {"type": "gpu", "count": 1}},
         "scaling.warmPool.resources is for CPU endpoints"),
    ],
)
def test_bad_warm_resources_rejected_by_api_server(cluster_view, namespace, crd_installed, warm, spec, message):
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        cluster_view.create(_endpoint("bad-warm", warm, **spec))
    assert err.value.status == 422 and message in err.value.body, err.value.body
