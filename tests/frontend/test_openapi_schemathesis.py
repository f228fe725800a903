"""schemathesis over the HTTP app: generated requests for every documented operation (inferline's
routes, the admin API with a fake plan target, the KServe v2 and TF Serving doors) get no 5xx
and no answer that breaks the documented schema (status codes, content types, bodies).
At least 1,000 cases in all (1,248 with these settings); about 30 s of CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402

from inferline.core import Plan  # noqa: E402
from inferline.server import (  # noqa: E402
    App,
    InputSpec,
    Service,
    create_app,
    make_admin_router,
)
from inferline.server.frontdoors import (  # noqa: E402
    FrontDoor,
    Signature,
    TensorInfo,
    make_kserve_router,
    make_tfserving_router,
)

MAX_EXAMPLES = 100
MIN_CASES = 1000


async def _double(x: Any, slo: float) -> Any:
    return np.asarray(x) * 2


class _FakeTarget:
    async def apply(self, service: Service, plan: Plan) -> dict[str, str]:
        service.plan = plan
        return dict.fromkeys(plan.models, "ok")


def _app() -> Any:
    svc = Service(
        [
            App("dbl", _double, 1.0, input_spec=InputSpec("float32", (3,))),
            App("any", _double, 1.0, default_output=0.0),
        ],
        plan_target=_FakeTarget(),
    )
    sig = Signature((TensorInfo("x", "float32", (3,)),), (TensorInfo("y", "float32", (3,)),))
    door = FrontDoor(svc, {"dbl": sig})
    return create_app(
        svc,
        routers=[make_admin_router, make_kserve_router(door), make_tfserving_router(door)],
        close_service_on_shutdown=False,
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())
_cases: dict[str, int] = {}


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_generated_requests_get_documented_answers(case: Any) -> None:
    key = f"{case.method} {case.path}"
    _cases[key] = _cases.get(key, 0) + 1
    # Every check but positive_data_acceptance: a request can fit the JSON schema and still
    # be refused by rules a schema cannot state (a plan's models must exist, a tensor's shape
    # must match its data, model names are the server's): those 4xx are right.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


def test_zz_enough_cases_ran() -> None:
    if not _cases:
        pytest.skip("the generated tests did not run (selected out)")
    assert sum(_cases.values()) >= MIN_CASES, _cases
