"""The gloo worlds the distributed tests run their cases in: two and four rank processes on
the SYCL CPU device, made once per test module (a module may define its own)."""
from helpers import distributed_cases as dc
import pytest


@pytest.fixture(scope="module")
def world2():
    world = dc.World(2)
    yield world
    world.close()


@pytest.fixture(scope="module")
def world4():
    world = dc.World(4)
    yield world
    world.close()
