"""A request's caller (specdec.core.caller): one small type, the shared, a named and an isolated
caller, converted once from the loose public values ("", a name, None); the server names its callers
with it (cache_scope)."""

from __future__ import annotations

import pytest

from specdec.core.caller import Caller, as_caller
from specdec.core.request import DecodeConfig
from specdec.errors import SpecdecError


def test_the_loose_public_values_convert_once_to_a_caller():
    assert as_caller("") == Caller.SHARED == Caller.named("") == Caller()
    assert as_caller("alice") == Caller.named("alice") != Caller.SHARED
    assert as_caller(None) == Caller.ISOLATED and as_caller(None).isolated and not Caller.SHARED.isolated
    assert as_caller(Caller.named("bob")) == Caller.named("bob")
    assert str(Caller.named("alice")) == "alice" and str(Caller.SHARED) == "" and str(Caller.ISOLATED) == "(isolated)"


def test_a_request_holds_a_caller_whatever_it_was_given():
    assert DecodeConfig().caller == Caller.SHARED
    assert DecodeConfig().with_settings(caller="alice").caller == Caller.named("alice")
    assert DecodeConfig().with_settings(caller=None).caller == Caller.ISOLATED
    assert DecodeConfig(caller="bob").caller == Caller.named("bob")
    assert DecodeConfig(caller=None).caller == Caller.ISOLATED
    assert DecodeConfig().with_settings(caller=Caller.ISOLATED).caller.isolated


@pytest.mark.parametrize("bad, message", [
    (3, "caller must be a string, None or a Caller, got int"),
    (b"alice", "caller must be a string, None or a Caller, got bytes"),
    (["alice"], "caller must be a string, None or a Caller, got list"),
])
def test_a_bad_caller_is_a_one_line_error(bad, message):
    for make in (as_caller, lambda c: DecodeConfig().with_settings(caller=c), lambda c: DecodeConfig(caller=c)):
        with pytest.raises(SpecdecError) as err:
            make(bad)
        assert str(err.value) == message and "\n" not in str(err.value)


def test_a_caller_is_named_by_a_string_and_an_isolated_one_is_nameless():
    with pytest.raises(SpecdecError, match="a caller's name must be a string, got int"):
        Caller.named(3)
    with pytest.raises(SpecdecError, match="an isolated caller has no name, got 'alice'"):
        Caller("alice", isolated=True)


def test_the_server_names_its_callers():
    pytest.importorskip("fastapi")
    from specdec.frontends.server.app import cache_scope

    assert cache_scope("", None, shared=True) == Caller.named("all")
    assert cache_scope("", None, shared=False) == Caller.ISOLATED
    assert cache_scope("key:ab", None, shared=False) == Caller.named("key:ab")
    salted = cache_scope("", "s", shared=False)
    assert salted.name.startswith("all|salt:") and not salted.isolated
    assert cache_scope("key:ab", "s", shared=True).name.startswith("key:ab|salt:")
