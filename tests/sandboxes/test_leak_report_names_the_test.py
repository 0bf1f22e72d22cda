"""The suite's leak check names the test that made each leftover container.

The check runs once per pytest process, at its end, and pytest reports a failure there on
whichever test the process ran last: without the maker's name a CI log says nothing useful.
"""

from __future__ import annotations

import pytest

from agentgym.sandboxes import DockerSandbox
from tests.sandboxes.conftest import made_by, own_containers

pytestmark = pytest.mark.docker


def test_a_container_is_named_with_the_test_that_made_it(
    docker_ready: None, request: pytest.FixtureRequest
) -> None:
    with DockerSandbox() as sandbox:
        mine = [c for c in own_containers() if c.id == sandbox._container.id]
        assert len(mine) == 1
        assert made_by(mine) == {mine[0].short_id: request.node.nodeid}
