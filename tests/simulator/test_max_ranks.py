"""``pytest --max-ranks N`` (tests/conftest.py), which ``make test-fast`` uses: it deselects the items of
``@on_ranks`` tests on more than N simulated ranks, and nothing else."""

import os
import types

import pytest


class Item:
    def __init__(self, name, ranks, simulated):
        self.name, self.simulated = name, simulated
        self.callspec = types.SimpleNamespace(params={"ranks": ranks})

    def get_closest_marker(self, name):
        return object() if name == "simulated" and self.simulated else None


class Config:
    def __init__(self, limit):
        self.limit, self.deselected = limit, []
        self.hook = types.SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name):
        assert name == "max_ranks", name
        return self.limit


@pytest.fixture
def modify(request):
    hook, = [h for h in request.config.hook.pytest_collection_modifyitems.get_hookimpls()
             if h.plugin_name.endswith(os.path.join("tests", "conftest.py"))]
    return hook.function


def test_the_items_on_more_ranks_are_deselected_and_reported(modify):
    items = [Item("on 2", 2, True), Item("on 4", 4, True), Item("on 8", 8, True),
             Item("a bad size, not on ranks", 9, False)]
    config = Config(4)
    modify(config=config, items=items)
    assert [i.name for i in items] == ["on 2", "on 4", "a bad size, not on ranks"]
    assert [i.name for i in config.deselected] == ["on 8"]


def test_without_the_option_nothing_is_deselected(modify):
    items = [Item("on 8", 8, True)]
    config = Config(None)
    modify(config=config, items=items)
    assert [i.name for i in items] == ["on 8"] and config.deselected == []


def test_a_limit_below_one_rank_is_refused(modify):
    with pytest.raises(pytest.UsageError, match="--max-ranks must be a number of ranks >= 1, got 0"):
        modify(config=Config(0), items=[])
