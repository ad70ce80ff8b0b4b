"""remat.core.options: one record for keyword arguments, REMAT_FLAGS and defaults."""

import pytest

from remat._flags import parse_flags
from remat.core.options import (DEFAULT_SMALL_NODE_BYTES, PORTFOLIO, RematOptions,
                                parse_limit, resolve_options)


def test_keyword_arguments_win_over_flags_which_win_over_defaults():
    flags = parse_flags("--memory_limit=0.5 --algorithm=standard --small_node_limit=4KiB")
    o = resolve_options({"memory_limit": "1GiB"}, flags)
    assert (o.memory_limit, o.algorithm, o.small_node_bytes, o.small_node_given) == (
        2**30, "standard", 4096, True)
    o = resolve_options({"memory_limit": 0.25}, {})
    assert (o.memory_limit, o.algorithm, o.scheduler, o.small_node_bytes,
            o.small_node_given, o.solver_seconds) == (
        0.25, PORTFOLIO, "best", DEFAULT_SMALL_NODE_BYTES, False, 60.0)
    assert resolve_options({"memory_limit": 1, "small_node_limit": 0}, {}).small_node_given


@pytest.mark.parametrize("given,want", [(1, 1), ("0.5", 0.5), (0.5, 0.5), (1.0, 1.0),
                                        ("2GiB", 2**30 * 2), ("1e3", 1000), ("4096", 4096)])
def test_limits_accepted(given, want):
    assert parse_limit(given) == want and type(parse_limit(given)) is type(want)


@pytest.mark.parametrize("bad", [0, -5, "abc", 1.5, 2.0, -0.1, True, None, "0", "-1MiB",
                                 float("inf"), [3]])
def test_bad_limits_name_the_parameter_the_value_and_the_accepted_forms(bad):
    with pytest.raises(ValueError) as e:
        parse_limit(bad)
    assert f"memory_limit={bad!r}" in str(e.value) and "accepted:" in str(e.value)


def test_other_bad_settings_name_their_parameter():
    for key, value, accepted in [("small_node_limit", -1, "bytes as an int >= 0"),
                                 ("small_node_limit", "big", "bytes as an int >= 0"),
                                 ("algorithm", "magic", "'auto', 'standard'"),
                                 ("scheduler", "fast", "'best', 'list'"),
                                 ("solver_seconds", "0", "seconds > 0")]:
        with pytest.raises(ValueError, match=rf"{key}={value!r}.*accepted: {accepted}"):
            resolve_options({"memory_limit": 0.5, key: value}, {})
    with pytest.raises(ValueError, match="no memory limit"):
        resolve_options({}, {})
    with pytest.raises(ValueError, match="--dump_dot needs a directory"):
        resolve_options({"memory_limit": 0.5}, {"dump_dot": True})


def test_dump_switches_default_to_all_when_none_is_chosen():
    o = resolve_options({"memory_limit": 0.5, "dump_to": "/tmp/x"}, {})
    assert o.dump_dot and o.dump_memlog
    o = resolve_options({"memory_limit": 0.5}, {"dump_to": "/tmp/x", "dump_memlog": True})
    assert o.dump_memlog and not o.dump_dot


def test_the_record_checks_itself():
    with pytest.raises(ValueError, match="unknown algorithm 'magic'"):
        RematOptions(1, "magic")
    with pytest.raises(ValueError, match="model_target_bytes and small_node_bytes"):
        RematOptions(-1, "path")
