"""The adapter's own errors: every library error leaves ``inplace_extension.kube`` as a KubeError naming
what was done and the HTTP status (never a response body), its class saying what kind of trouble."""

from __future__ import annotations

import httpx2
import pytest
from lightkube import ApiError

from inplace_extension.kube.client import translated
from inplace_extension.kube.errors import Conflict, Forbidden, KubeError, NotFound, Unreachable


def api_error(status: int) -> ApiError:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "message": "secret"}
    return ApiError(response=httpx2.Response(status, json=body))


@pytest.mark.parametrize(
    ("status", "kind"),
    [(403, Forbidden), (404, NotFound), (409, Conflict), (422, KubeError)],
)
def test_an_api_error_becomes_our_error_naming_the_call_and_status(
    status: int, kind: type[KubeError]
) -> None:
    with pytest.raises(KubeError) as caught, translated("get Machine ns/m1"):
        raise api_error(status)
    assert type(caught.value) is kind
    assert caught.value.status == status
    assert str(caught.value) == f"KubeError: get Machine ns/m1: the API server answered {status}"
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    "error", [httpx2.ConnectError("refused"), httpx2.ReadTimeout("slow"), OSError("reset")]
)
def test_no_answer_at_all_is_unreachable(error: Exception) -> None:
    with pytest.raises(Unreachable) as caught, translated("list Nodes"):
        raise error
    assert caught.value.status is None
    assert caught.value.message == f"the API server is unreachable ({type(error).__name__})"


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_an_api_server_busy_or_failing_is_unreachable_naming_the_call_and_status(status: int) -> None:
    """429 (priority and fairness) and 5xx say "not now", nothing about the object: try again later."""
    with pytest.raises(Unreachable) as caught, translated("patch Machine ns/m1"):
        raise api_error(status)
    assert caught.value.status == status
    assert caught.value.message == f"patch Machine ns/m1: the API server answered {status}"
    assert "secret" not in str(caught.value)


def test_an_error_answer_the_transport_raises_is_an_answer_not_an_outage() -> None:
    """A list of a kind the API server does not serve fails in the transport (HTTPStatusError)."""
    request = httpx2.Request("GET", "https://api/apis/example.com/v1/things")
    answer = httpx2.Response(404, request=request, text="secret")
    with pytest.raises(NotFound) as caught, translated("list Thing"):
        raise httpx2.HTTPStatusError("404", request=request, response=answer)
    assert caught.value.message == "list Thing: the API server answered 404"
