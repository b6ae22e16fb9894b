"""The names users bring from vLLM and transformers: ``max_tokens`` is ``max_new_tokens``, and a
keyword no request takes is named as unknown, with the closest known one."""

from __future__ import annotations

import pytest

from specdec.errors import SpecdecError
from specdec.core.request import DEFAULTS, make_config


def test_max_tokens_is_max_new_tokens():
    assert make_config(max_tokens=17).max_new_tokens == 17
    assert make_config(max_tokens=17, max_new_tokens=17).max_new_tokens == 17
    assert make_config().max_new_tokens == DEFAULTS["max_new_tokens"]
    with pytest.raises(SpecdecError, match="not both"):
        make_config(max_tokens=17, max_new_tokens=20)
    with pytest.raises(SpecdecError, match="max_new_tokens"):
        make_config(max_tokens=0)


@pytest.mark.parametrize("name,hint", [("max_new_token", "max_new_tokens"), ("temprature", "temperature"),
                                       ("draft_windows", "draft_window"), ("ngram_mx", "ngram_max")])
def test_an_unknown_keyword_names_the_closest_known_one(name, hint):
    with pytest.raises(SpecdecError) as err:
        make_config(**{name: 1})
    msg = str(err.value)
    assert f"unknown option {name!r}" in msg and f"did you mean {hint!r}" in msg and "\n" not in msg


def test_an_unknown_keyword_without_a_close_one():
    with pytest.raises(SpecdecError) as err:
        make_config(do_sample=True)
    assert "unknown option 'do_sample'" in str(err.value) and "did you mean" not in str(err.value)


def test_a_known_parameter_of_another_rule_keeps_its_own_message():
    with pytest.raises(SpecdecError, match="takes no parameters"):
        make_config(policy="lossless", theta=0.5)


def test_vllm_flag_names_and_ours_are_one_flag():
    """`vllm serve`'s names (--max-model-len, --allowed-origins) are the flags; ours stay as aliases."""
    from specdec.cli import build_parser
    from specdec.frontends.cliargs import VLLM_NAMES

    assert VLLM_NAMES == {"--context-length": "--max-model-len", "--allow-origin": "--allowed-origins"}
    p = build_parser()
    for argv in (["generate", "x"], ["serve"], ["bench", "--out", "runs/x"]):
        for flag in ("--max-model-len", "--context-length"):
            assert p.parse_args([*argv, flag, "512"]).context_length == 512
    a = p.parse_args(["serve", "--allowed-origins", "http://a.example", "--allow-origin", "http://b.example"])
    assert a.allow_origin == ["http://a.example", "http://b.example"]


@pytest.mark.parametrize("flag,value,name", [
    ("--repetition-penalty", "0", "repetition_penalty"), ("--presence-penalty", "2.5", "presence_penalty"),
    ("--frequency-penalty", "-3", "frequency_penalty"), ("--max-model-len", "many", "max-model-len"),
])
def test_bad_new_flags_fail_in_one_line_before_loading(tmp_path, capsys, flag, value, name):
    from specdec.cli import main

    import contextlib

    # argparse refuses a non-number itself (exit 2); the penalties' ranges are the library's checks
    with pytest.raises(SystemExit) if name == "max-model-len" else contextlib.nullcontext():
        code = main(["generate", "hi", flag, value, "--target", str(tmp_path / "no-such-model")])
        assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and name in err[-1] and "no-such-model" not in err[-1]
